"""The ``fhe`` command line: each command parses its options, makes one :mod:`fhe.api` call and
prints.

Library errors become click errors in one place (:func:`library_errors`): a
:class:`~fhe.errors.BadOptionError` exits 2 (usage), any other :class:`~fhe.errors.FheError` exits
1.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import click

from fhe.cli_common import library_errors
from models.config import Activation, AttentionKind, NormKind

KINDS = [k.value for k in AttentionKind]
SCHEMES = ["tfhe", "ckks"]


def _echo_err(message: str) -> None:
    click.echo(message, err=True)


def _json_object(param, value: str | None) -> dict:
    """A JSON object option ({} when not given); anything else is a usage error."""
    if value is None:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param=param) from exc
    if not isinstance(parsed, dict):
        raise click.BadParameter("expected a JSON object ({...})", param=param)
    return parsed


def _write_json(path: Path | None, payload: dict) -> None:
    if path:
        path.write_text(json.dumps(payload, indent=2))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """fhe-attention: private inference for small transformers, and what it costs."""


@main.command()
@click.option(
    "--task",
    type=click.Choice(["adding", "digits", "mnist", "imdb"]),
    default="digits",
    show_default=True,
    help="Training task.",
)
@click.option(
    "--attention", "attention", type=click.Choice(KINDS), default="inhibitor", show_default=True
)
@click.option("--layers", type=int, default=None, help="Number of blocks (task preset if omitted).")
@click.option("--d-model", type=int, default=None, help="Embedding width (task preset if omitted).")
@click.option("--heads", type=int, default=None, help="Attention heads (task preset if omitted).")
@click.option(
    "--d-ff",
    type=click.IntRange(min=1),
    default=None,
    help="FFN hidden width (default 2 x --d-model). Under TFHE each hidden unit costs one lookup "
    "per token.",
)
@click.option(
    "--tie-qk/--no-tie-qk",
    default=False,
    show_default=True,
    help="Inhibitor: K = Q (one projection; symmetric scores). Under TFHE: no K requantisation and "
    "|q_i - q_j| for the T(T-1)/2 pairs only, instead of T^2.",
)
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    default=None,
    help="Training epochs (task preset if omitted).",
)
@click.option("--batch-size", type=int, default=None)
@click.option("--lr", type=float, default=None)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--norm",
    type=click.Choice([n.value for n in NormKind]),
    default="batchnorm",
    show_default=True,
    help="batchnorm folds into the linear layers at export (free under TFHE and CKKS); layernorm "
    "needs an encrypted 1/sqrt (CKKS only, with depth); none.",
)
@click.option(
    "--ffn-activation",
    type=click.Choice([a.value for a in Activation]),
    default="relu",
    show_default=True,
)
@click.option("--seq-len", type=int, default=None, help="Sequence length (adding: 100, imdb: 128).")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder of the task's data files (mnist, imdb); default ../shared/data/<task>.",
)
@click.option("--limit", type=int, default=None, help="Use only the first N training samples.")
@click.option(
    "--patch",
    type=click.IntRange(min=1),
    default=None,
    help="Image tasks: tokens of PATCH x PATCH pixels instead of rows (digits --patch 4: 4 tokens "
    "of 16 pixels; attention's encrypted cost grows with the square of the token count).",
)
@click.option(
    "--range-loss",
    "range_loss",
    type=float,
    default=0.0,
    show_default=True,
    help="Weight of the PowerSoftmax range loss (Eq. 9).",
)
@click.option(
    "--act-range-loss",
    "act_range_loss",
    type=float,
    default=0.0,
    show_default=True,
    help="Weight of the activation range loss (max |FFN activation input|; narrows CKKS polynomial "
    "fits).",
)
@click.option(
    "--range-threshold",
    type=float,
    default=0.0,
    show_default=True,
    help="Hinge for the range losses: penalise max |PowerSoftmax input| only beyond this (0: Eq. "
    "9).",
)
@click.option(
    "--act-range-threshold",
    type=float,
    default=0.0,
    show_default=True,
    help="Hinge for the activation range loss.",
)
@click.option(
    "--init",
    "init_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Start from this model.pt (e.g. range-minimisation fine-tuning, PowerSoftmax Alg. 1 step "
    "2); its architecture is kept, except --power-form.",
)
@click.option(
    "--power-eps",
    type=float,
    default=None,
    help="PowerSoftmax ε (Eq. 5; default 1e-3, or --init's); in the length-agnostic form it bounds "
    "the CKKS division interval below.",
)
@click.option(
    "--power-p",
    type=int,
    default=None,
    help="PowerSoftmax power p, a positive even integer (Eq. 4; default 4): under CKKS x^p costs "
    "log2(p) levels.",
)
@click.option(
    "--power-form",
    type=click.Choice(["stable", "length-agnostic"]),
    default=None,
    help="PowerSoftmax training form (default stable, or --init's): stable (Eqs. 5-6) or the "
    "polynomial model's length-agnostic form with ε (Eq. 7), whose division interval ε bounds from "
    "below.",
)
@click.option(
    "--qat-bits",
    type=int,
    default=None,
    help="After float training, fine-tune through the TFHE integer program itself (activations at "
    "N bits; the other widths from the TFHE defaults or the options below): its integer program "
    "then reproduces the QAT model exactly. The model file records the configuration for `fhe "
    "compile`.",
)
@click.option(
    "--qat-epochs",
    type=click.IntRange(min=1),
    default=None,
    help="QAT fine-tuning epochs (default: --epochs).",
)
@click.option(
    "--qat-method",
    type=click.Choice(["program", "brevitas"]),
    default="program",
    show_default=True,
    help="program: through the exported integer program; brevitas: quantized linear layers only.",
)
@click.option(
    "--qat-attention-bits", type=int, default=None, help="QAT: Q/K/V bits (TFHE default 3)."
)
@click.option(
    "--qat-lut-bits", type=int, default=None, help="QAT: lookup input bits (TFHE default 5)."
)
@click.option("--qat-lr", type=float, default=2e-3, show_default=True, help="QAT learning rate.")
@click.option(
    "--qat-quant",
    callback=lambda ctx, param, value: _json_object(param, value),
    default=None,
    help='QAT: QuantConfig fields over the TFHE defaults as JSON, e.g. \'{"weight_bits": 6, '
    '"round_attention": true}\' (the --qat-* options win; 0 turns lut_bits or '
    "attention_lut_bits off). The model file records the result.",
)
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
    given = click.get_current_context().get_parameter_source("attention")
    req = api.TrainRequest(
        **options, attention_given=given is not click.core.ParameterSource.DEFAULT
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
    _write_json(json_path, summary)
    shown = (
        f"{100 * outcome.test_score:.2f}%" if metric == "accuracy" else f"{outcome.test_score:.5f}"
    )
    if outcome.integer_program:
        shown += " (integer program)"
    click.echo(
        f"{req.task} / {outcome.attention}: test {metric} = {shown} on {summary['n_test']} samples "
        f"({summary['params']} parameters) -> {output}"
    )


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


@main.command()
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
    _write_json(json_path, summary)


@main.command()
@click.argument("model_path", type=click.Path(path_type=Path))
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@library_errors
def evaluate(model_path, data_dir) -> None:
    """Reload MODEL_PATH and report its test score on its task."""
    from fhe import api
    from models.training import evaluate as run_eval

    ckpt, data = api.load_model_and_task(model_path, data_dir)
    click.echo(f"{ckpt.task['name']}: test {data.metric.value} = {run_eval(ckpt.model, data):.4f}")


# ------------------------------------------------------------------------------------------------
# FHE: compile, run, compare, report
# ------------------------------------------------------------------------------------------------
def fhe_options(fn):
    opts = [
        click.option("--scheme", type=click.Choice(SCHEMES), default="tfhe", show_default=True),
        click.option(
            "--n-bits",
            type=int,
            default=None,
            help="TFHE activation bits (default: what the model was trained for with --qat-bits, "
            "else 6).",
        ),
        click.option("--weight-bits", type=int, default=None, help="TFHE weight bits (default 4)."),
        click.option("--input-bits", type=int, default=None, help="TFHE input bits (default 4)."),
        click.option(
            "--attention-bits",
            type=int,
            default=None,
            help="TFHE bits of Q, K and V, which set the width of every attention lookup (default "
            "3).",
        ),
        click.option(
            "--rounding-bits",
            type=int,
            default=None,
            help="LSBs every table lookup rounds away first.",
        ),
        click.option(
            "--lut-bits",
            type=int,
            default=None,
            help="Round each lookup's input down to at most this many bits (default 5; 0: off).",
        ),
        click.option(
            "--attention-lut-bits",
            type=int,
            default=None,
            help="TFHE, Inhibitor kinds: the lookups that produce Q, K and V read at most this "
            "many bits (default 4; 0: as --lut-bits).",
        ),
        click.option(
            "--range-mode",
            type=click.Choice(["minmax", "percentile"]),
            default=None,
            help="Calibration ranges (default percentile: clips outliers).",
        ),
        click.option(
            "--rounding",
            type=click.Choice(["exact", "approximate"]),
            default="exact",
            show_default=True,
            help="TFHE: Concrete's exact rounding (encrypted == clear program), or its approximate "
            "rounding (cheaper; values near a rounding boundary may read the neighbouring entry).",
        ),
        click.option(
            "--ranges",
            type=click.Choice(["calibrated", "proven"]),
            default="calibrated",
            show_default=True,
            help="TFHE: bit widths from the calibration set (inputs that would overflow one are "
            "refused by the client), or proven by interval arithmetic for every accepted input "
            "(wider, slower).",
        ),
        click.option(
            "--compress-keys/--no-compress-keys",
            default=True,
            show_default=True,
            help="TFHE: seeded evaluation keys (~4-5x fewer bytes to store and upload; the server "
            "expands them on load, same memory and speed there).",
        ),
        click.option("--p-error", type=float, default=None, help="Per-PBS error probability."),
        click.option("--global-p-error", type=float, default=1e-5, show_default=True),
        click.option(
            "--calib",
            "n_calib",
            type=int,
            default=None,
            help="Calibration samples from the training split (default: 2000 for TFHE; 5000 for "
            "CKKS, whose polynomials diverge outside their intervals, so intervals must cover the "
            "tails).",
        ),
        click.option(
            "--inputset",
            type=int,
            default=500,
            show_default=True,
            help="Calibration samples Concrete evaluates when compiling.",
        ),
        click.option("--data-dir", type=click.Path(path_type=Path), default=None),
        # CKKS
        click.option(
            "--poly-modulus-degree",
            type=click.Choice(["8192", "16384", "32768"]),
            default=None,
            help="CKKS ring size (default: the smallest whose 128-bit chain holds the program's "
            "depth).",
        ),
        click.option(
            "--scale-bits", type=int, default=40, show_default=True, help="CKKS scale 2^bits."
        ),
        click.option(
            "--outer-bits",
            type=int,
            default=60,
            show_default=True,
            help="CKKS: bits of the chain's first and special primes (smaller ones leave room for "
            "more levels or a larger scale; the first must hold the output's integer part).",
        ),
        click.option(
            "--refresh",
            is_flag=True,
            help="CKKS: allow client-assisted refreshes (the data owner decrypts and re-encrypts "
            "ciphertexts that run out of levels). Off by default; counted in the report.",
        ),
        click.option(
            "--reciprocal-tol",
            type=float,
            default=1e-2,
            show_default=True,
            help="CKKS: relative error of the Goldschmidt 1/x (sets the iteration count).",
        ),
        click.option(
            "--activation-tol",
            type=float,
            default=2e-2,
            show_default=True,
            help="CKKS: max error of the GELU/ReLU polynomial on its interval (sets the degree).",
        ),
        click.option(
            "--max-degree",
            type=int,
            default=31,
            show_default=True,
            help="CKKS: activation degree cap.",
        ),
        click.option(
            "--margin",
            type=float,
            default=0.2,
            show_default=True,
            help="CKKS: widen calibrated intervals by this fraction of their width on each side.",
        ),
        click.option(
            "--layout",
            type=click.Choice(["auto", "batch", "packed"]),
            default="auto",
            show_default=True,
            help="CKKS: batch (samples in the SIMD slots: N/2 samples per run at the cost of one) "
            "or packed (one sample per ciphertext, rotations: the latency of one query). auto: "
            "packed for `fhe compile` (one query), batch for `fhe compare` (a dataset) and with "
            "--refresh.",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


@main.command(name="compile")
@click.argument("model_path", type=click.Path(path_type=Path))
@fhe_options
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write the report."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Write client/ (with secret keys) and server/ (circuit + evaluation keys only) artifacts.",
)
@click.option(
    "--no-run", is_flag=True, help="Skip keygen and the timing run of one encrypted sample."
)
@library_errors
def compile_cmd(model_path, json_path, out_dir, no_run, **opts) -> None:
    """Compile MODEL_PATH into an encrypted program and print its cost report."""
    from fhe import api
    from fhe.summaries import format_report

    options = api.CompileOptions.from_mapping(opts)
    if options.scheme == "tfhe":
        what = "TFHE"
    else:
        layout = api.choose_layout(options, for_dataset=False)
        what = f"CKKS (polynomial program, {layout.layout} layout; {layout.reason})"
    click.echo(f"compiling {model_path} for {what} ...")
    c = api.compile_file(model_path, options, on_message=click.echo)
    api.check_circuit(c, on_message=click.echo)
    if not no_run:
        api.keygen(c, on_message=click.echo)
        click.echo("running one encrypted test sample ...")
        click.echo(api.one_encrypted_sample(c).describe())
    if out_dir:
        paths = api.save_artifacts(c, out_dir, on_message=click.echo)
    rep = c.report()
    click.echo(format_report(rep))
    _write_json(json_path, rep)
    if out_dir:
        label = "no secret key" if options.scheme == "tfhe" else "public context, no secret key"
        click.echo(
            f"server artifact ({label}): {paths['server']}; client artifact: {paths['client']}"
        )


@main.command(name="run")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option(
    "--sample", type=int, default=0, show_default=True, help="Index into the task's test split."
)
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@click.option(
    "--allow-overflow",
    is_flag=True,
    help="TFHE: encrypt an input outside the calibrated widths anyway (the answer can be wrong).",
)
@library_errors
def run_cmd(artifact_dir, sample, data_dir, allow_overflow) -> None:
    """Encrypt a test sample with the client artifact, run it on the server artifact, decrypt."""
    from fhe import api

    run = api.run_artifact(artifact_dir, sample, data_dir, allow_overflow)
    click.echo(run.describe())
    for note in run.notes:
        _echo_err(note)


@main.command()
@click.argument("model_path", type=click.Path(path_type=Path))
@fhe_options
@click.option("--n", "n_samples", type=int, default=20, show_default=True, help="Test samples.")
@click.option(
    "--mode", type=click.Choice(["simulate", "execute"]), default="simulate", show_default=True
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="TFHE execute: spread the encrypted samples over N local Ray workers (0: in this "
    "process).",
)
@click.option(
    "--ray", "ray_address", default=None, help="TFHE execute: join the Ray cluster at this address."
)
@library_errors
def compare(model_path, n_samples, mode, json_path, workers, ray_address, **opts) -> None:
    """Float vs clear-integer vs simulated/encrypted accuracy and agreement on N test samples
    (CKKS: float vs clear polynomial program vs encrypted, with output MSE)."""
    from tqdm import tqdm

    from fhe import api

    options = api.CompileOptions.from_mapping(opts)
    where = (
        f"{workers or 'cluster'} Ray workers"
        if mode == "execute" and (workers or ray_address)
        else "this process"
    )
    with tqdm(desc=f"{mode} ({where})", unit="sample", disable=options.scheme != "tfhe") as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        result = api.compare_file(
            model_path,
            options,
            n_samples,
            mode,
            workers,
            ray_address,
            progress=progress,
            on_message=_echo_err,
        )
    for k, v in result.items():
        click.echo(f"{k:>24}: {v}")
    if result.get("refused_overflow"):
        _echo_err(
            f"warning: {result['refused_overflow']} sample(s) would take a value outside the "
            "calibrated bit widths (the encrypted circuit would wrap around); the client refused "
            "them and the figures above leave them out. Compile with --ranges proven, or "
            "calibrate on data like them (--calib)."
        )
    _write_json(json_path, result)


@main.command()
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option(
    "--n",
    "n_samples",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Test samples.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Local Ray workers (0: in this process).",
)
@click.option(
    "--ray", "ray_address", default=None, help="Join the Ray cluster at this address instead."
)
@click.option(
    "--block",
    type=click.IntRange(min=1),
    default=None,
    help="CKKS: samples per SIMD batch (one work item per batch; default: split evenly over "
    "workers).",
)
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@library_errors
def batch(artifact_dir, n_samples, workers, ray_address, block, data_dir) -> None:
    """Encrypt the first N test samples with ARTIFACT_DIR/client, run them on ARTIFACT_DIR/server
    (in this process or on Ray workers), decrypt, and print accuracy and throughput."""
    from fhe import api

    click.echo(
        api.batch_artifact(
            artifact_dir, n_samples, workers, ray_address, block, data_dir
        ).describe()
    )


@main.command()
@click.option("--seq-lens", default="2,4,8,16", show_default=True)
@click.option("--d", type=int, default=2, show_default=True, help="Head dimension.")
@click.option("--n-bits", type=int, default=6, show_default=True)
@click.option(
    "--lut-bits",
    type=int,
    default=5,
    show_default=True,
    help="Round lookup inputs to N bits (0: off; unrounded dot-product circuits find no "
    "parameters).",
)
@click.option(
    "--variants",
    default="inhibitor,dot-product",
    show_default=True,
    help="Comma list of inhibitor, signed-inhibitor, dot-product, power-softmax, dct, geglu.",
)
@click.option(
    "--mode", type=click.Choice(["simulate", "execute"]), default="execute", show_default=True
)
@click.option(
    "--repeats", type=int, default=3, show_default=True, help="Encrypted runs per circuit (median)."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("reports"),
    show_default=True,
    help="Folder for the Markdown, JSON and PNG (benchmarks/tfhe_attention.py writes "
    "benchmarks/results).",
)
@click.option(
    "--stem", default=None, help="File name stem (default tfhe_attention / ckks_attention)."
)
@click.option(
    "--scheme",
    type=click.Choice(SCHEMES),
    default="tfhe",
    show_default=True,
    help="ckks: one-block models per kind and T, both layouts (depth, operations, keys, latency).",
)
@click.option("--layouts", default="batch,packed", show_default=True, help="CKKS: layouts to plan.")
def report(
    seq_lens, d, n_bits, lut_bits, variants, mode, repeats, out_dir, stem, scheme, layouts
) -> None:
    """Sweep attention over sequence lengths: TFHE single-head circuits (PBS, bit widths, crypto
    parameters, keygen and encrypted run time) or, with --scheme ckks, one-block models per
    attention kind (depth, operations, Galois keys, estimated latency; --mode execute runs the
    packed ones). Markdown, JSON, PNG."""
    from circuits.study import parse_seq_lens, study

    try:
        names = (
            None
            if variants == "inhibitor,dot-product" and scheme == "ckks"
            else variants.split(",")
        )
        paths = study(
            scheme,
            names,
            parse_seq_lens(seq_lens),
            out_dir,
            "fhe " + " ".join(sys.argv[1:]),
            stem,
            execute=mode == "execute",
            layouts=tuple(layouts.split(",")),
            d=d,
            n_bits=n_bits,
            lut_bits=lut_bits or None,
            repeats=repeats,
            progress=_echo_err,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(paths["md"].read_text())
    click.echo(f"wrote {paths['md']}, {paths['json']}, {paths['png']}")


from fhe.serve_cli import client_cmd, serve, serve_token  # noqa: E402 - registered below

for _command in (serve, serve_token, client_cmd):
    main.add_command(_command)


def entry() -> None:
    """The ``fhe`` console script: :func:`main`, leaving with the status it meant.

    After an encrypted Concrete run, the interpreter's normal shutdown turns every exit status into
    0 (tests/test_exit_codes.py), so a failed command would look successful to a script or CI. This
    runs the click group, prints what click or Python would print, then flushes and calls
    ``os._exit``."""
    status = 0
    try:
        main(standalone_mode=True)
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: B036  (KeyboardInterrupt included: report it and fail)
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":  # pragma: no cover
    entry()
