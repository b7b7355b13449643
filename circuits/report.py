"""Tables and plots of circuit sweeps: Markdown, JSON and a PNG of cost against sequence length."""

from __future__ import annotations

import json
from pathlib import Path

from circuits.sweep import CircuitReport


def _fmt(v, spec=".2f") -> str:
    return "—" if v is None else format(v, spec)


def markdown(reports: list[CircuitReport], command: str) -> str:
    lines = [
        "# TFHE attention circuits per sequence length (Inhibitor paper, Tables 2 and 4)",
        "",
        f"Command: `{command}`",
        "",
        "Single head, Q|K|V encrypted at n_bits, Concrete's default p_error settings. Run time is "
        "the median over repeats of one encrypted execution; `exact` says every encrypted output "
        "equalled the clear integer program. Peak RSS is the sweep process's high-water mark after "
        "that circuit (circuits run in order of T, so it bounds compile + keygen + runs of the "
        "row's circuit).",
        "",
        "| variant | T | d | n_bits | PBS | max bits | lwe dim | glwe dim | poly size | pbs base "
        "log | pbs level | ks base log | ks level | eval keys (MiB) | compile (s) | keygen (s) | "
        "run (s) | exact | peak RSS (MiB) |",
        "|" + "---|" * 19,
    ]
    for r in reports:
        p = r.params
        if r.error:
            lines.append(
                f"| {r.variant} | {r.seq_len} | {r.d} | {r.n_bits} | failed: {r.error} |"
                + " |" * 14
            )
            continue
        lines.append(
            f"| {r.variant} | {r.seq_len} | {r.d} | {r.n_bits} | {r.pbs_count} | {r.max_bit_width} "
            f"| {p.get('lwe_dimension', '—')} | {p.get('glwe_dimension', '—')} | "
            f"{p.get('polynomial_size', '—')} | {p.get('pbs_base_log', '—')} | "
            f"{p.get('pbs_level', '—')} | {p.get('ks_base_log', '—')} | {p.get('ks_level', '—')} | "
            f"{r.key_sizes_bytes['evaluation'] / 2**20:.0f} | {r.compile_s:.1f} | "
            f"{_fmt(r.keygen_s, '.1f')} | {_fmt(r.run_median_s, '.3f')} | {r.exact} | "
            f"{_fmt(r.peak_rss_mib, '.0f')} |"
        )
    return "\n".join(lines) + "\n"


def ratios(
    reports: list[CircuitReport], base: str = "dot-product", other: str = "inhibitor"
) -> list[dict]:
    """Per T: base/other ratios of PBS and encrypted run time, measured in the same sweep."""
    out = []
    for t in sorted({r.seq_len for r in reports}):
        b = next((r for r in reports if r.seq_len == t and r.variant == base), None)
        o = next((r for r in reports if r.seq_len == t and r.variant == other), None)
        if b is None or o is None or b.error or o.error:
            continue
        row = {
            "seq_len": t,
            "pbs_ratio": b.pbs_count / o.pbs_count,
            "bits": (b.max_bit_width, o.max_bit_width),
        }
        if b.run_median_s and o.run_median_s:
            row["speedup"] = b.run_median_s / o.run_median_s
        out.append(row)
    return out


def write(reports: list[CircuitReport], out_dir: Path, stem: str, command: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(reports, command)
    rat = ratios(reports)
    if rat:
        md += (
            "\n## Dot-product / Inhibitor, same run\n\n| T | PBS ratio | max bits (dot, inh) | "
            "speed-up |\n|---|---|---|---|\n"
        )
        md += "".join(
            f"| {r['seq_len']} | {r['pbs_ratio']:.2f} | {r['bits'][0]}, {r['bits'][1]} | "
            f"{_fmt(r.get('speedup'))} |\n"
            for r in rat
        )
        md += "\nPaper (d = 2): speed-ups 3.6×, 2.6×, 4.5×, 6.5× at T = 2, 4, 8, 16.\n"
    paths = {
        "md": out_dir / f"{stem}.md",
        "json": out_dir / f"{stem}.json",
        "png": out_dir / f"{stem}.png",
    }
    paths["md"].write_text(md)
    paths["json"].write_text(
        json.dumps({"reports": [r.to_dict() for r in reports], "ratios": rat}, indent=2)
    )
    plot(reports, paths["png"])
    return paths


def plot(reports: list[CircuitReport], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for variant in sorted({r.variant for r in reports}):
        rs = sorted(
            (r for r in reports if r.variant == variant and not r.error), key=lambda r: r.seq_len
        )
        ts = [r.seq_len for r in rs]
        if rs:
            axes[0].plot(ts, [r.pbs_count for r in rs], marker="o", label=variant)
        if rs and all(r.run_median_s for r in rs):
            axes[1].plot(ts, [r.run_median_s for r in rs], marker="o", label=variant)
    axes[0].set(xlabel="sequence length T", ylabel="PBS count", title="PBS")
    axes[1].set(xlabel="sequence length T", ylabel="seconds", title="encrypted run (median)")
    ts = sorted({r.seq_len for r in reports})
    for ax in axes:
        if not ax.lines:  # nothing compiled (or nothing executed: --mode simulate)
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            continue
        ax.set_yscale("log")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ts, [str(t) for t in ts])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load(path: Path) -> list[CircuitReport]:
    """Reports back from a sweep's JSON (to re-render tables and plots)."""
    return [CircuitReport(**r) for r in json.loads(Path(path).read_text())["reports"]]
