"""Lazy affine maps of ciphertext values: consecutive clear linear layers compose in the clear and
cost one level only when a non-linear operation needs their value (see fhe/ckks/program.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fhe.ckks.arith import Arith, Val


def per_position(w: np.ndarray, seq_len: int) -> np.ndarray:
    """A position-wise linear map (out, in) as a map of the flattened (T·in) vector: I_T ⊗ W."""
    return np.kron(np.eye(seq_len), w)


@dataclass
class Affine:
    """y = Σₖ Mₖ·xₖ + b over lists of materialised values xₖ: no ciphertext operation until
    needed."""

    terms: list[tuple[Any, np.ndarray]]  # x: a list[Val] (batch layout) or a PVec (packed)
    bias: np.ndarray

    @classmethod
    def scaled(cls, x, scale: float, offset: float, n: int) -> Affine:
        """scale·x + offset over n values (an activation's value, see PolyProgram._activation)."""
        return cls([(x, scale * np.eye(n))], np.full(n, offset))

    @property
    def size(self) -> int:
        return len(self.bias)

    def apply(self, m: np.ndarray, c: np.ndarray | float = 0.0) -> Affine:
        return Affine([(x, m @ w) for x, w in self.terms], m @ self.bias + c)

    def __add__(self, other: Affine) -> Affine:
        merged: dict[int, tuple[Any, np.ndarray]] = {}
        for x, w in self.terms + other.terms:
            merged[id(x)] = (x, merged[id(x)][1] + w) if id(x) in merged else (x, w)
        return Affine(list(merged.values()), self.bias + other.bias)

    def materialize(self, ar: Arith) -> list[Val]:
        out = []
        for i in range(self.size):
            vals, weights = [], []
            for x, w in self.terms:
                nz = np.flatnonzero(w[i])
                vals += [x[j] for j in nz]
                weights += w[i, nz].tolist()
            if not vals:
                vals, weights = [self.terms[0][0][0]], [0.0]
            out.append(ar.lincomb(vals, weights, float(self.bias[i])))
        return out
