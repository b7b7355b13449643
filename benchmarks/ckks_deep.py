"""Deep CKKS models with no client in the loop: the OpenFHE engine's bootstraps (issue 28).

    python benchmarks/ckks_deep.py                      # the three models, 1 encrypted sample each
    python benchmarks/ckks_deep.py --only gelu-1 --n 3   # rerun one model, keep the others
    python benchmarks/ckks_deep.py --plan-only layernorm-gelu-4   # that one planned, not run

Each model is trained on digits (fhe.api), then:
- its float model and clear polynomial program are scored on the whole test split (360 samples);
- it is compiled with `--engine openfhe` (N = 2^16, 128-bit), its keys made, and the first `--n`
  test samples run encrypted, one query each, against the clear polynomial program (max error,
  MSE, argmax agreement), with the latency of each query and the server worker's peak memory.
  A model in `--plan-only` is planned only (bootstraps, depth); its latency is then a lower bound,
  its bootstraps times one measured bootstrap (benchmarks/results/ckks_bootstrap.json), labelled.
Writes benchmarks/results/ckks_deep.md|json. Everything goes through fhe.api.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import command_line, write_results  # noqa: E402

MODELS = {
    # issue 28's example: TenSEAL's planner stops at depth 21 (the 128-bit chain holds 19)
    "gelu-1": (
        "1 block, no norm, GELU (issue 28's example)",
        dict(recipe="ckks-deep", norm="none", layers=1, epochs=20, seed=3),
    ),
    # the paper's recipe (fhe train --recipe ckks-deep): LayerNorm, polynomial GELU, 2 blocks
    "layernorm-gelu-2": (
        "2 blocks, LayerNorm, GELU (the paper's recipe)",
        dict(recipe="ckks-deep"),
    ),
    "layernorm-gelu-4": ("4 blocks, LayerNorm, GELU", dict(recipe="ckks-deep", layers=4)),
}


def bootstrap_seconds(baby_steps: list[int]) -> float:
    """One bootstrap on both cores with the plan's baby steps (its report's), from
    benchmarks/results/ckks_bootstrap.json."""
    import json

    from benchmarks._results import RESULTS

    rows = json.loads((RESULTS / "ckks_bootstrap.json").read_text())["results"]
    ours = [r for r in rows if list(r.get("baby_steps", [0, 0])) == list(baby_steps)]
    return min(r["by_magnitude"]["1.0"]["engine_s"] for r in ours or rows if r["threads"] == 2)


def run_model(name: str, train: dict, n: int, tmp: Path) -> dict:
    from fhe import api

    outcome = api.train_model(api.TrainRequest(task="digits", **train), progress=False)
    path = tmp / f"{name}.pt"
    outcome.save(path)
    n_test = len(outcome.data.x_test)
    clear = api.compare_file(
        path, api.CompileOptions(scheme="ckks", layout="batch"), n=n_test, mode="simulate"
    )
    c = api.compile_file(path, api.CompileOptions(scheme="ckks", engine="openfhe"))
    backend = c.compiled.backend
    rows: list[dict] = []
    if n == 0:  # planned only
        rep = backend.report()
        return summary(name, train, outcome, clear, rep, rows, None)
    api.keygen(c)
    for i in range(n):
        x = c.data.x_test[i].numpy()
        start = time.perf_counter()
        got = backend.encrypt_run_decrypt(x)[0]
        seconds = time.perf_counter() - start
        want = backend.simulate(x[None])[0]
        rows.append(
            {
                "sample": i,
                "seconds": seconds,
                "server_run_s": backend.timings_s["run"],
                "max_error": float(np.abs(got - want).max()),
                "mse": float(((got - want) ** 2).mean()),
                "argmax_equal": bool(got.argmax() == want.argmax()),
                "bootstraps": backend.last_run["op_counts"]["bootstrap"],
                "stages_s": {k: round(v, 2) for k, v in backend.last_run["stages_s"].items()},
            }
        )
        print(f"  {name} sample {i}: {rows[-1]}", flush=True)
    peak = backend.server.call("peak_memory")[0]["bytes"]
    rep = backend.report()
    backend.close()
    return summary(name, train, outcome, clear, rep, rows, peak)


def summary(name, train, outcome, clear, rep, rows, peak) -> dict:
    return {
        "name": name,
        "train": train,
        "n_test": len(outcome.data.x_test),
        "accuracy_float": clear["accuracy"]["float"],
        "accuracy_poly_clear": clear["accuracy"]["poly_clear"],
        "program_depth": rep["depth"],
        "bootstraps": rep["bootstraps"],
        "bootstraps_per_stage": rep["bootstraps_per_stage"],
        "bootstraps_beyond_flat_error": rep["bootstraps_beyond_flat_error"],
        "levels_after_bootstrap": rep["levels_after_bootstrap"],
        "levels_of_a_fresh_query": rep["levels_of_a_fresh_query"],
        "bootstrap_baby_steps": rep["bootstrap_baby_steps"],
        "slots": rep["slots"],
        "keygen_s": rep["timings_s"].get("keygen"),
        "key_bytes": rep["key_sizes_bytes"],
        "server_peak_bytes": peak,
        "samples": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only", default=None, help="models, comma-separated (rerun: the others are kept)"
    )
    parser.add_argument("--n", type=int, default=1, help="encrypted samples per model")
    parser.add_argument("--plan-only", default="", help="models planned, not run (comma-separated)")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    load = f"{os.getloadavg()[0]:.2f}"
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            print(f"{name} ...", flush=True)
            n = 0 if name in args.plan_only.split(",") else args.n
            results.append(run_model(name, MODELS[name][1], n, Path(tmp)))
    command = command_line()
    if args.only:  # rerun models: replace them in the saved table, keep the others
        import json

        from benchmarks._results import RESULTS

        old = json.loads((RESULTS / "ckks_deep.json").read_text())
        fresh = {r["name"]: r for r in results}
        results = [fresh.pop(r["name"], r) for r in old["results"]] + list(fresh.values())
        command = f"{old.get('command', 'python benchmarks/ckks_deep.py')}; then {command}"
        load = f"{old['load']}, then {load}"
    write_table(results, command, load)


def latency(seconds: list[float]) -> str:
    """The median query, and the range when there are several."""
    if len(seconds) == 1:
        return f"{seconds[0]:.0f}"
    return f"{np.median(seconds):.0f} (median; {min(seconds):.1f}-{max(seconds):.1f})"


def fresh_levels(row: dict) -> int:
    """A fresh query's levels (rows measured before the client encoded at the chain's top: a
    bootstrap's)."""
    return row.get("levels_of_a_fresh_query", row["levels_after_bootstrap"])


