"""The ``fhe`` command line: train, and (as backends land) compile, run, compare and report."""

from __future__ import annotations

import json
from pathlib import Path

import click

from models.config import Activation, AttentionKind, NormKind

KINDS = [k.value for k in AttentionKind]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """fhe-attention: private inference for small transformers, and what it costs."""


@main.command()
@click.option("--task", type=click.Choice(["adding", "digits", "mnist", "imdb"]), default="digits",
              show_default=True, help="Training task.")
@click.option("--attention", "attention", type=click.Choice(KINDS), default="inhibitor", show_default=True)
@click.option("--layers", type=int, default=None, help="Number of blocks (task preset if omitted).")
@click.option("--d-model", type=int, default=None, help="Embedding width (task preset if omitted).")
@click.option("--heads", type=int, default=None, help="Attention heads (task preset if omitted).")
@click.option("--epochs", type=int, default=None, help="Training epochs (task preset if omitted).")
@click.option("--batch-size", type=int, default=None)
@click.option("--lr", type=float, default=None)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--norm", type=click.Choice([n.value for n in NormKind]), default="layernorm", show_default=True)
@click.option("--ffn-activation", type=click.Choice([a.value for a in Activation]), default="relu",
              show_default=True)
@click.option("--seq-len", type=int, default=None, help="Sequence length (adding: 100, imdb: 128).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Folder of the task's data files (mnist, imdb); default ../shared/data/<task>.")
@click.option("--limit", type=int, default=None, help="Use only the first N training samples.")
@click.option("--range-loss", "range_loss", type=float, default=0.0, show_default=True,
              help="Weight of the PowerSoftmax range loss (Eq. 9).")
@click.option("--qat-bits", type=int, default=None,
              help="After float training, fine-tune with brevitas quantization-aware training at N bits.")
