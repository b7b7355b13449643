"""``fhe train``, ``fhe quantize`` and ``fhe evaluate`` as calls: training requests, model files."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from fhe.errors import BadOptionError, FheError


# ------------------------------------------------------------------------------------------
# training
@dataclass(frozen=True)
class TrainRequest:
    """``fhe train``'s options; None takes the task preset (``models/presets.py``). ``recipe``
    (``tfhe``, ``ckks``) fills the fields left at their defaults with a named recipe
    (:mod:`fhe.api.recipes`)."""

    task: str = "digits"
    recipe: str | None = None
    attention: str = "inhibitor"
    attention_given: bool = True  # False: ``attention`` is a default, and ``init_path``'s kind wins
    layers: int | None = None
    d_model: int | None = None
    heads: int | None = None
    d_ff: int | None = None
    tie_qk: bool = False  # Inhibitor: K = Q
    mask_padding: bool = True  # token inputs: attention never reads a padding key
    causal: bool = False  # query i attends keys j <= i only
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    seed: int = 0
    norm: str = "batchnorm"
    ffn_activation: str = "relu"
    seq_len: int | None = None
    data_dir: Path | None = None
    limit: int | None = None
    patch: int | None = None
    range_loss: float = 0.0
    act_range_loss: float = 0.0
    range_threshold: float = 0.0
    act_range_threshold: float = 0.0
    init_path: Path | None = None  # fine-tune this model file instead of training from scratch
    power_eps: float | None = None
    power_form: str | None = None
    power_p: int | None = None
    qat_bits: int | None = None  # fine-tune through the integer program (or brevitas) at these bits
    qat_epochs: int | None = None
    qat_method: str = "program"
    qat_attention_bits: int | None = None
    qat_lut_bits: int | None = None
    qat_lr: float = 2e-3
    # QuantConfig fields over the TFHE defaults (the qat_* options win); 0 turns a lut width off
    qat_quant: dict = field(default_factory=dict)


@dataclass
class TrainOutcome:
    model: object  # models.transformer.Transformer
    data: object  # models.tasks.TaskData
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
    defaults keep their values."""
    if req.recipe is None:
        return req
    from fhe.api.recipes import recipe_for

    defaults = TrainRequest()
    recipe = recipe_for(req.task, req.recipe)
    if given is None:
        given = frozenset(k for k in recipe if getattr(req, k) != getattr(defaults, k))
    options = {k: v for k, v in recipe.items() if k not in given}
    return dataclasses.replace(req, **options, recipe=None)


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

    qat = train_program(result.model, data, quant, qat_config, progress=progress)
    outcome.model, outcome.test_score = qat.model, qat.program_score
    outcome.extra.update(quant=quant.to_dict(), qat_history=qat.history)
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
            req.task, data_dir=req.data_dir, seq_len=req.seq_len, limit=req.limit, patch=req.patch
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
    try:
        model_config = config_for_task(
            data,
            attention=req.attention,
            d_model=req.d_model or preset.d_model,
            n_heads=req.heads or preset.n_heads,
            d_ff=req.d_ff,
            tie_qk=req.tie_qk,
            mask_padding=req.mask_padding,
            causal=req.causal,
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
        )
    except ValueError as exc:
        raise BadOptionError(str(exc)) from exc
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
            f"--attention {req.attention} cannot apply (train from scratch)"
        )
    model_config = base.config.replace(**power)
    init_model = Transformer(model_config)
    init_model.load_state_dict(base.state_dict())
    return data, model_config, train_config, init_model


# ---------------------------------------------------------------------------------------- model
# files
def load_model_and_task(model_path: str | Path, data_dir: str | Path | None = None):
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
        data = load_task_of(ckpt.task, data_dir=data_dir, seq_len=ckpt.model.config.seq_len)
    except DataFileError as exc:
        raise BadOptionError(str(exc)) from exc
    return ckpt, data


def quantize_file(
    model_path: str | Path,
    config,
    n_calib: int = 500,
    data_dir: str | Path | None = None,
    n_test: int | None = None,
    policy: str = "clip",
):
    """``fhe quantize``: the model's integer program under ``config`` (a
    :class:`~quant.QuantConfig`), with its bit widths and float vs integer accuracy on the first
    ``n_test`` test samples. Returns (program, summary)."""
    from models.training import predict
    from quant import ExportError, OverflowPolicy, RangeOverflowError, export
    from quant.report import accuracy, program_summary

    ckpt, data = load_model_and_task(model_path, data_dir)
    try:
        program = export(ckpt.model, data.x_train[:n_calib], config)
    except ExportError as exc:
        raise FheError(str(exc)) from exc
    x, y = data.x_test[:n_test], data.y_test[:n_test].numpy()
    try:
        out_int, clipped = program.run_int(program.quantize_input(x), OverflowPolicy(policy))
    except RangeOverflowError as exc:
        raise FheError(str(exc)) from exc
    summary = program_summary(program.graph)
    summary.update(
        n_bits=config.n_bits,
        float_accuracy=accuracy(predict(ckpt.model, x).numpy(), y),
        int_accuracy=accuracy(program.dequantize_output(out_int), y),
        n_test=len(y),
        clipped_values=sum(clipped.values()),
        input_clipped=program.input_clip_count(x),
    )
    return program, summary
