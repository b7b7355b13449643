"""One query under CKKS: the packed layout (one sample per ciphertext, SEAL rotations) end to end.

Trains the digits PowerSoftmax model with the polynomial recipe (as benchmarks/ckks_compare.py)
unless ``--model`` names one, compiles it with ``--layout packed``, generates the keys (Galois keys
for the planned rotation steps only), runs ``--n-exec`` test samples encrypted one at a time (the
first run encodes the matrices' plaintexts, later runs reuse them: both latencies are reported), and
checks the clear packed program against the batch layout's clear program on the test split.

    python benchmarks/ckks_packed.py --task digits --model runs/ckks/dD.pt
    python benchmarks/ckks_packed.py --task mnist --n-exec 1
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks._results import command_line, write_results  # noqa: E402
from benchmarks.ckks_compare import RECIPES, get_model, recipe_suffix  # noqa: E402
from fhe.api.parts import (  # noqa: E402
    ApproxConfig,
    CkksParams,
    compile_model,
    float_inference_form,
    load_task,
    predict,
)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--task", default="digits", choices=["digits", "mnist"])
    ap.add_argument(
        "--model", default=None, help="a trained model.pt (default: train one with the recipe)"
    )
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default="gelu",
        help="training recipe when no --model: gelu (x⁴, GELU, ε 0.05: depth 20, N = 32768), "
        "quad (x², quad, ε 1: depth 10, N = 16384), quad-batchnorm (the same with BatchNorm, "
        "folded: free) or quad-layernorm (with LayerNorm: depth 41, refresh only)",
    )
    ap.add_argument(
        "--n-exec", type=int, default=3, help="test samples run encrypted, one query each"
    )
    ap.add_argument(
        "--n-sim", type=int, default=None, help="test samples for the clear checks (default: all)"
    )
    ap.add_argument(
        "--n-packed",
        type=int,
        default=1000,
        help="of those, samples the clear packed program runs (one at a time: ~0.1-1 s each)",
    )
    ap.add_argument("--calib", type=int, default=5000)
    ap.add_argument("--scale-bits", type=int, default=40)
    ap.add_argument(
        "--outer-bits", type=int, default=60, help="bits of the chain's first and special primes"
    )
    ap.add_argument(
        "--poly-modulus-degree", type=int, default=None, help="N (default: the smallest that fits)"
    )
    ap.add_argument("--reciprocal-tol", type=float, default=1e-2)
    ap.add_argument("--stem", default=None, help="results file name (default from task and recipe)")
    ap.add_argument("--activation-tol", type=float, default=2e-2)
    args = ap.parse_args()
    if args.n_exec < 1:
        ap.error("--n-exec must be >= 1")
    model, origin = get_model(args)
    data = load_task(args.task, seq_len=model.config.seq_len)
    params = CkksParams(
        layout="packed",
        scale_bits=args.scale_bits,
        poly_modulus_degree=args.poly_modulus_degree,
        outer_bits=args.outer_bits,
        approx=ApproxConfig(reciprocal_tol=args.reciprocal_tol, activation_tol=args.activation_tol),
    )
    start = time.perf_counter()
    compiled = compile_model(model, data.x_train[: args.calib], params, meta={"task": args.task})
    backend = compiled.backend
    compile_s = time.perf_counter() - start
    x = data.x_test[: args.n_sim].numpy().astype(np.float64)
    y = data.y_test[: args.n_sim].numpy()
    print(
        f"clear checks on {len(x)} samples (packed: {min(len(x), args.n_packed)}) ...", flush=True
    )
    poly = backend.program.clear(x)
    packed_clear = backend.simulate_packed(x[: args.n_packed])
    flt, flt_inf = (
        predict(model, data.x_test[: args.n_sim]).double().numpy(),
        float_inference_form(model, x),
    )
    print(
        f"keygen (N={backend.plan.poly_modulus_degree}, {len(backend.rotation_steps)} Galois keys) "
        "...",
        flush=True,
    )
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    backend.keygen()
    keygen_s = time.perf_counter() - start
    runs = []
    for i in range(args.n_exec):
        start = time.perf_counter()
        cts = backend.encrypt(x[i : i + 1])
        enc_s = time.perf_counter() - start
        out = backend.run(cts)
        run_s = backend.timings_s["run"]
        start = time.perf_counter()
        got = backend.decrypt(out)[0]
        dec_s = time.perf_counter() - start
        runs.append(
            {
                "sample": i,
                "encrypt_s": enc_s,
                "run_s": run_s,
                "decrypt_s": dec_s,
                "max_abs_error": float(np.abs(got - poly[i]).max()),
                "mse": float(((got - poly[i]) ** 2).mean()),
                "argmax_equal": bool(got.argmax() == poly[i].argmax()),
                "stages_s": dict(backend.last_run["stages_s"]),
            }
        )
        print(
            f"  sample {i}: run {run_s:.2f} s, max |error| {runs[-1]['max_abs_error']:.2e}",
            flush=True,
        )
    rep = backend.report()
    load_after = os.getloadavg()[0]
    acc = {
        k: float((v.argmax(-1) == y).mean())
        for k, v in (
            ("float", flt),
            ("float_inference", flt_inf),
            ("poly_clear", poly),
        )
    }
    acc["packed_clear"] = float((packed_clear.argmax(-1) == y[: len(packed_clear)]).mean())
    result = {
        "task": args.task,
        "model": origin,
        "n_sim": int(len(x)),
        "n_packed": int(len(packed_clear)),
        "compile_s": compile_s,
        "keygen_s": keygen_s,
        "accuracy": acc,
        "packed_vs_batch_clear_max_abs_diff": float(
            np.abs(packed_clear - poly[: len(packed_clear)]).max()
        ),
        "packed_vs_batch_clear_argmax_agreement": float(
            (packed_clear.argmax(-1) == poly[: len(packed_clear)].argmax(-1)).mean()
        ),
        "runs": runs,
        "report": rep,
        "load_avg_1min_before_after": [load_before, load_after],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    lat = [r["run_s"] for r in runs]
    warm = lat[1:] or lat
    mib = {k: v / 2**20 for k, v in rep["key_sizes_bytes"].items()}
    lines = [
        f"# CKKS, one query: the packed layout on {args.task}",
        "",
        f"Command: `{command_line()}` ({origin})"
        if args.model
        else f"Command: `{command_line()}` ({origin}; the same recipe as a CLI command: "
        f"`{RECIPES[args.recipe][1].format(task=args.task, epochs=args.epochs)}`)",
        "",
        f"One sample per ciphertext, N = {rep['poly_modulus_degree']}, depth {rep['depth']} of "
        f"chain {rep['coeff_mod_bit_sizes']} (scale 2^{rep['scale_bits']}), no client-assisted "
        f"refresh. Machine: 2 cores, load {load_before:.1f} before / {load_after:.1f} after; SEAL "
        "runs one operation at a time on one core.",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        "| encrypted latency, first query (s; encodes the matrices' plaintexts) | "
        f"{lat[0]:.2f} | |",
        f"| encrypted latency, later queries (s, median of {len(warm)}) | {np.median(warm):.2f} | "
        "≤ 10 |",
        f"| encrypt / decrypt (s) | {np.median([r['encrypt_s'] for r in runs]):.2f} / "
        f"{np.median([r['decrypt_s'] for r in runs]):.3f} | |",
        "| executed samples: argmax == clear polynomial program | "
        f"{sum(r['argmax_equal'] for r in runs)}/{len(runs)} | all |",
        "| executed samples: output MSE vs clear, max | "
        f"{max((r['mse'] for r in runs), default=float('nan')):.2e} | ≤ 1e-3 |",
        f"| clear packed vs batch program on {len(packed_clear)} test samples: argmax agreement | "
        f"{100 * result['packed_vs_batch_clear_argmax_agreement']:.2f}% | ≥ 99% |",
        "| clear packed vs batch program: max abs difference | "
        f"{result['packed_vs_batch_clear_max_abs_diff']:.1e} | |",
        f"| accuracy on {len(x)} test samples: float / inference form / polynomial program | "
        f"{100 * acc['float']:.2f}% / "
        f"{100 * acc['float_inference']:.2f}% / {100 * acc['poly_clear']:.2f}% | within 1 point of "
        "float |",
        f"| Galois keys (rotation steps) | {rep['galois_keys_count']}: {rep['rotation_steps']} | |",
        "| keys (MiB) | " + ", ".join(f"{k} {v:.1f}" for k, v in mib.items()) + " | |",
        f"| keygen (s) / peak RSS (GiB) | {keygen_s:.1f} / {result['peak_rss_gib']:.1f} | |",
        "",
        "Operation counts per query (the clear plan, equal to the encrypted run's): "
        + ", ".join(f"{k} {v}" for k, v in rep["op_counts"].items()),
        "",
        "Level after each stage: " + ", ".join(f"{k} {v}" for k, v in rep["depth_per_tag"].items()),
        "",
        "| stage | rotations | ct×ct | ct×pt | rescales | time, last query (s) |",
        "|---|---|---|---|---|---|",
    ]
    stages = runs[-1]["stages_s"] if runs else {}
    for tag, c in rep["op_counts_per_tag"].items():
        lines.append(
            f"| {tag} | {c.get('rotation', 0)} | {c.get('ct_ct_mul', 0)} | {c.get('ct_pt_mul', 0)} "
            f"| {c.get('rescale', 0)} | {stages.get(tag, 0.0):.2f} |"
        )
    paths = write_results(
        args.stem or f"ckks_packed_{args.task}{recipe_suffix(args)}", lines, result
    )
    print("\n".join(lines))
    print(f"wrote {paths['md']}")


if __name__ == "__main__":
    main()
