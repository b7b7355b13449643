"""The ``fhe`` command line: train, and (as backends land) compile, run, compare and report."""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import click
import numpy as np

from models.config import Activation, AttentionKind, NormKind
from quant.config import DEFAULT_CALIB_SAMPLES

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
@click.option("--d-ff", type=click.IntRange(min=1), default=None,
              help="FFN hidden width (default 2 x --d-model). Under TFHE each hidden unit costs one lookup per token.")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Training epochs (task preset if omitted).")
@click.option("--batch-size", type=int, default=None)
@click.option("--lr", type=float, default=None)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--norm", type=click.Choice([n.value for n in NormKind]), default="batchnorm", show_default=True,
              help="batchnorm folds into the linear layers at export (free under TFHE and CKKS); layernorm "
              "needs an encrypted 1/sqrt (CKKS only, with depth); none.")
@click.option("--ffn-activation", type=click.Choice([a.value for a in Activation]), default="relu",
              show_default=True)
@click.option("--seq-len", type=int, default=None, help="Sequence length (adding: 100, imdb: 128).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Folder of the task's data files (mnist, imdb); default ../shared/data/<task>.")
@click.option("--limit", type=int, default=None, help="Use only the first N training samples.")
@click.option("--patch", type=click.IntRange(min=1), default=None,
              help="Image tasks: tokens of PATCH x PATCH pixels instead of rows (digits --patch 4: 4 tokens of "
              "16 pixels; attention's encrypted cost grows with the square of the token count).")
@click.option("--range-loss", "range_loss", type=float, default=0.0, show_default=True,
              help="Weight of the PowerSoftmax range loss (Eq. 9).")
@click.option("--act-range-loss", "act_range_loss", type=float, default=0.0, show_default=True,
              help="Weight of the activation range loss (max |FFN activation input|; narrows CKKS polynomial fits).")
@click.option("--range-threshold", type=float, default=0.0, show_default=True,
              help="Hinge for the range losses: penalise max |PowerSoftmax input| only beyond this (0: Eq. 9).")
@click.option("--act-range-threshold", type=float, default=0.0, show_default=True,
              help="Hinge for the activation range loss.")
@click.option("--init", "init_path", type=click.Path(path_type=Path), default=None,
              help="Start from this model.pt (e.g. range-minimisation fine-tuning, PowerSoftmax Alg. 1 step 2); "
              "its architecture is kept, except --power-form.")
@click.option("--power-eps", type=float, default=None,
              help="PowerSoftmax ε (Eq. 5; default 1e-3, or --init's); in the length-agnostic form it bounds the "
              "CKKS division interval below.")
@click.option("--power-form", type=click.Choice(["stable", "length-agnostic"]), default=None,
              help="PowerSoftmax training form (default stable, or --init's): stable (Eqs. 5-6) or the polynomial "
              "model's length-agnostic form with ε (Eq. 7), whose division interval ε bounds from below.")
@click.option("--qat-bits", type=int, default=None,
              help="After float training, fine-tune through the TFHE integer program itself (activations at N "
              "bits; the other widths from the TFHE defaults or the options below): its integer program then "
              "reproduces the QAT model exactly. The model file records the configuration for `fhe compile`.")
@click.option("--qat-epochs", type=click.IntRange(min=1), default=None,
              help="QAT fine-tuning epochs (default: --epochs).")
@click.option("--qat-method", type=click.Choice(["program", "brevitas"]), default="program", show_default=True,
              help="program: through the exported integer program; brevitas: quantized linear layers only.")
