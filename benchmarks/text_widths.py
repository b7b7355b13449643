"""Which bit widths keep a TFHE text program within 1 point of its float model (issue 27)?

    python benchmarks/text_widths.py                   # every shape, seeds 0-2 (about an hour)
    python benchmarks/text_widths.py --only imdb-L2 --seeds 0   # replaces those cells only
    python benchmarks/text_widths.py --only causal --candidate '5-bit Q/K/V'

For each shape (1 block at T = 16, the recipe's own; 2 blocks at T = 16; 1 block at T = 32; 1
causal block at T = 16; the first 32 words padded; the next-word model; the 1-block recipe with
dot-product attention; ``-mean``: with the
Inhibitor's sums as means, ``--inhibitor-mean``; ``-norm``: each segment mean scaled to unit RMS on
the client, ``--segment-norm``) and each candidate quantization, a model is
trained per seed with ``fhe train --task <task> --recipe tfhe`` and the candidate as
``--qat-quant`` (the float model, then 3 epochs of QAT through the integer program).
The float model as trained (before QAT) and the integer program are scored on the whole test split;
the gap is their difference, per seed. The cost columns are the first seed's compiled circuit (no
keys made): PBS count, the compiler's latency estimate and the evaluation keys' size; with them,
the share of short reviews that circuit refuses (each test review cut to its first 8 and 16 words:
the client refuses an input that would overflow a calibrated width, and the calibration set holds
long reviews only).

Writes benchmarks/results/text_widths.md|json. Everything goes through fhe.api.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import command_line, merged_with_saved, write_results  # noqa: E402

# the text recipes' widths (fhe.api.recipes): the TFHE defaults are 6-bit activations, 4-bit
# weights and inputs, 3-bit Q/K/V read by 4-bit lookups, 5-bit lookup inputs
ONE_BLOCK = {"inhibitor_positive_v": True}  # the 1-block sentiment recipe's
WIDE_ATTENTION = {"attention_bits": 4, "attention_lut_bits": 5}
WIDE_V = {"value_bits": 4, "attention_lut_bits": 6}  # V alone at 4 bits (Q/K at 3), 6-bit reads
# the 2-block and padded rule's widths
FIVE_BIT = {**ONE_BLOCK, **WIDE_ATTENTION, "weight_bits": 5, "input_bits": 5}
RECIPE = {**ONE_BLOCK, **WIDE_V, "input_bits": 6}  # the 1-block recipe's widths (fhe.api.recipes)
Z_POINT = r"block\d+\.mix\.attn\.z$"  # the Inhibitor's z = (‖q − k‖₁/γ − α)⁺ lookups
SIX_BIT_LOOKUPS = {"weight_bits": 6, "input_bits": 6, "lut_bits": 6}  # the next-word rows'
CANDIDATES = {
    "imdb": {
        "1-block recipe": ONE_BLOCK,
        "5-bit weights/inputs, 4-bit Q/K/V": FIVE_BIT,
        "6-bit weights/inputs, 4-bit Q/K/V": {
            **ONE_BLOCK,
            **WIDE_ATTENTION,
            "weight_bits": 6,
            "input_bits": 6,
        },
        # padded positions' last residual kept out of the head (their programs fold it since
        # 2026-12-07; the padded rows measured before ran these programs)
        "5-bit weights/inputs, 4-bit Q/K/V, unfolded": {**FIVE_BIT, "fold_last_residual": False},
        "5-bit weights/inputs, 5-bit Q/K/V": {  # read by 6-bit lookups
            **ONE_BLOCK,
            "attention_bits": 5,
            "attention_lut_bits": 6,
            "weight_bits": 5,
            "input_bits": 5,
        },
        # the 1-block widths with wider client inputs (and weights): Q/K/V stay at 3 bits
        "1-block recipe, 5-bit inputs": {**ONE_BLOCK, "input_bits": 5},
        "1-block recipe, 6-bit inputs": {**ONE_BLOCK, "input_bits": 6},
        "1-block recipe, 5-bit weights/inputs": {**ONE_BLOCK, "weight_bits": 5, "input_bits": 5},
        # a wider V widens the (v − z)⁺ lookups, not the |q − k| ones
        "1-block recipe, 4-bit V": {**ONE_BLOCK, **WIDE_V},
        "1-block recipe, 6-bit inputs, 4-bit V": {**ONE_BLOCK, **WIDE_V, "input_bits": 6},
        # the same with V's lookups at 5 bits: no N = 8192 parameter set
        "1-block recipe, 6-bit inputs, 4-bit V read by 5 bits": {
            **ONE_BLOCK,
            **WIDE_V,
            "input_bits": 6,
            "attention_lut_bits": 5,
        },
        "1-block recipe, 6-bit inputs, 4-bit V, 5-bit weights": {
            **ONE_BLOCK,
            **WIDE_V,
            "input_bits": 6,
            "weight_bits": 5,
        },
        "1-block recipe, 6-bit inputs, 4-bit Q/K/V": {
            **ONE_BLOCK,
            "input_bits": 6,
            "attention_bits": 4,
            "attention_lut_bits": 6,
        },
        "1-block recipe, 4-bit V, 5-bit lookups": {
            **ONE_BLOCK,
            "value_bits": 4,
            "attention_lut_bits": 5,
        },
        "4-bit Q/K/V read by 6-bit lookups": {
            **ONE_BLOCK,
            "attention_bits": 4,
            "attention_lut_bits": 6,
        },
        # the dot-product's softmax (numerators, reciprocal, probabilities) narrower: operands of
        # its encrypted products σ(s)·(1/Σ) and a·V
        "recipe, 4-bit softmax": {**RECIPE, "softmax_bits": 4},
        "recipe, 3-bit softmax": {**RECIPE, "softmax_bits": 3},
    },
    "imdb-lm": {
        "6-bit weights/inputs": {"weight_bits": 6, "input_bits": 6},
        # the padded sentiment model's rule (fhe.api.recipes: BEYOND_SHAPE's padded), V⁺ included
        "5-bit weights/inputs, 4-bit Q/K/V, V⁺": {
            **ONE_BLOCK,
            **WIDE_ATTENTION,
            "weight_bits": 5,
            "input_bits": 5,
        },
        "6-bit weights/inputs, 4-bit Q/K/V": {**WIDE_ATTENTION, "weight_bits": 6, "input_bits": 6},
        "6-bit weights/inputs, 6-bit lookups": SIX_BIT_LOOKUPS,
        # z's lookups read 4 bits (its output has 2): the 6-bit lookups are then only the
        # residual's and the FFN's
        "6-bit weights/inputs/lookups, 4-bit z": {
            **SIX_BIT_LOOKUPS,
            "lut_bits_overrides": {Z_POINT: 4},
        },
        "6-bit weights/inputs/lookups, 5-bit z": {
            **SIX_BIT_LOOKUPS,
            "lut_bits_overrides": {Z_POINT: 5},
        },
        # the same program as 6-bit lookups, z = (‖q − k‖₁/γ − α)⁺ (4 levels) computed as three
        # 4-bit comparisons (quant/steps.py): the recipe's
        "6-bit weights/inputs/lookups, z by 4-bit comparisons": {
            **SIX_BIT_LOOKUPS,
            "step_lut_bits": 4,
        },
        "6-bit weights/inputs/lookups, 6-bit Q/K/V": {
            **SIX_BIT_LOOKUPS,
            "attention_bits": 6,
            "attention_lut_bits": 6,
        },
    },
}


@dataclass(frozen=True)
class Shape:
    task: str
    layers: int
    seq_len: int
    causal: bool = False  # PowerSoftmax paper Eq. 11's mask (imdb-lm: always)
    padded: bool = False  # the first seq_len words, padded, the key mask encrypted (no segments)
    mean: bool = False  # the Inhibitor's sums as means (``--inhibitor-mean``)
    norm: bool = False  # segment means at unit RMS (``--segment-norm``)
    d_model: int | None = None  # the width, where not the recipe's
    qat_epochs: int | None = None  # QAT epochs, where not the recipe's
    attention: str = "inhibitor"  # ``--attention``


SHAPES = {
    "imdb-L1-T16": Shape("imdb", 1, 16),  # the shape the 1-block recipe was tuned on
    "imdb-L1-T16-mean": Shape("imdb", 1, 16, mean=True),  # the same with means
    "imdb-L1-T16-mean-norm": Shape("imdb", 1, 16, mean=True, norm=True),  # the recipe's before
    # narrower: fewer T²-sized attention lookups (T²·d of them for the Inhibitor's (v − z)⁺)
    "imdb-L1-T16-mean-norm-d6": Shape("imdb", 1, 16, mean=True, norm=True, d_model=6),
    "imdb-L1-T16-mean-norm-d6-qat6": Shape(
        "imdb", 1, 16, mean=True, norm=True, d_model=6, qat_epochs=6
    ),
    "imdb-L1-T16-mean-norm-d5": Shape("imdb", 1, 16, mean=True, norm=True, d_model=5),
    "imdb-L1-T16-mean-norm-d4": Shape("imdb", 1, 16, mean=True, norm=True, d_model=4),
    # the same recipe with dot-product attention
    "imdb-L1-T16-dot-product": Shape("imdb", 1, 16, norm=True, attention="dot-product"),
    "imdb-L2-T16": Shape("imdb", 2, 16),
    "imdb-L2-T16-mean": Shape("imdb", 2, 16, mean=True),
    "imdb-L2-T16-norm": Shape("imdb", 2, 16, norm=True),
    "imdb-L2-T16-mean-norm": Shape("imdb", 2, 16, mean=True, norm=True),
    "imdb-L1-T32": Shape("imdb", 1, 32),
    "imdb-L1-T32-mean": Shape("imdb", 1, 32, mean=True),
    "imdb-L1-T32-mean-norm": Shape("imdb", 1, 32, mean=True, norm=True),
    "imdb-L1-T16-causal": Shape("imdb", 1, 16, causal=True),
    "imdb-L1-T16-causal-mean": Shape("imdb", 1, 16, causal=True, mean=True),
    "imdb-L1-T16-causal-mean-norm": Shape("imdb", 1, 16, causal=True, mean=True, norm=True),
    "imdb-L1-T32-padded": Shape("imdb", 1, 32, padded=True),
    "imdb-L1-T32-padded-mean": Shape("imdb", 1, 32, padded=True, mean=True),
    # -norm on padded words: each word's embedding at unit RMS (a segment of one word)
    "imdb-L1-T32-padded-mean-norm": Shape("imdb", 1, 32, padded=True, mean=True, norm=True),
    # the next-word model at d = 8 (the recipe's width before), then at the recipe's d = 16
    "imdb-lm-L1-T16": Shape("imdb-lm", 1, 16, causal=True, d_model=8),
    "imdb-lm-L1-T16-mean": Shape("imdb-lm", 1, 16, causal=True, mean=True, d_model=8),
    "imdb-lm-L1-T16-norm": Shape("imdb-lm", 1, 16, causal=True, norm=True, d_model=8),
    "imdb-lm-L1-T16-d16": Shape("imdb-lm", 1, 16, causal=True, d_model=16),
}


def run(shape: str, candidate: str, seed: int, data_dir: str | None, cost: bool) -> dict:
    import torch

    from fhe import api

    torch.set_num_threads(2)
    s = SHAPES[shape]
    quant = CANDIDATES[s.task][candidate]
    req = api.TrainRequest(
        task=s.task,
        attention=s.attention,
        recipe="tfhe",
        layers=s.layers,
        seq_len=s.seq_len,
        causal=s.causal,
        inhibitor_mean=s.mean,
        segment_norm=s.norm,
        words=None,  # kept only where padded (given), else the recipe's
        **({"d_model": s.d_model} if s.d_model else {}),
        **({"qat_epochs": s.qat_epochs} if s.qat_epochs else {}),
        seed=seed,
        qat_quant=quant,
        data_dir=Path(data_dir) if data_dir else None,
    )
    given = {
        "layers",
        "seq_len",
        "seed",
        "qat_quant",
        "inhibitor_mean",
        "segment_norm",
        "attention",
    }
    given |= {"words"} if s.padded else set()
    given |= {"d_model"} if s.d_model else set()
    given |= {"qat_epochs"} if s.qat_epochs else set()
    req = api.with_recipe(req, given=frozenset(given))
    start = time.perf_counter()
    outcome = api.train_model(req, progress=False)
    out = {
        "shape": shape,
        "candidate": candidate,
        "qat_quant": quant,
        "seed": seed,
        "float": outcome.float_score,  # as trained, before QAT
        "program": outcome.test_score,  # the integer program after QAT, whole test split
        "train_s": time.perf_counter() - start,
    }
    if cost:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.pt"
            outcome.save(path)
            opts = api.CompileOptions(scheme="tfhe", data_dir=req.data_dir)
            compiled = api.compile_file(path, opts, simulate_only=True)
            rep = compiled.report()
            short = {} if s.padded else short_refusals(compiled, data_dir)
        out.update(
            pbs=rep.get("pbs_count"),
            est_latency_s=rep.get("estimated_latency_s"),
            eval_keys_bytes=rep.get("key_sizes_bytes", {}).get("evaluation"),
            **short,
        )
    return out


SHORT_WORDS = (8, 16)  # test reviews cut to their first 8 and 16 words


def short_refusals(compiled, data_dir: str | None) -> dict:
    """The share of the test reviews, each cut to its first k words, that the compiled program
    refuses (a value would leave its calibrated width): ``refused_first_<k>_words``."""
    import numpy as np

    from fhe.api import parts

    words = compiled.text.words
    ids = parts.load_task("imdb", data_dir=data_dir, seq_len=words).x_test  # (N, words), 0: pad
    program = compiled.compiled.program  # the client's check, as fhe compare applies it
    out = {}
    for k in SHORT_WORDS:
        cut = ids.clone()
        cut[:, k:] = 0
        x_int = program.quantize_input(compiled.text.embed_ids(cut))
        _, accepted = program.run_int_accepted(x_int)
        out[f"refused_first_{k}_words"] = float(1 - np.mean(accepted))
    return out


COST_FIELDS = (
    "pbs",
    "est_latency_s",
    "eval_keys_bytes",
    *(f"refused_first_{k}_words" for k in SHORT_WORDS),
)


def _cell(row: dict) -> tuple[str, str, int]:
    return row["shape"], row["candidate"], row["seed"]


def summarise(rows: list[dict]) -> list[dict]:
    """One line per (shape, candidate): mean float and program, each seed's gap, the cost."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["shape"], r["candidate"]), []).append(r)

    def order(group: tuple[str, str]) -> tuple[int, int]:  # the order SHAPES and CANDIDATES give
        shape, candidate = group
        return list(SHAPES).index(shape), list(CANDIDATES[SHAPES[shape].task]).index(candidate)

    out = []
    for (shape, candidate), rs in sorted(groups.items(), key=lambda g: order(g[0])):
        gaps = [100 * (r["float"] - r["program"]) for r in sorted(rs, key=lambda r: r["seed"])]
        cost = next((r for r in rs if "pbs" in r), {})
        out.append(
            {
                "shape": shape,
                "candidate": candidate,
                "seeds": sorted(r["seed"] for r in rs),
                "float_mean": sum(r["float"] for r in rs) / len(rs),
                "program_mean": sum(r["program"] for r in rs) / len(rs),
                "gaps_points": gaps,
                "gap_mean": sum(gaps) / len(gaps),
                "within_1_point": sum(g <= 1.0 for g in gaps),
                **{k: v for k, v in cost.items() if k in COST_FIELDS},
            }
        )
    return out


