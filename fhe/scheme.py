"""The two FHE schemes, in a module that imports nothing heavy (the service process reads it
without loading torch or an FHE library); :mod:`fhe.schemes` holds their parameters."""

from __future__ import annotations

from enum import Enum


class Scheme(str, Enum):
    TFHE = "tfhe"
    CKKS = "ckks"