@click.option("--qat-attention-bits", type=int, default=None, help="QAT: Q/K/V bits (TFHE default 3).")
@click.option("--qat-lut-bits", type=int, default=None, help="QAT: lookup input bits (TFHE default 5).")
@click.option("--qat-lr", type=float, default=2e-3, show_default=True, help="QAT learning rate.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("model.pt"), show_default=True)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Also write the training summary as JSON.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(task, attention, layers, d_model, heads, d_ff, epochs, batch_size, lr, seed, norm, ffn_activation, seq_len,
          data_dir, limit, patch, range_loss, act_range_loss, range_threshold, act_range_threshold, init_path,
          power_eps, power_form, qat_bits, qat_epochs, qat_method, qat_attention_bits, qat_lut_bits, qat_lr, output,
          json_path, quiet) -> None:
    """Train a model on a task and save config + weights to OUTPUT."""
    import torch

    from models.presets import PRESETS
    from models.tasks import DataFileError, load_task
    from models.training import TrainConfig, config_for_task, save_checkpoint
    from models.training import train as run_training

    torch.set_num_threads(max(1, torch.get_num_threads()))
    preset = PRESETS[task]
    try:
        data = load_task(task, data_dir=data_dir, seq_len=seq_len, limit=limit, patch=patch)
    except (DataFileError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    power_options = {k: v for k, v in (("power_form", power_form), ("power_eps", power_eps)) if v is not None}
    try:
        model_config = config_for_task(
            data, attention=attention, d_model=d_model or preset.d_model, n_heads=heads or preset.n_heads,
            d_ff=d_ff, n_layers=layers or preset.n_layers, norm=norm, ffn_activation=ffn_activation, **power_options)
        train_config = TrainConfig(epochs=preset.epochs if epochs is None else epochs,
                                   batch_size=batch_size or preset.batch_size, lr=lr or preset.lr, seed=seed,
                                   range_loss_weight=range_loss, act_range_loss_weight=act_range_loss,
                                   range_threshold=range_threshold, act_range_threshold=act_range_threshold)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    init_model = None
    if init_path is not None:
        from models.training import load_checkpoint
        from models.transformer import Transformer

        try:
            base = load_checkpoint(init_path).model
        except (FileNotFoundError, ValueError) as exc:
            raise click.UsageError(str(exc)) from exc
        given = click.get_current_context().get_parameter_source("attention")
        if given is not click.core.ParameterSource.DEFAULT and attention != base.config.attention.value:
            raise click.UsageError(f"--init {init_path} is a {base.config.attention.value} model; fine-tuning keeps "
                                   f"its architecture, so --attention {attention} cannot apply (train from scratch)")
        model_config = base.config.replace(**power_options)
        attention = model_config.attention.value
        init_model = Transformer(model_config)
        init_model.load_state_dict(base.state_dict())
    result = run_training(model_config, data, train_config, progress=not quiet, model=init_model)
    extra = {"train": train_config.__dict__, "history": result.history}
    if qat_bits is not None:
        float_score = result.test_score
        qat_config = TrainConfig(epochs=qat_epochs or train_config.epochs, batch_size=train_config.batch_size,
                                 lr=qat_lr, seed=seed)
        if qat_method == "brevitas":
            from quant.qat import prepare_qat, strip_qat

            try:
                qat_model = prepare_qat(result.model, qat_bits)
            except ValueError as exc:
                raise click.UsageError(str(exc)) from exc
            result = run_training(model_config, data, qat_config, progress=not quiet, model=qat_model)
            result.model = strip_qat(result.model)
            extra.update(qat_bits=qat_bits, qat_method=qat_method, float_test=float_score,
                         qat_history=result.history)
        else:
            from fhe.tfhe_recipe import resolve_quant
            from quant.program_qat import train_program

            try:
                quant = resolve_quant(None, n_bits=qat_bits, attention_bits=qat_attention_bits,
                                      lut_bits=qat_lut_bits)
            except ValueError as exc:
                raise click.UsageError(str(exc)) from exc
            qat = train_program(result.model, data, quant, qat_config, progress=not quiet)
            result.model, result.test_score = qat.model, qat.program_score
            extra.update(qat_bits=qat_bits, qat_method=qat_method, float_test=float_score, quant=quant.to_dict(),
                         qat_history=qat.history)
            click.echo(f"integer program (the QAT model's forward) test {result.metric.value}: "
                       f"{qat.program_score:.4f}")
        click.echo(f"float test {result.metric.value} before QAT: {float_score:.4f}")
    save_checkpoint(output, result.model, data, **extra)
    summary = {"task": task, "attention": attention, "metric": result.metric.value, "test": result.test_score,
               "n_test": len(data.x_test), "params": sum(p.numel() for p in result.model.parameters()),
               "output": str(output)}
    if json_path:
        json_path.write_text(json.dumps(summary, indent=2))
    shown = f"{100 * result.test_score:.2f}%" if result.metric.value == "accuracy" else f"{result.test_score:.5f}"
    if "quant" in extra:
        shown += " (integer program)"
    click.echo(f"{task} / {attention}: test {result.metric.value} = {shown} on {len(data.x_test)} samples "
               f"({summary['params']} parameters) -> {output}")


def load_model_and_task(model_path: Path, data_dir: Path | None):
    """(checkpoint, task data) for a saved model, with click errors for bad files."""
    from models.tasks import DataFileError, load_task_of
    from models.training import load_checkpoint

    try:
        ckpt = load_checkpoint(model_path)
    except (FileNotFoundError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    if not ckpt.task:
        raise click.UsageError(f"{model_path} records no task")
    try:
        data = load_task_of(ckpt.task, data_dir=data_dir, seq_len=ckpt.model.config.seq_len)
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
        click.option("--range-mode", type=click.Choice(["minmax", "percentile"]), default="minmax",
                     show_default=True, help="Calibration ranges: min/max, or the 99.99th percentile (clips "
                     "outliers; better at 4 bits)."),
        click.option("--calib", "n_calib", type=int, default=500, show_default=True,
                     help="Calibration samples (from the training split)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def make_quant_config(n_bits, weight_bits, input_bits, rounding_bits, per_channel, asymmetric, range_mode="minmax"):
    from quant import QuantConfig

    try:
        return QuantConfig(n_bits=n_bits, weight_bits=weight_bits, input_bits=input_bits,
                           rounding_bits=rounding_bits, symmetric=not asymmetric,
                           weight_granularity="per-channel" if per_channel else "per-tensor", range_mode=range_mode)
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
def quantize(model_path, n_bits, weight_bits, input_bits, rounding_bits, per_channel, asymmetric, range_mode, n_calib,
             data_dir, n_test, policy, show_nodes, json_path) -> None:
    """Quantize MODEL_PATH to an integer program; report bit widths and float vs integer accuracy."""
    from models.training import predict
    from quant import ExportError, OverflowPolicy, RangeOverflowError, export
    from quant.report import accuracy, format_program, program_summary

    ckpt, data = load_model_and_task(model_path, data_dir)
    qconfig = make_quant_config(n_bits, weight_bits, input_bits, rounding_bits, per_channel, asymmetric, range_mode)
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


# ------------------------------------------------------------------------------------------------
# FHE: compile, run, compare, report
# ------------------------------------------------------------------------------------------------
SCHEMES = ["tfhe", "ckks"]


def _artifact_meta(model_path, ckpt) -> dict:
    """What artifacts record of the model: its file, and its task with the tokenisation (`fhe run`)."""
    return {"model_path": str(model_path), "task": ckpt.task["name"],
            "patch": (ckpt.task.get("meta") or {}).get("patch")}


TFHE_QUANT_OPTIONS = ("n_bits", "weight_bits", "input_bits", "attention_bits", "rounding_bits", "lut_bits",
                      "range_mode")


def _compile(model_path, opts: dict, simulate_only: bool = False):
    """(checkpoint, task data, compiled TFHE model) for the `fhe compile/compare` options ``opts``."""
    from fhe.harness import compile_model
    from fhe.schemes import TfheParams
    from fhe.tfhe_recipe import resolve_quant
    from quant import BitWidthError, ExportError

    ckpt, data = load_model_and_task(model_path, opts["data_dir"])
    try:
        qconfig = resolve_quant(ckpt.extra.get("quant"), **{k: opts[k] for k in TFHE_QUANT_OPTIONS})
        params = TfheParams(quant=qconfig, p_error=opts["p_error"],
                            global_p_error=opts["global_p_error"], inputset_size=opts["inputset"],
                            exact_rounding=opts["rounding"] == "exact", ranges=opts["ranges"],
                            compress_keys=opts["compress_keys"])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        compiled = compile_model(ckpt.model, data.x_train[:opts["n_calib"] or DEFAULT_CALIB_SAMPLES], params, qconfig,
                                 simulate_only=simulate_only,
                                 meta={**_artifact_meta(model_path, ckpt), "quant": qconfig.to_dict()})
    except (ExportError, BitWidthError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    except RuntimeError as exc:
        if "NoParametersFound" not in str(exc):
            raise
        raise click.ClickException(
            "Concrete found no TFHE parameters for the widest lookup or encrypted product of this program (see "
            "`fhe quantize MODEL --nodes` for the widths). Narrow them: --lut-bits 4, --attention-bits 3, "
            "--n-bits 5, or fewer tokens / a smaller --d-model when training.") from exc
    return ckpt, data, compiled


def _keygen_checked(compiled) -> None:
    """Print the expected key size and latency, refuse keys that will not fit, then generate them."""
    from fhe.tfhe_recipe import KeysTooLargeError, preflight

    check = preflight(compiled.backend.circuit)
    click.echo(check.describe())
    try:
        check.check()
    except KeysTooLargeError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo("generating keys ...")
    compiled.keygen()


def fhe_options(fn):
    opts = [
        click.option("--scheme", type=click.Choice(SCHEMES), default="tfhe", show_default=True),
        click.option("--n-bits", type=int, default=None,
                     help="TFHE activation bits (default: what the model was trained for with --qat-bits, else 6)."),
        click.option("--weight-bits", type=int, default=None, help="TFHE weight bits (default 4)."),
        click.option("--input-bits", type=int, default=None, help="TFHE input bits (default 4)."),
        click.option("--attention-bits", type=int, default=None,
                     help="TFHE bits of Q, K and V, which set the width of every attention lookup (default 3)."),
        click.option("--rounding-bits", type=int, default=None, help="LSBs every table lookup rounds away first."),
        click.option("--lut-bits", type=int, default=None,
                     help="Round each lookup's input down to at most this many bits (default 5; 0: off)."),
        click.option("--range-mode", type=click.Choice(["minmax", "percentile"]), default=None,
                     help="Calibration ranges (default percentile: clips outliers)."),
        click.option("--rounding", type=click.Choice(["exact", "approximate"]), default="exact", show_default=True,
                     help="TFHE: Concrete's exact rounding (encrypted == clear program), or its approximate "
                     "rounding (cheaper; values near a rounding boundary may read the neighbouring entry)."),
        click.option("--ranges", type=click.Choice(["calibrated", "proven"]), default="calibrated", show_default=True,
                     help="TFHE: bit widths from the calibration set (inputs that would overflow one are refused "
                     "by the client), or proven by interval arithmetic for every accepted input (wider, slower)."),
        click.option("--compress-keys/--no-compress-keys", default=True, show_default=True,
                     help="TFHE: seeded evaluation keys (~4-5x fewer bytes to store and upload; the server "
                     "expands them on load, same memory and speed there)."),
        click.option("--p-error", type=float, default=None, help="Per-PBS error probability."),
        click.option("--global-p-error", type=float, default=1e-5, show_default=True),
        click.option("--calib", "n_calib", type=int, default=None,
                     help="Calibration samples from the training split (default: 2000 for TFHE; 5000 for CKKS, "
                     "whose polynomials diverge outside their intervals, so intervals must cover the tails)."),
        click.option("--inputset", type=int, default=500, show_default=True,
                     help="Calibration samples Concrete evaluates when compiling."),
        click.option("--data-dir", type=click.Path(path_type=Path), default=None),
        # CKKS
        click.option("--poly-modulus-degree", type=click.Choice(["8192", "16384", "32768"]), default=None,
                     help="CKKS ring size (default: the smallest whose 128-bit chain holds the program's depth)."),
        click.option("--scale-bits", type=int, default=40, show_default=True, help="CKKS scale 2^bits."),
        click.option("--refresh", is_flag=True,
                     help="CKKS: allow client-assisted refreshes (the data owner decrypts and re-encrypts "
                     "ciphertexts that run out of levels). Off by default; counted in the report."),
        click.option("--reciprocal-tol", type=float, default=1e-2, show_default=True,
                     help="CKKS: relative error of the Goldschmidt 1/x (sets the iteration count)."),
        click.option("--activation-tol", type=float, default=2e-2, show_default=True,
                     help="CKKS: max error of the GELU/ReLU polynomial on its interval (sets the degree)."),
        click.option("--max-degree", type=int, default=31, show_default=True, help="CKKS: activation degree cap."),
        click.option("--margin", type=float, default=0.2, show_default=True,
                     help="CKKS: widen calibrated intervals by this fraction of their width on each side."),
        click.option("--layout", type=click.Choice(["batch", "packed"]), default="batch", show_default=True,
                     help="CKKS: batch (samples in the SIMD slots: N/2 samples per run at the cost of one) or "
                     "packed (one sample per ciphertext, rotations: the latency of one query)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


CKKS_OPTIONS = ("data_dir", "n_calib", "poly_modulus_degree", "scale_bits", "refresh", "reciprocal_tol",
                "activation_tol", "max_degree", "margin", "layout")


def _ckks_compile(model_path, data_dir, n_calib, poly_modulus_degree, scale_bits, refresh, reciprocal_tol,
                  activation_tol, max_degree, margin, layout="batch", simulate_only=False):
    from fhe.ckks import ApproxConfig, PolynomialError
    from fhe.ckks.approx import ApproximationError
    from fhe.ckks.planner import DepthError
    from fhe.harness import compile_model
    from fhe.schemes import CkksParams

    ckpt, data = load_model_and_task(model_path, data_dir)
    n_calib = n_calib or 5000
    try:
        params = CkksParams(poly_modulus_degree=int(poly_modulus_degree) if poly_modulus_degree else None,
                            scale_bits=scale_bits, refresh=refresh, layout=layout,
                            approx=ApproxConfig(reciprocal_tol=reciprocal_tol, activation_tol=activation_tol,
                                                max_degree=max_degree, margin=margin))
        meta = _artifact_meta(model_path, ckpt)
        try:
            compiled = compile_model(ckpt.model, data.x_train[:n_calib], params, meta=meta)
        except DepthError as exc:
            if not simulate_only or layout == "packed":
                raise
            click.echo(f"note: {str(exc).split(';')[0].split(' and TenSEAL')[0]}; simulating anyway "
                       "(no encryption), parameters planned with --refresh", err=True)
            compiled = compile_model(ckpt.model, data.x_train[:n_calib], params.replace(refresh=True), meta=meta)
    except (PolynomialError, ApproximationError, DepthError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    return ckpt, data, compiled


def print_ckks_report(rep: dict) -> None:
    rows = [("scheme", rep["scheme"]), ("layout", rep["layout"]), ("seq_len", rep["seq_len"]),
            ("depth", rep["depth"]), ("poly_modulus_degree", rep["poly_modulus_degree"]),
            ("coeff_mod_bit_sizes", rep["coeff_mod_bit_sizes"]), ("scale_bits", rep["scale_bits"]),
            ("security_bits", rep["security_bits"]), ("slots (samples per ciphertext)", rep["slots"]),
            ("client-assisted refresh", rep["client_assisted_refresh"]),
            ("program depth without refresh", rep["program_depth_without_refresh"])]
    if rep["layout"] == "packed":
        rows += [("rotation steps (one Galois key each)", len(rep["rotation_steps"]))]
    rows += [(f"ops.{k}", v) for k, v in rep["op_counts"].items()]
    rows += [(f"keys.{k} (MiB)", f"{v / 2**20:.1f}") for k, v in rep["key_sizes_bytes"].items()]
    rows += [(f"time.{k} (s)", f"{v:.3f}") for k, v in rep["timings_s"].items()]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"  {k:<{width}}  {v}")
    click.echo("  level after each stage: " + ", ".join(f"{t} {d}" for t, d in rep["depth_per_tag"].items()))
    for name, op in rep["approximations"].items():
        detail = (f"{op['iterations']} iterations" if "iterations" in op else
                  f"degree {op['degree']}, max error {op['max_error']:.3g}")
        click.echo(f"  {name}: calibrated [{op['calibrated'][0]:.4g}, {op['calibrated'][1]:.4g}], {detail}")


def print_report(rep: dict) -> None:
    rows = [("scheme", rep["scheme"]), ("seq_len", rep["seq_len"]), ("n_bits", rep["n_bits"]),
            ("PBS", rep["pbs_count"]), ("max bit width", rep["max_bit_width"]),
            ("rounding", "exact" if rep["exact_rounding"] else "approximate"),
            ("ranges", _ranges_line(rep))]
    rows += [(f"params.{k}", v) for k, v in rep["params"].items()]
    rows += [(f"keys.{k} (MiB)", f"{v / 2**20:.1f}") for k, v in rep["key_sizes_bytes"].items()]
    rows += [(f"time.{k} (s)", "—" if v is None else f"{v:.3f}") for k, v in rep["timings_s"].items()]
    rows += [("est. latency (s)", f"{rep['estimated_latency_s']:.1f}")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"  {k:<{width}}  {v}")
    click.echo("\n  | stage | PBS | lookup input bits | max width | parameter sets (PBS each) | est. time share |")
    click.echo("  |---|---|---|---|---|---|")
    for r in rep["stages"]:
        params = "; ".join(f"{p}: {n}" for p, n in r["params"].items()) or "—"
        click.echo(f"  | {r['tag']} | {r['pbs']} | {r['lookup_input_bits'] or '—'} | {r['bit_width']} | {params} | "
                   f"{100 * r['est_time_share']:.1f}% |")


def _ranges_line(rep: dict) -> str:
    if rep["ranges"] == "proven":
        return "proven (no accepted input can overflow)"
    risks = rep["overflow_risks"]
    if not risks:
        return "calibrated (proven safe for every accepted input)"
    return (f"calibrated: {len(risks)} node(s) can overflow on inputs unlike the calibration set (e.g. "
            f"{risks[0]['node']}: {risks[0]['calibrated_bits']} -> {risks[0]['proven_bits']} bits); the client "
            "refuses such inputs; --ranges proven rules them out")


@main.command(name="compile")
@click.argument("model_path", type=click.Path(path_type=Path))
@fhe_options
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write the report.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Write client/ (with secret keys) and server/ (circuit + evaluation keys only) artifacts.")
@click.option("--no-run", is_flag=True, help="Skip keygen and the timing run of one encrypted sample.")
def compile_cmd(model_path, scheme, json_path, out_dir, no_run, **opts) -> None:
    """Compile MODEL_PATH into an encrypted program and print its cost report."""
    if scheme == "ckks":
        _compile_ckks_cmd(model_path, *(opts[k] for k in CKKS_OPTIONS), json_path, out_dir, no_run)
        return
    click.echo(f"compiling {model_path} for TFHE ...")
    _, data, compiled = _compile(model_path, opts)
    q = compiled.program.config
    click.echo(f"quantization: {q.n_bits}-bit activations, {q.w_bits}-bit weights, {q.in_bits}-bit inputs, "
               f"attention {q.bits_for('block0.mix.qk')} bits, lookups <= {q.lut_bits or 'unrounded'} bits, "
               f"{q.range_mode.value} ranges")
    calib_x = data.x_train[: opts["n_calib"] or DEFAULT_CALIB_SAMPLES]
    check = compiled.verify(calib_x, limit=len(calib_x))
    click.echo(check.describe())
    if not check.exact and compiled.backend.params.exact_rounding:
        from fhe.harness import locate_divergence

        click.echo("locating the first diverging node (compiling prefixes of the program) ...")
        where = locate_divergence(compiled, calib_x, check)
        raise click.ClickException(
            "the compiled circuit does not compute the integer program (Concrete's simulation differs on "
            f"{check.n - check.n_equal} calibration samples; "
            f"{where.describe() if where else 'no prefix of the program reproduces it'}); refusing to produce keys "
            "or artifacts. Please report it with the model file; another --lut-bits may avoid it.")
    if not no_run:
        _keygen_checked(compiled)
        click.echo("running one encrypted test sample ...")
        x = data.x_test[:1]
        got = compiled.backend.encrypt_run_decrypt(compiled.program.quantize_input(x)[0])
        want, _ = compiled.program.run_int(compiled.program.quantize_input(x), "clip")
        click.echo(f"encrypted output equals the clear integer program: {bool(np.array_equal(got, want[0]))}")
    _report_and_save(compiled, print_report, json_path, out_dir, "no secret key",
                     keygen_first=(lambda: _keygen_checked(compiled)) if no_run else None)


def _report_and_save(compiled, print_fn, json_path, out_dir, server_label: str, keygen_first=None) -> None:
    """Print the cost report, write it as JSON, and write the client/server artifacts (both schemes);
    ``keygen_first``: what generates the keys when they do not exist yet."""
    rep = compiled.report()
    print_fn(rep)
    if json_path:
        json_path.write_text(json.dumps(rep, indent=2))
    if out_dir:
        if keygen_first:
            keygen_first()
        paths = compiled.save(out_dir, include_secret_key=True)
        click.echo(f"server artifact ({server_label}): {paths['server']}; client artifact: {paths['client']}")


def _compile_ckks_cmd(model_path, data_dir, n_calib, poly_modulus_degree, scale_bits, refresh, reciprocal_tol,
                      activation_tol, max_degree, margin, layout, json_path, out_dir, no_run) -> None:
    click.echo(f"compiling {model_path} for CKKS (polynomial program, {layout} layout) ...")
    _, data, compiled = _ckks_compile(model_path, data_dir, n_calib, poly_modulus_degree, scale_bits, refresh,
                                      reciprocal_tol, activation_tol, max_degree, margin, layout)
    if not no_run or out_dir:
        compiled.keygen()
    if not no_run:
        click.echo("running one encrypted test sample ...")
        x = data.x_test[:1]
        got, want = compiled.encrypt_run_decrypt(x), compiled.simulate(x)
        click.echo(f"encrypted vs clear polynomial program: max |error| {np.abs(got - want).max():.2e}")
    _report_and_save(compiled, print_ckks_report, json_path, out_dir, "public context, no secret key")


@main.command(name="run")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--sample", type=int, default=0, show_default=True, help="Index into the task's test split.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
def run_cmd(artifact_dir, sample, data_dir) -> None:
    """Encrypt a test sample with the client artifact, run it on the server artifact, decrypt."""
    import time

    from models.tasks import load_task

    if (artifact_dir / "server" / "program.json").exists():
        _run_ckks(artifact_dir, sample, data_dir)
        return
    from fhe.backends.tfhe import TfheClient, TfheServer

    try:
        client, server = TfheClient(artifact_dir / "client"), TfheServer(artifact_dir / "server")
    except (FileNotFoundError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    meta = client.meta
    data = load_task(meta["task"], data_dir=data_dir, seq_len=meta["seq_len"], patch=meta.get("patch"))
    if not 0 <= sample < len(data.x_test):
        raise click.UsageError(f"--sample must be in [0, {len(data.x_test) - 1}] for {meta['task']}, got {sample}")
    from fhe.deploy.client import quantize_input

    x_int = quantize_input(meta, data.x_test[sample].numpy())
    start = time.perf_counter()
    out = client.decrypt(server.run(client.encrypt(x_int))) * np.asarray(meta["output_scale"])
    click.echo(f"sample {sample}: label {int(data.y_test[sample])}, encrypted prediction {int(out.argmax())} "
               f"({time.perf_counter() - start:.1f} s); logits {np.round(out, 3).tolist()}")
    if meta.get("overflow_risks"):
        click.echo(f"note: compiled with calibrated ranges; {len(meta['overflow_risks'])} node(s) can overflow on "
                   "inputs unlike the calibration set, which this client (holding no program) cannot check. "
                   "`fhe compare` refuses such inputs; `fhe compile --ranges proven` rules them out.", err=True)


def _run_ckks(artifact_dir: Path, sample: int, data_dir) -> None:
    import time

    from fhe.backends.ckks_packed import open_client, open_server
    from models.tasks import load_task

    try:
        client, server = open_client(artifact_dir / "client"), open_server(artifact_dir / "server")
    except (FileNotFoundError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    data = load_task(server.meta["task"], data_dir=data_dir, seq_len=server.meta["seq_len"],
                     patch=server.meta.get("patch"))
    if not 0 <= sample < len(data.x_test):
        raise click.UsageError(f"--sample must be in [0, {len(data.x_test) - 1}], got {sample}")
    start = time.perf_counter()
    cts = client.encrypt(data.x_test[sample:sample + 1].numpy())
    out = client.decrypt(server.run(cts, client.refresh(server.context)))[0]
    click.echo(f"sample {sample}: label {int(data.y_test[sample])}, encrypted prediction {int(out.argmax())} "
               f"({time.perf_counter() - start:.1f} s, CKKS); logits {np.round(out, 3).tolist()}")


@main.command()
@click.argument("model_path", type=click.Path(path_type=Path))
@fhe_options
@click.option("--n", "n_samples", type=int, default=20, show_default=True, help="Test samples.")
@click.option("--mode", type=click.Choice(["simulate", "execute"]), default="simulate", show_default=True)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
@click.option("--workers", type=click.IntRange(min=0), default=0, show_default=True,
              help="TFHE execute: spread the encrypted samples over N local Ray workers (0: in this process).")
@click.option("--ray", "ray_address", default=None, help="TFHE execute: join the Ray cluster at this address.")
def compare(model_path, scheme, n_samples, mode, json_path, workers, ray_address, **opts) -> None:
    """Float vs clear-integer vs simulated/encrypted accuracy and agreement on N test samples
    (CKKS: float vs clear polynomial program vs encrypted, with output MSE)."""
    from tqdm import tqdm

    from fhe.compare import NothingToCompareError, compare_tfhe

    if scheme == "ckks":
        _compare_ckks(model_path, *(opts[k] for k in CKKS_OPTIONS), n_samples, mode, json_path)
        return
    _, data, compiled = _compile(model_path, opts, simulate_only=mode == "simulate")
    if mode == "execute":
        _keygen_checked(compiled)
    where = f"{workers or 'cluster'} Ray workers" if mode == "execute" and (workers or ray_address) else "this process"
    with tqdm(desc=f"{mode} ({where})", unit="sample") as bar:
        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        try:
            result = compare_tfhe(compiled, data.x_test[:n_samples], data.y_test[:n_samples].numpy(), mode, workers,
                                  ray_address, progress=progress, on_message=click.echo)
        except NothingToCompareError as exc:
            raise click.ClickException(str(exc)) from exc
    for k, v in result.items():
        click.echo(f"{k:>20}: {v}")
    if result["refused_overflow"]:
        click.echo(f"warning: {result['refused_overflow']} sample(s) would take a value outside the calibrated bit "
                   "widths (the encrypted circuit would wrap around); the client refused them and the figures above "
                   "leave them out. Compile with --ranges proven, or calibrate on data like them (--calib).", err=True)
    if json_path:
        json_path.write_text(json.dumps(result, indent=2))


@main.command()
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--n", "n_samples", type=click.IntRange(min=1), default=8, show_default=True, help="Test samples.")
@click.option("--workers", type=click.IntRange(min=0), default=0, show_default=True,
              help="Local Ray workers (0: in this process).")
@click.option("--ray", "ray_address", default=None, help="Join the Ray cluster at this address instead.")
@click.option("--block", type=click.IntRange(min=1), default=None,
              help="CKKS: samples per SIMD batch (one work item per batch; default: split evenly over workers).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
def batch(artifact_dir, n_samples, workers, ray_address, block, data_dir) -> None:
    """Encrypt the first N test samples with ARTIFACT_DIR/client, run them on ARTIFACT_DIR/server (in
    this process or on Ray workers), decrypt, and print accuracy and throughput."""
    from fhe.deploy.batch import run_batch
    from fhe.deploy.client import Client
    from fhe.errors import FheError
    from models.tasks import load_task

    try:
        client = Client(artifact_dir / "client")
        meta = client.meta
        data = load_task(meta["task"], data_dir=data_dir, seq_len=meta["seq_len"], patch=meta.get("patch"))
        x, y = data.x_test[:n_samples].numpy(), data.y_test[:n_samples].numpy()
        if client.scheme == "tfhe":
            groups = [xi for xi in x]
        else:
            size = block or -(-len(x) // max(1, workers))
            groups = [x[i:i + size] for i in range(0, len(x), size)]
        payloads = [client.encrypt(g) for g in groups]
        result = run_batch(artifact_dir / "server", client.public_keys(), payloads, workers, ray_address)
        logits = np.concatenate([np.asarray(client.decrypt(o)).reshape(-1, data.n_outputs) for o in result.outputs])
    except FheError as exc:
        raise click.ClickException(str(exc)) from exc
    where = "in this process" if not result.workers else f"on {result.workers} Ray workers"
    per_worker = ", ".join(f"{s:.1f}" for s in result.per_worker_setup_s)
    click.echo(f"{len(x)} samples {where}: accuracy {(logits.argmax(-1) == y).mean():.4f}; "
               f"setup {result.setup_s:.1f} s (per worker {per_worker} s), run {result.run_s:.1f} s, "
               f"{len(x) / result.run_s:.3f} samples/s")


def _compare_ckks(model_path, data_dir, n_calib, poly_modulus_degree, scale_bits, refresh, reciprocal_tol,
                  activation_tol, max_degree, margin, layout, n_samples, mode, json_path) -> None:
    from fhe.ckks.compare import compare_ckks

    _, data, compiled = _ckks_compile(model_path, data_dir, n_calib, poly_modulus_degree, scale_bits, refresh,
                                      reciprocal_tol, activation_tol, max_degree, margin, layout,
                                      simulate_only=mode == "simulate")
    x, y = data.x_test[:n_samples], data.y_test[:n_samples].numpy()
    result = compare_ckks(compiled, x, y, execute=mode == "execute", progress=lambda m: click.echo(m, err=True))
    for k, v in result.items():
        click.echo(f"{k:>24}: {v}")
    if json_path:
        json_path.write_text(json.dumps(result, indent=2))


@main.command()
@click.option("--seq-lens", default="2,4,8,16", show_default=True)
@click.option("--d", type=int, default=2, show_default=True, help="Head dimension.")
@click.option("--n-bits", type=int, default=6, show_default=True)
@click.option("--lut-bits", type=int, default=5, show_default=True,
              help="Round lookup inputs to N bits (0: off; unrounded dot-product circuits find no parameters).")
@click.option("--variants", default="inhibitor,dot-product", show_default=True,
              help="Comma list of inhibitor, signed-inhibitor, dot-product, power-softmax, dct, geglu.")
@click.option("--mode", type=click.Choice(["simulate", "execute"]), default="execute", show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True, help="Encrypted runs per circuit (median).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("reports"), show_default=True,
              help="Folder for the Markdown, JSON and PNG (benchmarks/tfhe_attention.py writes benchmarks/results).")
@click.option("--stem", default=None, help="File name stem (default tfhe_attention / ckks_attention).")
@click.option("--scheme", type=click.Choice(SCHEMES), default="tfhe", show_default=True,
              help="ckks: one-block models per kind and T, both layouts (depth, operations, keys, latency).")
@click.option("--layouts", default="batch,packed", show_default=True, help="CKKS: layouts to plan.")
def report(seq_lens, d, n_bits, lut_bits, variants, mode, repeats, out_dir, stem, scheme, layouts) -> None:
    """Sweep attention over sequence lengths: TFHE single-head circuits (PBS, bit widths, crypto parameters,
    keygen and encrypted run time) or, with --scheme ckks, one-block models per attention kind (depth,
    operations, Galois keys, estimated latency; --mode execute runs the packed ones). Markdown, JSON, PNG."""
    try:
        lens = [int(t) for t in seq_lens.split(",")]
    except ValueError:
        raise click.UsageError(f"--seq-lens must be a comma-separated list of integers, got {seq_lens!r}") from None
    if scheme == "ckks":
        from circuits import ckks_sweep

        kinds = variants.split(",") if variants != "inhibitor,dot-product" else list(ckks_sweep.KINDS)
        bad = [k for k in kinds if k not in ckks_sweep.KINDS]
        if bad:
            raise click.UsageError(f"--variants for CKKS: {', '.join(ckks_sweep.KINDS)}; got {', '.join(bad)}")
        command = "fhe " + " ".join(sys.argv[1:])
        reps = ckks_sweep.sweep(kinds, lens, tuple(layouts.split(",")), execute=mode == "execute",
                                progress=lambda m: click.echo(f"  {m} ...", err=True),
                                on_row=lambda rows: ckks_sweep.write(rows, out_dir, stem or "ckks_attention", command))
        paths = ckks_sweep.write(reps, out_dir, stem or "ckks_attention", command)
        click.echo(paths["md"].read_text())
        click.echo(f"wrote {paths['md']}, {paths['json']}, {paths['png']}")
        return
    from circuits.report import write
    from circuits.sweep import sweep

    stem = stem or "tfhe_attention"
    try:
        names = variants.split(",")
        reports = sweep(names, lens, d, n_bits, lut_bits or None, execute=mode == "execute", repeats=repeats,
                        progress=lambda spec: click.echo(f"  {spec.name} ...", err=True))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    paths = write(reports, out_dir, stem, "fhe " + " ".join(sys.argv[1:]))
    click.echo(paths["md"].read_text())
    click.echo(f"wrote {paths['md']}, {paths['json']}, {paths['png']}")


@main.command()
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--keys-dir", type=click.Path(path_type=Path), default=None,
              help="Where uploaded keys are stored (default: uploaded_keys/ next to the server folder).")
@click.option("--max-payload-mb", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--max-keys-mb", type=click.IntRange(min=1), default=8192, show_default=True)
def serve(artifact_dir, host, port, keys_dir, max_payload_mb, max_keys_mb) -> None:
    """Serve encrypted inference over HTTP from ARTIFACT_DIR's server artifact (never a secret key)."""
    from fhe.deploy.server import serve as run_server
    from fhe.errors import FheError

    try:
        run_server(artifact_dir, host, port, keys_dir, max_payload_bytes=max_payload_mb << 20,
                   max_keys_bytes=max_keys_mb << 20)
    except FheError as exc:
        raise click.ClickException(str(exc)) from exc


@main.command(name="client")
@click.argument("client_dir", type=click.Path(path_type=Path))
@click.option("--url", default="http://127.0.0.1:8000", show_default=True)
@click.option("--sample", type=int, default=None, help="Index into the task's test split.")
@click.option("--input", "input_path", type=click.Path(path_type=Path), default=None,
              help="A .npy file with one input (the model's input shape, floats).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
def client_cmd(client_dir, url, sample, input_path, data_dir) -> None:
    """Encrypt an input with CLIENT_DIR's keys, have the service at --url run it, decrypt the answer."""
    import httpx

    from fhe.deploy.client import Client
    from fhe.errors import FheError
    from models.tasks import load_task

    if (sample is None) == (input_path is None):
        raise click.UsageError("give exactly one of --sample N or --input FILE.npy")
    try:
        client = Client(client_dir, url)
        if input_path is not None:
            x, label = _read_input(input_path), None
        else:
            meta = client.meta
            data = load_task(meta["task"], data_dir=data_dir, seq_len=meta["seq_len"], patch=meta.get("patch"))
            if not 0 <= sample < len(data.x_test):
                raise click.UsageError(f"--sample must be in [0, {len(data.x_test) - 1}], got {sample}")
            x, label = data.x_test[sample].numpy(), int(data.y_test[sample])
        if client.scheme == "ckks":
            x = x[None]
        client.upload_keys()
        result = client.predict(x)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc} (is `fhe serve` running?)") from exc
    except (FheError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    logits = np.asarray(result.logits).reshape(-1)
    click.echo(f"prediction {int(logits.argmax())}" + ("" if label is None else f" (label {label})") +
               f"; round trip {result.round_trip_s:.2f} s, server {result.server_s:.2f} s; "
               f"logits {np.round(logits, 3).tolist()}")


def _read_input(path: Path) -> np.ndarray:
    if path.suffix != ".npy":
        raise click.UsageError(f"--input must be a .npy file, got {path.name}")
    try:
        return np.load(path, allow_pickle=False).astype(np.float64)
    except (OSError, ValueError) as exc:
        raise click.UsageError(f"cannot read {path}: {exc}") from exc


def entry() -> None:
    """The ``fhe`` console script: :func:`main`, leaving with the status it meant.

    After an encrypted Concrete run, the interpreter's normal shutdown turns every exit status into 0
    (tests/test_exit_codes.py), so a failed command would look successful to a script or CI. This runs
    the click group, prints what click or Python would print, then flushes and calls ``os._exit``."""
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
