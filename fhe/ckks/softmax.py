"""Three polynomial softmax kernels over one attention row, for the PowerSoftmax paper's Table 5.

A row of L scores is L values (SIMD layout: the slots hold independent rows). Every kernel may fold
one clear affine map of its input into the producing layer (as the full program folds 1/√d, 1/L and
the Goldschmidt scale into W_q), so each receives its input already mapped by :meth:`encode`.

- ``power``: length-agnostic PowerSoftmax (Eq. 7 with ε): x^p (log₂ p levels), the mean (a sum, the
  1/L folded), Goldschmidt 1/x, one product — depth log₂ p + n + 2.
- ``taylor``: exp by a degree-8 Taylor polynomial of x/4 raised to the 4th power (Nexus-style, with
  the 1/(L·D) of the mean folded into the coefficients), then the same Goldschmidt division.
- ``square``: Cho et al.'s normalise-and-square: y = 1 + x/2^k, then k rounds of y ← y²/mean(y²),
  each division by Goldschmidt on its own calibrated interval (the last round divides by the sum).

Intervals come from calibration rows; the Goldschmidt count from the tolerance, as in the compiler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fhe.ckks import approx as A
from fhe.ckks.arith import Arith, ClearArith, Val

KERNELS = ("power", "taylor", "square")


def exact_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def exact_power_softmax(x: np.ndarray, p: int, eps: float) -> np.ndarray:
    """Eq. 7 with ε: (x_j^p / L) / (ε + Mean_i x_i^p)."""
    xp = x**p
    return (xp / x.shape[-1]) / (eps + xp.mean(-1, keepdims=True))


@dataclass
class SoftmaxKernel:
    kind: str
    length: int
    tol: float = 1e-2
    p: int = 4
    eps: float = 0.05
    rounds: int = 5  # square strategy: exp(x) ≈ (1 + x/2^rounds)^(2^rounds)
    margin: float = 0.2
    headroom: float = 2.0
    consts: dict = field(default_factory=dict)

    # -------------------------------------------------------------- calibration
    def calibrate(self, rows: np.ndarray) -> SoftmaxKernel:
        """Fix scales and iteration counts from calibration rows (R, L) using the clear kernel."""
        self.consts = {}
        ranges = self._ranges(rows)
        for name, (lo, hi) in ranges.items():
            self.consts[name] = A.plan_reciprocal(lo, hi, self.tol, self.margin, self.headroom, 30)
        return self

    def _ranges(self, rows: np.ndarray) -> dict[str, tuple[float, float]]:
        L = self.length
        if self.kind == "power":
            a = self.eps + (rows**self.p).mean(-1)
            return {"div": (float(a.min()), float(a.max()))}
        if self.kind == "taylor":
            a = np.polynomial.polynomial.polyval(rows / 4, self._taylor()) ** 4
            a = a.mean(-1)
            return {"div": (float(a.min()), float(a.max()))}
        out, y = {}, 1 + rows / 2**self.rounds
        for r in range(self.rounds):
            z = y**2
            m = z.sum(-1, keepdims=True) / (
                L if r < self.rounds - 1 else 1
            )  # the last round normalises to 1
            out[f"div{r}"] = (float(m.min()), float(m.max()))
            y = z / m
        return out

    @staticmethod
    def _taylor(degree: int = 8) -> np.ndarray:
        return np.array([1 / math.factorial(k) for k in range(degree + 1)])

    # -------------------------------------------------------------- the kernel
    def encode(self, rows: np.ndarray) -> np.ndarray:
        """The clear affine map folded into the producer (applied before encryption here)."""
        if self.kind == "power":
            return rows / (self.length * self.consts["div"]["scale"]) ** (1 / self.p)
        if self.kind == "taylor":
            return rows
        return 1 + rows / 2**self.rounds

    def __call__(self, ar: Arith, xs: list[Val]) -> list[Val]:
        L, c = self.length, self.consts
        if self.kind == "power":
            sp = [A.power_even(ar, x, self.p) for x in xs]
            a = ar.add_scalar(ar.sum(sp), self.eps / c["div"]["scale"])
            y = A.goldschmidt_reciprocal(ar, a, c["div"]["iterations"])
            return [ar.mul(s, y) for s in sp]
        if self.kind == "taylor":
            k = (
                L * c["div"]["scale"]
            ) ** -0.25  # 1/(L·D) folded into the coefficients of t, e = t⁴
            coeffs = tuple(k * self._taylor()[j] / 4**j for j in range(9))
            e = [ar.square(ar.square(A.poly_eval(ar, x, coeffs))) for x in xs]
            y = A.goldschmidt_reciprocal(ar, ar.sum(e), c["div"]["iterations"])
            return [ar.mul(ej, y) for ej in e]
        ys, f = (
            xs,
            1.0,
        )  # ys = f · (the exactly normalised values): Goldschmidt returns D/a, not 1/a
        for r in range(self.rounds):
            z = [ar.square(v) for v in ys]
            d = c[f"div{r}"]
            f = f * f
            last = r == self.rounds - 1
            a = ar.lincomb(z, [1 / ((1 if last else L) * d["scale"] * f)] * L)  # the f² folded in
            inv = A.goldschmidt_reciprocal(ar, a, d["iterations"])
            ys = [
                ar.mul(v, inv) for v in z
            ]  # mean 1 after each round, sum 1 after the last (times f)
            f = f * d["scale"]
        return [ar.lincomb([v], [1 / f]) for v in ys]

    def reference(self, rows: np.ndarray) -> np.ndarray:
        return (
            exact_power_softmax(rows, self.p, self.eps)
            if self.kind == "power"
            else exact_softmax(rows)
        )

    def clear(self, rows: np.ndarray, ar: ClearArith | None = None) -> np.ndarray:
        ar = ar or ClearArith()
        enc = self.encode(rows)
        out = self(ar, [Val(enc[:, j]) for j in range(self.length)])
        return np.stack([v.data for v in out], axis=-1)
