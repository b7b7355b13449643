"""The Inhibitor paper's TFHE study (Tables 2 and 4) at our scale: single-head attention circuits
over sequence lengths, compiled, keyed and run encrypted, with ratios measured in the same run.

A thin wrapper over the ``fhe report`` command (circuits/sweep.py), run as a user runs it, kept here
so every benchmark lives in one place.

    python benchmarks/tfhe_attention.py --seq-lens 2,4,8,16 --d 2 --n-bits 4 --lut-bits 7
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FHE = str(Path(sys.executable).with_name("fhe"))  # the console script of this environment

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" not in args:
        args += ["--out", str(Path(__file__).resolve().parent / "results")]
    sys.exit(subprocess.call([FHE, "report", *args]))
