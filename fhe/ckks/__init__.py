"""CKKS backend internals: the polynomial program of a trained model, evaluated by one generic
arithmetic interface over clear numpy arrays or TenSEAL ciphertexts (no TenSEAL import here)."""

from fhe.ckks.approx import ApproxConfig
from fhe.ckks.arith import Arith, ClearArith, DepthExceededError, Val
from fhe.ckks.planner import CkksPlan, plan_parameters
from fhe.ckks.program import PolynomialError, PolyProgram, build_program

__all__ = [
    "ApproxConfig",
    "Arith",
    "ClearArith",
    "CkksPlan",
    "DepthExceededError",
    "PolyProgram",
    "PolynomialError",
    "Val",
    "build_program",
    "plan_parameters",
]
