"""Issue-3 acceptance figures: a one-layer Inhibitor (norm none) on digits and MNIST, its float
accuracy, PTQ integer accuracy at 6 bits, and brevitas QAT integer accuracy at 4 bits.

    python benchmarks/ptq_qat.py --tasks digits,mnist
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import write_results  # noqa: E402
from fhe.api.parts import (  # noqa: E402
    PRESETS,
    OverflowPolicy,
    QuantConfig,
    TrainConfig,
    accuracy,
    config_for_task,
    export,
    load_task,
    predict,
    prepare_qat,
    program_summary,
    strip_qat,
    train,
)


def int_accuracy(
    model, data, bits: int, n_calib: int, range_mode: str = "minmax"
) -> tuple[float, dict]:
    program = export(model, data.x_train[:n_calib], QuantConfig(n_bits=bits, range_mode=range_mode))
    out = program.forward(data.x_test, OverflowPolicy.CLIP)
    return accuracy(out, data.y_test.numpy()), program_summary(program.graph)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tasks", default="digits,mnist")
    ap.add_argument("--kind", default="inhibitor")
    ap.add_argument("--ptq-bits", type=int, default=6)
    ap.add_argument("--qat-bits", type=int, default=4)
    ap.add_argument("--calib", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--range-mode",
        choices=["minmax", "percentile"],
        default="minmax",
        help="calibration ranges of the QAT model's export (percentile: 99.99th, clips outliers)",
    )
    args = ap.parse_args()
    rows = []
    for task in args.tasks.split(","):
        start = time.perf_counter()
        data = load_task(task)
        p = PRESETS[task]
        cfg = config_for_task(
            data, attention=args.kind, d_model=p.d_model, n_heads=p.n_heads, n_layers=1, norm="none"
        )
        tcfg = TrainConfig(epochs=p.epochs, batch_size=p.batch_size, lr=p.lr, seed=args.seed)
        result = train(cfg, data, tcfg, progress=False)
        float_acc = accuracy(predict(result.model, data.x_test).numpy(), data.y_test.numpy())
        ptq_acc, ptq_summary = int_accuracy(result.model, data, args.ptq_bits, args.calib)
        qcfg = TrainConfig(
            epochs=max(1, p.epochs // 2), batch_size=p.batch_size, lr=p.lr / 3, seed=args.seed
        )
        qat = train(cfg, data, qcfg, progress=False, model=prepare_qat(result.model, args.qat_bits))
        qat_acc, qat_summary = int_accuracy(
            strip_qat(qat.model), data, args.qat_bits, args.calib, args.range_mode
        )
        rows.append(
            {
                "task": task,
                "kind": args.kind,
                "float": float_acc,
                "ptq_bits": args.ptq_bits,
                "ptq": ptq_acc,
                "qat_bits": args.qat_bits,
                "qat": qat_acc,
                "ptq_max_lut_bits": ptq_summary["max_lut_input_bits"],
                "qat_max_lut_bits": qat_summary["max_lut_input_bits"],
                "seconds": time.perf_counter() - start,
            }
        )
    lines = [
        "# PTQ and QAT accuracy of a one-layer Inhibitor (norm none)",
        "",
        f"Command: `python benchmarks/ptq_qat.py {' '.join(sys.argv[1:])}`",
        "",
        "| task | float acc | PTQ bits | PTQ int acc | Δ | QAT bits | QAT int acc | Δ | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d_ptq, d_qat = 100 * (r["ptq"] - r["float"]), 100 * (r["qat"] - r["float"])
        ok = d_ptq >= -1 and d_qat >= -2
        lines.append(
            f"| {r['task']} | {100 * r['float']:.2f} | {r['ptq_bits']} | {100 * r['ptq']:.2f} | "
            f"{d_ptq:+.2f} | {r['qat_bits']} | {100 * r['qat']:.2f} | {d_qat:+.2f} | "
            f"{'met' if ok else 'NOT met'} (PTQ within 1, QAT within 2 points) |"
        )
    stem = "ptq_qat" if args.range_mode == "minmax" else f"ptq_qat_{args.range_mode}"
    write_results(stem, lines, rows)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
