"""``fhe train``, ``fhe quantize`` and ``fhe evaluate`` as calls: training requests, model files."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fhe.api._common import coerce_enums, option_field
from fhe.api.recipes import Recipe
from fhe.errors import BadOptionError
from models.config import (
    INHIBITOR_KINDS,
    Activation,
    AttentionKind,
    InputKind,
    NormKind,
    Pooling,
    PowerForm,
)
from models.presets import PRESETS

if TYPE_CHECKING:
    from models.tasks.base import TaskData
    from models.text import TextEncoder
    from models.training import Checkpoint
    from models.transformer import Transformer

# ------------------------------------------------------------------------------------------
# training
DEFAULT_SEGMENTS = 16  # --words without --seq-len: the text bucket T


class QatMethod(str, Enum):
    """How ``fhe train --qat-bits`` fine-tunes a model for TFHE."""

    PROGRAM = "program"  # through the exported integer program itself (quant/program_qat.py)
    BREVITAS = "brevitas"  # quantized linear layers only (quant/qat.py)


@dataclass(frozen=True)
class TrainRequest:
    """``fhe train``'s options, declared once (the command's options are generated from these
    fields). None takes the task preset (``models/presets.py``). ``recipe`` (``tfhe``, ``ckks``)
    fills the fields left at their defaults with a named recipe (:mod:`fhe.api.recipes`)."""

    task: str = option_field(
        "digits",
        "Training task.",
        choices=tuple(PRESETS),
    )
    attention: AttentionKind = option_field(
        AttentionKind.INHIBITOR,
        "Attention kind (docs/models.md: papers, equations, cost under each scheme).",
    )
    attention_given: bool = option_field(
        True,
        cli=False,
    )  # False: a default; --init's kind wins
    recipe: Recipe | None = option_field(
        None,
        "A named recipe for the task (digits, imdb, imdb-lm): tfhe (small lookups; digits: the "
        "make demo model), ckks (shallow polynomials) or ckks-deep (digits: the PowerSoftmax "
        "paper's LayerNorm, GELU, 2 blocks; --engine auto bootstraps it); it sets every option "
        "you do not give (imdb under tfhe: wider bit widths past 1 block or 16 segments, or "
        "with --causal).",
    )
    layers: int | None = option_field(
        None,
        "Number of blocks (task preset if omitted).",
        min=1,
    )
    d_model: int | None = option_field(
        None,
        "Embedding width (task preset if omitted).",
        min=1,
    )
    heads: int | None = option_field(
        None,
        "Attention heads (task preset if omitted).",
        min=1,
    )
    d_ff: int | None = option_field(
        None,
        "FFN hidden width (default 2 x --d-model). Under TFHE each hidden unit costs one lookup"
        " per token.",
        min=1,
    )
    tie_qk: bool = option_field(
        False,
        "Inhibitor: K = Q (one projection; symmetric scores). Under TFHE: no K requantisation "
        "and |q_i - q_j| for the T(T-1)/2 pairs only, instead of T^2.",
        pair=True,
    )
    mask_padding: bool = option_field(
        True,
        "Token inputs (imdb): no attention reads a padding key, so a padded review gives the "
        "logits of the unpadded one (dot-product, Inhibitor kinds, PowerSoftmax).",
    )
    causal: bool = option_field(
        False,
        "Query i attends keys j <= i only (PowerSoftmax paper Eq. 11's mask; dot-product, "
        "Inhibitor kinds, PowerSoftmax). Always on for imdb-lm (next-word prediction).",
    )
    inhibitor_mean: bool = option_field(
        False,
        "Inhibitor: each query's sums over keys become means (times a public constant: 1/T, or "
        "~1/(i + 1) with --causal). The same function, trained to weights that quantize better. "
        "Under TFHE free without --causal, a clear product with it (a wider sum: more PBS after "
        "it); under CKKS folded into the output projection (no level).",
        pair=True,
    )
    segment_norm: bool = option_field(
        False,
        "Text: scale each client vector to unit RMS before its position is added (on the client, "
        "in the clear): with --words each segment's mean word vector, so that a one-sentence "
        "review reaches the program at the size of a long one (a TFHE program calibrated on long "
        "reviews otherwise refuses many short ones); without, each word's vector (padded word "
        "positions: one input scale fits every word).",
        pair=True,
    )
    epochs: int | None = option_field(
        None,
        "Training epochs (task preset if omitted).",
        min=1,
    )
    batch_size: int | None = option_field(
        None,
        "Batch size (task preset if omitted).",
    )
    lr: float | None = option_field(
        None,
        "Learning rate (task preset if omitted).",
    )
    seed: int = option_field(
        0,
        "Random seed (weights, data order).",
    )
    norm: NormKind = option_field(
        NormKind.BATCHNORM,
        "batchnorm folds into the linear layers at export (free under TFHE and CKKS); layernorm"
        " needs an encrypted 1/sqrt (CKKS only, with depth); none.",
    )
    ffn_activation: Activation = option_field(
        Activation.RELU,
        "FFN activation; quad (0.125x^2 + 0.25x + 0.5) is exact under CKKS at depth 1.",
    )
    seq_len: int | None = option_field(
        None,
        "Sequence length: positions attention sees (adding: 100; imdb: 128 words, or 16 "
        "segments with --words).",
        min=1,
    )
    words: int | None = option_field(
        None,
        "imdb: read this many words and mean-pool them into --seq-len segments (the client's "
        "front end under encryption: every position is real text, no padding mask; "
        "docs/text.md).",
        min=1,
    )
    data_dir: Path | None = option_field(
        None,
        "Folder of the task's data files (mnist, imdb); default ../shared/data/<task>.",
    )
    limit: int | None = option_field(
        None,
        "Use only the first N training samples.",
    )
    patch: int | None = option_field(
        None,
        "Image tasks: tokens of PATCH x PATCH pixels instead of rows (digits --patch 4: 4 "
        "tokens of 16 pixels; attention's encrypted cost grows with the square of the token "
        "count).",
        min=1,
    )
    range_loss: float = option_field(
        0.0,
        "Weight of the attention range loss (PowerSoftmax Eq. 9: max |score|; PowerSoftmax and "
        "dot-product, whose exp is a polynomial on that interval under CKKS).",
    )
    act_range_loss: float = option_field(
        0.0,
        "Weight of the activation range loss (max |FFN activation input|; narrows CKKS "
        "polynomial fits).",
    )
    range_threshold: float = option_field(
        0.0,
        "Hinge for the range losses: penalise max |attention score| only beyond this (0: Eq. 9).",
    )
    act_range_threshold: float = option_field(
        0.0,
        "Hinge for the activation range loss.",
    )
    norm_range_loss: float = option_field(
        0.0,
        "Weight of the LayerNorm range loss (the spread of its input variances beyond "
        "--norm-range-ratio; a cheaper CKKS 1/sqrt, a cubic or fewer Newton steps, hence fewer "
        "bootstraps).",
    )
    norm_range_ratio: float = option_field(
        3.0,
        "LayerNorm range loss: the max/min ratio of input variances it allows.",
    )
    init_path: Path | None = option_field(
        None,
        "Start from this model.pt (e.g. range-minimisation fine-tuning, PowerSoftmax Alg. 1 "
        "step 2); its architecture is kept, except --power-form.",
        option="--init",
    )
    power_eps: float | None = option_field(
        None,
        "PowerSoftmax ε (Eq. 5; default 1e-3, or --init's); in the length-agnostic form it "
        "bounds the CKKS division interval below.",
    )
    power_p: int | None = option_field(
        None,
        "PowerSoftmax power p, a positive even integer (Eq. 4; default 4): under CKKS x^p costs"
        " log2(p) levels.",
    )
    power_form: PowerForm | None = option_field(
        None,
        "PowerSoftmax training form (default stable, or --init's): stable (Eqs. 5-6) or the "
        "polynomial model's length-agnostic form with ε (Eq. 7), whose division interval ε "
        "bounds from below.",
    )
    qat_bits: int | None = option_field(
        None,
        "After float training, fine-tune through the TFHE integer program itself (activations "
        "at N bits; the other widths from the TFHE defaults or the options below): its integer "
        "program then reproduces the QAT model exactly. The model file records the "
        "configuration for `fhe compile`.",
    )
    qat_epochs: int | None = option_field(
        None,
        "QAT fine-tuning epochs (default: --epochs).",
        min=1,
    )
    qat_method: QatMethod = option_field(
        QatMethod.PROGRAM,
        "program: through the exported integer program; brevitas: quantized linear layers only.",
    )
    qat_attention_bits: int | None = option_field(
        None,
        "QAT: Q/K/V bits (TFHE default 3).",
    )
    qat_lut_bits: int | None = option_field(
        None,
        "QAT: lookup input bits (TFHE default 5).",
    )
    qat_lr: float = option_field(
        0.002,
        "QAT learning rate.",
    )
    qat_quant: dict = field(
        default_factory=dict,
        metadata=dict(
            help='QAT: QuantConfig fields over the TFHE defaults as JSON, e.g. \'{"weight_bits": 6,'
            ' "round_attention": true}\' (the --qat-* options win; 0 turns lut_bits or '
            "attention_lut_bits off). The model file records the result.",
            json=True,
        ),
    )

    def __post_init__(self) -> None:
        coerce_enums(
            self,
            attention=AttentionKind,
            recipe=Recipe,
            norm=NormKind,
            ffn_activation=Activation,
            power_form=PowerForm,
            qat_method=QatMethod,
        )


@dataclass
class TrainOutcome:
    model: Transformer
    data: TaskData
    attention: str
    test_score: float  # the integer program's with program QAT, else the float model's
    float_score: float  # before any QAT
    extra: dict = field(default_factory=dict)  # what the model file records besides the weights

    @property
    def metric(self) -> str:
        return self.data.metric.value

    @property
    def integer_program(self) -> bool:
        return "quant" in self.extra

    def save(self, path: str | Path) -> None:
        from models.training import save_checkpoint

        save_checkpoint(path, self.model, self.data, **self.extra)

    def summary(self, output: str | Path) -> dict:
        return {
            "task": self.data.name,
            "attention": self.attention,
            "metric": self.metric,
            "test": self.test_score,
            "n_test": len(self.data.x_test),
            "params": sum(p.numel() for p in self.model.parameters()),
            "output": str(output),
        }


def with_recipe(req: TrainRequest, given: frozenset[str] | None = None) -> TrainRequest:
    """``req`` with its recipe's options, except in the fields ``given`` names (the command line
    knows which options were typed); without ``given``, the fields that differ from their
    defaults keep their values. A model with more blocks or segments than the recipe was tuned on,
    or a causal one, or one that reads padded word positions instead of the recipe's segments,
    gets the recipe's options for that shape where it has them
    (:data:`fhe.api.recipes.BEYOND_SHAPE`: the text recipe's wider bit widths, as its sweep found
    best there), and a model of another attention kind the recipe's options for other kinds
    (:data:`fhe.api.recipes.OTHER_KINDS`, before the shape's). Options that do not apply to the
    model are dropped: the Inhibitor's means for another kind (and its K = Q), the norm range loss
    without LayerNorm. A kind takes the recipe's widths for it
    (:data:`fhe.api.recipes.KIND_WIDTHS`) unless ``qat_quant`` was given."""
    if req.recipe is None:
        return req
    from fhe.api.recipes import BEYOND_SHAPE, KIND_WIDTHS, OTHER_KINDS, recipe_for

    defaults = TrainRequest()
    recipe = recipe_for(req.task, req.recipe)
    if given is None:
        given = frozenset(k for k in recipe if getattr(req, k) != getattr(defaults, k))
    options = {k: v for k, v in recipe.items() if k not in given}
    out = dataclasses.replace(req, **options, recipe=None)
    if out.attention not in INHIBITOR_KINDS:  # the Inhibitor's options: --attention won
        dropped: dict[str, Any] = {
            o: False for o in ("inhibitor_mean", "tie_qk") if getattr(out, o) and o not in given
        }
        other = OTHER_KINDS.get((req.task, Recipe(req.recipe)), {})  # before the shape's options
        dropped |= {k: v for k, v in other.items() if k not in given}
        out = dataclasses.replace(out, **dropped)
    beyond = BEYOND_SHAPE.get((req.task, Recipe(req.recipe)))
    if beyond is not None:
        preset_layers = PRESETS[req.task].n_layers
        deeper = (out.layers or preset_layers) > recipe.get("layers", preset_layers)
        causal = out.causal and not recipe.get("causal", False)
        longer = out.seq_len is not None and out.seq_len > recipe.get("seq_len", out.seq_len)
        padded = out.words is None and recipe.get("words") is not None  # word positions
        for wider, extra in (
            (causal, beyond.causal),
            (deeper, beyond.blocks),
            (longer, beyond.segments),
            (padded, beyond.padded),
        ):
            if wider:
                extra = {k: v for k, v in extra.items() if k not in given}
                out = dataclasses.replace(out, **extra)
    if (
        out.norm_range_loss
        and "norm_range_loss" not in given
        and out.norm is not NormKind.LAYERNORM
    ):
        out = dataclasses.replace(out, norm_range_loss=0.0)  # no LayerNorm: --norm won
    widths = KIND_WIDTHS.get((req.task, Recipe(req.recipe)), {}).get(out.attention)
    typed = "qat_quant" in given or req.qat_quant != defaults.qat_quant
    if widths and not typed:
        out = dataclasses.replace(out, qat_quant={**out.qat_quant, **widths})
    return out


def train_model(req: TrainRequest, progress: bool = True) -> TrainOutcome:
    """Train (or fine-tune ``req.init_path``) on ``req.task``, then QAT when ``req.qat_bits`` is
    set."""
    from models.training import TrainConfig
    from models.training import train as run_training

    req = with_recipe(req)

    if req.qat_quant and (req.qat_bits is None or req.qat_method != "program"):
        raise BadOptionError(
            "--qat-quant configures program QAT: give --qat-bits (with --qat-method program)"
        )
    quant = _qat_quant(req) if req.qat_bits is not None and req.qat_method == "program" else None
    data, model_config, train_config, init_model = _training_setup(req)
    result = run_training(model_config, data, train_config, progress=progress, model=init_model)
    outcome = TrainOutcome(
        result.model,
        data,
        model_config.attention.value,
        result.test_score,
        result.test_score,
        {"train": train_config.__dict__, "history": result.history},
    )
    if req.qat_bits is None:
        return outcome
    qat_config = TrainConfig(
        epochs=req.qat_epochs or train_config.epochs,
        batch_size=train_config.batch_size,
        lr=req.qat_lr,
        seed=req.seed,
    )
    outcome.extra.update(
        qat_bits=req.qat_bits, qat_method=req.qat_method, float_test=result.test_score
    )
    if req.qat_method == "brevitas":
        from quant.qat import prepare_qat, strip_qat

        try:
            qat_model = prepare_qat(result.model, req.qat_bits)
        except ValueError as exc:
            raise BadOptionError(str(exc)) from exc
        qat = run_training(model_config, data, qat_config, progress=progress, model=qat_model)
        outcome.model, outcome.test_score = strip_qat(qat.model), qat.test_score
        outcome.extra["qat_history"] = qat.history
        return outcome
    from quant.program_qat import train_program

    assert quant is not None  # program QAT (checked above)
    if model_config.input_kind is InputKind.TOKENS:  # the program starts at the client's vectors
        from models.text import embedded_task, join_text_model, split_text_model

        try:
            text, inner = split_text_model(
                result.model, data.meta["vocab"], data.meta.get("labels")
            )
        except ValueError as exc:
            raise BadOptionError(f"--qat-bits: {exc}") from exc
        program = train_program(
            inner, embedded_task(data, text), quant, qat_config, progress=progress
        )
        program.model = join_text_model(result.model, program.model)
    else:
        program = train_program(result.model, data, quant, qat_config, progress=progress)
    outcome.model, outcome.test_score = program.model, program.program_score
    outcome.extra.update(quant=quant.to_dict(), qat_history=program.history)
    return outcome


def _qat_quant(req: TrainRequest):
    """The quantization program QAT trains for: the TFHE defaults, ``req.qat_quant`` over them,
    then the named ``--qat-*`` options."""
    from fhe.tfhe.recipe import resolve_quant
    from quant import QuantConfig

    known = set(QuantConfig.__dataclass_fields__)
    unknown = sorted(set(req.qat_quant) - known)
    if unknown:
        raise BadOptionError(
            f"--qat-quant: unknown field(s) {unknown}; QuantConfig has {sorted(known)}"
        )
    named = dict(
        n_bits=req.qat_bits, attention_bits=req.qat_attention_bits, lut_bits=req.qat_lut_bits
    )
    overrides = {**req.qat_quant, **{k: v for k, v in named.items() if v is not None}}
    try:
        return resolve_quant(None, **overrides)
    except (TypeError, ValueError) as exc:
        raise BadOptionError(f"--qat-quant: {exc}") from exc


def _training_setup(req: TrainRequest):
    """(task data, model config, train config, model to fine-tune or None) for ``req``."""
    from models.presets import PRESETS
    from models.tasks import DataFileError, load_task
    from models.training import TrainConfig, config_for_task

    preset = PRESETS[req.task]
    try:
        data = load_task(
            req.task,
            data_dir=req.data_dir,
            seq_len=req.words or req.seq_len,
            limit=req.limit,
            patch=req.patch,
        )
    except (DataFileError, ValueError) as exc:
        raise BadOptionError(str(exc)) from exc
    power = {
        k: v
        for k, v in (
            ("power_form", req.power_form),
            ("power_eps", req.power_eps),
            ("power_p", req.power_p),
        )
        if v is not None
    }
    text = {}
    if req.words is not None:
        if data.input_kind is not InputKind.TOKENS:
            raise BadOptionError(f"--words applies to token tasks (imdb), not {req.task}")
        text = dict(words=req.words, seq_len=req.seq_len or DEFAULT_SEGMENTS)
    try:
        model_config = config_for_task(
            data,
            **text,
            attention=req.attention,
            d_model=req.d_model or preset.d_model,
            n_heads=req.heads or preset.n_heads,
            d_ff=req.d_ff,
            tie_qk=req.tie_qk,
            mask_padding=req.mask_padding,
            causal=req.causal or data.pooling is Pooling.LAST,  # next-word: reads left to right
            inhibitor_mean=req.inhibitor_mean,
            segment_norm=req.segment_norm,
            n_layers=req.layers or preset.n_layers,
            norm=req.norm,
            ffn_activation=req.ffn_activation,
            **power,
        )
        train_config = TrainConfig(
            epochs=preset.epochs if req.epochs is None else req.epochs,
            batch_size=req.batch_size or preset.batch_size,
            lr=req.lr or preset.lr,
            seed=req.seed,
            range_loss_weight=req.range_loss,
            act_range_loss_weight=req.act_range_loss,
            range_threshold=req.range_threshold,
            act_range_threshold=req.act_range_threshold,
            norm_range_loss_weight=req.norm_range_loss,
            norm_range_ratio=req.norm_range_ratio,
        )
    except ValueError as exc:
        raise BadOptionError(str(exc)) from exc
    if req.norm_range_loss and model_config.norm is not NormKind.LAYERNORM:
        raise BadOptionError(
            "--norm-range-loss acts on LayerNorm inputs; this model has none "
            f"(--norm {model_config.norm.value}): use --norm layernorm or leave the option out"
        )
    if req.init_path is None:
        return data, model_config, train_config, None
    from models.training import load_checkpoint
    from models.transformer import Transformer

    try:
        base = load_checkpoint(req.init_path).model
    except (FileNotFoundError, ValueError) as exc:
        raise BadOptionError(str(exc)) from exc
    kind = base.config.attention.value
    if req.attention_given and req.attention != kind:
        raise BadOptionError(
            f"--init {req.init_path} is a {kind} model; fine-tuning keeps its architecture, so "
            f"--attention {req.attention.value} cannot apply (train from scratch)"
        )
    model_config = base.config.replace(**power)
    init_model = Transformer(model_config)
    init_model.load_state_dict(base.state_dict())
    return data, model_config, train_config, init_model


# ---------------------------------------------------------------------------------------- model
# files
def load_model_and_task(
    model_path: str | Path, data_dir: str | Path | None = None
) -> tuple[Checkpoint, TaskData]:
    """(checkpoint, task data) for a saved model; :class:`BadOptionError` for a bad file or missing
    data."""
    from models.tasks import DataFileError, load_task_of
    from models.training import load_checkpoint

    try:
        ckpt = load_checkpoint(model_path)
    except (FileNotFoundError, ValueError) as exc:
        raise BadOptionError(str(exc)) from exc
    if not ckpt.task:
        raise BadOptionError(f"{model_path} records no task")
    try:
        cfg = ckpt.model.config
        data = load_task_of(ckpt.task, data_dir=data_dir, seq_len=cfg.words or cfg.seq_len)
    except DataFileError as exc:
        raise BadOptionError(str(exc)) from exc
    return ckpt, data


@dataclass(frozen=True)
class EncryptionInputs:
    """What an encrypted program of a model file is built from: the checkpoint whose model the
    program computes, the task data in the form the client encrypts, and the client's text front
    end (None for feature inputs). A token model is split (:func:`models.text.split_text_model`):
    the client embeds its words, the program starts at the embedded vectors."""

    checkpoint: Checkpoint
    data: TaskData
    text: TextEncoder | None = None


def load_for_encryption(
    model_path: str | Path, data_dir: str | Path | None = None
) -> EncryptionInputs:
    """The model file and its task as an encrypted program sees them (:class:`EncryptionInputs`);
    :class:`BadOptionError` for a token model that cannot be split yet (padding masks, causal)."""
    ckpt, data = load_model_and_task(model_path, data_dir)
    if ckpt.model.config.input_kind is not InputKind.TOKENS:
        return EncryptionInputs(ckpt, data)
    from models.text import NoEncryptedTextError, embedded_task, split_text_model

    try:
        meta = (ckpt.task or {}).get("meta") or {}  # a task is recorded (load_model_and_task)
        text, model = split_text_model(ckpt.model, meta["vocab"], meta.get("labels"))
    except (NoEncryptedTextError, KeyError) as exc:
        raise BadOptionError(f"{model_path}: {exc}") from exc
    return EncryptionInputs(dataclasses.replace(ckpt, model=model), embedded_task(data, text), text)
