"""How the digits TFHE recipe was chosen: accuracy over QAT seeds against the compiled circuit's
cost.

For each candidate (model shape x quantization), train the float model and fine-tune it through its
integer program (``fhe train --qat-bits 6``) for every seed, then compile the seed-0 model
(simulation only: no keys) and read its PBS count, Concrete's complexity as an estimated latency on
this machine (``fhe/tfhe/recipe.py``, within ~10% of measured runs) and the evaluation-key size.
Measured latencies of the chosen recipe are in ``tfhe_model.md``.

    python benchmarks/tfhe_recipes.py --seeds 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks._results import command_line, write_results  # noqa: E402

BASE = dict(patch=4, d_model=16, epochs=60, qat_epochs=100, batch_size=64)
CANDIDATES = [  # label, model overrides, quantization overrides (on the TFHE defaults)
    ("2 heads, 4-bit Q/K/V (the previous default)", {"n_heads": 2}, {"attention_bits": 4}),
    ("2 heads, 3-bit Q/K/V", {"n_heads": 2}, {"attention_bits": 3}),
    ("1 head, 3-bit Q/K/V (the default)", {"n_heads": 1}, {"attention_bits": 3}),
    ("2 heads, FFN 64, 3-bit Q/K/V", {"n_heads": 2, "d_ff": 64}, {"attention_bits": 3}),
    ("1 head, FFN 64, 3-bit Q/K/V", {"n_heads": 1, "d_ff": 64}, {"attention_bits": 3}),
]


def main() -> None:
    from fhe.api.parts import (
        DEFAULT_CALIB_SAMPLES,
        DEFAULT_QUANT,
        TfheParams,
        TrainConfig,
        compile_model,
        config_for_task,
        load_task,
        train,
        train_program,
    )

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(2)
    data = load_task("digits", patch=BASE["patch"])
    floats: dict[tuple, list] = {}
    rows = []
    for label, arch, quant_changes in CANDIDATES:
        key = tuple(sorted(arch.items()))
        if key not in floats:
            cfg = config_for_task(
                data, attention="inhibitor", d_model=BASE["d_model"], norm="batchnorm", **arch
            )
            floats[key] = [
                train(
                    cfg,
                    data,
                    TrainConfig(
                        epochs=BASE["epochs"], batch_size=BASE["batch_size"], lr=3e-3, seed=s
                    ),
                    progress=False,
                )
                for s in range(args.seeds)
            ]
        quant = DEFAULT_QUANT.replace(**quant_changes)
        accs, cost = [], {}
        for seed, res in enumerate(floats[key]):
            qat = train_program(
                res.model,
                data,
                quant,
                TrainConfig(
                    epochs=BASE["qat_epochs"], lr=2e-3, seed=seed, batch_size=BASE["batch_size"]
                ),
                progress=False,
            )
            accs.append(qat.program_score)
            if seed == 0:
                start = time.perf_counter()
                rep = compile_model(
                    qat.model,
                    data.x_train[:DEFAULT_CALIB_SAMPLES],
                    TfheParams(quant=quant),
                    quant,
                    simulate_only=True,
                ).report()
                cost = {
                    "pbs": rep["pbs_count"],
                    "estimated_latency_s": rep["estimated_latency_s"],
                    "key_mib": rep["key_sizes_bytes"]["evaluation"] / 2**20,
                    "parameter_sets": [
                        f"N={p['polynomial_size']}: {p['pbs']}" for p in rep["params_all"]
                    ],
                    "compile_s": time.perf_counter() - start,
                }
        row = {
            "label": label,
            "model": arch,
            "quant": quant_changes,
            "float": [r.test_score for r in floats[key]],
            "qat_program": accs,
            **cost,
        }
        rows.append(row)
        print(
            f"{label}: {100 * np.mean(accs):.2f} ± {100 * np.std(accs):.2f}%, {cost['pbs']} PBS, "
            f"est. {cost['estimated_latency_s']:.1f} s, {cost['key_mib']:.0f} MiB",
            flush=True,
        )
    lines = [
        "# Choosing the digits TFHE recipe: accuracy over QAT seeds against cost",
        "",
        f"`{command_line()}`",
        "",
        f"Inhibitor, {BASE}; BatchNorm folded; the TFHE defaults otherwise (6-bit activations, "
        "4-bit weights and inputs, lookups rounded to <= 5 bits, exact rounding, global p_error "
        "1e-5). Cost of each seed-0 model from its compiled circuit (estimated latency: "
        "Concrete's complexity x the seconds-per-complexity measured on this 2-core machine; "
        "keys: server memory).",
        "",
        "| recipe | float | QAT program (per seed) | QAT program | PBS | parameter sets (PBS each) "
        "| est. latency (s) | eval. keys (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f, q = np.array(r["float"]), np.array(r["qat_program"])
        lines.append(
            f"| {r['label']} | {100 * f.mean():.2f} ± {100 * f.std():.2f} | "
            f"{', '.join(f'{100 * a:.1f}' for a in q)} | {100 * q.mean():.2f} ± "
            f"{100 * q.std():.2f} | {r['pbs']} | {'; '.join(r['parameter_sets'])} | "
            f"{r['estimated_latency_s']:.1f} | {r['key_mib']:.0f} |"
        )
    paths = write_results("tfhe_recipes", lines, {"base": BASE, "seeds": args.seeds, "rows": rows})
    print("\n".join(lines))
    print(f"wrote {paths['md']} and {paths['json']}")


if __name__ == "__main__":
    main()
