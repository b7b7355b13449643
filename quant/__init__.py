"""Quantization front-end: calibration, PTQ, QAT (brevitas) and the integer program.

Imports ``models``; never imports an FHE library. The package itself imports no torch: its
configuration and IR are numpy only, and a CKKS server reads ``QuantConfig`` through
``fhe.schemes``. The exporter, which lowers a torch model, is ``quant.export.export``.
"""

from quant.config import Granularity, QuantConfig, RangeMode
from quant.ir import BitWidthError, Graph, OverflowPolicy, RangeOverflowError

__all__ = [
    "BitWidthError",
    "Granularity",
    "Graph",
    "OverflowPolicy",
    "QuantConfig",
    "RangeMode",
    "RangeOverflowError",
]
