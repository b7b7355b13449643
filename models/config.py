"""Configuration of the transformer encoder: one frozen dataclass, validated on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

import numpy as np

E = TypeVar("E", bound=Enum)


class AttentionKind(str, Enum):
    """The attention variants of the zoo; the CLI accepts their string values."""

    DOT_PRODUCT = "dot-product"
    INHIBITOR = "inhibitor"
    SIGNED_INHIBITOR = "signed-inhibitor"
    POWER_SOFTMAX = "power-softmax"
    DCT = "dct"
    ACTIVATOR = "activator"
    GEGLU_ONLY = "geglu-only"


class NormKind(str, Enum):
    LAYERNORM = "layernorm"
    # per-feature affine at inference: folded into the next linear layer, free under FHE
    BATCHNORM = "batchnorm"
    NONE = "none"


class Activation(str, Enum):
    RELU = "relu"
    GELU = "gelu"
    QUAD = "quad"  # 0.125x² + 0.25x + 0.5 (MPCFormer's "Quad"): exact under CKKS at depth 1


class InputKind(str, Enum):
    """How a sample enters the model: token ids (embedding table) or feature vectors per
    position."""

    TOKENS = "tokens"
    PATCHES = "patches"
    # vectors a client computed from its tokens (embedding lookup, segment means, positions): the
    # model's first layer is the identity; made by models.text.split_text_model, never trained
    EMBEDDED = "embedded"


class Pooling(str, Enum):
    """How the encoder's positions become the model's one output."""

    MEAN = "mean"  # a classifier of the whole sequence: the mean over its positions (padding out)
    # the output of the last word (right-padded token inputs): with causal attention, a next-word
    # language model; under encryption the client picks that row of the per-position outputs
    LAST = "last"


class PowerForm(str, Enum):
    """The PowerSoftmax form a model trains in (PowerSoftmax paper)."""

    STABLE = "stable"  # Eqs. 5-6 in training, Eq. 7 at inference
    LENGTH_AGNOSTIC = "length-agnostic"  # Eq. 7 with ε throughout: the polynomial model's form


def causal_mean_factors(T: int) -> tuple[np.ndarray, int]:
    """Under ``inhibitor_mean`` with the causal mask, query i's sums are scaled by m_i / n:
    n = 4·2^⌈log2 T⌉ and m_i = round(n / (i + 1)) (>= 4), within 12% of the mean's 1 / (i + 1).
    An integer over a power of two, so the integer program multiplies by the clear integer m_i
    and its scale absorbs n."""
    n = 4 << max(0, (T - 1).bit_length())
    return np.floor(n / np.arange(1, T + 1) + 0.5).astype(np.int64), n


def inhibitor_mean_scale(T: int, causal: bool) -> np.ndarray:
    """(T,): query i's scale under ``inhibitor_mean``: m_i / n of :func:`causal_mean_factors` with
    the causal mask, 1 / T without (every query sums T keys)."""
    if not causal:
        return np.full(T, 1.0 / T)
    m, n = causal_mean_factors(T)
    return m / n


INHIBITOR_KINDS = (AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR)

# the kinds whose attention takes a mask (key padding, causal); the others are token-local
# (activator, geglu-only: a padding position changes nothing but itself) or mix positions through a
# transform that has no mask (dct: DCT-Former compresses the whole sequence, padding included)
MASKED_KINDS = (
    AttentionKind.DOT_PRODUCT,
    AttentionKind.INHIBITOR,
    AttentionKind.SIGNED_INHIBITOR,
    AttentionKind.POWER_SOFTMAX,
)


@dataclass(frozen=True)
class TransformerConfig:
    """Everything needed to rebuild a model; stored in ``model.pt``.

    ``in_features`` is the vocabulary size for token inputs, the feature count per position
    otherwise. Attention-specific knobs: ``inhibitor_alpha`` (shift α; the paper uses 0.5) and
    ``inhibitor_gamma`` (γ; ``None`` means √d_head as in the paper), ``power_p`` / ``power_eps``
    (PowerSoftmax p and ε), ``power_form`` (``stable``: train with Eqs. 5-6, infer with Eq. 7;
    ``length-agnostic``: Eq. 7 with ε in training and inference, the polynomial model's form),
    ``dct_n_bar`` (kept DCT coefficients), ``dct_ideal`` (Algorithm 2, evaluation only).
    ``tie_qk`` (Inhibitor kinds): K = Q, one projection, so the Manhattan scores of Eq. (5) are
    symmetric with a zero diagonal; under TFHE the program then needs |q_i − q_j| for the
    T(T − 1)/2 pairs i < j only and no K requantisation.
    ``mask_padding`` (token inputs): padding keys are masked out of every attention that takes a
    mask (:data:`MASKED_KINDS`), so a padded sequence gives the logits of the unpadded one; an
    embedded input (the client's vectors of such a model) carries the mask as its last column.
    ``causal``: query i attends keys j <= i only.
    ``inhibitor_mean`` (Inhibitor kinds): each query's sums over keys (Eqs. 6-7) become means,
    scaled by a public constant (:func:`inhibitor_mean_scale`): 1 / T, or with the causal mask
    about 1 / (i + 1) for query i, so that the first positions' sums, over few keys, are not on
    another scale than the last ones'. The model computes the same function as with sums (the
    output projection could absorb 1 / T), but it trains to other weights, which the integer
    program follows more closely (benchmarks/results/text_widths.md).
    ``pooling``: ``mean`` (a sequence classifier) or ``last`` (the last word's output, a next-word
    model; token inputs that mask their padding, no ``words``).
    ``words`` (token inputs): the model reads this many words and mean-pools them into ``seq_len``
    contiguous segments of (nearly) equal length before the positions are added
    (:func:`models.segments.segment_means`), so every position holds real words and no padding
    enters attention; under encryption the client computes this front end (:mod:`models.text`).
    ``segment_norm`` (token inputs): each segment mean is scaled to unit RMS before its position
    is added (:func:`models.segments.unit_rms`, on the client), so that a short review's segments
    (single words) are not several times larger than a long review's (means of many words);
    without ``words`` (padded word positions), each word's vector, a segment of one word (one
    input scale then fits every word: the TFHE program follows its float model more closely,
    benchmarks/results/text_widths.md).
    """

    seq_len: int
    in_features: int
    n_outputs: int
    input_kind: InputKind = InputKind.PATCHES
    attention: AttentionKind = AttentionKind.DOT_PRODUCT
    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 1
    d_ff: int | None = None
    norm: NormKind = NormKind.LAYERNORM
    ffn_activation: Activation = Activation.RELU
    inhibitor_alpha: float = 0.5
    inhibitor_gamma: float | None = None
    power_p: int = 4
    power_eps: float = 1e-3
    power_form: PowerForm = PowerForm.STABLE
    dct_n_bar: int | None = None
    dct_ideal: bool = False
    dropout: float = 0.0
    tie_qk: bool = False
    mask_padding: bool = True  # token inputs: no query attends a padding key (and pooling skips it)
    causal: bool = False  # query i attends keys j <= i only (PowerSoftmax paper Eq. 11's mask)
    inhibitor_mean: bool = False  # Inhibitor: each query's sums over keys as means
    words: int | None = None  # token inputs: words read, pooled into seq_len segments
    segment_norm: bool = False  # each segment mean (or padded word) scaled to unit RMS
    pooling: Pooling = Pooling.MEAN

    def __post_init__(self) -> None:
        coerce_enums(
            self,
            attention=AttentionKind,
            norm=NormKind,
            ffn_activation=Activation,
            input_kind=InputKind,
            pooling=Pooling,
            power_form=PowerForm,
        )
        for name in ("seq_len", "in_features", "n_outputs", "d_model", "n_heads", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"TransformerConfig.{name} must be >= 1, got {getattr(self, name)}"
                )
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.power_p <= 0 or self.power_p % 2:
            raise ValueError(f"power_p must be a positive even integer, got {self.power_p}")
        if self.tie_qk and self.attention not in (
            AttentionKind.INHIBITOR,
            AttentionKind.SIGNED_INHIBITOR,
        ):
            raise ValueError(
                f"tie_qk (K = Q) is an Inhibitor option, not of {self.attention.value} attention"
            )
        if self.causal and self.attention not in MASKED_KINDS:
            raise ValueError(
                f"causal attention is an option of {', '.join(k.value for k in MASKED_KINDS)}, "
                f"not of {self.attention.value}"
            )
        if self.inhibitor_mean and self.attention not in INHIBITOR_KINDS:
            raise ValueError(
                "inhibitor_mean is an option of Inhibitor attention (the other kinds normalise "
                f"their rows already), not of {self.attention.value}"
            )
        if self.words is not None and (
            self.input_kind is not InputKind.TOKENS or self.words < self.seq_len
        ):
            raise ValueError(
                f"words={self.words} (words pooled into seq_len={self.seq_len} segments) needs "
                "token inputs and at least one word per segment"
            )
        if self.segment_norm and self.input_kind is not InputKind.TOKENS:
            raise ValueError(
                "segment_norm scales the client's word vectors (segment means, or each word of a "
                "padded input): it needs token inputs"
            )
        if (
            self.input_kind is InputKind.EMBEDDED
            and self.in_features != self.d_model + self.key_mask_column
        ):
            raise ValueError(
                f"embedded inputs have d_model={self.d_model} columns"
                + (" and the key mask column" if self.key_mask_column else "")
                + f", not in_features={self.in_features}"
            )
        if self.pooling is Pooling.LAST and not (
            self.mask_padding
            and self.words is None
            and self.input_kind in (InputKind.TOKENS, InputKind.EMBEDDED)
        ):
            raise ValueError(
                "pooling='last' (the last word's output) needs word positions: token inputs (or "
                "the client's embedded ones) that mask their padding, without words= segments"
            )
        if self.dct_n_bar is not None and not 0 < self.dct_n_bar <= self.seq_len:
            raise ValueError(
                f"dct_n_bar must be in [1, seq_len={self.seq_len}], got {self.dct_n_bar}"
            )

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def key_mask_column(self) -> bool:
        """Whether the input's last column is the client's key mask (0 at padding): an embedded
        input of a model that masks padding (a padded text model, :mod:`models.text`)."""
        return self.input_kind is InputKind.EMBEDDED and self.mask_padding

    @property
    def has_ffn(self) -> bool:
        """Whether each block has an FFN after its mixer (GEGLU-only blocks have none)."""
        return self.attention is not AttentionKind.GEGLU_ONLY

    @property
    def ffn_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 2 * self.d_model

    def replace(self, **changes) -> TransformerConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in out.items()}

    @classmethod
    def from_dict(cls, data: dict) -> TransformerConfig:
        # model files written before masks existed attended to padding: they keep doing so;
        # "causal_mean" is inhibitor_mean's first name (it had the causal mask only)
        data = dict(data)
        if "causal_mean" in data:
            data["inhibitor_mean"] = data.pop("causal_mean")
        return dataclass_from_dict(cls, {"mask_padding": False, **data})


def as_enum(kind: type[E], value, what: str) -> E:
    """``value`` (a member or its string) as a member of ``kind``; a ValueError naming ``what`` and
    the choices otherwise."""
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise ValueError(f"{what} must be one of {choices}, got {value!r}") from None


def coerce_enums(config, **kinds: type[Enum]) -> None:
    """In a frozen config dataclass's ``__post_init__``: each field named in ``kinds``, a member or
    its string (a model file's, the CLI's, a script's), becomes a member of its enum; None stays
    None; an unknown value is a ValueError naming the field and the choices (:func:`as_enum`)."""
    for name, kind in kinds.items():
        value = getattr(config, name)
        if value is not None:
            object.__setattr__(config, name, as_enum(kind, value, name))


def dataclass_from_dict(cls, data: dict):
    """``cls(**data)`` for a config dataclass, with an error naming any field ``cls`` does not have
    (a model file written by another version)."""
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    return cls(**data)
