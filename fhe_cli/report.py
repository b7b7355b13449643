"""``fhe report``: attention circuits per sequence length (the study lives in
:mod:`circuits`, above :mod:`fhe`; this command is the one place that joins them), or, given a
trained text model, that model's cost per sequence length under both schemes
(:mod:`fhe.api.lengths`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fhe_cli._common import echo_err, library_errors
from fhe_cli.fhe_options import SCHEMES


@click.command()
@click.argument("model_path", required=False, type=click.Path(path_type=Path))
@click.option(
    "--seq-lens", default=None, help="Comma list of T [circuits: 2,4,8,16; a model: 16,32,64,128]."
)
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
    default=None,
    help="Comma list of attention kinds (TFHE: inhibitor, signed-inhibitor, dot-product, "
    "power-softmax, dct, geglu-only; default inhibitor,dot-product. CKKS: every kind with a "
    "polynomial lowering; default one per family).",
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
    default=None,
    help="Circuits: tfhe (default) or ckks (one-block models per kind and T, both layouts: depth, "
    "operations, keys, latency). A model: both unless one is named.",
)
@click.option("--layouts", default="batch,packed", show_default=True, help="CKKS: layouts to plan.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="A model's data.")
@click.option(
    "--budget",
    type=float,
    default=1800.0,
    show_default=True,
    help="A model: run one encrypted sample per T when it is estimated to take at most this many "
    "seconds (else the estimate, labelled).",
)
def report(
    model_path,
    seq_lens,
    d,
    n_bits,
    lut_bits,
    variants,
    mode,
    repeats,
    out_dir,
    stem,
    scheme,
    layouts,
    data_dir,
    budget,
) -> None:
    """Sweep attention over sequence lengths: TFHE single-head circuits (PBS, bit widths, crypto
    parameters, keygen and encrypted run time) or, with --scheme ckks, one-block models per
    attention kind (depth, operations, Galois keys, estimated latency; --mode execute runs the
    packed ones). Given MODEL_PATH (a text model trained with --words): that model's cost per T
    under both schemes, run once encrypted where it fits. Markdown, JSON, PNG."""
    from circuits.study import parse_seq_lens, study

    if model_path is not None:
        if variants:
            raise click.UsageError("--variants is for circuits; a model file has its own kind")
        _model_report(
            model_path,
            parse_seq_lens(seq_lens or "16,32,64,128"),
            scheme,
            data_dir,
            mode == "execute",
            budget,
            out_dir,
            stem,
        )
        return
    seq_lens, scheme = seq_lens or "2,4,8,16", scheme or "tfhe"
    try:
        paths = study(
            scheme,
            variants.split(",") if variants else None,
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
            progress=echo_err,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(paths["md"].read_text())
    click.echo(f"wrote {paths['md']}, {paths['json']}, {paths['png']}")


@library_errors
def _model_report(model_path, seq_lens, scheme, data_dir, execute, budget, out_dir, stem) -> None:
    from fhe.api import lengths
    from fhe.schemes import Scheme

    schemes = (Scheme(scheme),) if scheme else (Scheme.TFHE, Scheme.CKKS)
    rows = lengths.cost_per_length(
        model_path, seq_lens, schemes, data_dir, execute, budget, on_message=echo_err
    )
    name = Path(model_path).stem
    paths = lengths.write(
        rows, out_dir, stem or f"{name}_per_length", name, "fhe " + " ".join(sys.argv[1:])
    )
    click.echo(paths["md"].read_text())
    click.echo(f"wrote {paths['md']}, {paths['json']}, {paths['png']}")
