"""The README's main job, end to end on a fresh machine (run by `make demo`).

1. train a small Inhibitor transformer on sklearn's digits (8 tokens of 8 pixels), with 4-bit
   quantization-aware fine-tuning;
2. quantize it and print the integer program's widths and float vs integer accuracy;
3. compile it with TFHE, generate keys, run one test sample encrypted and print the cost report;
   write the client (secret keys) and server (no secret key) artifacts;
4. compare float, clear-integer and encrypted predictions on a few test samples;
5. CKKS: train a PowerSoftmax model with the polynomial recipe (length-agnostic form, range losses),
   print its CKKS cost report, and compare float, clear polynomial and encrypted predictions on all
   360 test samples at once (SIMD slots; N = 16384 with the labelled client-assisted refresh, which
   keeps the demo to minutes; `fhe compare` without `--refresh` picks N = 32768 and needs none).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RUNS = Path("runs")
N_ENCRYPTED = int(os.environ.get("FHE_DEMO_SAMPLES", "1"))


def fhe(*args: str) -> None:
    print(f"\n$ fhe {' '.join(args)}", flush=True)
    subprocess.run([str(Path(sys.executable).with_name("fhe")), *args], check=True)


def main() -> None:
    RUNS.mkdir(exist_ok=True)
    model = str(RUNS / "digits-inhibitor.pt")
    fhe("train", "--task", "digits", "--attention", "inhibitor", "--norm", "none", "--d-model", "16", "--heads", "2",
        "--epochs", "40", "--qat-bits", "4", "--qat-epochs", "15", "-o", model)
    fhe("quantize", model, "--n-bits", "4")
    fhe("compile", model, "--scheme", "tfhe", "--n-bits", "4", "--lut-bits", "7", "--json",
        str(RUNS / "digits-inhibitor-tfhe.json"), "--out", str(RUNS / "digits-inhibitor-tfhe"))
    fhe("compare", model, "--scheme", "tfhe", "--n-bits", "4", "--lut-bits", "7", "--mode", "simulate", "--n", "360")
    fhe("compare", model, "--scheme", "tfhe", "--n-bits", "4", "--lut-bits", "7", "--mode", "execute", "--n",
        str(N_ENCRYPTED))

    poly = str(RUNS / "digits-power-softmax.pt")
    fhe("train", "--task", "digits", "--attention", "power-softmax", "--norm", "none", "--ffn-activation", "gelu",
        "--power-form", "length-agnostic", "--power-eps", "0.05", "--d-model", "16", "--heads", "2", "--epochs", "60",
        "--range-loss", "0.1", "--range-threshold", "1.0", "--act-range-loss", "0.05", "--act-range-threshold", "3",
        "-o", poly)
    fhe("compile", poly, "--scheme", "ckks", "--no-run", "--refresh", "--json",
        str(RUNS / "digits-power-softmax-ckks.json"))
    fhe("compare", poly, "--scheme", "ckks", "--mode", "execute", "--n", "360", "--refresh",
        "--poly-modulus-degree", "16384")


if __name__ == "__main__":
    main()
