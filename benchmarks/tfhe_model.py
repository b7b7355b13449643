"""Whole models under TFHE: accuracy, PBS, widths, keys, keygen and encrypted latency, side by side.

For each attention kind: train the float model (BatchNorm, folded at export), fine-tune it through
its integer program (``fhe train --qat-bits``, several seeds for the accuracy statistics), then
for the seed-0 model compile with the TFHE defaults, generate keys, run ``--n-exec`` test samples
encrypted (each compared with the clear integer program) and simulate the whole test split. Each
measurement runs in a child process (its own peak memory; ``taskset`` for the core-count rows).
Variants of the first kind: approximate rounding, a looser global error probability, and Concrete's
parallelism modes.

    python benchmarks/tfhe_model.py    # digits, 4x4 patches: Inhibitor vs dot-product
    python benchmarks/tfhe_model.py --task mnist --kinds inhibitor --seeds 3 --n-exec 3
        --no-variants    # 4 tokens of 14x14: ~25 min, 1.9 GB of keys, 10k samples simulated
    python benchmarks/tfhe_model.py --task mnist --kinds inhibitor --model m.pt --n-exec 3
        --no-variants    # measure a saved model (e.g. benchmarks/mnist_qat_schedule.py --save-dir)

With ``--model`` the first kind is that checkpoint (its recorded quantization) and nothing is
trained: the report then has no accuracy table (the encrypted table has the program's clear
accuracy). ``--recipe`` overrides the task's recipe (e.g. the 16-token MNIST recipe of earlier
results, docs/tfhe.md "MNIST").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks._results import RESULTS, command_line, write_results  # noqa: E402
from fhe.api.parts import DEFAULT_CALIB_SAMPLES  # noqa: E402

RECIPES = {  # model size, tokenisation, training and quantization (over the TFHE defaults) per task
    # digits: make demo's model (5-bit activations: results/digits_design_sweep_widths.md)
    "digits": dict(
        patch=4,
        d_model=16,
        n_heads=1,
        epochs=60,
        qat_epochs=100,
        batch_size=64,
        quant=dict(n_bits=5),
    ),
    # MNIST as 4 tokens of 14x14 pixels (benchmarks/results/tfhe_model_mnist_4tokens.md): 16
    # tokens of 7x7 (docs/tfhe.md) pay T² = 256 attention lookups per feature, ~2100 s estimated
    # per sample for a 96.7% program; 4 tokens with d_model 24: a 98.05% float model, a 97.6%
    # program, ~160 s. Wider attention than the digits defaults: 6-bit Q/K/V (3-bit: 26% after
    # PTQ), 7-bit activations, 6-bit weights, every lookup (the attention's too) rounded to 6 bits
    # (one N = 8192 parameter set instead of N = 16384); the client pools the head; the last
    # residual is not folded (a point lost on MNIST: results/mnist_qat_client_pooling.md).
    "mnist": dict(
        patch=14,
        d_model=24,
        n_heads=2,
        epochs=80,
        qat_epochs=10,
        qat_lr=5e-4,
        batch_size=128,
        quant=dict(
            n_bits=7,
            weight_bits=6,
            attention_bits=6,
            lut_bits=6,
            round_attention=True,
            client_pooling=True,
            fold_last_residual=False,
            attention_lut_bits=None,
        ),
    ),
}


def recipe_quant(task: str):
    from fhe.api.parts import DEFAULT_QUANT

    return DEFAULT_QUANT.replace(**RECIPES[task].get("quant", {}))


# ------------------------------------------------------------------------------------------
# training
def train_models(task: str, kinds: list[str], seeds: int, workdir: Path) -> dict:
    from fhe.api.parts import (
        TrainConfig,
        config_for_task,
        export,
        load_task,
        program_score,
        save_checkpoint,
        train,
        train_program,
    )

    r = RECIPES[task]
    quant = recipe_quant(task)
    data = load_task(task, patch=r["patch"])
    out = {}
    for kind in kinds:
        rows = []
        for seed in range(seeds):
            cfg = config_for_task(
                data,
                attention=kind,
                d_model=r["d_model"],
                n_heads=r["n_heads"],
                d_ff=r.get("d_ff"),
                norm="batchnorm",
            )
            start = time.perf_counter()
            res = train(
                cfg,
                data,
                TrainConfig(epochs=r["epochs"], batch_size=r["batch_size"], lr=3e-3, seed=seed),
                progress=False,
            )
            ptq = program_score(
                export(res.model, data.x_train[:DEFAULT_CALIB_SAMPLES], quant), data
            )
            qat = train_program(
                res.model,
                data,
                quant,
                TrainConfig(
                    epochs=r["qat_epochs"],
                    lr=r.get("qat_lr", 2e-3),
                    seed=seed,
                    batch_size=r["batch_size"],
                ),
                progress=False,
            )
            rows.append(
                {
                    "seed": seed,
                    "float": res.test_score,
                    "ptq": ptq,
                    "qat_program": qat.program_score,
                    "train_s": time.perf_counter() - start,
                }
            )
            print(
                f"  {kind} seed {seed}: float {res.test_score:.4f}, PTQ {ptq:.4f}, QAT program "
                f"{qat.program_score:.4f}",
                flush=True,
            )
            if seed == 0:
                save_checkpoint(workdir / f"{kind}.pt", qat.model, data, quant=quant.to_dict())
        out[kind] = rows
    return out


# --------------------------------------------------------------------------------- one measurement
def measure(spec: dict) -> dict:
    """Compile ``spec['model']`` with the TFHE defaults (+ ``spec`` overrides), keygen, run
    encrypted samples, simulate the test split. Runs in a child process."""
    from fhe.api.parts import (
        TfheParams,
        compile_model,
        estimated_latency_s,
        load_checkpoint,
        load_task_of,
        resolve_quant,
    )

    torch.set_num_threads(2)
    ckpt = load_checkpoint(spec["model"])
    data = load_task_of(ckpt.task)
    quant = resolve_quant(ckpt.extra.get("quant"))
    params = TfheParams(
        quant=quant,
        exact_rounding=spec.get("exact_rounding", True),
        global_p_error=spec.get("global_p_error", 1e-5),
        loop_parallelize=spec.get("loop_parallelize", True),
        dataflow_parallelize=spec.get("dataflow_parallelize", False),
        compress_keys=spec.get("compress_keys", True),
    )
    load_before = os.getloadavg()[0]
    compiled = compile_model(ckpt.model, data.x_train[:DEFAULT_CALIB_SAMPLES], params, quant)
    circuit = compiled.backend.circuit
    rep = compiled.report()
    x_int = compiled.program.quantize_input(data.x_test)
    # the clear program per sample; the refused samples take some value outside its calibrated
    # width (the clear run saturates it, the circuit wraps around: InputOverflowError)
    clear, accepted = compiled.program.run_int_accepted(x_int)
    logits = compiled.program.dequantize_output  # a client-pooled program sums per-token outputs
    y = data.y_test.numpy()
    result = {
        "spec": spec,
        "quant": quant.to_dict(),
        "pbs": rep["pbs_count"],
        "max_bit_width": rep["max_bit_width"],
        "max_lookup_input_bits": max(r["lookup_input_bits"] or 0 for r in rep["stages"]),
        "params": rep["params_all"],
        "key_mib": rep["key_sizes_bytes"]["evaluation"] / 2**20,
        "complexity": rep["complexity"],
        "global_p_error": rep["global_p_error"],  # Concrete's, for the circuit it compiled
        "estimated_latency_s": estimated_latency_s(circuit),
        "stages": rep["stages"],
        "clear_accuracy": float((logits(clear).argmax(-1) == y).mean()),
        "load_avg_1min_before": load_before,
    }
    result["n_refused"] = int((~accepted).sum())
    if spec.get("simulate", True):
        sim = np.stack([compiled.backend.simulate(x) for x in x_int])
        equal = (sim == clear).reshape(len(y), -1).all(-1)
        result.update(
            sim_accuracy=float((logits(sim).argmax(-1) == y).mean()),
            sim_exact_match=float(equal.mean()),
            sim_exact_match_accepted=float(equal[accepted].mean()),
            sim_argmax_agreement=float((logits(sim).argmax(-1) == logits(clear).argmax(-1)).mean()),
            n_test=int(len(y)),
        )
    n_exec = spec.get("n_exec", 1)
    if n_exec:
        start = time.perf_counter()
        compiled.keygen()
        result["keygen_s"] = time.perf_counter() - start
        result["key_upload_mib"] = compiled.backend.serialized_key_bytes() / 2**20
        lat, equal, correct = [], [], []
        for i in range(n_exec):
            ct = compiled.backend.encrypt(x_int[i])
            start = time.perf_counter()
            out_ct = compiled.backend.run(ct)
            lat.append(time.perf_counter() - start)
            got = compiled.backend.decrypt(out_ct)
            equal.append(bool(np.array_equal(got, clear[i])))
            correct.append(bool(logits(got).argmax() == y[i]))
        result.update(
            latency_s=lat,
            latency_median_s=float(np.median(lat)),
            encrypted_equals_clear=equal,
            encrypted_correct=correct,
        )
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    result["load_avg_1min_after"] = os.getloadavg()[0]
    return result


CHILD_TIMEOUT_S = (
    3600  # per measurement; --child-timeout (MNIST's 6-bit attention: ~30 min per sample alone)
)


def run_child(spec: dict, cores: str | None = None, timeout_s: int = CHILD_TIMEOUT_S) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    if cores:
        cmd = ["taskset", "-c", cores, *cmd]
    return run_json_command(cmd, timeout_s, f"measurement {spec}")


def run_json_command(cmd: list[str], timeout_s: int, what: str) -> dict:
    """Run a measurement process whose last line of output is its JSON result."""
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if res.returncode:
        raise RuntimeError(f"{what} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------- report
def _pct(v) -> str:
    return "—" if v is None else f"{100 * v:.2f}%"


def _sim_equal(m: dict) -> str:
    """Simulation == clear over the test split, and over the samples the client accepts (the
    others overflow a calibrated width: refused, InputOverflowError)."""
    text = _pct(m.get("sim_exact_match"))
    if m.get("n_refused"):
        text += (
            f" ({_pct(m.get('sim_exact_match_accepted'))} of the accepted; {m['n_refused']} "
            "refused)"
        )
    return text


def _num(v, spec: str) -> str:  # "—" for what a run did not measure (e.g. keygen with --n-exec 0)
    return "—" if v is None else format(v, spec)


def report(
    task: str, accuracy: dict, main_rows: dict, variants: list[tuple[str, dict]]
) -> list[str]:
    lines = [f"# Whole models under TFHE: {task}", "", f"`{command_line()}`", ""]
    if accuracy:
        lines.append(
            f"Recipe: {RECIPES[task]}; BatchNorm folded at export; `fhe train --qat-bits "
            f"{recipe_quant(task).n_bits}` (QAT "
            f"through the integer program: {_quant_text(task)}, exact rounding, global p_error "
            "1e-5, seeded evaluation keys)."
        )
    else:
        (kind, m), *_ = main_rows.items()
        lines.append(
            f"A saved {kind} model (`{m['spec']['model']}`), compiled with the quantization it "
            f"records: {m['quant']}; exact rounding, global p_error 1e-5, seeded evaluation keys."
        )
    lines += [
        "Machine: 2 cores, shared; load averages are listed with each measurement. Keys: 'in "
        "memory' is what the server holds (Concrete's key sizes), 'uploaded' what the client "
        "serialises, stores and sends.",
    ]
    if accuracy:
        lines += [
            "",
            "## Accuracy (test split; the integer program is the QAT model's own forward)",
            "",
            "| kind | float | PTQ program | QAT program | seeds |",
            "|---|---|---|---|---|",
        ]
    for kind, rows in accuracy.items():
        f, p, q = (np.array([r[k] for r in rows]) for k in ("float", "ptq", "qat_program"))
        lines.append(
            f"| {kind} | {100 * f.mean():.2f} ± {100 * f.std():.2f} | {100 * p.mean():.2f} ± "
            f"{100 * p.std():.2f} | {100 * q.mean():.2f} ± {100 * q.std():.2f} | {len(rows)} |"
        )
    lines += [
        "",
        "## Encrypted (seed-0 model of each kind)",
        "",
        "| kind | PBS | max lookup input bits | max width | eval. keys in memory (MiB) | keys "
        "uploaded (MiB) | keygen (s) | latency (s, median) | est. latency (s) | encrypted == clear "
        "| clear acc. | simulated acc. | sim == clear | peak RSS (GiB) | load before/after |",
        "|" + "---|" * 15,
    ]
    for kind, m in main_rows.items():
        lines.append(
            f"| {kind} | {m['pbs']} | {m['max_lookup_input_bits']} | {m['max_bit_width']} | "
            f"{m['key_mib']:.0f} | "
            f"{_num(m.get('key_upload_mib'), '.0f')} | "
            f"{_num(m.get('keygen_s'), '.1f')} | {_num(m.get('latency_median_s'), '.1f')} | "
            f"{m['estimated_latency_s']:.1f} | {sum(m.get('encrypted_equals_clear', []))}/"
            f"{len(m.get('encrypted_equals_clear', []))} | {_pct(m['clear_accuracy'])} | "
            f"{_pct(m.get('sim_accuracy'))} | {_sim_equal(m)} | "
            f"{m['peak_rss_gib']:.2f} | "
            f"{m['load_avg_1min_before']:.1f}/{m['load_avg_1min_after']:.1f} |"
        )
    if len(main_rows) == 2:
        (ka, a), (kb, b) = main_rows.items()
        if "latency_median_s" in a and "latency_median_s" in b:
            lines += [
                "",
                f"{kb} / {ka}: {b['pbs'] / a['pbs']:.2f}x the PBS, "
                f"{b['latency_median_s'] / a['latency_median_s']:.2f}x the latency, "
                f"{b['key_mib'] / a['key_mib']:.2f}x the keys (same run, same machine).",
            ]
    for kind, m in main_rows.items():
        lines += [
            "",
            f"### {kind}: stages",
            "",
            "| stage | PBS | lookup input bits | max width | parameter sets | est. time share |",
            "|---|---|---|---|---|---|",
        ]
        for r in m["stages"]:
            params = "; ".join(f"{p}: {n}" for p, n in r["params"].items()) or "—"
            lines.append(
                f"| {r['tag']} | {r['pbs']} | {r['lookup_input_bits'] or '—'} | {r['bit_width']} | "
                f"{params} | {100 * r['est_time_share']:.1f}% |"
            )
    if variants:
        lines += [
            "",
            "## Variants (first kind's model)",
            "",
            "| variant | PBS | eval. keys in memory / uploaded (MiB) | latency (s) | est. latency "
            "(s) | simulated acc. | sim == clear | sim argmax == clear | encrypted == clear | load "
            "before/after |",
            "|" + "---|" * 10,
        ]
        for label, m in variants:
            eq = m.get("encrypted_equals_clear", [])
            lines.append(
                f"| {label} | {m['pbs']} | {m['key_mib']:.0f} / "
                f"{m.get('key_upload_mib', float('nan')):.0f} | "
                f"{m.get('latency_median_s', float('nan')):.1f} | {m['estimated_latency_s']:.1f} | "
                f"{_pct(m.get('sim_accuracy'))} | {_pct(m.get('sim_exact_match'))} | "
                f"{_pct(m.get('sim_argmax_agreement'))} | {sum(eq)}/{len(eq)} | "
                f"{m['load_avg_1min_before']:.1f}/{m['load_avg_1min_after']:.1f} |"
            )
    return lines


def _quant_text(task: str) -> str:
    q = recipe_quant(task)
    return (
        f"{q.n_bits}-bit activations, {q.attention_bits}-bit Q/K/V, {q.weight_bits}-bit weights, "
        f"{q.input_bits}-bit inputs, lookups rounded to <= {q.lut_bits} bits"
        + (" (the attention's |q − k| and (v − z)⁺ too)" if q.round_attention else "")
    )


VARIANTS = [
    ("uncompressed keys", {"compress_keys": False}),
    ("approximate rounding", {"exact_rounding": False}),
    ("global p_error 1e-3", {"global_p_error": 1e-3}),
    ("no loop parallelism (1 thread of work)", {"loop_parallelize": False}),
    ("dataflow parallelism (loops off)", {"dataflow_parallelize": True, "loop_parallelize": False}),
]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--task", choices=sorted(RECIPES), default="digits")
    ap.add_argument("--kinds", default="inhibitor,dot-product")
    ap.add_argument("--seeds", type=int, default=3, help="QAT seeds for the accuracy statistics")
    ap.add_argument("--n-exec", type=int, default=3, help="encrypted samples of the first kind")
    ap.add_argument(
        "--n-exec-others",
        type=int,
        default=1,
        help="encrypted samples of the other kinds (the dot-product model's keys are ~8 GB here)",
    )
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--stem", default=None)
    ap.add_argument(
        "--quant",
        type=json.loads,
        default={},
        help="JSON overrides of the recipe's quantization, e.g. '{\"round_attention\": true}'",
    )
    ap.add_argument(
        "--recipe",
        type=json.loads,
        default={},
        help='JSON overrides of the task\'s recipe (RECIPES), e.g. \'{"patch": 7, "d_model": '
        "16}' for the earlier 16-token MNIST model",
    )
    ap.add_argument(
        "--child-timeout",
        type=int,
        default=CHILD_TIMEOUT_S,
        help="seconds one measurement (compile, simulate the test split, keygen, encrypted runs) "
        "may take",
    )
    ap.add_argument(
        "--model",
        type=Path,
        default=None,
        help="measure this fhe train / mnist_qat_schedule.py checkpoint as the (single) kind "
        "instead of training",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model and "," in args.kinds:
        ap.error("--model measures one model: give --kinds with the one kind it is")
    if args.model and not args.model.is_file():
        ap.error(f"--model {args.model}: no such file")
    if args.child:
        print(json.dumps(measure(json.loads(args.child)), default=float), flush=True)
        sys.stdout.flush()
        os._exit(0)
    unknown = set(args.recipe) - set(RECIPES[args.task]) - {"d_ff"}
    if unknown:
        ap.error(f"--recipe: unknown keys {sorted(unknown)}; known: {sorted(RECIPES[args.task])}")
    RECIPES[args.task] = {**RECIPES[args.task], **args.recipe}
    if args.quant:  # the report's recipe line shows the overrides with the rest
        RECIPES[args.task] = {
            **RECIPES[args.task],
            "quant": {**RECIPES[args.task].get("quant", {}), **args.quant},
        }
    kinds = args.kinds.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        models = {kinds[0]: args.model} if args.model else None
        if models is None:
            print(f"training ({args.seeds} seeds per kind) ...", flush=True)
            accuracy = train_models(args.task, kinds, args.seeds, workdir)
            models = {kind: workdir / f"{kind}.pt" for kind in kinds}
        else:
            accuracy = {}
        main_rows = {}
        for i, (kind, path) in enumerate(models.items()):
            print(f"measuring {kind} ...", flush=True)
            n_exec = args.n_exec if i == 0 else args.n_exec_others
            main_rows[kind] = run_child(
                {"model": str(path), "n_exec": n_exec}, timeout_s=args.child_timeout
            )
        variants = []
        if not args.no_variants:
            first = str(models[kinds[0]])
            for label, spec in VARIANTS:
                print(f"variant: {label} ...", flush=True)
                variants.append(
                    (
                        label,
                        run_child(
                            {"model": first, "n_exec": 1, **spec}, timeout_s=args.child_timeout
                        ),
                    )
                )
            print("variant: one core (taskset -c 0) ...", flush=True)
            variants.append(
                (
                    "one core (taskset -c 0)",
                    run_child(
                        {"model": first, "n_exec": 1, "simulate": False},
                        cores="0",
                        timeout_s=args.child_timeout,
                    ),
                )
            )
    lines = report(args.task, accuracy, main_rows, variants)
    stem = args.stem or ("tfhe_model" if args.task == "digits" else f"tfhe_model_{args.task}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    import benchmarks._results as results

    results.RESULTS = args.out_dir
    paths = write_results(
        stem,
        lines,
        {
            "task": args.task,
            "recipe": RECIPES[args.task],
            "accuracy": accuracy,
            "encrypted": main_rows,
            "variants": dict(variants),
        },
    )
    print("\n".join(lines))
    print(f"wrote {paths['md']} and {paths['json']}")


if __name__ == "__main__":
    main()
