"""Quantization configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from enum import Enum

from models.config import coerce_enums, dataclass_from_dict

# calibration samples (from the training split) for PTQ, QAT through the program and `fhe compile`:
# the
# same set everywhere, so the program compiled from a QAT model is the program it was trained
# through
DEFAULT_CALIB_SAMPLES = 2000

# the requantisation points that feed attention: Q, K (shared for the Inhibitor) and V of every
# block
ATTENTION_POINT = re.compile(r"^block\d+\.mix\.(q|k|v|qk)(\.out)?$")
VALUE_POINT = re.compile(r"^block\d+\.mix\.v(\.out)?$")  # V's alone, of every block
# the softmax kinds' numerators (exp, x^p), reciprocal and probabilities, of every block
SOFTMAX_POINT = re.compile(r"^block\d+\.mix\.attn\.(exp|pow|recip|probs)$")


class Granularity(str, Enum):
    PER_TENSOR = "per-tensor"
    PER_CHANNEL = "per-channel"  # one weight scale per output channel


class RangeMode(str, Enum):
    MINMAX = "minmax"  # calibrated min/max
    PERCENTILE = "percentile"  # clip the calibration outliers (``percentile``)


@dataclass(frozen=True)
class QuantConfig:
    r"""How a float model becomes an integer program.

    ``n_bits``: activations at every requantisation point; ``weight_bits`` (default ``n_bits``): the
    clear weights; ``input_bits`` (default ``n_bits``): the client's encrypted input.
    ``symmetric``: signed activations with zero-point 0; otherwise asymmetric (zero-points folded
    into biases, so the integer program itself never carries a zero-point). ``rounding_bits``:
    least-significant bits each table lookup rounds away before reading its table (concrete's
    ``round_bit_pattern``); 0 disables. ``lut_bits``: instead, round each lookup's input just enough
    that it reads at most this many bits (chosen per lookup from its calibrated range; TFHE's PBS
    cost grows steeply with this width). ``attention_bits`` (default ``n_bits``): the Q, K and V
    requantisations, which set the width of every attention lookup (|q − k|, (v − z)⁺, ...): the
    T²-sized part of the circuit. ``value_bits`` (default ``attention_bits``): V's requantisation
    alone. The Inhibitor's T²·d lookups (v − z)⁺ read V and Z, its |q − k| lookups Q and K, so a
    wider V widens only the former (candidates in benchmarks/results/text_widths.md).
    ``round_attention``: the attention's exact lookups (|q − k| and (v − z)⁺, whose inputs are one
    bit wider than Q/K/V) are rounded to ``lut_bits`` like every other lookup, dropping that bit
    instead of paying for a wider PBS. ``bits_overrides``:
    per-requantisation-point n_bits, keyed by point name prefix (e.g. ``{"block0.attn": 8}``).
    ``client_pooling``: the program outputs the head per token and the client sums them (mean
    pooling and the head are linear): a narrower encrypted output, on cheaper parameters.
    ``fold_last_residual`` (with ``client_pooling``): the last block's FFN residual goes straight
    into the head, W_h·h + (W_h W₂)·a, without its requantisation lookups.
    ``attention_lut_bits`` (with ``lut_bits``; Inhibitor kinds, whose Q/K/V feed lookups directly):
    the lookups that produce Q, K and V read at most this many bits instead (their output has only
    ``attention_bits``; Concrete puts lookups of one width on one parameter set, so reading 4 bits
    joins the attention's own 4-bit lookups on a smaller one, for one more small rounding PBS each).
    ``softmax_bits`` (default ``n_bits``; dot-product and PowerSoftmax): the numerators σ(s), the
    reciprocal of their row sum and the probabilities, the operands of the two encrypted products
    per score (σ(s)·(1/Σ) and a·V, each two lookups as wide as its operands): the IMDB
    dot-product model's circuit is estimated at 2,599 s and 11.3 GiB of keys with 6 bits, 267 s and
    2.01 GiB with 4, 207 s and 1.57 GiB with 3 (its TFHE recipe; docs/text.md).
    ``lut_bits_overrides`` (with ``lut_bits``): per-lookup widths, as ((pattern, bits), ...) or a
    dict; a lookup whose point name matches a pattern from its start (``re.match``; the first that
    matches wins) rounds its input to that width instead, e.g. ``{r"block\d+\.mix\.attn\.z$": 4}``
    for the Inhibitor's z. Concrete puts the lookups of one width on one parameter set, and each set
    brings its own bootstrap key and keyswitch keys to and from the others, so one lookup moved
    off a width can change the keys far more than its PBS (benchmarks/results/text_widths.md).
    ``step_lut_bits``: a lookup that reads more bits than this, and whose table is a monotone step
    function of at most three steps over its input's whole width (the Inhibitor's z at 3-bit V),
    runs as one comparison per step, each a lookup of at most this many bits, summed
    (:mod:`quant.steps`): the same integers, more but narrower PBS, and no parameter set of the
    wider width just for it (the next-word recipe's z: keys 2.06 → 1.83 GiB).
    ``inhibitor_positive_v`` (the unsigned Inhibitor): Eq. (6)'s ReLU reads V⁺, fused into V's own
    lookup, so its T²·d lookups read one bit less; Concrete then gives them cheaper parameters of
    their own: faster, but one more parameter set's keys (the IMDB recipe: measured 71.3 → 63.6 s
    per review, keys 995 → 1211 MiB; the digits recipe: estimated 16.2 → 14.4 s, keys 906 → 1137
    MiB, above its 1 GB target, so it is off by default and on in the IMDB TFHE recipe).
    """

    n_bits: int = 6
    weight_bits: int | None = None
    input_bits: int | None = None
    symmetric: bool = True
    weight_granularity: Granularity = Granularity.PER_TENSOR
    range_mode: RangeMode = RangeMode.MINMAX
    percentile: float = 99.99
    rounding_bits: int = 0
    lut_bits: int | None = None
    bits_overrides: tuple[tuple[str, int], ...] = ()
    attention_bits: int | None = None
    value_bits: int | None = None
    round_attention: bool = False
    client_pooling: bool = False
    fold_last_residual: bool = False
    attention_lut_bits: int | None = None
    inhibitor_positive_v: bool = False
    softmax_bits: int | None = None
    lut_bits_overrides: tuple[tuple[str, int], ...] = ()
    step_lut_bits: int | None = None

    def __post_init__(self) -> None:
        coerce_enums(self, weight_granularity=Granularity, range_mode=RangeMode)
        if isinstance(self.bits_overrides, dict):
            object.__setattr__(self, "bits_overrides", tuple(sorted(self.bits_overrides.items())))
        for name in ("bits_overrides", "lut_bits_overrides"):  # JSON: a dict or [[key, bits]]
            pairs = getattr(self, name)
            pairs = pairs.items() if isinstance(pairs, dict) else pairs  # a dict keeps its order
            object.__setattr__(self, name, tuple((str(k), int(b)) for k, b in pairs))
        for name in (
            "n_bits",
            "weight_bits",
            "input_bits",
            "attention_bits",
            "value_bits",
            "softmax_bits",
        ):
            v = getattr(self, name)
            if v is not None and not 2 <= v <= 16:
                raise ValueError(f"QuantConfig.{name} must be in [2, 16], got {v}")
        for name, v in (
            ("lut_bits", self.lut_bits),
            ("attention_lut_bits", self.attention_lut_bits),
            ("step_lut_bits", self.step_lut_bits),
            *((f"lut_bits_overrides[{p!r}]", b) for p, b in self.lut_bits_overrides),
        ):
            if v is not None and not 2 <= v <= 16:
                raise ValueError(f"{name} must be in [2, 16], got {v}")
        for pattern, _ in self.lut_bits_overrides:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(
                    f"lut_bits_overrides: {pattern!r} is not a regular expression ({e})"
                ) from None
        if self.lut_bits_overrides and self.lut_bits is None:
            raise ValueError("lut_bits_overrides needs lut_bits (lookups rounded to a width)")
        if self.rounding_bits < 0:
            raise ValueError(f"rounding_bits must be >= 0, got {self.rounding_bits}")
        if self.fold_last_residual and not self.client_pooling:
            raise ValueError("fold_last_residual needs client_pooling (per-token logits)")
        if not 50.0 < self.percentile <= 100.0:
            raise ValueError(f"percentile must be in (50, 100], got {self.percentile}")

    @property
    def w_bits(self) -> int:
        return self.weight_bits or self.n_bits

    @property
    def in_bits(self) -> int:
        return self.input_bits or self.n_bits

    def bits_for(self, point: str) -> int:
        for prefix, bits in self.bits_overrides:
            if point.startswith(prefix):
                return bits
        if self.softmax_bits is not None and SOFTMAX_POINT.match(point):
            return self.softmax_bits
        if self.value_bits is not None and VALUE_POINT.match(point):
            return self.value_bits
        if self.attention_bits is not None and ATTENTION_POINT.match(point):
            return self.attention_bits
        return self.n_bits

    def lut_bits_for(self, point: str, default: int | None = None) -> int | None:
        """The width a lookup at ``point`` rounds its input to: the first ``lut_bits_overrides``
        pattern that matches the point's start, else ``default`` (a caller's narrower width) or
        ``lut_bits``."""
        for pattern, bits in self.lut_bits_overrides:
            if re.match(pattern, point):
                return bits
        return default or self.lut_bits

    def replace(self, **changes) -> QuantConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain JSON-able values (model files record the configuration a model was trained for)."""
        out = dataclasses.asdict(self)
        out["weight_granularity"] = self.weight_granularity.value
        out["range_mode"] = self.range_mode.value
        out["bits_overrides"] = [list(kv) for kv in self.bits_overrides]
        out["lut_bits_overrides"] = [list(kv) for kv in self.lut_bits_overrides]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> QuantConfig:
        return dataclass_from_dict(cls, data)
