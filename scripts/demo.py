"""The README's main job, end to end on a fresh machine (called by `make demo`).

Trains a small Inhibitor transformer on sklearn's digits and prints its accuracy. Later stages of the
pipeline (quantization, TFHE compile, encrypted runs) are appended here as they land.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUNS = Path("runs")


def fhe(*args: str) -> None:
    cmd = [str(Path(sys.executable).with_name("fhe")), *args]
    print("$ fhe", " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def main() -> None:
    RUNS.mkdir(exist_ok=True)
    model = RUNS / "digits-inhibitor.pt"
    fhe("train", "--task", "digits", "--attention", "inhibitor", "--norm", "none", "--d-model", "16",
        "--heads", "1", "--epochs", "40", "-o", str(model))


if __name__ == "__main__":
    main()
