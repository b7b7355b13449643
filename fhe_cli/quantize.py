"""``fhe quantize`` and ``fhe evaluate``: a model file's integer program and its accuracy."""

from __future__ import annotations

from pathlib import Path

import click

from fhe.api.quantize import QuantizeOptions
from fhe_cli._common import config_from, library_errors, options_from, write_json


@click.command()
@click.argument("model_path", type=click.Path(path_type=Path))
@options_from(QuantizeOptions)
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@click.option(
    "--n", "n_test", type=int, default=None, help="Test samples to evaluate (default: all)."
)
@click.option(
    "--policy",
    type=click.Choice(["error", "clip"]),
    default="clip",
    show_default=True,
    help="Values outside the calibrated bit widths: stop with an error, or saturate and count.",
)
@click.option("--nodes", "show_nodes", is_flag=True, help="Print the per-node bit-width table.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
@library_errors
def quantize(model_path, data_dir, n_test, policy, show_nodes, json_path, **options) -> None:
    """Quantize MODEL_PATH to an integer program; report bit widths and float vs integer
    accuracy."""
    from fhe import api
    from quant.report import format_program

    quantization = config_from(QuantizeOptions, options)
    program, summary = api.quantize_file(model_path, quantization, data_dir, n_test, policy)
    if show_nodes:
        click.echo(format_program(program.graph))
    for key in (
        "n_bits",
        "max_bit_width",
        "max_lut_input_bits",
        "fits_tfhe",
        "pbs_estimate",
        "float_accuracy",
        "int_accuracy",
        "n_test",
        "clipped_values",
        "input_clipped",
    ):
        click.echo(f"{key:>20}: {summary[key]}")
    write_json(json_path, summary)


@click.command()
@click.argument("model_path", type=click.Path(path_type=Path))
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@library_errors
def evaluate(model_path, data_dir) -> None:
    """Reload MODEL_PATH and report its test score on its task."""
    from fhe import api
    from models.training import evaluate as run_eval

    ckpt, data = api.load_model_and_task(model_path, data_dir)
    click.echo(f"{data.name}: test {data.metric.value} = {run_eval(ckpt.model, data):.4f}")
