"""Design choices of the digits TFHE model, each over several seeds: QAT accuracy and compiled cost.

For every variant and seed: train the make-demo model's float network (digits, 4 tokens of 4x4
pixels, Inhibitor, d_model 16, 1 head, BatchNorm, 60 epochs), fine-tune it through its integer
program (``quant.program_qat.train_program``, 100 epochs) with the variant's quantization, then
compile it (no keys, no encrypted run: ``benchmarks/tfhe_model.py``'s measurement) for its PBS,
parameter sets, evaluation-key size, Concrete complexity and estimated latency. Accuracies are the
integer program's on the test split (360 digits); one row per seed, then the mean per variant.

    python benchmarks/digits_design_sweep.py                      # ~45 s per variant and seed
    python benchmarks/digits_design_sweep.py --variants tied,tied-a4 --seeds 0,1,2

The machine's load does not enter these figures: complexity and parameters are deterministic for a
given program; the estimated latency is complexity times one constant (fhe/tfhe/recipe.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import command_line, write_results  # noqa: E402
from benchmarks.mnist_qat_schedule import _cost, _param_text  # noqa: E402
from fhe.api.parts import QuantConfig  # noqa: E402

# The quantization every variant changes: the TFHE recipe before this sweep, with the head per
# token pooled by the client (fhe/tfhe/recipe.py's DEFAULT_QUANT is "fold-qkv-lut4" below)
BASE = QuantConfig(
    n_bits=6,
    weight_bits=4,
    input_bits=4,
    attention_bits=3,
    lut_bits=5,
    range_mode="percentile",
    client_pooling=True,
)

# name: (what it changes, model options, quantization changes over BASE)
VARIANTS = {
    "default": ("6/4/4-bit, 3-bit Q/K/V, lookups <= 5 bits, the client pools the head", {}, {}),
    "server-pooling": ("mean pooling and head on the server", {}, {"client_pooling": False}),
    "tied": ("K = Q (--tie-qk), 3-bit Q/K/V", {"tie_qk": True}, {}),
    "tied-a4": ("K = Q, 4-bit Q/K/V", {"tie_qk": True}, {"attention_bits": 4}),
    "n5": ("5-bit activations", {}, {"n_bits": 5}),
    "w3": ("3-bit weights", {}, {"weight_bits": 3}),
    "fold-residual": (
        "the last FFN residual folded into the per-token head (no res2 lookups)",
        {},
        {"fold_last_residual": True},
    ),
    "qkv-lut4": (
        "the Q/K/V lookups read 4 bits (the attention's partition)",
        {},
        {"attention_lut_bits": 4},
    ),
    "fold-qkv-lut4": (
        "fold-residual and qkv-lut4 (the TFHE defaults now)",
        {},
        {"fold_last_residual": True, "attention_lut_bits": 4},
    ),
    "lut4": ("every lookup reads at most 4 bits", {}, {"lut_bits": 4}),
    "d12": ("d_model 12 (every per-token lookup count x 0.75)", {"d_model": 12}, {}),
    "d8": ("d_model 8 (every per-token lookup count x 0.5)", {"d_model": 8}, {}),
    "d12-fold-qkv-lut4": (
        "d_model 12, fold-residual and qkv-lut4",
        {"d_model": 12},
        {"fold_last_residual": True, "attention_lut_bits": 4},
    ),
    # narrower accumulators: every bit less is one rounding PBS less per lookup
    "fold-qkv-lut4-n5": (
        "the TFHE defaults with 5-bit activations",
        {},
        {"fold_last_residual": True, "attention_lut_bits": 4, "n_bits": 5},
    ),
    "fold-qkv-lut4-w3": (
        "the TFHE defaults with 3-bit weights",
        {},
        {"fold_last_residual": True, "attention_lut_bits": 4, "weight_bits": 3},
    ),
}


def run_one(model_options: dict, quant_changes: dict, seed: int) -> dict:
    from fhe import api
    from fhe.api.parts import TrainConfig, train_program

    options = dict(task="digits", patch=4, attention="inhibitor", d_model=16, heads=1, epochs=60)
    req = api.TrainRequest(**{**options, **model_options}, seed=seed)
    outcome = api.train_model(req, progress=False)
    quant = BASE.replace(**quant_changes)
    qat = train_program(
        outcome.model,
        outcome.data,
        quant,
        TrainConfig(epochs=100, lr=2e-3, seed=seed),
        progress=False,
    )
    cost = _cost(qat.model, outcome.data, quant)
    return {
        "seed": seed,
        "float_accuracy": outcome.test_score,
        "program_accuracy": qat.program_score,
        "pbs": cost["pbs"],
        "max_bit_width": cost["max_bit_width"],
        "key_mib": cost["key_mib"],
        "complexity": cost["complexity"],
        "estimated_latency_s": cost["estimated_latency_s"],
        "params": cost["params"],
    }


def report(rows: dict[str, list[dict]]) -> list[str]:
    lines = [
        "# Digits TFHE model: design choices over seeds",
        "",
        f"`{command_line()}`",
        "",
        "The make-demo model (4 tokens of 4x4 pixels, Inhibitor, d_model 16, 1 head), fine-tuned "
        "through its integer program per variant; accuracy of the integer program on the 360 test "
        "digits; cost of the compiled circuit (global p_error 1e-5, exact rounding, no keys "
        "generated). Estimated latency = complexity x 6e-11 s (a fast hour of this 2-core "
        "machine; slow hours ran up to 2.6x longer).",
        "",
        "## Mean per variant",
        "",
        "| variant | seeds | float acc. | program acc. (min-max) | PBS | key MiB | complexity | "
        "est. latency (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rs in rows.items():
        acc = [r["program_accuracy"] for r in rs]
        lines.append(
            f"| {name}: {VARIANTS[name][0]} | {len(rs)} | "
            f"{100 * statistics.mean(r['float_accuracy'] for r in rs):.2f}% | "
            f"{100 * statistics.mean(acc):.2f}% ({100 * min(acc):.2f}-{100 * max(acc):.2f}) | "
            f"{statistics.mean(r['pbs'] for r in rs):.0f} | "
            f"{statistics.mean(r['key_mib'] for r in rs):.0f} | "
            f"{statistics.mean(r['complexity'] for r in rs):.3g} | "
            f"{statistics.mean(r['estimated_latency_s'] for r in rs):.1f} |"
        )
    lines += [
        "",
        "## Every run",
        "",
        "| variant | seed | float | program | PBS | max width | key MiB | est. (s) | "
        "parameter sets |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rs in rows.items():
        for r in rs:
            lines.append(
                f"| {name} | {r['seed']} | {100 * r['float_accuracy']:.2f}% | "
                f"{100 * r['program_accuracy']:.2f}% | {r['pbs']} | {r['max_bit_width']} | "
                f"{r['key_mib']:.0f} | {r['estimated_latency_s']:.1f} | {_param_text(r)} |"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--stem", default="digits_design_sweep")
    ap.add_argument(
        "--render",
        action="store_true",
        help="only rewrite the Markdown from the stem's JSON (this script's current descriptions)",
    )
    args = ap.parse_args()
    if args.render:
        import json

        from benchmarks._results import RESULTS

        rows = json.loads((RESULTS / f"{args.stem}.json").read_text())
        produced_by = (
            (RESULTS / f"{args.stem}.md").read_text().splitlines()[2].split("; rendered")[0]
        )
        lines = report(rows)
        lines[2] = f"{produced_by}; rendered again by `{command_line()}`"
        paths = write_results(args.stem, lines, rows)
        print(f"wrote {paths['md']}")
        return
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    rows: dict[str, list[dict]] = {}
    for name in names:
        _, model_options, quant_changes = VARIANTS[name]
        for seed in seeds:
            row = run_one(model_options, quant_changes, seed)
            rows.setdefault(name, []).append(row)
            print(
                f"{name} seed {seed}: program {100 * row['program_accuracy']:.2f}%, "
                f"{row['pbs']} PBS, est. {row['estimated_latency_s']:.1f} s",
                flush=True,
            )
            paths = write_results(args.stem, report(rows), rows)  # after every run: partial
    print(f"wrote {paths['md']} and {paths['json']}")


if __name__ == "__main__":
    main()
