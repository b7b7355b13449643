"""Cost reports as text a person reads (what ``fhe compile`` prints): one function per scheme."""

from __future__ import annotations

from fhe.schemes import Scheme


def format_report(rep: dict) -> str:
    """``CompiledModel.report()`` as aligned rows, then the per-stage table (TFHE) or levels
    (CKKS)."""
    return (
        format_tfhe_report(rep) if Scheme(rep["scheme"]) is Scheme.TFHE else format_ckks_report(rep)
    )


def _rows(rows: list[tuple[str, object]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [f"  {k:<{width}}  {v}" for k, v in rows]


def format_tfhe_report(rep: dict) -> str:
    rows = [
        ("scheme", rep["scheme"]),
        ("seq_len", rep["seq_len"]),
        ("n_bits", rep["n_bits"]),
        ("PBS", rep["pbs_count"]),
        ("max bit width", rep["max_bit_width"]),
        ("rounding", "exact" if rep["exact_rounding"] else "approximate"),
        ("ranges", ranges_line(rep)),
    ]
    rows += [(f"params.{k}", v) for k, v in rep["params"].items()]
    rows += [(f"keys.{k} (MiB)", f"{v / 2**20:.1f}") for k, v in rep["key_sizes_bytes"].items()]
    rows += [
        (f"time.{k} (s)", "—" if v is None else f"{v:.3f}") for k, v in rep["timings_s"].items()
    ]
    rows += [("est. latency (s)", f"{rep['estimated_latency_s']:.1f}")]
    lines = _rows(rows)
    lines += [
        "",
        "  | stage | PBS | lookup input bits | max width | parameter sets (PBS each) | est. time "
        "share |",
        "  |---|---|---|---|---|---|",
    ]
    for r in rep["stages"]:
        params = "; ".join(f"{p}: {n}" for p, n in r["params"].items()) or "—"
        lines.append(
            f"  | {r['tag']} | {r['pbs']} | {r['lookup_input_bits'] or '—'} | {r['bit_width']} | "
            f"{params} | {100 * r['est_time_share']:.1f}% |"
        )
    return "\n".join(lines)


def ranges_line(rep: dict) -> str:
    """How the TFHE bit widths were fixed, and what that means for inputs unlike the calibration
    set."""
    if rep["ranges"] == "proven":
        return "proven (no accepted input can overflow)"
    risks = rep["overflow_risks"]
    if not risks:
        return "calibrated (proven safe for every accepted input)"
    return (
        f"calibrated: {len(risks)} node(s) can overflow on inputs unlike the calibration set (e.g. "
        f"{risks[0]['node']}: {risks[0]['calibrated_bits']} -> {risks[0]['proven_bits']} bits); "
        "the client refuses such inputs; --ranges proven rules them out"
    )


def _chain_rows(rep: dict) -> list[tuple[str, object]]:
    """The modulus chain: TenSEAL's one chain (and its refreshes), or OpenFHE's with bootstraps."""
    if rep.get("engine") != "openfhe":
        return [
            ("poly_modulus_degree", rep["poly_modulus_degree"]),
            ("coeff_mod_bit_sizes", rep["coeff_mod_bit_sizes"]),
            ("scale_bits", rep["scale_bits"]),
            ("security_bits", rep["security_bits"]),
            ("slots (samples per ciphertext)", rep["slots"]),
            ("client-assisted refresh", rep["client_assisted_refresh"]),
            ("program depth without refresh", rep["program_depth_without_refresh"]),
        ]
    security = "INSECURE test ring" if rep["insecure_test_parameters"] else rep["security_bits"]
    per_stage = ", ".join(f"{t} {n}" for t, n in rep["bootstraps_per_stage"].items()) or "none"
    levels = rep.get("bootstrap_entry_levels", {})  # absent from reports saved before the search
    entry = ", ".join(f"{t} {k}" for t, k in levels.items()) or "none (just in time)"
    return [
        ("engine", "openfhe"),
        ("ring dimension", rep["poly_modulus_degree"]),
        ("security_bits", security),
        ("scale_bits / first prime bits", f"{rep['scale_bits']} / {rep['first_mod_bits']}"),
        ("slots", rep["slots"]),
        ("chain depth", rep["chain_depth"]),
        ("levels after a bootstrap", rep["levels_after_bootstrap"]),
        # absent from reports saved before: a query was encoded with a bootstrap's levels
        (
            "levels of a fresh query",
            rep.get("levels_of_a_fresh_query", rep["levels_after_bootstrap"]),
        ),
        ("levels one bootstrap uses", rep["bootstrap_depth"]),
        (
            "bootstrap level budget / baby steps (0: OpenFHE's)",
            f"{rep['level_budget']} / {rep.get('bootstrap_baby_steps', [0, 0])}",
        ),
        ("bootstraps (server-side)", rep["bootstraps"]),
        ("bootstraps per stage", per_stage),
        ("stages renewed on entry (level >)", entry),
        ("1/x renews y alone, rebuilds e = 1 - a*y", rep.get("goldschmidt_rebuild", False)),
        ("largest |input| of a bootstrap", max(rep["bootstrap_input_peaks"], default=0)),
        ("bootstraps above |x| = 16 (less precise)", rep["bootstraps_beyond_flat_error"]),
    ]


def format_ckks_report(rep: dict) -> str:
    rows = [
        ("scheme", rep["scheme"]),
        ("layout", rep["layout"]),
        ("layout, why", rep["layout_reason"]),
        ("seq_len", rep["seq_len"]),
        ("depth", rep["depth"]),
        *([("engine, why", rep["engine_reason"])] if "engine_reason" in rep else []),
        *_chain_rows(rep),
    ]
    if rep["layout"] == "packed":
        rows += [("rotation steps (one Galois key each)", len(rep["rotation_steps"]))]
    if rep.get("rotation_keys_made") is not None:  # OpenFHE, after keygen
        rows += [("rotation keys made (bootstrap's and program's)", rep["rotation_keys_made"])]
    rows += [(f"ops.{k}", v) for k, v in rep["op_counts"].items()]
    rows += [(f"keys.{k} (MiB)", f"{v / 2**20:.1f}") for k, v in rep["key_sizes_bytes"].items()]
    rows += [(f"time.{k} (s)", f"{v:.3f}") for k, v in rep["timings_s"].items()]
    lines = _rows(rows)
    lines.append(
        "  level after each stage: "
        + ", ".join(f"{t} {d}" for t, d in rep["depth_per_tag"].items())
    )
    for name, op in rep["approximations"].items():
        detail = (
            f"{op['iterations']} iterations"
            if "iterations" in op
            else f"degree {op['degree']}, max error {op['max_error']:.3g}"
        )
        lines.append(
            f"  {name}: calibrated [{op['calibrated'][0]:.4g}, {op['calibrated'][1]:.4g}], {detail}"
        )
    return "\n".join(lines)
