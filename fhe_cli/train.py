"""``fhe train``: train a model on a task (float, then optionally QAT through its integer
program) and save it."""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from fhe.api.recipes import Recipe
from fhe_cli._common import json_object, library_errors, write_json
from models.config import Activation, AttentionKind, NormKind

KINDS = [k.value for k in AttentionKind]


@click.command()
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
@click.option(
    "--recipe",
    type=click.Choice([r.value for r in Recipe]),
    default=None,
    help="A named recipe for the task (digits: tfhe, the make demo model compiled under TFHE; "
    "ckks, the shallow polynomial one): it sets every option you do not give.",
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
    "--mask-padding/--no-mask-padding",
    default=True,
    show_default=True,
    help="Token inputs (imdb): no attention reads a padding key, so a padded review gives the "
    "logits of the unpadded one (dot-product, Inhibitor kinds, PowerSoftmax).",
)
@click.option(
    "--causal",
    is_flag=True,
    help="Query i attends keys j <= i only (PowerSoftmax paper Eq. 11's mask; dot-product, "
    "Inhibitor kinds, PowerSoftmax).",
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
    callback=lambda ctx, param, value: json_object(param, value),
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
