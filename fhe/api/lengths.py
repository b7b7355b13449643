"""``fhe report MODEL --seq-lens``: one trained text model's cost per sequence length T, under
both schemes.

A text model trained with ``--words`` reads its words into T segments on the client
(:mod:`models.text`), so the same weights run at any T: only the positions change, linearly
interpolated from the trained ones. Each T is compiled as ``fhe compile`` would (calibrated on the
task's data at that T) and, where it fits, run once encrypted:

1. TFHE is pre-flighted on the integer program first (its PBS count, no Concrete compile): a
   circuit above ``max_compile_pbs`` is not compiled and its latency is extrapolated from the
   largest compiled T by PBS count, labelled so;
2. a compiled circuit is run when its estimated latency is within ``budget_s`` and its keys fit in
   memory (the keygen pre-flight), otherwise its estimate is reported, labelled so.

The accuracy of a T other than the trained one is not reported: the interpolated positions were
never trained at that T. What the table answers is the cost of this architecture and these weights
per T.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from fhe.api._common import Echo, silent
from fhe.errors import BadOptionError, FheError
from fhe.schemes import LayoutOption, Scheme

MAX_COMPILE_PBS = (
    40_000  # Concrete's compile of a larger circuit needs more memory than 24 GB holds
)
BUDGET_S = 1800.0  # run one encrypted sample when it is estimated to take at most this long
# the pre-flight's calibration: the lookups' count does not depend on it, their widths little, and
# at T = 128 the full calibration set's attention tensors alone would take gigabytes
PREFLIGHT_SAMPLES = 256


class Status(str, Enum):
    MEASURED = "measured"
    ESTIMATED = "compiled, latency estimated"
    EXTRAPOLATED = "pre-flight only"  # PBS counted; latency extrapolated from a compiled T, if any
    STOPPED = "stopped"


@dataclass(frozen=True)
class LengthCost:
    """One (scheme, T) row: what the compiled program costs and, where run, what it took."""

    scheme: Scheme
    seq_len: int
    status: Status
    pbs: int | None = None  # TFHE
    max_lut_bits: int | None = None  # TFHE: the widest lookup's input
    depth: int | None = None  # CKKS: multiplicative depth of the packed program
    poly_modulus_degree: int | None = None  # CKKS
    keys_mib: float | None = None  # evaluation keys (TFHE: estimated before keygen)
    estimated_latency_s: float | None = None
    latency_s: float | None = None  # one encrypted sample, measured
    max_error: float | None = None  # encrypted vs clear program (TFHE: 0 means equal)
    compile_s: float | None = None
    note: str = ""


def resized_text_model(model, seq_len: int):
    """``model`` (a token model trained with ``words``) at ``seq_len`` segments: the same weights,
    the positions linearly interpolated."""
    from torch.nn import functional as F

    from models.transformer import Transformer

    cfg = model.config
    if not cfg.words:
        raise BadOptionError(
            "--seq-lens on a model file needs a text model trained with --words (its T is the "
            "client's segment count); an image model's T is fixed by its image"
        )
    if seq_len > cfg.words:
        raise BadOptionError(f"T={seq_len} is more segments than the model's {cfg.words} words")
    resized = Transformer(cfg.replace(seq_len=seq_len))
    state = model.state_dict()
    pos = state["pos"].T[None]  # (1, C, T0)
    state["pos"] = F.interpolate(pos, size=seq_len, mode="linear", align_corners=True)[0].T
    resized.load_state_dict(state)
    return resized.eval()


def cost_per_length(
    model_path: str | Path,
    seq_lens: list[int],
    schemes: tuple[Scheme, ...] = (Scheme.TFHE, Scheme.CKKS),
    data_dir: str | Path | None = None,
    execute: bool = True,
    budget_s: float = BUDGET_S,
    max_compile_pbs: int = MAX_COMPILE_PBS,
    on_message: Echo = silent,
) -> list[LengthCost]:
    """The rows of ``fhe report MODEL --seq-lens`` (see the module docstring)."""
    from fhe.api.train import load_model_and_task
    from models.training import save_checkpoint

    ckpt, data = load_model_and_task(model_path, data_dir)
    for T in seq_lens:
        resized_text_model(ckpt.model, T)  # refuse a bad T before any work
    rows: list[LengthCost] = []
    with tempfile.TemporaryDirectory(prefix="fhe-lengths-") as tmp:
        for scheme in schemes:
            compiled: list[LengthCost] = []
            for T in seq_lens:
                path = Path(tmp) / f"T{T}.pt"
                save_checkpoint(path, resized_text_model(ckpt.model, T), data, **ckpt.extra)
                on_message(f"{scheme.value} T={T} ...")
                try:
                    row = _one_length(path, scheme, T, data_dir, execute, budget_s, max_compile_pbs)
                except _TooLarge as big:
                    row = _extrapolated(big, compiled, max_compile_pbs)
                except FheError as exc:
                    row = LengthCost(scheme, T, Status.STOPPED, note=str(exc)[:300])
                rows.append(row)
                if row.status in (Status.MEASURED, Status.ESTIMATED):
                    compiled.append(row)
    return rows


class _TooLarge(Exception):
    def __init__(self, row: LengthCost) -> None:
        self.row = row


def _one_length(
    path: Path,
    scheme: Scheme,
    T: int,
    data_dir,
    execute: bool,
    budget_s: float,
    max_compile_pbs: int,
) -> LengthCost:
    from fhe.api.compile import CompileOptions, compile_file, keygen, one_encrypted_sample

    layout = LayoutOption.AUTO if scheme is Scheme.TFHE else LayoutOption.PACKED
    options = CompileOptions(scheme=scheme, data_dir=data_dir, layout=layout)
    bits = None
    if scheme is Scheme.TFHE:
        pbs, bits = _tfhe_preflight(path, data_dir)
        if pbs > max_compile_pbs:
            raise _TooLarge(LengthCost(scheme, T, Status.EXTRAPOLATED, pbs=pbs, max_lut_bits=bits))
    t0 = time.perf_counter()
    c = compile_file(path, options, simulate_only=not execute)
    rep = c.report()
    row = LengthCost(
        scheme,
        T,
        Status.ESTIMATED,
        pbs=rep.get("pbs_count"),
        max_lut_bits=bits,
        depth=rep.get("depth"),
        poly_modulus_degree=rep.get("poly_modulus_degree"),
        estimated_latency_s=rep.get("estimated_latency_s"),
        compile_s=round(time.perf_counter() - t0, 1),
    )
    if scheme is Scheme.TFHE:  # known before keygen (Concrete's circuit sizes)
        row = dataclasses.replace(row, keys_mib=_keys_mib(rep))
    estimate = row.estimated_latency_s
    if not execute or (estimate is not None and estimate > budget_s):
        why = f"estimated above the {budget_s:.0f} s budget: not run" if execute else ""
        return dataclasses.replace(row, note=why)
    keygen(c)
    check = one_encrypted_sample(c)
    return dataclasses.replace(
        row,
        status=Status.MEASURED,
        keys_mib=_keys_mib(c.report()),
        latency_s=check.seconds,
        max_error=check.max_error,
    )


def _keys_mib(report: dict) -> float:
    """The evaluation keys a server holds (TFHE: bootstrap + keyswitch; CKKS: the public context,
    relinearisation and Galois keys), in MiB."""
    sizes = report.get("key_sizes_bytes", {})
    public = ("evaluation", "public_context", "relin_keys", "galois_keys")
    return sum(v for k, v in sizes.items() if k in public) / 2**20


def _tfhe_preflight(path: Path, data_dir) -> tuple[int, int]:
    """(PBS estimate, widest lookup input) of the integer program, without Concrete."""
    from fhe.api.train import load_for_encryption
    from fhe.tfhe.recipe import resolve_quant
    from quant.export import ExportError, export
    from quant.report import program_summary

    inputs = load_for_encryption(path, data_dir)
    ckpt: Any = inputs.checkpoint
    data: Any = inputs.data
    quant = resolve_quant(ckpt.extra.get("quant"))
    try:
        program = export(ckpt.model, data.x_train[:PREFLIGHT_SAMPLES], quant)
    except ExportError as exc:
        raise FheError(str(exc)) from exc
    summary = program_summary(program.graph)
    return int(summary["pbs_estimate"]), int(summary["max_lut_input_bits"])


def _extrapolated(big: _TooLarge, compiled: list[LengthCost], limit: int) -> LengthCost:
    row = big.row
    note = f"{row.pbs} PBS > {limit}: not compiled (Concrete's compile would not fit in memory)"
    refs = [r for r in compiled if r.pbs and r.estimated_latency_s is not None]
    if not refs or not row.pbs:
        return dataclasses.replace(row, note=note)
    ref = refs[-1]  # the largest compiled T
    assert ref.pbs and ref.estimated_latency_s is not None
    keys = f" (its keys: {ref.keys_mib:.0f} MiB)" if ref.keys_mib else ""
    return dataclasses.replace(
        row,
        estimated_latency_s=ref.estimated_latency_s * row.pbs / ref.pbs,
        note=f"{note}; latency from T={ref.seq_len}'s estimate x PBS ratio{keys}",
    )


# ------------------------------------------------------------------------------------------
# writing
def markdown(rows: list[LengthCost], model: str, command: str) -> str:
    def num(v, fmt: str) -> str:
        return "—" if v is None else fmt.format(v)

    lines = [
        f"# Cost per sequence length: `{model}`",
        "",
        f"`{command}`",
        "",
        "The same weights at every T (positions interpolated; accuracy is the trained T's only). "
        "TFHE: PBS and the widest lookup of the integer program; CKKS: the packed program's depth "
        "and ring. Latency: one encrypted sample where `measured`, else the compiler's estimate.",
        "",
        "| scheme | T | status | PBS / depth | widest lookup | keys | latency (est.) | "
        "latency (measured) | enc vs clear | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cost = (
            num(r.pbs, "{} PBS")
            if r.scheme is Scheme.TFHE
            else (f"depth {r.depth}, N={r.poly_modulus_degree}" if r.depth is not None else "—")
        )
        err = (
            "—"
            if r.max_error is None
            else ("equal" if r.scheme is Scheme.TFHE and r.max_error == 0 else f"{r.max_error:.2g}")
        )
        lines.append(
            f"| {r.scheme.value} | {r.seq_len} | {r.status.value} | {cost} | "
            f"{num(r.max_lut_bits, '{} bits')} | {num(r.keys_mib, '{:.0f} MiB')} | "
            f"{num(r.estimated_latency_s, '{:.1f} s')} | {num(r.latency_s, '{:.1f} s')} | {err} | "
            f"{r.note} |"
        )
    return "\n".join(lines) + "\n"


def write(
    rows: list[LengthCost], out_dir: str | Path, stem: str, model: str, command: str
) -> dict[str, Path]:
    """Markdown, JSON and a PNG (latency per T, both schemes, log scale) under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / f"{stem}.{k}" for k in ("md", "json", "png")}
    paths["md"].write_text(markdown(rows, model, command))
    paths["json"].write_text(
        json.dumps(
            {"model": model, "command": command, "rows": [asdict(r) for r in rows]}, indent=2
        )
    )
    _plot(rows, paths["png"])
    return paths


def _plot(rows: list[LengthCost], path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for scheme in sorted({r.scheme for r in rows}):
        for label, key, style in (
            ("measured", "latency_s", "o-"),
            ("estimated", "estimated_latency_s", "x--"),
        ):
            pts = [
                (r.seq_len, getattr(r, key))
                for r in rows
                if r.scheme is scheme and getattr(r, key) is not None
            ]
            if pts:
                t, s = np.array(pts, dtype=float).T
                ax.plot(t, s, style, label=f"{scheme.value} {label}")
    ax.set(xscale="log", yscale="log", xlabel="T (segments)", ylabel="seconds per sample")
    ax.set_xticks(
        sorted({r.seq_len for r in rows}),
        labels=[str(t) for t in sorted({r.seq_len for r in rows})],
    )
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # T's own labels only
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
