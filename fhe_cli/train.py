"""``fhe train``: train a model on a task (float, then optionally QAT through its integer
program) and save it."""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from fhe.api.train import TrainRequest
from fhe_cli._common import library_errors, options_from, write_json


@click.command()
@options_from(TrainRequest)
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), default=Path("model.pt"), show_default=True
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the training summary as JSON.",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@library_errors
def train(output, json_path, quiet, **options) -> None:
    """Train a model on a task and save config + weights to OUTPUT."""
    import torch

    from fhe import api

    torch.set_num_threads(max(1, torch.get_num_threads()))
    ctx = click.get_current_context()
    typed = frozenset(
        name for name in options if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
    )
    req = api.with_recipe(
        api.TrainRequest(**options, attention_given="attention" in typed), given=typed
    )
    outcome = api.train_model(req, progress=not quiet)
    outcome.save(output)
    metric = outcome.metric
    if outcome.integer_program:
        click.echo(
            f"integer program (the QAT model's forward) test {metric}: {outcome.test_score:.4f}"
        )
    if req.qat_bits is not None:
        click.echo(f"float test {metric} before QAT: {outcome.float_score:.4f}")
    summary = outcome.summary(output)
    write_json(json_path, summary)
    shown = (
        f"{100 * outcome.test_score:.2f}%" if metric == "accuracy" else f"{outcome.test_score:.5f}"
    )
    if outcome.integer_program:
        shown += " (integer program)"
    click.echo(
        f"{req.task} / {outcome.attention}: test {metric} = {shown} on {summary['n_test']} samples "
        f"({summary['params']} parameters) -> {output}"
    )
