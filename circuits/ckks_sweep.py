"""Attention kinds under CKKS per sequence length: depth, operations, keys and latency, both
layouts.

For each kind and T a one-block model (random weights, calibrated on N(0, 1) inputs: what an
untrained model's intervals give, not a trained one's) is compiled to its polynomial program; the
clear plan gives depth, N, every operation count and the Galois keys exactly, for the batch layout
(N/2 samples per run) and, where it exists, the packed one (one query). Latency is estimated from
those counts and SEAL operation costs measured in the same run at the planned N with all its primes:
an upper bound, since operations at lower levels are cheaper; the costs are CPU time of one core
(robust to a loaded machine). ``execute`` runs the packed programs encrypted too.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import tenseal as ts
import tenseal.sealapi as sa
import torch

from fhe.ckks.approx import ApproxConfig, ApproximationError
from fhe.ckks.planner import DepthError
from fhe.ckks.program import PolynomialError
from fhe.ckks.seal import galois_keys_memory, make_galois_keys
from fhe.harness import compile_model
from fhe.schemes import CkksLayout, CkksParams
from models.config import Activation, AttentionKind, NormKind, PowerForm, TransformerConfig
from models.transformer import Transformer

# the default sweep: one representative per family (the signed Inhibitor and the Activator share
# their family's lowering); every kind with a registered polynomial lowering can be asked for
DEFAULT_KINDS = ("power-softmax", "dot-product", "inhibitor", "dct", "geglu-only")


def known_kinds() -> list[str]:
    """The kinds with a polynomial lowering (fhe/ckks/mixers/ registers them)."""
    from fhe.ckks.mixers import registered_poly_mixers

    return [k.value for k in registered_poly_mixers()]


@dataclass
class CkksKindReport:
    kind: str
    seq_len: int
    layout: str
    depth: int | None = None
    poly_modulus_degree: int | None = None
    scale_bits: int | None = None
    client_refreshes: int | None = None
    ct_ct_mul: int | None = None
    ct_pt_mul: int | None = None
    rotations: int | None = None
    rescales: int | None = None
    galois_keys: int | None = None
    key_mib: float | None = None  # relinearisation + Galois keys held by the server
    samples_per_run: int | None = None
    estimated_run_s: float | None = None
    measured_run_s: float | None = None
    max_abs_error: float | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


_COSTS: dict[tuple[int, tuple[int, ...]], dict[str, float]] = {}


def op_costs(n: int, bit_sizes: tuple[int, ...], repeats: int = 3) -> dict[str, float]:
    """Seconds per SEAL operation at ring size n with this chain of primes (at its top level),
    measured here."""
    bit_sizes = tuple(bit_sizes)
    if (n, bit_sizes) in _COSTS:
        return _COSTS[(n, bit_sizes)]
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS, poly_modulus_degree=n, coeff_mod_bit_sizes=list(bit_sizes)
    )
    seal = ctx.seal_context().data
    ev, enc = sa.Evaluator(seal), sa.CKKSEncoder(seal)
    pt, ct = sa.Plaintext(), sa.Ciphertext()
    enc.encode(np.random.default_rng(0).random(n // 2).tolist(), 2.0 ** bit_sizes[1], pt)
    sa.Encryptor(seal, ctx.public_key().data).encrypt(pt, ct)
    keys = make_galois_keys(ctx, [1], n)
    relin = ctx.relin_keys().data

    def timed(
        fn,
    ) -> float:  # this process's CPU time: SEAL runs one operation on one core, so a loaded
        start = (
            time.process_time()
        )  # machine (other jobs, a niced sweep) does not inflate the estimate
        for _ in range(repeats):
            fn()
        return (time.process_time() - start) / repeats

    def mul():
        out = sa.Ciphertext()
        ev.multiply(ct, ct, out)
        ev.relinearize_inplace(out, relin)
        ev.rescale_to_next_inplace(out)

    def rot():
        ev.rotate_vector(ct, 1, keys, sa.Ciphertext())

    def mul_plain():
        ev.multiply_plain(ct, pt, sa.Ciphertext())

    def rescale():
        out = sa.Ciphertext()
        ev.multiply_plain(ct, pt, out)
        ev.rescale_to_next_inplace(out)

    plain_s = timed(mul_plain)
    _COSTS[(n, bit_sizes)] = {
        "ct_ct_mul": timed(mul),
        "rotation": timed(rot),
        "ct_pt_mul": plain_s,
        "rescale": max(timed(rescale) - plain_s, 0.0),
    }
    return _COSTS[(n, bit_sizes)]


def model_for(
    kind: str, seq_len: int, d_model: int, n_heads: int, features: int = 8, n_outputs: int = 10
):
    cfg = TransformerConfig(
        seq_len=seq_len,
        in_features=features,
        n_outputs=n_outputs,
        attention=AttentionKind(kind),
        d_model=d_model,
        n_heads=n_heads,
        norm=NormKind.NONE,
        ffn_activation=Activation.GELU,
        power_form=PowerForm.LENGTH_AGNOSTIC,
        power_eps=0.5,
    )  # ε: untrained scores are wide
    torch.manual_seed(0)
    return Transformer(cfg).double().eval()


PACKED_SCALES = (38, 33, 30)  # without refresh, a deeper packed program trades precision for levels


def _compile(model, calib, layout: str, approx: ApproxConfig):
    """Batch: scale 2^40, labelled refreshes where the chain is too short. Packed (never refreshes):
    the largest scale in PACKED_SCALES whose chain holds the program."""
    if layout == "batch":
        params = CkksParams(layout=CkksLayout(layout), approx=approx, scale_bits=40)
        try:
            return compile_model(model, calib, params)
        except DepthError:
            return compile_model(
                model, calib, params.replace(refresh=True, poly_modulus_degree=32768)
            )
    for bits in PACKED_SCALES[:-1]:
        try:
            return compile_model(
                model, calib, CkksParams(layout=CkksLayout(layout), approx=approx, scale_bits=bits)
            )
        except DepthError:
            pass
    return compile_model(
        model,
        calib,
        CkksParams(layout=CkksLayout(layout), approx=approx, scale_bits=PACKED_SCALES[-1]),
    )


def measure(
    kind: str,
    seq_len: int,
    layout: str,
    d_model: int = 16,
    n_heads: int = 2,
    approx: ApproxConfig | None = None,
    execute: bool = False,
) -> CkksKindReport:
    rep = CkksKindReport(kind, seq_len, layout)
    model = model_for(kind, seq_len, d_model, n_heads)
    calib = torch.randn(
        300 if seq_len <= 16 else 64, seq_len, model.config.in_features, dtype=torch.float64
    )
    approx = approx or ApproxConfig(reciprocal_tol=0.05, activation_tol=0.05)
    try:
        compiled = _compile(model, calib, layout, approx)
    except (PolynomialError, ApproximationError, DepthError, ValueError) as exc:
        rep.error = str(exc).split(";")[0][:160]
        return rep
    r = compiled.report()
    ops, n = r["op_counts"], r["poly_modulus_degree"]
    n_primes = len(r["coeff_mod_bit_sizes"])
    rep.depth, rep.poly_modulus_degree, rep.scale_bits = (
        r["program_depth_without_refresh"],
        n,
        r["scale_bits"],
    )
    rep.client_refreshes, rep.ct_ct_mul, rep.ct_pt_mul = (
        ops["client_refresh"],
        ops["ct_ct_mul"],
        ops["ct_pt_mul"],
    )
    rep.rotations, rep.rescales = ops["rotation"], ops["rescale"]
    rep.galois_keys = r.get("galois_keys_count", 0)
    relin = galois_keys_memory(
        1, n, n_primes
    )  # a relinearisation key is one key-switching key, as a Galois key
    rep.key_mib = (relin + galois_keys_memory(rep.galois_keys, n, n_primes)) / 2**20
    rep.samples_per_run = 1 if layout == "packed" else n // 2
    costs = op_costs(n, r["coeff_mod_bit_sizes"])
    rep.estimated_run_s = sum(costs[k] * ops[k] for k in costs)
    if execute and layout == "packed":
        x = torch.randn(1, seq_len, model.config.in_features, dtype=torch.float64).numpy()
        compiled.keygen()
        got = compiled.encrypt_run_decrypt(x)
        rep.measured_run_s = compiled.backend.timings_s["run"]
        rep.max_abs_error = float(np.abs(got - compiled.clear(x)).max())
    return rep


def sweep(
    kinds,
    seq_lens,
    layouts=("batch", "packed"),
    execute: bool = False,
    progress=None,
    on_row=None,
    **kw,
) -> list[CkksKindReport]:
    """Every kind × T × layout; ``on_row(rows so far)`` after each (e.g. to write partial results:
    the Inhibitor's clear plan at T = 128 alone takes tens of minutes)."""
    from fhe.ckks.mixers import registered_packed_mixers

    packed_kinds = {k.value for k in registered_packed_mixers()}

    out = []
    for kind in kinds:
        for t in seq_lens:
            for layout in layouts:
                if layout == "packed" and kind not in packed_kinds:
                    out.append(
                        CkksKindReport(
                            kind, t, layout, error="no packed lowering yet (batch layout only)"
                        )
                    )
                else:
                    if progress:
                        progress(f"{kind} T={t} {layout}")
                    out.append(measure(kind, t, layout, execute=execute, **kw))
                if on_row:
                    on_row(out)
    return out


def markdown(reports: list[CkksKindReport], command: str) -> str:
    lines = [
        "# Attention kinds under CKKS per sequence length",
        "",
        f"Command: `{command}`",
        "",
        "One block (d_model 16, 2 heads, GELU FFN, no norm), random weights calibrated on N(0, 1) "
        "inputs (300 of them up to T = 16, 64 beyond), tolerances 0.05, PowerSoftmax ε = 0.5. "
        "Counts, depth and keys are the clear plan's (equal to an encrypted run's). Estimated "
        "run: counts × SEAL operation costs (CPU time on one core) measured in this run at the "
        "top level of the planned chain (an upper bound). Batch: one run serves N/2 samples; "
        "packed: one query. Keys: relinearisation + Galois keys in server memory. Scale: 2^40 "
        f"batch; packed (no refresh) the largest of 2^{PACKED_SCALES} whose chain holds the "
        "program.",
        "",
        "| kind | T | layout | depth | N | scale bits | refreshes | ct×ct | ct×pt | rotations "
        "| Galois keys | keys (MiB) | samples/run | est. run (s) | measured run (s) "
        "| max abs error |",
        "|" + "---|" * 16,
    ]
    for r in reports:
        if r.error:
            lines.append(f"| {r.kind} | {r.seq_len} | {r.layout} | {r.error} |" + " |" * 12)
            continue
        meas = "—" if r.measured_run_s is None else f"{r.measured_run_s:.2f}"
        err = "—" if r.max_abs_error is None else f"{r.max_abs_error:.1e}"
        lines.append(
            f"| {r.kind} | {r.seq_len} | {r.layout} | {r.depth} | {r.poly_modulus_degree} | "
            f"{r.scale_bits} | {r.client_refreshes} | {r.ct_ct_mul} | {r.ct_pt_mul} | "
            f"{r.rotations} | {r.galois_keys} | {r.key_mib:.0f} | {r.samples_per_run} | "
            f"{r.estimated_run_s:.1f} | {meas} | {err} |"
        )
    return "\n".join(lines) + "\n"


def plot(reports: list[CkksKindReport], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for kind, layout in sorted({(r.kind, r.layout) for r in reports}):
        rs = sorted(
            (r for r in reports if (r.kind, r.layout) == (kind, layout) and not r.error),
            key=lambda r: r.seq_len,
        )
        if not rs:
            continue
        style = "-" if layout == "batch" else "--"
        ts_ = [r.seq_len for r in rs]
        axes[0].plot(ts_, [r.depth for r in rs], style, marker="o", label=f"{kind} ({layout})")
        axes[1].plot(
            ts_,
            [(r.estimated_run_s or 0.0) / (r.samples_per_run or 1) for r in rs],  # set (no error)
            style,
            marker="o",
            label=f"{kind} ({layout})",
        )
    axes[0].set(xlabel="sequence length T", ylabel="multiplicative depth", title="depth")
    axes[1].set(
        xlabel="sequence length T",
        ylabel="seconds per sample (estimated)",
        title="latency / sample",
        yscale="log",
    )
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(reports: list[CkksKindReport], out_dir, stem: str, command: str) -> dict:
    import json
    from pathlib import Path

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "md": out_dir / f"{stem}.md",
        "json": out_dir / f"{stem}.json",
        "png": out_dir / f"{stem}.png",
    }
    paths["md"].write_text(markdown(reports, command))
    costs = {f"N={n},primes={len(b)}x{b[1]}b": c for (n, b), c in _COSTS.items()}
    paths["json"].write_text(
        json.dumps({"reports": [r.to_dict() for r in reports], "op_costs_s": costs}, indent=2)
    )
    plot(reports, paths["png"])
    return paths
