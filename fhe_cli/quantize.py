"""``fhe quantize`` and ``fhe evaluate``: a model file's integer program and its accuracy."""

from __future__ import annotations

from pathlib import Path

import click

from fhe_cli._common import library_errors, write_json


def quant_options(fn):
    """--n-bits and friends, shared by quantize and compile."""
    opts = [
        click.option("--n-bits", type=int, default=6, show_default=True, help="Activation bits."),
        click.option(
            "--weight-bits", type=int, default=None, help="Weight bits (default: --n-bits)."
        ),
        click.option(
            "--input-bits", type=int, default=None, help="Input bits (default: --n-bits)."
        ),
        click.option(
            "--rounding-bits",
            type=int,
            default=0,
            show_default=True,
            help="LSBs each table lookup rounds away first (concrete round_bit_pattern).",
        ),
        click.option("--per-channel", is_flag=True, help="Per-output-channel weight scales."),
        click.option(
            "--asymmetric", is_flag=True, help="Asymmetric (zero-point) activation quantizers."
        ),
        click.option(
            "--range-mode",
            type=click.Choice(["minmax", "percentile"]),
            default="minmax",
            show_default=True,
            help="Calibration ranges: min/max, or the 99.99th percentile (clips outliers; better "
            "at 4 bits).",
        ),
        click.option(
            "--calib",
            "n_calib",
            type=int,
            default=500,
            show_default=True,
            help="Calibration samples (from the training split).",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def make_quant_config(
    n_bits, weight_bits, input_bits, rounding_bits, per_channel, asymmetric, range_mode="minmax"
):
    from quant import QuantConfig

    try:
        return QuantConfig(
            n_bits=n_bits,
            weight_bits=weight_bits,
            input_bits=input_bits,
            rounding_bits=rounding_bits,
            symmetric=not asymmetric,
            weight_granularity="per-channel" if per_channel else "per-tensor",
            range_mode=range_mode,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


@click.command()
@click.argument("model_path", type=click.Path(path_type=Path))
@quant_options
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
def quantize(
    model_path,
    n_bits,
    weight_bits,
    input_bits,
    rounding_bits,
    per_channel,
    asymmetric,
    range_mode,
    n_calib,
    data_dir,
    n_test,
    policy,
    show_nodes,
    json_path,
) -> None:
    """Quantize MODEL_PATH to an integer program; report bit widths and float vs integer
    accuracy."""
    from fhe import api
    from quant.report import format_program

    config = make_quant_config(
        n_bits, weight_bits, input_bits, rounding_bits, per_channel, asymmetric, range_mode
    )
    program, summary = api.quantize_file(model_path, config, n_calib, data_dir, n_test, policy)
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
