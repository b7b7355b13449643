"""Text under encryption: IMDB reviews through the client's front end and both schemes, per T.

    python benchmarks/text.py                       # the full table (about an hour on 2 cores)
    python benchmarks/text.py --quick               # one TFHE and one CKKS model, 2 samples
    python benchmarks/text.py --row tfhe-inhibitor-L1-T16   # rerun rows (repeat --row), keep others

Each row is one model trained by ``fhe train --task imdb --recipe <scheme>`` (512 words pooled on
the client into T segments, :mod:`models.text`), with the options of the row on top. For each:

- accuracy of the float model, of the clear program (TFHE: the integer program; CKKS: the
  polynomial program) on the whole 4000-review test split, and of encrypted runs on the first
  ``--n`` reviews, with the encrypted == clear check (TFHE: every output integer equal; CKKS:
  max |logit error|);
- latency per review (TFHE: one encrypted review; CKKS: one packed query), evaluation keys, the
  circuit's PBS or depth, and the peak memory of the process that compiled and ran it.

Rows that would take too long here are compiled and estimated, not run (``executed`` says which).
Everything goes through :mod:`fhe.api`, as a user's script would.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gc
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import command_line, merged_with_saved, write_results  # noqa: E402
from fhe.api.recipes import TEXT_D8, TEXT_D8_WIDTHS  # noqa: E402


@dataclass(frozen=True)
class Row:
    scheme: str
    attention: str
    layers: int = 1
    seq_len: int = 16
    n_encrypted: int = 20  # 0: compile and estimate only
    options: dict = field(default_factory=dict)  # TrainRequest fields over the recipe
    task: str = "imdb"  # imdb-lm: next-word prediction (causal, padded word positions)
    tag: str = ""  # a suffix that tells apart rows of the same shape (e.g. other bit widths)

    @property
    def name(self) -> str:
        causal = "-causal" if self.options.get("causal") else ""
        padded = "-padded" if "words" in self.options and self.options["words"] is None else ""
        lm = "-next-word" if self.task == "imdb-lm" else ""
        shape = f"{self.scheme}-{self.attention}-L{self.layers}-T{self.seq_len}"
        return f"{shape}{causal}{padded}{lm}{'-' + self.tag if self.tag else ''}"


WIDE_QUANT = {
    "weight_bits": 6,
    "input_bits": 6,
    "attention_bits": 6,
    "lut_bits": 6,
    "attention_lut_bits": 6,
}
FULL = [
    Row("tfhe", "inhibitor", 1, 16, 20),
    # the sentiment recipe before stop 60 (d = 8, 4-bit V): run beside the row above, to compare
    # their latency in one run (--row tfhe-inhibitor-L1-T16 --row tfhe-inhibitor-L1-T16-d8)
    Row("tfhe", "inhibitor", 1, 16, 5, {**TEXT_D8, "qat_quant": TEXT_D8_WIDTHS}, tag="d8"),
    # 2 blocks (and, below, 32 segments): the recipe's wider widths (fhe.api.recipes.BEYOND_SHAPE)
    Row("tfhe", "inhibitor", 2, 16, 2),
    # the same with 6-bit weights, inputs, Q/K/V and lookups (the TFHE defaults: 4, 4, 3, 5 and 4)
    Row("tfhe", "inhibitor", 2, 16, 0, {"qat_quant": WIDE_QUANT}, tag="6bit"),
    Row("tfhe", "inhibitor", 1, 32, 1),
    Row("tfhe", "dot-product", 1, 16, 1, {"tie_qk": False}),  # the recipe's 3-bit softmax
    Row("ckks", "power-softmax", 1, 16, 20),
    Row("ckks", "power-softmax", 2, 16, 20),
    Row("ckks", "power-softmax", 1, 32, 5),
    Row("ckks", "power-softmax", 1, 64, 3),
    Row("ckks", "power-softmax", 1, 128, 2),
    # PowerSoftmax paper Eq. 11's causal mask: segment i reads segments j <= i (TFHE: the
    # recipe's means for a causal model, --inhibitor-mean, fhe.api.recipes.BEYOND_SHAPE)
    Row("tfhe", "inhibitor", 1, 16, 10, {"causal": True}),
    Row("ckks", "power-softmax", 1, 16, 10, {"causal": True}),
    Row("ckks", "dot-product", 1, 16, 5, {"causal": True}),  # exp polynomial, mask: one product
    # word positions (the first T words), right-padded, the key mask encrypted
    Row("tfhe", "inhibitor", 1, 32, 3, {"words": None}),
    Row("ckks", "power-softmax", 1, 32, 5, {"words": None}),
    # a small causal language model: the word after a padded window of up to T words
    Row("tfhe", "inhibitor", 1, 16, 5, task="imdb-lm"),
    Row("ckks", "power-softmax", 1, 16, 5, task="imdb-lm"),
]
QUICK = [Row("tfhe", "inhibitor", 1, 16, 2), Row("ckks", "power-softmax", 1, 16, 2)]


def run_row(row: Row, work: Path, data_dir: str | None) -> dict:
    """Train, compile and measure one row (in its own process: its peak memory is its own)."""
    import numpy as np
    import torch

    from fhe import api
    from fhe.api.parts import FheError, predict

    torch.set_num_threads(2)
    path = work / f"{row.name}.pt"
    req = api.TrainRequest(
        task=row.task,
        recipe=row.scheme,
        attention=row.attention,
        layers=row.layers,
        seq_len=row.seq_len,
        data_dir=Path(data_dir) if data_dir else None,
        **row.options,
    )
    given = frozenset({"attention", "layers", "seq_len", *row.options})  # the row's own options win
    req = api.with_recipe(req, given=given)
    t0 = time.perf_counter()
    outcome = api.train_model(req, progress=False)
    outcome.save(path)
    out: dict = {"row": row.name, "train_s": time.perf_counter() - t0}
    if outcome.integer_program:  # QAT moved the float weights: the model as trained before it
        out["float_before_qat"] = outcome.float_score
    opts = api.CompileOptions(
        scheme=row.scheme,
        data_dir=req.data_dir,
        layout="packed" if row.scheme == "ckks" else "auto",
    )
    try:
        c = api.compile_file(path, opts, simulate_only=not row.n_encrypted)
    except FheError as exc:  # e.g. a CKKS program deeper than every chain: the planner says so
        out.update(float_acc=outcome.test_score, stopped=str(exc))
        return out
    api.check_circuit(c)
    x, y = c.data.x_test, c.data.y_test.numpy()
    clear = np.concatenate([c.compiled.clear(x[i : i + 500]) for i in range(0, len(x), 500)])
    rep = c.report()
    majority = int(np.bincount(c.data.y_train.numpy()).argmax())  # the most frequent label
    out.update(
        majority_acc=float((y == majority).mean()),
        float_acc=float((predict(c.checkpoint.model, x).numpy().argmax(-1) == y).mean()),
        program_acc=float((clear.argmax(-1) == y).mean()),
        n_test=len(y),
        pbs=rep.get("pbs_count"),
        depth=rep.get("depth"),
        poly_modulus_degree=rep.get("poly_modulus_degree"),
        est_latency_s=rep.get("estimated_latency_s"),
    )
    if not row.n_encrypted:
        out["executed"] = False
        if row.scheme == "tfhe":  # the compiler's key sizes, none made
            out["keys_expected_mib"] = rep.get("key_sizes_bytes", {}).get("evaluation", 0) / 2**20
        return out
    api.keygen(c)
    sizes = c.report()["key_sizes_bytes"]
    public = (
        ("evaluation",) if row.scheme == "tfhe" else ("public_context", "relin_keys", "galois_keys")
    )
    out["keys_mib"] = sum(sizes.get(k, 0) for k in public) / 2**20
    del c  # its keys: the comparison below makes its own (peak memory: one key set)
    gc.collect()
    # CKKS: one packed query per review (the batch layout holds T² ciphertexts of every sample
    # batch at once: ~10 GB at T = 16, out of reach beyond)
    cmp = api.compare_file(path, opts, n=row.n_encrypted, mode="execute")
    if row.scheme == "ckks":
        out.update(
            encrypted_acc=cmp["accuracy"]["encrypted"],
            float_acc_n=cmp["accuracy"]["float"],
            clear_acc_n=cmp["accuracy"]["poly_clear"],
            n_encrypted=cmp["n"],
            max_abs_error=cmp["max_abs_error_encrypted_vs_clear"],
            max_mse=cmp["mse_encrypted_vs_clear"]["max_per_sample"],
            agreement=cmp["agreement"]["encrypted_vs_poly_clear"],
            latency_s=float(np.median(cmp["latency_s"]["per_batch"])),
        )
    else:
        out.update(
            encrypted_acc=cmp["accuracy"]["execute"],
            float_acc_n=cmp["accuracy"]["float"],
            clear_acc_n=cmp["accuracy"]["clear"],
            n_encrypted=cmp["n"],
            exact_integer_match=cmp["exact_integer_match"],
            refused_overflow=cmp["refused_overflow"],
            latency_s=cmp["latency_s"]["median"],
        )
    out["executed"] = True
    return out


def _in_process(row: Row, work: Path, data_dir: str | None) -> dict:
    out = run_row(row, work, data_dir)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def markdown(results: list[dict], load: str, command: str) -> list[str]:
    def pct(v):
        return "—" if v is None else f"{100 * v:.2f}%"

    def num(v, fmt="{:.1f}"):
        return "—" if v is None else fmt.format(v)

    lines = [
        "# Text under encryption: IMDB, client-side front end, both schemes",
        "",
        f"`{command}`",
        "",
        f"Machine: 2 shared cores; load average at the start {load}. Each row trained with "
        "`fhe train --task imdb --recipe <scheme>` and the row's options (512 words pooled on the "
        "client into T segments; `-causal`: PowerSoftmax paper Eq. 11's mask; `-padded`: the "
        "first T words, right-padded, the key mask encrypted; `-next-word`: `fhe train --task "
        "imdb-lm --recipe <scheme>`, a causal model that predicts the word after a padded window "
        "of up to T words among the 64 most frequent, scored on one window per test review, "
        "beside the most frequent word's score). Accuracy: float and clear program "
        "on all 4000 test reviews (TFHE's float: the model's weights after QAT, run in float; "
        "in brackets, the float model as trained before QAT, where the row records it); "
        "encrypted on the first n. Latency: one review (TFHE) or one packed query (CKKS). "
        "Estimated rows were compiled, not run (their keys: the compiler's sizes, none made).",
        "",
        "| model | float | program | encrypted (n) | enc == clear | latency / review | keys | "
        "PBS / depth | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "stopped" in r:
            lines.append(
                f"| {r['row']} | {pct(r.get('float_acc'))} | stopped: {r['stopped'][:160]} "
                "| | | | | | |"
            )
            continue
        if r.get("executed"):
            enc = f"{pct(r.get('encrypted_acc'))} of {r.get('n_encrypted')}"
            if "clear_acc_n" in r:  # the same reviews through the clear program and float
                enc += f" (clear {pct(r['clear_acc_n'])}, float {pct(r['float_acc_n'])})"
            if "exact_integer_match" in r:
                same = f"{100 * r['exact_integer_match']:.0f}% exact"
            else:
                same = f"max err {r['max_abs_error']:.2g}, argmax {100 * r['agreement']:.0f}%"
            latency = f"{r['latency_s']:.1f} s"
        else:
            enc, same = "not run", "—"
            est = r.get("est_latency_s")
            latency = f"~{est:.0f} s (estimated)" if est else "—"
        cost = (
            f"{r['pbs']} PBS"
            if r.get("pbs")
            else f"depth {r.get('depth')}, N={r.get('poly_modulus_degree')}"
        )
        keys = num(r.get("keys_mib"), "{:.0f} MiB")
        if "keys_expected_mib" in r:
            keys = f"~{r['keys_expected_mib']:.0f} MiB (expected)"
        name = r["row"]
        if name.endswith("-next-word") and "majority_acc" in r:
            name += f" (most frequent word: {pct(r['majority_acc'])})"
        flt = pct(r.get("float_acc"))
        if "float_before_qat" in r:
            flt += f" (before QAT {pct(r['float_before_qat'])})"
        lines.append(
            f"| {name} | {flt} | {pct(r.get('program_acc'))} | {enc} | "
            f"{same} | {latency} | {keys} | {cost} | "
            f"{num(r.get('peak_rss_mib'), '{:.0f} MiB')} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two rows, 2 encrypted samples each")
    parser.add_argument("--only", default=None, help="rows whose name contains this")
    parser.add_argument(
        "--row", action="append", default=None, help="the row of exactly this name (repeatable)"
    )
    parser.add_argument("--work", type=Path, default=Path("runs/text"), help="model files")
    parser.add_argument("--data-dir", default=None, help="IMDB folder (default ../shared/data)")
    parser.add_argument(
        "--render", action="store_true", help="only rewrite the Markdown from the results JSON"
    )
    args = parser.parse_args()
    stem = "text_quick" if args.quick else "text"
    if args.render:
        from benchmarks._results import RESULTS

        saved = json.loads((RESULTS / f"{stem}.json").read_text())
        write_results(
            stem,
            markdown(
                saved["rows"], saved["load"], saved.get("command", "python benchmarks/text.py")
            ),
            saved,
        )
        return
    rows = QUICK if args.quick else FULL
    if args.only:
        rows = [r for r in rows if args.only in r.name]
    if args.row:
        rows = [r for r in rows if r.name in args.row]
    if not rows:
        parser.error("no row matches --only / --row")
    args.work.mkdir(parents=True, exist_ok=True)
    load = f"{os.getloadavg()[0]:.2f}"
    results = []
    ctx = mp.get_context("spawn")
    for row in rows:
        print(f"== {row.name}", flush=True)
        with cf.ProcessPoolExecutor(1, mp_context=ctx) as pool:  # one heavy run at a time
            try:
                r = pool.submit(_in_process, row, args.work, args.data_dir).result()
            except Exception as exc:  # noqa: BLE001 - a row that fails is reported, not hidden
                r = {"row": row.name, "stopped": f"{type(exc).__name__}: {exc}"}
        print(r, flush=True)
        results.append(r)
    command = command_line()
    if args.only or args.row:  # rerun rows: replace them in the saved table, keep the others
        results, load, command = merged_with_saved(stem, results, lambda r: r["row"], load, command)
    saved = {"rows": results, "load": load, "command": command}
    paths = write_results(stem, markdown(results, load, command), saved)
    print("\n".join(markdown(results, load, command)))
    print(f"wrote {paths['md']}")


if __name__ == "__main__":
    main()