@click.option("--qat-epochs", type=int, default=None, help="QAT fine-tuning epochs (default: half of --epochs).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("model.pt"), show_default=True)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Also write the training summary as JSON.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(task, attention, layers, d_model, heads, epochs, batch_size, lr, seed, norm, ffn_activation, seq_len,
          data_dir, limit, range_loss, qat_bits, qat_epochs, output, json_path, quiet) -> None:
    """Train a model on a task and save config + weights to OUTPUT."""
    import torch

    from models.presets import PRESETS
    from models.tasks import DataFileError, load_task
    from models.training import TrainConfig, config_for_task, save_checkpoint
    from models.training import train as run_training

    torch.set_num_threads(max(1, torch.get_num_threads()))
    preset = PRESETS[task]
    try:
        data = load_task(task, data_dir=data_dir, seq_len=seq_len, limit=limit)
    except DataFileError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        model_config = config_for_task(
            data, attention=attention, d_model=d_model or preset.d_model, n_heads=heads or preset.n_heads,
            n_layers=layers or preset.n_layers, norm=norm, ffn_activation=ffn_activation)
        train_config = TrainConfig(epochs=preset.epochs if epochs is None else epochs,
                                   batch_size=batch_size or preset.batch_size, lr=lr or preset.lr, seed=seed,
                                   range_loss_weight=range_loss)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    result = run_training(model_config, data, train_config, progress=not quiet)
    extra = {"train": train_config.__dict__, "history": result.history}
    if qat_bits is not None:
        from quant.qat import prepare_qat, strip_qat

        float_score = result.test_score
        try:
            qat_model = prepare_qat(result.model, qat_bits)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
        qat_config = TrainConfig(epochs=qat_epochs or max(1, train_config.epochs // 2),
                                 batch_size=train_config.batch_size,
                                 lr=train_config.lr / 3, seed=seed)
        result = run_training(model_config, data, qat_config, progress=not quiet, model=qat_model)
        result.model = strip_qat(result.model)
        extra.update(qat_bits=qat_bits, float_test=float_score, qat_history=result.history)
        click.echo(f"float test {result.metric.value} before QAT: {float_score:.4f}")
    save_checkpoint(output, result.model, data, **extra)
    summary = {"task": task, "attention": attention, "metric": result.metric.value, "test": result.test_score,
               "n_test": len(data.x_test), "params": sum(p.numel() for p in result.model.parameters()),
               "output": str(output)}
    if json_path:
        json_path.write_text(json.dumps(summary, indent=2))
    shown = f"{100 * result.test_score:.2f}%" if result.metric.value == "accuracy" else f"{result.test_score:.5f}"
    click.echo(f"{task} / {attention}: test {result.metric.value} = {shown} on {len(data.x_test)} samples "
               f"({summary['params']} parameters) -> {output}")


def load_model_and_task(model_path: Path, data_dir: Path | None):
    """(checkpoint, task data) for a saved model, with click errors for bad files."""
    from models.tasks import DataFileError, load_task
    from models.training import load_checkpoint

    try:
        ckpt = load_checkpoint(model_path)
    except (FileNotFoundError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    if not ckpt.task:
        raise click.UsageError(f"{model_path} records no task")
    try:
        data = load_task(ckpt.task["name"], data_dir=data_dir, seq_len=ckpt.model.config.seq_len)
    except DataFileError as exc:
        raise click.UsageError(str(exc)) from exc
    return ckpt, data


def quant_options(fn):
    """--n-bits and friends, shared by quantize and compile."""
    opts = [
        click.option("--n-bits", type=int, default=6, show_default=True, help="Activation bits."),
        click.option("--weight-bits", type=int, default=None, help="Weight bits (default: --n-bits)."),
        click.option("--input-bits", type=int, default=None, help="Input bits (default: --n-bits)."),
        click.option("--rounding-bits", type=int, default=0, show_default=True,
                     help="LSBs each table lookup rounds away first (concrete round_bit_pattern)."),
        click.option("--per-channel", is_flag=True, help="Per-output-channel weight scales."),
        click.option("--asymmetric", is_flag=True, help="Asymmetric (zero-point) activation quantizers."),
        click.option("--calib", "n_calib", type=int, default=500, show_default=True,
                     help="Calibration samples (from the training split)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def make_quant_config(n_bits, weight_bits, input_bits, rounding_bits, per_channel, asymmetric):
    from quant import QuantConfig

    try:
        return QuantConfig(n_bits=n_bits, weight_bits=weight_bits, input_bits=input_bits,
                           rounding_bits=rounding_bits, symmetric=not asymmetric,
                           weight_granularity="per-channel" if per_channel else "per-tensor")
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


@main.command()
@click.argument("model_path", type=click.Path(path_type=Path))
@quant_options
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@click.option("--n", "n_test", type=int, default=None, help="Test samples to evaluate (default: all).")
@click.option("--policy", type=click.Choice(["error", "clip"]), default="clip", show_default=True,
              help="Values outside the calibrated bit widths: stop with an error, or saturate and count.")
@click.option("--nodes", "show_nodes", is_flag=True, help="Print the per-node bit-width table.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
def quantize(model_path, n_bits, weight_bits, input_bits, rounding_bits, per_channel, asymmetric, n_calib, data_dir,
             n_test, policy, show_nodes, json_path) -> None:
    """Quantize MODEL_PATH to an integer program; report bit widths and float vs integer accuracy."""
    from models.training import predict
    from quant import ExportError, OverflowPolicy, RangeOverflowError, export
    from quant.report import accuracy, format_program, program_summary

    ckpt, data = load_model_and_task(model_path, data_dir)
    qconfig = make_quant_config(n_bits, weight_bits, input_bits, rounding_bits, per_channel, asymmetric)
    try:
        program = export(ckpt.model, data.x_train[:n_calib], qconfig)
    except ExportError as exc:
        raise click.ClickException(str(exc)) from exc
    x, y = data.x_test[:n_test], data.y_test[:n_test].numpy()
    try:
        out_int, clipped = program.run_int(program.quantize_input(x), OverflowPolicy(policy))
    except RangeOverflowError as exc:
        raise click.ClickException(str(exc)) from exc
    summary = program_summary(program.graph)
    summary.update(n_bits=n_bits, float_accuracy=accuracy(predict(ckpt.model, x).numpy(), y),
                   int_accuracy=accuracy(program.dequantize_output(out_int), y), n_test=len(y),
                   clipped_values=sum(clipped.values()), input_clipped=program.input_clip_count(x))
    if show_nodes:
        click.echo(format_program(program.graph))
    for key in ("n_bits", "max_bit_width", "max_lut_input_bits", "fits_tfhe", "pbs_estimate", "float_accuracy",
                "int_accuracy", "n_test", "clipped_values", "input_clipped"):
        click.echo(f"{key:>20}: {summary[key]}")
    if json_path:
        json_path.write_text(json.dumps(summary, indent=2))


@main.command()
@click.argument("model_path", type=click.Path(path_type=Path))
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
def evaluate(model_path, data_dir) -> None:
    """Reload MODEL_PATH and report its test score on its task."""
    from models.training import evaluate as run_eval

    ckpt, data = load_model_and_task(model_path, data_dir)
    click.echo(f"{ckpt.task['name']}: test {data.metric.value} = {run_eval(ckpt.model, data):.4f}")


if __name__ == "__main__":  # pragma: no cover
    main()
