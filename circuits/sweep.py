"""Compile, key and run attention circuits over sequence lengths: the Inhibitor paper's Tables 2 and
4."""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from circuits.attention import CircuitSpec, attention_kind, build
from fhe.schemes import TfheParams
from fhe.tfhe.backend import TfheBackend
from quant.config import QuantConfig


@dataclass
class CircuitReport:
    variant: str
    seq_len: int
    d: int
    n_bits: int
    lut_bits: int | None
    pbs_count: int
    pbs_per_tag: dict[str, int]
    max_bit_width: int
    bit_width_per_tag: dict[str, int]
    params: dict
    key_sizes_bytes: dict[str, int]
    compile_s: float
    keygen_s: float | None = None
    run_s: list[float] = field(default_factory=list)
    run_median_s: float | None = None
    exact: bool | None = None  # encrypted output == clear integer program on every tested input
    max_abs_error_vs_float: float | None = None
    peak_rss_mib: float | None = None
    error: str | None = None  # why Concrete could not compile or run it

    def to_dict(self) -> dict:
        return asdict(self)


def measure(
    spec: CircuitSpec, execute: bool = True, repeats: int = 3, params: TfheParams | None = None
) -> CircuitReport:
    """Builds, compiles and (with ``execute``) keys and runs one circuit ``repeats`` times on inputs
    drawn from its inputset, checking every encrypted output against the clear integer program."""
    built = build(spec)
    params = params or TfheParams(
        quant=QuantConfig(n_bits=spec.n_bits), inputset_size=len(built.calib_ints)
    )
    backend = TfheBackend.compile(
        built.graph,
        built.calib_ints,
        params,
        meta={"seq_len": spec.seq_len},
        simulate_only=not execute,
    )
    rep = backend.report()
    out = CircuitReport(
        spec.variant.value,
        spec.seq_len,
        spec.d,
        spec.n_bits,
        spec.lut_bits,
        rep["pbs_count"],
        rep["pbs_per_tag"],
        rep["max_bit_width"],
        rep["bit_width_per_tag"],
        rep["params"],
        rep["key_sizes_bytes"],
        rep["timings_s"]["compile"],
    )
    xs = built.calib_ints[:repeats]
    clear, _ = built.graph.run(xs)
    out.max_abs_error_vs_float = float(
        np.abs(clear * np.asarray(built.output_scale) - built.reference(xs)).max()
    )
    if execute:
        backend.keygen()
        out.keygen_s = backend.timings_s["keygen"]
        exact = True
        for x, want in zip(xs, clear, strict=True):
            got = backend.encrypt_run_decrypt(x)
            out.run_s.append(backend.timings_s["run"])
            exact &= bool(np.array_equal(got, want))
        out.exact = exact
        out.run_median_s = statistics.median(out.run_s)
    else:
        sims = np.stack([backend.simulate(x) for x in xs])
        out.exact = bool(np.array_equal(sims, clear))
    out.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    backend.circuit.cleanup()
    return out


def failed(spec: CircuitSpec, error: str) -> CircuitReport:
    return CircuitReport(
        spec.variant.value,
        spec.seq_len,
        spec.d,
        spec.n_bits,
        spec.lut_bits,
        0,
        {},
        0,
        {},
        {},
        {"evaluation": 0},
        0.0,
        error=error,
    )


def sweep(
    variants: list[str],
    seq_lens: list[int],
    d: int = 2,
    n_bits: int = 6,
    lut_bits: int | None = None,
    execute: bool = True,
    repeats: int = 3,
    progress=None,
) -> list[CircuitReport]:
    jobs = [
        CircuitSpec(attention_kind(v), t, d, n_bits, lut_bits) for t in seq_lens for v in variants
    ]
    reports = []
    for spec in jobs:
        if progress:
            progress(spec)
        start = time.perf_counter()
        try:
            reports.append(measure(spec, execute, repeats))
        except RuntimeError as exc:  # Concrete's NoParametersFound and friends: report, go on
            reports.append(failed(spec, f"{type(exc).__name__}: {exc}"))
        reports[-1].params["wall_s"] = time.perf_counter() - start
    return reports