def markdown(summary: list[dict], load: str, command: str, cost_seed: int) -> list[str]:
    lines = [
        "# TFHE text programs: bit widths against the 1-point gap to float (issue 27)",
        "",
        f"`{command}`",
        "",
        f"Machine: 2 shared cores; load average at the start {load}. Each cell: `fhe train --task "
        "<task> --recipe tfhe` with the candidate as `--qat-quant` (3 QAT epochs through the "
        "integer program), one model per seed. Float: the model as trained, before QAT; program: "
        "the integer program after QAT; both on the whole test split (4000 reviews). Gap: float "
        f"minus program, in points, per seed. Cost: the seed-{cost_seed} model's circuit, compiled "
        "without keys (the compiler's latency estimate, not a measurement). Short reviews refused: "
        "by that circuit, the test reviews cut to their first 8 / 16 words (— where not measured "
        "or the input is padded word by word).",
        "",
        "Each cell's cost is its circuit's on the day it ran. Since 2026-12-07 (stop 58) the key "
        "mask's lookup on a signed V reads one bit less, and so do the encrypted products of an "
        "unsigned and a signed operand: the masked cells without V⁺ run before then (next word "
        "at d = 8; d = 16 with 6-bit weights/inputs; padded without V⁺) compile to other circuits "
        "now (the d = 16 recipe's cell, rerun: 2.47 → 2.06 GiB).",
        "",
        "| shape | widths (`--qat-quant`) | float (mean) | program (mean) | gap per seed (points) "
        "| seeds within 1 point | PBS | est. latency | eval. keys | short reviews refused |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        gaps = ", ".join(f"{g:.2f}" for g in s["gaps_points"])
        keys = s.get("eval_keys_bytes")
        est = s.get("est_latency_s")
        lines.append(
            f"| {s['shape']} | {s['candidate']} | {100 * s['float_mean']:.2f}% | "
            f"{100 * s['program_mean']:.2f}% | {gaps} (mean {s['gap_mean']:.2f}) | "
            f"{s['within_1_point']}/{len(s['gaps_points'])} | {s.get('pbs', '—')} | "
            f"{'—' if est is None else f'{est:.0f} s'} | "
            f"{'—' if keys is None else f'{keys / 2**30:.2f} GiB'} | {_refused(s)} |"
        )
    return lines


def _refused(summary: dict) -> str:
    shares = [summary.get(f"refused_first_{k}_words") for k in SHORT_WORDS]
    if None in shares:
        return "—"
    return " / ".join(f"{100 * v:.1f}%" for v in shares)


def _matching(names: dict, name: str | None) -> list[str]:
    """The key called ``name``, else those that contain it (all for None)."""
    if name in names:
        return [name]
    return [c for c in names if name is None or name in c]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    parser.add_argument(
        "--only", default=None, help="the shape of this name, else those whose name contains it"
    )
    parser.add_argument(
        "--candidate", default=None, help="the candidate of this name, else those containing it"
    )
    parser.add_argument("--data-dir", default=None, help="IMDB folder (default ../shared/data)")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    shapes = _matching(SHAPES, args.only)
    if not shapes:
        parser.error(f"no shape matches --only; shapes: {', '.join(SHAPES)}")
    load = f"{os.getloadavg()[0]:.2f}"
    picked = {shape: _matching(CANDIDATES[SHAPES[shape].task], args.candidate) for shape in shapes}
    if not any(picked.values()):
        parser.error("no candidate of those shapes matches --candidate")
    rows = []
    for shape in shapes:
        for candidate in picked[shape]:
            for seed in seeds:
                r = run(shape, candidate, seed, args.data_dir, cost=seed == seeds[0])
                gap = 100 * (r["float"] - r["program"])
                print(
                    f"{shape} | {candidate} | seed {seed}: float {r['float']:.4f} program "
                    f"{r['program']:.4f} gap {gap:.2f} ({r['train_s']:.0f} s)",
                    flush=True,
                )
                rows.append(r)
    command = command_line()
    if args.only or args.candidate:  # a partial rerun replaces its cells in the saved table
        rows, load, command = merged_with_saved("text_widths", rows, _cell, load, command)
    summary = summarise(rows)
    lines = markdown(summary, load, command, seeds[0])
    paths = write_results(
        "text_widths", lines, {"load": load, "command": command, "rows": rows, "summary": summary}
    )
    print("\n".join(lines))
    print(f"wrote {paths['md']}")


if __name__ == "__main__":
    main()
