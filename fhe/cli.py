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
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("model.pt"), show_default=True)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Also write the training summary as JSON.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(task, attention, layers, d_model, heads, epochs, batch_size, lr, seed, norm, ffn_activation, seq_len,
          data_dir, limit, range_loss, output, json_path, quiet) -> None:
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
    save_checkpoint(output, result.model, data, train=train_config.__dict__, history=result.history)
    summary = {"task": task, "attention": attention, "metric": result.metric.value, "test": result.test_score,
               "n_test": len(data.x_test), "params": sum(p.numel() for p in result.model.parameters()),
               "output": str(output)}
    if json_path:
        json_path.write_text(json.dumps(summary, indent=2))
    shown = f"{100 * result.test_score:.2f}%" if result.metric.value == "accuracy" else f"{result.test_score:.5f}"
    click.echo(f"{task} / {attention}: test {result.metric.value} = {shown} on {len(data.x_test)} samples "
               f"({summary['params']} parameters) -> {output}")


@main.command()
@click.argument("model_path", type=click.Path(path_type=Path))
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
def evaluate(model_path, data_dir) -> None:
    """Reload MODEL_PATH and report its test score on its task."""
    from models.tasks import load_task
    from models.training import evaluate as run_eval
    from models.training import load_checkpoint

    try:
        ckpt = load_checkpoint(model_path)
    except (FileNotFoundError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    if not ckpt.task:
        raise click.UsageError(f"{model_path} records no task")
    data = load_task(ckpt.task["name"], data_dir=data_dir, seq_len=ckpt.model.config.seq_len)
    click.echo(f"{ckpt.task['name']}: test {data.metric.value} = {run_eval(ckpt.model, data):.4f}")


if __name__ == "__main__":  # pragma: no cover
    main()
