"""Peak memory and time of the Inhibitor's fused form (Eqs. 8-10) against the broadcast form (Eqs.
5-7).

Each measurement runs in a fresh subprocess and reports the growth of peak resident memory
(ru_maxrss) over the process's baseline, for a forward pass and a forward+backward pass.

    python benchmarks/inhibitor_memory.py --seq-len 1024 --d 16 --heads 2
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def measure(form: str, T: int, d: int, heads: int, backward: bool, signed: bool) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from models.attention import functional as AF

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, T, d, requires_grad=backward) for _ in range(3))
    fn = AF.inhibitor if form == "fused" else AF.inhibitor_broadcast
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    out = fn(q, k, v, d**0.5, 0.5, signed)
    if backward:
        out.sum().backward()
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"form": form, "peak_mib": (peak - base) / 1024, "time_s": elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--d", type=int, default=16, help="head dimension")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument(
        "--child", nargs=3, metavar=("FORM", "BACKWARD", "SIGNED"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.child:
        form, backward, signed = args.child
        print(
            json.dumps(
                measure(form, args.seq_len, args.d, args.heads, backward == "1", signed == "1")
            )
        )
        return
    rows = []
    for signed in ("0", "1"):
        for backward in ("0", "1"):
            for form in ("fused", "broadcast"):
                cmd = [
                    sys.executable,
                    __file__,
                    "--seq-len",
                    str(args.seq_len),
                    "--d",
                    str(args.d),
                    "--heads",
                    str(args.heads),
                    "--child",
                    form,
                    backward,
                    signed,
                ]
                out = json.loads(
                    subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                )
                out.update(signed=signed == "1", backward=backward == "1")
                rows.append(out)
    lines = [
        f"# Inhibitor memory: fused (Eqs. 8-10) vs broadcast (Eqs. 5-7), T = {args.seq_len}, "
        f"d_head = {args.d}, heads = {args.heads}, batch 1, float32",
        "",
        f"Command: `python benchmarks/inhibitor_memory.py --seq-len {args.seq_len} --d {args.d} "
        f"--heads {args.heads}`",
        "",
        "| variant | pass | fused peak (MiB) | broadcast peak (MiB) | memory ratio | fused time "
        "(s) | broadcast time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for signed in (False, True):
        for backward in (False, True):
            f, b = (
                next(
                    r
                    for r in rows
                    if r["form"] == form and r["signed"] == signed and r["backward"] == backward
                )
                for form in ("fused", "broadcast")
            )
            ratio = b["peak_mib"] / max(f["peak_mib"], 1e-9)
            lines.append(
                f"| {'signed' if signed else 'unsigned'} | {'fwd+bwd' if backward else 'forward'} "
                f"| {f['peak_mib']:.1f} | {b['peak_mib']:.1f} | {ratio:.1f}× | {f['time_s']:.3f} | "
                f"{b['time_s']:.3f} |"
            )
    write_results("inhibitor_memory", lines, rows)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