def write_table(results: list[dict], command: str, load: str) -> None:
    gib = 2**30
    lines = [
        "# Deep CKKS models on the OpenFHE engine: bootstraps, no refresh (issue 28)",
        "",
        f"`{command}`",
        "",
        "Digits, trained by the script (fhe.api). Float and clear polynomial program on the whole "
        "test split; the encrypted runs are single queries on the first test samples (packed "
        "layout, N = 2^16, 128-bit), each against the clear polynomial program. Latency is one "
        "query, client encryption and decryption included, with OpenFHE on both cores. Load "
        f"average at the start {load} (2 cores, shared).",
        "",
        "| model | float | poly. program | depth | levels of a fresh query | bootstraps "
        "| encrypted == clear (argmax) | max error | latency / query (s) | keygen (s) "
        "| eval. keys (GiB) | server peak (GiB / GB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["samples"]
        if not s:  # planned only: a lower bound from the bootstraps alone
            bound = r["bootstraps"] * bootstrap_seconds(r.get("bootstrap_baby_steps", [0, 0]))
            lines.append(
                f"| {MODELS[r['name']][0]} | {100 * r['accuracy_float']:.2f}% | "
                f"{100 * r['accuracy_poly_clear']:.2f}% | {r['program_depth']} | "
                f"{fresh_levels(r)} | {r['bootstraps']} | not run | | "
                f"≥ {bound:.0f} (bootstraps alone, estimated) | | | |"
            )
            continue
        keys = (r["key_bytes"]["relin_keys"] + r["key_bytes"]["rotation_and_bootstrap_keys"]) / gib
        lines.append(
            f"| {MODELS[r['name']][0]} | {100 * r['accuracy_float']:.2f}% | "
            f"{100 * r['accuracy_poly_clear']:.2f}% | {r['program_depth']} | {fresh_levels(r)} | "
            f"{r['bootstraps']} | {sum(x['argmax_equal'] for x in s)}/{len(s)} | "
            f"{max(x['max_error'] for x in s):.1e} | "
            f"{latency([x['seconds'] for x in s])} | {r['keygen_s']:.0f} | {keys:.2f} | "
            f"{r['server_peak_bytes'] / gib:.1f} / {r['server_peak_bytes'] / 1e9:.1f} |"
        )
    lines += ["", "Bootstraps per stage:", ""]
    for r in results:
        per = ", ".join(f"{t} {k}" for t, k in r["bootstraps_per_stage"].items())
        lines.append(f"- {MODELS[r['name']][0]}: {per}")
    write_results("ckks_deep", lines, {"load": load, "command": command, "results": results})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
