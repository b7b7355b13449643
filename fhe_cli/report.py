"""``fhe report``: attention circuits per sequence length (the study lives in
:mod:`circuits`, above :mod:`fhe`; this command is the one place that joins them)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fhe_cli._common import echo_err
from fhe_cli.fhe_options import SCHEMES


@click.command()
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
