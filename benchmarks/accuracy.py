"""Inhibitor paper Table 1 at our scale: every task x every attention kind, repeated seeds.

Reports mean ± 95% confidence interval (Student t) over seeds and a Welch t-test of each kind
against dot-product attention. Each (task, kind, seed) result is cached in
``benchmarks/results/accuracy_runs.json`` so an interrupted run resumes where it stopped.

    python benchmarks/accuracy.py --seeds 5                 # the full table
    python benchmarks/accuracy.py --tasks digits --seeds 20 # one task, 20 seeds

A second process can run beside the first with ``--cache OTHER.json`` (it skips runs either file
has), and ``--merge OTHER.json --report-only`` folds its runs in afterwards.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fhe.api.parts import (  # noqa: E402
    PRESETS,
    TASKS,
    AttentionKind,
    TrainConfig,
    config_for_task,
    load_task,
    train,
)

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = [k.value for k in AttentionKind]


def ci95(values: list[float]) -> float:
    if len(values) < 2:
        return float("nan")
    return float(
        stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values))
    )


def welch_p(a: list[float], b: list[float]) -> float:
    if len(a) < 2 or len(b) < 2 or (np.std(a) == 0 and np.std(b) == 0):
        return float("nan")
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def run_one(task_name: str, kind: str, seed: int, data, epochs_scale: float) -> dict:
    preset = PRESETS[task_name]
    cfg = config_for_task(
        data,
        attention=kind,
        d_model=preset.d_model,
        n_heads=preset.n_heads,
        n_layers=preset.n_layers,
    )
    tcfg = TrainConfig(
        epochs=max(1, round(preset.epochs * epochs_scale)),
        batch_size=preset.batch_size,
        lr=preset.lr,
        seed=seed,
    )
    start = time.perf_counter()
    result = train(cfg, data, tcfg, progress=False)
    return {
        "task": task_name,
        "kind": kind,
        "seed": seed,
        "metric": result.metric.value,
        "score": result.test_score,
        "epochs": tcfg.epochs,
        "train_s": time.perf_counter() - start,
    }


def format_score(metric: str, mean: float, ci: float) -> str:
    if metric == "accuracy":
        return f"{100 * mean:.2f} ± {100 * ci:.2f}"
    return f"{mean:.5f} ± {ci:.5f}"


def write_table(runs: list[dict], tasks: list[str], kinds: list[str], command: str) -> str:
    lines = [
        "# Accuracy of every attention kind on every task (Inhibitor paper, Table 1)",
        "",
        f"Command: `{command}`",
        "",
        "Mean ± 95% confidence interval over seeds (accuracy in %, adding-problem MSE). p: Welch "
        "t-test against dot-product on the same task (p < 0.05 = significant difference).",
        "Runs are cached in `accuracy_runs.json`; a cell with n < 5 or — is not fully measured "
        "yet, and `python benchmarks/accuracy.py --seeds 5` resumes and completes the table.",
        "",
        "| task | metric | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    summary = {}
    for task in tasks:
        by_kind = {
            k: [r["score"] for r in runs if r["task"] == task and r["kind"] == k] for k in kinds
        }
        metric = next((r["metric"] for r in runs if r["task"] == task), "")
        cells = []
        for k in kinds:
            vals = by_kind[k]
            if not vals:
                cells.append("—")
                continue
            p = (
                welch_p(vals, by_kind.get("dot-product", []))
                if k != "dot-product"
                else float("nan")
            )
            cell = format_score(metric, float(np.mean(vals)), ci95(vals)) + f" (n={len(vals)})"
            if not math.isnan(p):
                cell += f", p={p:.2f}"
            cells.append(cell)
            summary[f"{task}/{k}"] = {
                "mean": float(np.mean(vals)),
                "ci95": ci95(vals),
                "n": len(vals),
                "p": p,
                "metric": metric,
            }
        lines.append(f"| {task} | {metric} | " + " | ".join(cells) + " |")
    secs = {t: sum(r["train_s"] for r in runs if r["task"] == t) for t in tasks}
    lines += [
        "",
        "Training time summed over runs (s): " + ", ".join(f"{t} {s:.0f}" for t, s in secs.items()),
        "",
        "Paper (one layer, MNIST): dot-product 98.2%, Inhibitor 97.9%.",
    ]
    (RESULTS / "accuracy.json").write_text(json.dumps(summary, indent=2))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument(
        "--epochs-scale", type=float, default=1.0, help="multiply every preset's epoch count"
    )
    ap.add_argument("--fresh", action="store_true", help="ignore cached runs")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="render the table from cached runs, train nothing",
    )
    ap.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="write new runs here instead of accuracy_runs.json (a second process running beside "
        "the first); runs in either file count as done",
    )
    ap.add_argument(
        "--merge",
        type=Path,
        default=None,
        help="fold the runs of this cache into accuracy_runs.json",
    )
    args = ap.parse_args()
    tasks, kinds = args.tasks.split(","), args.kinds.split(",")
    RESULTS.mkdir(parents=True, exist_ok=True)
    main_cache = RESULTS / "accuracy_runs.json"
    cache_path = args.cache or main_cache
    runs = [] if args.fresh or not cache_path.exists() else json.loads(cache_path.read_text())
    if args.merge:
        runs += json.loads(args.merge.read_text())
    key = lambda r: (r["task"], r["kind"], r["seed"], r["epochs"])  # noqa: E731
    runs = list({key(r): r for r in runs}.values())
    if args.merge:
        cache_path.write_text(json.dumps(runs, indent=1))
    others = (
        json.loads(main_cache.read_text())
        if cache_path != main_cache and main_cache.exists()
        else []
    )
    done = {key(r) for r in runs + others}
    todo = [(t, k, s) for t in tasks for k in kinds for s in range(args.seeds)]
    if args.report_only:
        todo = []
    bar = tqdm(todo, desc="accuracy", unit="run")
    data_cache = {}
    for task, kind, seed in bar:
        epochs = max(1, round(PRESETS[task].epochs * args.epochs_scale))
        if (task, kind, seed, epochs) in done:
            continue
        bar.set_postfix_str(f"{task}/{kind}/seed{seed}")
        if task not in data_cache:
            data_cache = {task: load_task(task)}
        runs.append(run_one(task, kind, seed, data_cache[task], args.epochs_scale))
        cache_path.write_text(json.dumps(runs, indent=1))
        if args.cache is None:  # a side process leaves the table to the main one (and to --merge)
            publish(
                runs, tasks, kinds, args
            )  # the table is current after every run (interruptible)
    if args.cache is None:
        print(publish(runs, tasks, kinds, args))


def publish(runs: list[dict], tasks: list[str], kinds: list[str], args) -> str:
    selected = [
        r
        for r in runs
        if r["task"] in tasks
        and r["kind"] in kinds
        and r["seed"] < args.seeds
        and r["epochs"] == max(1, round(PRESETS[r["task"]].epochs * args.epochs_scale))
    ]
    command = "python benchmarks/accuracy.py " + " ".join(sys.argv[1:])
    table = write_table(selected, tasks, kinds, command)
    (RESULTS / "accuracy.md").write_text(table)
    return table


if __name__ == "__main__":
    main()
