"""Quantization front-end: calibration, PTQ, QAT (brevitas) and the integer program.

Imports ``models``; never imports an FHE library.
"""

from quant.config import Granularity, QuantConfig, RangeMode
from quant.export import ExportError, QuantizedProgram, export
from quant.ir import BitWidthError, Graph, OverflowPolicy, RangeOverflowError

__all__ = [
    "BitWidthError",
    "ExportError",
    "Granularity",
    "Graph",
    "OverflowPolicy",
    "QuantConfig",
    "QuantizedProgram",
    "RangeMode",
    "RangeOverflowError",
    "export",
]
