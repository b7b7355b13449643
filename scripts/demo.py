"""The README's main job, end to end on a fresh machine (run by `make demo`; minutes on 2 cores
once installed).

1. train a small Inhibitor transformer on sklearn's digits (4 tokens of 4x4 pixels, BatchNorm), then
   fine-tune it through its own TFHE integer program (`--qat-bits 5`: 5-bit activations, one
   rounding PBS less per lookup than 6; the program reproduces the QAT model);
2. compile it with TFHE (the defaults keep every lookup at <= 5 bits): expected key size and
   latency, keygen, one encrypted test sample, the cost report per stage; client (secret keys) and
   server (no secret key) artifacts;
3. `fhe run` one sample through the artifacts, then compare float, clear-integer and simulated
   predictions on the whole test split and encrypted ones on a few samples (`FHE_DEMO_SAMPLES`,
   default 1);
4. CKKS: train a PowerSoftmax model with the shallow polynomial recipe (length-agnostic form with
   x² and ε = 1, the exact quad activation, BatchNorm folded into the linear layers, range losses:
   depth 10), print its CKKS cost report for one query (`--layout auto` picks the packed layout:
   one sample per ciphertext, rotations by SEAL, N = 16384, its rotation steps and Galois keys)
   and run one encrypted sample against the clear polynomial program (5-7 s);
5. compare float, clear polynomial and encrypted predictions on all 360 test samples at once (the
   batch layout, which `fhe compare` picks for a dataset: the samples in the SIMD slots, no
   refresh);
6. text (when the IMDB files of `../shared/data/imdb` are there): train the CKKS and the TFHE text
   recipes (512 words pooled on the client into 16 segments, docs/text.md), compile each with its
   client front end, and classify the same review given as text, encrypted (one packed CKKS query,
   one TFHE query of about a minute).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from models.tasks import default_data_dir

RUNS = Path("runs")
N_ENCRYPTED = int(os.environ.get("FHE_DEMO_SAMPLES", "1"))
REVIEW = "A quiet, beautiful film: I loved every minute of it."


def fhe(command: str, *paths: str) -> None:
    """Run ``fhe <command>`` (its words split on spaces), then the ``paths``."""
    args = [*command.split(), *paths]
    print(f"\n$ fhe {' '.join(args)}", flush=True)
    subprocess.run([str(Path(sys.executable).with_name("fhe")), *args], check=True)


def main() -> None:
    RUNS.mkdir(exist_ok=True)
    model = str(RUNS / "digits-inhibitor.pt")
    tfhe_json, tfhe_art = (
        str(RUNS / "digits-inhibitor-tfhe.json"),
        str(RUNS / "digits-inhibitor-tfhe"),
    )
    fhe("train --task digits --recipe tfhe -o", model)  # fhe/api/recipes.py
    fhe("compile --scheme tfhe", model, "--json", tfhe_json, "--out", tfhe_art)
    fhe("run --sample 1", tfhe_art)
    fhe("compare --scheme tfhe --mode simulate --n 360", model)
    fhe(f"compare --scheme tfhe --mode execute --n {N_ENCRYPTED}", model)

    poly = str(RUNS / "digits-power-softmax-bn.pt")
    fhe("train --task digits --recipe ckks -o", poly)
    ckks = "--scheme ckks --outer-bits 45 --scale-bits 34 --reciprocal-tol 5e-2"
    fhe(f"compile {ckks} --json", str(RUNS / "digits-power-softmax-packed.json"), poly)
    fhe(f"compare {ckks} --mode execute --n 360", poly)

    imdb = default_data_dir("imdb")
    if not (imdb / "imdb_train_6000.csv.gz").exists():
        print(f"\nskipping the text step: no IMDB files in {imdb} (see docs/text.md)")
        return
    for scheme in ("ckks", "tfhe"):  # the same review under both schemes
        text_model, text_art = str(RUNS / f"imdb-{scheme}.pt"), str(RUNS / f"imdb-{scheme}")
        fhe(f"train --task imdb --recipe {scheme} -o", text_model)
        fhe(f"compile --scheme {scheme} --out", text_art, text_model)
        fhe("run", text_art, "--text", REVIEW)


if __name__ == "__main__":
    main()
