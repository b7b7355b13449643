"""Overflow policy: calibrated widths (the client refuses inputs that would overflow) vs proven
widths.

For every attention circuit (T tokens, 6 bits, lookups <= 5 bits) and a whole digits model, compile
twice: with the calibrated bit widths and with the widths proven by interval arithmetic
(quant/ranges.py). Edge inputs (all-min, all-max, alternating signs; for the model: all-black,
all-white, checkerboards) are simulated and compared with the clear integer program. Reports which
inputs overflow a calibrated width (the ones the client refuses), whether the simulation equals the
clear program on each, and what the proven widths cost (max width, Concrete's complexity, keys).

    python benchmarks/overflow.py [--seq-len 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks._results import command_line, write_results  # noqa: E402

VARIANTS = ["inhibitor", "signed-inhibitor", "dot-product", "power-softmax", "dct", "geglu"]


def edge_inputs(shape: tuple[int, ...], lo: int, hi: int) -> dict[str, np.ndarray]:
    checker = np.indices(shape).sum(0) % 2 == 0
    return {
        "all-min": np.full(shape, lo),
        "all-max": np.full(shape, hi),
        "alternating": np.where(checker, lo, hi),
        "alternating'": np.where(checker, hi, lo),
    }


def measure(graph, calib_ints, input_range, ranges: str) -> dict:
    from fhe.api.parts import TfheBackend, TfheParams

    start = time.perf_counter()
    backend = TfheBackend.compile(
        graph,
        calib_ints,
        TfheParams(inputset_size=len(calib_ints), ranges=ranges),
        simulate_only=True,
        input_range=input_range,
    )
    rep = backend.report()
    edges = {}
    for name, x in edge_inputs(graph.input_shape, *input_range).items():
        clear, clipped = graph.run(x, "clip")
        sim = backend.simulate(x)
        edges[name] = {
            "overflows": sorted(clipped),
            "sim_equals_clear": bool(np.array_equal(sim, clear)),
        }
    backend.circuit.cleanup()
    return {
        "ranges": ranges,
        "pbs": rep["pbs_count"],
        "max_bit_width": rep["max_bit_width"],
        "complexity": rep["complexity"],
        "eval_keys_mib": rep["key_sizes_bytes"]["evaluation"] / 2**20,
        "est_latency_s": rep["estimated_latency_s"],
        "overflow_risks": len(rep["overflow_risks"]),
        "edges": edges,
        "compile_s": time.perf_counter() - start,
    }


def circuit_rows(seq_len: int) -> list[dict]:
    from circuits.attention import CircuitSpec, build

    rows = []
    for variant in VARIANTS:
        for ranges in ("calibrated", "proven"):
            built = build(
                CircuitSpec(variant, seq_len, n_bits=6, lut_bits=5)
            )  # fresh graph: proven widens in place
            qmax = 2**5 - 1
            row = {
                "program": f"{variant} T={seq_len}",
                **measure(built.graph, built.calib_ints, (-qmax, qmax), ranges),
            }
            rows.append(row)
            print(_describe(row), flush=True)
    return rows


def model_rows() -> list[dict]:
    import torch

    from fhe.api.parts import (
        DEFAULT_CALIB_SAMPLES,
        DEFAULT_QUANT,
        TrainConfig,
        config_for_task,
        export,
        load_task,
        train,
    )

    data = load_task("digits", patch=4)
    cfg = config_for_task(data, attention="inhibitor", d_model=16, n_heads=2, norm="batchnorm")
    model = train(
        cfg, data, TrainConfig(epochs=30, batch_size=64, lr=3e-3, seed=0), progress=False
    ).model
    calib = data.x_train[:DEFAULT_CALIB_SAMPLES]
    rows = []
    for ranges in ("calibrated", "proven"):
        program = export(model, calib, DEFAULT_QUANT)
        q = program.input_quantizer
        row = {
            "program": "digits Inhibitor model (d16, 2 heads, 4 tokens)",
            **measure(program.graph, program.quantize_input(calib), (q.qmin, q.qmax), ranges),
        }
        out, clipped = program.run_int(program.quantize_input(data.x_test), "clip")
        row["test_accuracy"] = data.score(
            torch.from_numpy(program.dequantize_output(out)), data.y_test
        )
        row["test_samples_refused"] = int(
            sum(
                1
                for i in range(len(data.x_test))
                if program.run_int(program.quantize_input(data.x_test[i : i + 1]), "clip")[1]
            )
        )
        rows.append(row)
        print(_describe(row), flush=True)
    return rows


def _describe(row: dict) -> str:
    edges = ", ".join(
        f"{k}: {'overflow ' if v['overflows'] else ''}{'==' if v['sim_equals_clear'] else '!='}"
        for k, v in row["edges"].items()
    )
    return (
        f"{row['program']:<34} {row['ranges']:<10} width {row['max_bit_width']:>2}  complexity "
        f"{row['complexity']:.2e}  keys {row['eval_keys_mib']:.0f} MiB  [{edges}]"
    )


def markdown(rows: list[dict]) -> list[str]:
    lines = [
        "# Overflow policy: calibrated widths (client refuses) vs proven widths",
        "",
        f"`{command_line()}`",
        "",
        "Simulation (Concrete) against the clear integer program on edge inputs. `refused` marks "
        "an input that takes some value outside its calibrated width: the clear program saturates "
        "it, the circuit wraps around, so the client refuses to encrypt it (`InputOverflowError`). "
        "With proven widths nothing can overflow and every edge input must be `==`.",
        "",
        "| program | ranges | nodes at risk | max width | complexity | x calibrated | eval. keys "
        "(MiB) | est. latency (s) | edge inputs (sim vs clear) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = {}
    for r in rows:
        base.setdefault(r["program"], r["complexity"])
        edges = "; ".join(
            f"{k}: {'refused, ' if v['overflows'] else ''}{'==' if v['sim_equals_clear'] else '!='}"
            for k, v in r["edges"].items()
        )
        lines.append(
            f"| {r['program']} | {r['ranges']} | {r['overflow_risks']} | {r['max_bit_width']} | "
            f"{r['complexity']:.2e} | {r['complexity'] / base[r['program']]:.2f} | "
            f"{r['eval_keys_mib']:.0f} | {r['est_latency_s']:.1f} | {edges} |"
        )
    models = [r for r in rows if "test_accuracy" in r]
    if models:
        lines += [
            "",
            "Whole model, test split: "
            + "; ".join(
                f"{r['ranges']}: accuracy {100 * r['test_accuracy']:.2f}%, "
                f"{r['test_samples_refused']} sample(s) refused"
                for r in models
            )
            + " (proven widths never change a value the calibrated program computes; they only "
            "make room).",
        ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=8)
    ap.add_argument("--no-model", action="store_true")
    args = ap.parse_args()
    rows = circuit_rows(args.seq_len) + ([] if args.no_model else model_rows())
    print(write_results("overflow", markdown(rows), rows))


if __name__ == "__main__":
    main()
