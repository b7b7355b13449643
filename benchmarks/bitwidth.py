"""The Inhibitor paper's precision claim as a table: for each attention kind and task, the smallest
activation bit width whose integer program (PTQ) is within 1 point of the float model's accuracy,
with the program's widths at that setting.

Models are trained here with ``--norm none`` (the TFHE configuration) and each task's preset.

    python benchmarks/bitwidth.py --tasks digits,mnist --bits 3-10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import write_results  # noqa: E402
from fhe.api.parts import (  # noqa: E402
    PRESETS,
    AttentionKind,
    OverflowPolicy,
    QuantConfig,
    TrainConfig,
    accuracy,
    config_for_task,
    export,
    load_task,
    predict,
    program_summary,
    train,
)


def sweep(
    task: str, kind: str, bits_range: list[int], seed: int, n_test: int | None, n_calib: int
) -> dict:
    data = load_task(task)
    p = PRESETS[task]
    cfg = config_for_task(
        data, attention=kind, d_model=p.d_model, n_heads=p.n_heads, n_layers=p.n_layers, norm="none"
    )
    start = time.perf_counter()
    result = train(
        cfg,
        data,
        TrainConfig(epochs=p.epochs, batch_size=p.batch_size, lr=p.lr, seed=seed),
        progress=False,
    )
    x, y = data.x_test[:n_test], data.y_test[:n_test].numpy()
    float_acc = accuracy(predict(result.model, x).numpy(), y)
    rows = []
    for bits in bits_range:
        program = export(result.model, data.x_train[:n_calib], QuantConfig(n_bits=bits))
        out, clipped = program.run_int(program.quantize_input(x), OverflowPolicy.CLIP)
        s = program_summary(program.graph)
        rows.append(
            {
                "n_bits": bits,
                "int_accuracy": accuracy(program.dequantize_output(out), y),
                "max_bit_width": s["max_bit_width"],
                "max_lut_input_bits": s["max_lut_input_bits"],
                "pbs_estimate": s["pbs_estimate"],
                "clipped": sum(clipped.values()),
            }
        )
    ok = [r for r in rows if r["int_accuracy"] >= float_acc - 0.01]
    return {
        "task": task,
        "kind": kind,
        "float_accuracy": float_acc,
        "sweep": rows,
        "min_bits": ok[0]["n_bits"] if ok else None,
        "at_min": ok[0] if ok else None,
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tasks", default="digits,mnist")
    ap.add_argument("--kinds", default=",".join(k.value for k in AttentionKind))
    ap.add_argument("--bits", default="3-10", help="inclusive range, e.g. 3-10")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-test", type=int, default=2000, help="test samples per evaluation")
    ap.add_argument("--calib", type=int, default=1000)
    ap.add_argument("--stem", default=None, help="output file stem (default: bitwidth[_<tasks>])")
    args = ap.parse_args()
    lo, hi = (int(v) for v in args.bits.split("-"))
    bits_range = list(range(lo, hi + 1))
    jobs = [(t, k) for t in args.tasks.split(",") for k in args.kinds.split(",")]
    results = [
        sweep(t, k, bits_range, args.seed, args.n_test, args.calib)
        for t, k in tqdm(jobs, desc="bitwidth")
    ]
    lines = [
        "# Smallest activation bit width within 1 point of float accuracy (PTQ, norm none)",
        "",
        f"Command: `python benchmarks/bitwidth.py {' '.join(sys.argv[1:])}`",
        "",
        "Widths at that setting: max bit width of any value in the integer program (the "
        "accumulators), max table-lookup input width (what TFHE's PBS cost depends on), and the "
        "estimated PBS count.",
        "",
        "| task | kind | float acc | min n_bits | int acc | max bit width | max LUT input bits | "
        "PBS (est.) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["at_min"]
        if m is None:
            lines.append(
                f"| {r['task']} | {r['kind']} | {100 * r['float_accuracy']:.2f} | > {hi} | "
                f"{100 * r['sweep'][-1]['int_accuracy']:.2f} (at {hi}) | — | — | — |"
            )
            continue
        lines.append(
            f"| {r['task']} | {r['kind']} | {100 * r['float_accuracy']:.2f} | {r['min_bits']} | "
            f"{100 * m['int_accuracy']:.2f} | {m['max_bit_width']} | {m['max_lut_input_bits']} | "
            f"{m['pbs_estimate']} |"
        )
    lines += [
        "",
        "Accuracy (%) of the integer program per n_bits:",
        "",
        "| task | kind | " + " | ".join(str(b) for b in bits_range) + " |",
        "|---|---|" + "---|" * len(bits_range),
    ]
    for r in results:
        lines.append(
            f"| {r['task']} | {r['kind']} | "
            + " | ".join(f"{100 * s['int_accuracy']:.1f}" for s in r["sweep"])
            + " |"
        )
    stem = args.stem or (
        "bitwidth" if args.tasks == "digits,mnist" else "bitwidth_" + args.tasks.replace(",", "_")
    )
    write_results(stem, lines, results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
