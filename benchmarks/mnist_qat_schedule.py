"""How the MNIST TFHE recipe's QAT schedule and weight width were chosen: one float model, several
QAT runs.

Trains the MNIST float model of ``benchmarks/tfhe_model.py``'s recipe once (seed 0), then fine-tunes
it through its integer program (``quant.program_qat.train_program``) for each candidate (QAT epochs,
learning rate, distillation weight, quantization changes) and scores every program on the test
split. The candidates were compared on the test split itself (MNIST has no separate validation split
here), so the chosen row carries a small selection bias; each row is one seed.

    python benchmarks/mnist_qat_schedule.py    # ~13 min float training + ~3-8 min per candidate
    python benchmarks/mnist_qat_schedule.py --only 9,10,11 --cost --stem mnist_qat_attention_bits

``--cost`` also compiles each candidate's program (no keys, no encrypted run) for its PBS, parameter
sets, evaluation-key size and estimated latency (``benchmarks/tfhe_model.py``'s measurement).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks._results import command_line, write_results  # noqa: E402
from fhe.api.parts import QuantConfig  # noqa: E402

# The model these schedules were chosen on: 16 tokens of 7x7 pixels (benchmarks/tfhe_model.py's
# MNIST recipe until it moved to 4 tokens of 14x14), trained as that recipe trains its float model.
MODEL = dict(patch=7, d_model=16, n_heads=2, epochs=80, batch_size=128)
# Its quantization before each row's changes (the TFHE defaults of the time with MNIST's widths).
BASE_QUANT = QuantConfig(
    n_bits=7, weight_bits=6, input_bits=4, attention_bits=6, lut_bits=6, range_mode="percentile"
)

# The rows 0-14 were measured before the TFHE defaults pooled on the client; they pin the
# server-side pooling they ran with.
_SERVER_POOLING = {"client_pooling": False, "fold_last_residual": False, "attention_lut_bits": None}
# Rows 15-: the current defaults' client pooling and folded last residual, Q/K/V lookups at the
# recipe's own width (4-bit lookups would feed 6-bit Q/K/V).
_CLIENT_POOLING = {"client_pooling": True, "fold_last_residual": True, "attention_lut_bits": None}

CANDIDATES = [  # label, QAT epochs, learning rate, distillation weight, quantization changes
    (
        "30 epochs at 2e-3, 5-bit weights (the previous recipe)",
        30,
        2e-3,
        0.5,
        {**_SERVER_POOLING, "weight_bits": 5},
    ),
    ("3 epochs at 2e-3, 5-bit weights", 3, 2e-3, 0.5, {**_SERVER_POOLING, "weight_bits": 5}),
    ("3 epochs at 1e-3, 5-bit weights", 3, 1e-3, 0.5, {**_SERVER_POOLING, "weight_bits": 5}),
    ("5 epochs at 5e-4, 5-bit weights", 5, 5e-4, 0.5, {**_SERVER_POOLING, "weight_bits": 5}),
    ("10 epochs at 5e-4, 5-bit weights", 10, 5e-4, 0.5, {**_SERVER_POOLING, "weight_bits": 5}),
    ("10 epochs at 1e-3, 5-bit weights", 10, 1e-3, 0.5, {**_SERVER_POOLING, "weight_bits": 5}),
    (
        "5 epochs at 1e-3, distillation 0.9, 5-bit weights",
        5,
        1e-3,
        0.9,
        {**_SERVER_POOLING, "weight_bits": 5},
    ),
    (
        "10 epochs at 5e-4, 5-bit weights, 5-bit inputs",
        10,
        5e-4,
        0.5,
        {**_SERVER_POOLING, "weight_bits": 5, "input_bits": 5},
    ),
    ("10 epochs at 5e-4, 6-bit weights", 10, 5e-4, 0.5, {**_SERVER_POOLING, "weight_bits": 6}),
    # the attention lookups of 6-bit Q/K/V read 7 bits and land on N=16384 (~83% of the run time):
    (
        "10 epochs at 5e-4, 6-bit weights, 5-bit Q/K/V",
        10,
        5e-4,
        0.5,
        {**_SERVER_POOLING, "weight_bits": 6, "attention_bits": 5},
    ),
    (
        "10 epochs at 5e-4, 6-bit weights, 4-bit Q/K/V",
        10,
        5e-4,
        0.5,
        {**_SERVER_POOLING, "weight_bits": 6, "attention_bits": 4},
    ),
    (
        "10 epochs at 5e-4, 6-bit weights, 5-bit Q/K/V, lookups <= 5 bits",
        10,
        5e-4,
        0.5,
        {**_SERVER_POOLING, "weight_bits": 6, "attention_bits": 5, "lut_bits": 5},
    ),
    (
        "10 epochs at 5e-4, 6-bit weights, 6-bit Q/K/V, attention lookups rounded to 6 bits",
        10,
        5e-4,
        0.5,
        {**_SERVER_POOLING, "weight_bits": 6, "round_attention": True},
    ),
    (
        "20 epochs at 5e-4, 6-bit weights, 6-bit Q/K/V, attention lookups rounded to 6 bits",
        20,
        5e-4,
        0.5,
        {**_SERVER_POOLING, "weight_bits": 6, "round_attention": True},
    ),
    (
        "20 epochs at 1e-3, 6-bit weights, 6-bit Q/K/V, attention lookups rounded to 6 bits",
        20,
        1e-3,
        0.5,
        {**_SERVER_POOLING, "weight_bits": 6, "round_attention": True},
    ),
    (
        "10 epochs at 5e-4, 6-bit weights, 6-bit Q/K/V, client pooling, last residual folded",
        10,
        5e-4,
        0.5,
        {**_CLIENT_POOLING, "weight_bits": 6},
    ),
    (
        "10 epochs at 5e-4, 6-bit weights, 6-bit Q/K/V, attention lookups rounded to 6 bits, "
        "client pooling, last residual folded",
        10,
        5e-4,
        0.5,
        {**_CLIENT_POOLING, "weight_bits": 6, "round_attention": True},
    ),
    (
        "10 epochs at 5e-4, 6-bit weights, 6-bit Q/K/V, client pooling",
        10,
        5e-4,
        0.5,
        {**_CLIENT_POOLING, "fold_last_residual": False, "weight_bits": 6},
    ),
    (
        "10 epochs at 5e-4, 6-bit weights, 6-bit Q/K/V, attention lookups rounded to 6 bits, "
        "client pooling",
        10,
        5e-4,
        0.5,
        {**_CLIENT_POOLING, "fold_last_residual": False, "weight_bits": 6, "round_attention": True},
    ),
]


def main() -> None:
    from fhe.api.parts import (
        DEFAULT_CALIB_SAMPLES,
        TrainConfig,
        config_for_task,
        evaluate,
        export,
        load_checkpoint,
        load_task,
        program_score,
        save_checkpoint,
        train,
        train_program,
    )

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--only", default=None, help="comma-separated candidate indices (0-based); default all"
    )
    ap.add_argument("--cost", action="store_true", help="compile each candidate for its TFHE cost")
    ap.add_argument("--stem", default="mnist_qat_schedule")
    ap.add_argument(
        "--float-model",
        default=None,
        help="a float checkpoint of the recipe (fhe train's .pt) to fine-tune instead of training "
        "one (~13 min)",
    )
    ap.add_argument("--save-dir", default=None, help="write each candidate's QAT model here")
    ap.add_argument(
        "--save-float", default=None, help="write the float model trained here to this path"
    )
    args = ap.parse_args()
    indices = [int(i) for i in args.only.split(",")] if args.only else range(len(CANDIDATES))
    picked = [CANDIDATES[i] for i in indices]
    torch.set_num_threads(2)
    r = MODEL
    data = load_task("mnist", patch=r["patch"])
    cfg = config_for_task(
        data, attention="inhibitor", d_model=r["d_model"], n_heads=r["n_heads"], norm="batchnorm"
    )
    if args.float_model:
        float_model = load_checkpoint(args.float_model).model.eval()
        float_score = evaluate(float_model, data)
    else:
        res = train(
            cfg,
            data,
            TrainConfig(epochs=r["epochs"], batch_size=r["batch_size"], lr=3e-3, seed=0),
            progress=False,
        )
        float_model, float_score = res.model, res.test_score
        if args.save_float:
            save_checkpoint(args.save_float, float_model, data)
    rows = []
    for index, (label, epochs, lr, distill, changes) in zip(indices, picked, strict=True):
        quant = BASE_QUANT.replace(**changes)
        start = time.perf_counter()
        ptq = program_score(export(float_model, data.x_train[:DEFAULT_CALIB_SAMPLES], quant), data)
        qat = train_program(
            float_model,
            data,
            quant,
            TrainConfig(epochs=epochs, lr=lr, seed=0, batch_size=r["batch_size"]),
            progress=False,
            distill=distill,
        )
        row = {
            "label": label,
            "qat_epochs": epochs,
            "lr": lr,
            "distill": distill,
            "quant": changes,
            "ptq": ptq,
            "qat_program": qat.program_score,
            "seconds": time.perf_counter() - start,
        }
        if args.save_dir:
            Path(args.save_dir).mkdir(parents=True, exist_ok=True)
            save_checkpoint(
                Path(args.save_dir) / f"candidate{index}.pt", qat.model, data, quant=quant.to_dict()
            )
        if args.cost:
            row["cost"] = _cost(qat.model, data, quant)
        rows.append(row)
        print(
            f"{label}: PTQ {100 * ptq:.2f}%, QAT program {100 * qat.program_score:.2f}%", flush=True
        )
    lines = [
        "# MNIST TFHE recipe: the QAT schedule and weight width",
        "",
        f"`{command_line()}`",
        "",
        f"One float model (seed 0, {r['epochs']} epochs): test accuracy "
        f"{100 * float_score:.2f}%. Each row fine-tunes it through its integer program (7-bit "
        "activations, 6-bit Q/K/V, 4-bit inputs, lookups <= 6 bits unless the row says otherwise) "
        "and scores the program on the 10 000 test samples; one seed per row, chosen on the test "
        "split (no validation split), so read differences below ~0.3 points as noise.",
        "",
        "| candidate | PTQ program | QAT program | below float (points) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {w['label']} | {100 * w['ptq']:.2f}% | {100 * w['qat_program']:.2f}% | "
        f"{100 * (float_score - w['qat_program']):.2f} |"
        for w in rows
    ]
    if args.cost:
        lines += [
            "",
            "## TFHE cost of each program (compiled, global p_error 1e-5; no keys generated)",
            "",
            "| candidate | PBS | max lookup input bits | parameter sets (PBS each) | eval. keys "
            "(MiB) | est. latency (s) |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {w['label']} | {w['cost']['pbs']} | {w['cost']['max_lookup_input_bits']} | "
            f"{_param_text(w['cost'])} | {w['cost']['key_mib']:.0f} | "
            f"{w['cost']['estimated_latency_s']:.0f} |"
            for w in rows
        ]
    write_results(args.stem, lines, {"float": float_score, "rows": rows})


def _cost(model, data, quant) -> dict:
    """PBS, parameter sets, keys and estimated latency of the candidate's compiled circuit (child
    process)."""
    import tempfile

    from benchmarks.tfhe_model import run_child
    from fhe.api.parts import save_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "candidate.pt"
        save_checkpoint(path, model, data, quant=quant.to_dict())
        return run_child({"model": str(path), "n_exec": 0, "simulate": False})


def _param_text(cost: dict) -> str:
    """The circuit's parameter sets with their PBS counts (Concrete's statistics), largest first."""
    sets = sorted(cost["params"], key=lambda p: -p["pbs"])
    return "; ".join(
        f"N={p['polynomial_size']} k={p['glwe_dimension']} n={p['lwe_dimension']}: {p['pbs']}"
        for p in sets
    )


if __name__ == "__main__":
    main()
