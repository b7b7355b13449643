"""Polynomial stand-ins for the non-polynomial operations (PowerSoftmax paper, Section 4.5, App. C).

- 1/x (the PowerSoftmax denominator): Goldschmidt iterations. With e₀ = 1 − a and y₀ = 1 + e₀,
  eₖ = eₖ₋₁², yₖ = yₖ₋₁(1 + eₖ) gives yₙ = (1 − e₀^(2ⁿ⁺¹))/a: the relative error is e₀^(2ⁿ⁺¹), so
  the interval [lo, hi] of a (from calibration) is scaled to be symmetric around 1 and the iteration
  count is the smallest n with ((hi − lo)/(hi + lo))^(2ⁿ⁺¹) ≤ tolerance.
- 1/√z (LayerNorm): Newton-type steps y ← a·y − b·z·y³ from a linear first guess on the calibrated
  interval, (a, b) per step the minimax choice for the error left by the steps before (Newton's
  (1.5, 0.5) is one choice); the count is the smallest that meets the tolerance on a dense grid.
- GELU(x) = x·sigmoid(1.702x) (App. C, Eq. 10): a Chebyshev fit of the sigmoid on the calibrated
  interval, degree the smallest whose error bound meets the tolerance; ReLU by a direct Chebyshev
  fit; quad (0.125x² + 0.25x + 0.5) exactly, by one squaring.

Every approximation is evaluated through an :class:`~fhe.ckks.arith.Arith`, so the clear reference,
the depth planner and the encrypted run execute the very same polynomial operations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.polynomial import chebyshev as C
from scipy.optimize import linprog
from scipy.special import erf

from fhe.ckks.arith import Arith, Val
from models.config import Activation
from models.polynomials import QUAD_COEFFS, quad


class ApproximationError(ValueError):
    pass


@dataclass(frozen=True)
class ApproxConfig:
    """Accuracy targets of the approximations and the safety margin around calibrated intervals.

    ``margin`` widens every calibrated interval by that fraction of its width on each side (values
    the calibration set did not reach still converge); ``reciprocal_headroom`` (see
    :func:`goldschmidt_scale`) keeps extra room above the division's interval.
    """

    reciprocal_tol: float = 1e-2  # relative error of Goldschmidt 1/x
    invsqrt_tol: float = 1e-2  # relative error of Newton 1/sqrt(z)
    activation_tol: float = 2e-2  # max absolute error of the GELU/ReLU polynomial on its interval
    max_degree: int = 31
    max_iterations: int = 20
    margin: float = 0.2
    reciprocal_headroom: float = (
        2.0  # < 2 trades depth for convergence beyond the calibrated interval
    )

    def __post_init__(self) -> None:
        for name in ("reciprocal_tol", "invsqrt_tol", "activation_tol"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be in (0, 1), got {getattr(self, name)}")
        if not 1 < self.reciprocal_headroom <= 2:
            raise ValueError(
                f"reciprocal_headroom must be in (1, 2], got {self.reciprocal_headroom}"
            )
        if self.max_degree < 1 or self.max_iterations < 1 or self.margin < 0:
            raise ValueError(f"invalid approximation settings: {self}")


def widen(lo: float, hi: float, margin: float, positive: bool = False) -> tuple[float, float]:
    """[lo, hi] widened by ``margin`` of its width each side (multiplicatively for positive
    intervals)."""
    if positive:
        return lo / (1 + margin), hi * (1 + margin)
    pad = margin * max(hi - lo, 1e-6)
    return lo - pad, hi + pad


# ---------------------------------------------------------------------------------------------- 1/x
def goldschmidt_scale(lo: float, hi: float, headroom: float = 2.0) -> float:
    """D such that a/D covers [lo, hi] around 1 (the midpoint: fewest iterations) but ends at most
    at ``headroom`` < 2: Goldschmidt diverges for a/D ≥ 2, so with headroom 1.5 an input a third
    above the (already widened) interval still converges instead of exploding, for a little more
    depth."""
    return max((lo + hi) / 2, hi / headroom)


def goldschmidt_iterations(lo: float, hi: float, tol: float, max_iterations: int) -> int:
    """Smallest n with r^(2ⁿ⁺¹) ≤ tol, r = max |1 − a| over the scaled interval [lo, hi]."""
    if not 0 < lo <= hi:
        raise ApproximationError(
            f"Goldschmidt 1/x needs a positive interval, got [{lo:.3g}, {hi:.3g}]"
        )
    r = max(1 - lo, hi - 1)
    if r >= 1:
        raise ApproximationError(
            f"Goldschmidt 1/x does not converge on [{lo:.3g}, {hi:.3g}] (needs (0, 2))"
        )
    if r == 0:
        return 0
    n = max(0, math.ceil(math.log2(math.log(tol) / math.log(r))) - 1)
    if n > max_iterations:
        raise ApproximationError(
            f"1/x on [{lo:.3g}, {hi:.3g}] (ratio {hi / lo:.0f}) needs {n} Goldschmidt iterations "
            f"for relative error {tol:g} (limit {max_iterations}); shrink the interval (range-loss "
            "fine-tuning, a larger ε) or relax the tolerance"
        )
    return n


def plan_reciprocal(
    lo: float, hi: float, tol: float, margin: float, headroom: float = 2.0, max_iterations: int = 20
) -> dict:
    """Goldschmidt settings for a calibrated range [lo, hi]: widen it, scale it around 1, count
    iterations."""
    lo_w, hi_w = widen(lo, hi, margin, positive=True)
    scale = goldschmidt_scale(lo_w, hi_w, headroom)
    return {
        "calibrated": [lo, hi],
        "scale": scale,
        "interval": [lo_w / scale, hi_w / scale],
        "iterations": goldschmidt_iterations(lo_w / scale, hi_w / scale, tol, max_iterations),
    }


def goldschmidt_reciprocal(ar: Arith, a: Val, n_iterations: int) -> Val:
    """1/a for a in (0, 2), a already scaled (the scale is folded into the producer's weights).

    y = ∏ (1 + e₀^(2^j)) with e₀ = 1 − a, so a·y = 1 − e² holds for the current e at every step.
    With ``ar.rebuild`` (a bootstrapping engine's plan chooses it), where y and e would be renewed
    together (both spent: they run one level apart), y alone is renewed and the next e is rebuilt
    as 1 − a·y, one product with a, which stays at its entry level: one bootstrap instead of two
    (three: just in time renews 1 + e, then e), for one level more, and the rebuilt e damps the
    bootstrap's error in y like a Newton step. Otherwise the plain iteration."""
    e = ar.add_scalar(ar.neg(a), 1.0)  # e₀ = 1 − a
    y = ar.add_scalar(e, 1.0)  # y₀ = 1 + e₀
    for _ in range(n_iterations):
        if ar.rebuild and (ar.spent(y) or ar.spent(e)):
            e = ar.add_scalar(ar.neg(ar.mul(a, ar.renew(y))), 1.0)  # e² = 1 − a·y
        else:
            e = ar.square(e)
        y = ar.mul(y, ar.add_scalar(e, 1.0))
    return y


# -----------------------------------------------------------------------------------------
# 1/sqrt(z)
def invsqrt_guess(lo: float, hi: float) -> tuple[float, float]:
    """Least-squares line c₀ + c₁z for 1/√z on [lo, hi] (Newton's starting point)."""
    z = np.linspace(lo, hi, 512)
    c1, c0 = np.polyfit(z, 1 / np.sqrt(z), 1)
    return float(c0), float(c1)


Steps = list[tuple[float, float]]


def newton_invsqrt(ar: Arith, z: Val, guess: tuple[float, float], steps: Steps) -> Val:
    """1/√z: y₀ = c₀ + c₁z, then yₖ₊₁ = a·yₖ − b·(z·yₖ)·yₖ² per step (a, b).

    With (a, b) = (1.5, 0.5) this is Newton's y(3 − z y²)/2. Written as a·y − (b·z·y)·y², the
    products y² and (−b z)·y run side by side: two levels per step instead of three.
    """
    z = ar.before_fanout(z, 3)  # each step: −b·z, then two products; z renewed once, not each step
    return newton_invsqrt_affine(ar, lambda c, b: ar.lincomb([z], [c], b), guess, steps)


ZAffine = Callable[[float, float], Val]  # (c, b) -> c·z + b


def newton_invsqrt_affine(ar: Arith, z: ZAffine, guess: tuple[float, float], steps: Steps) -> Val:
    """:func:`newton_invsqrt` where z is known only through ``z(c, b)`` = c·z + b. A producer that
    makes z with clear weights (LayerNorm's variance map) folds c into them, so the guess and each
    step's −b·z cost no level of their own: the guess sits at z's level and every step ends two
    levels above it (with ``ar.lincomb`` on z, three: :func:`newton_invsqrt`)."""
    y = z(guess[1], guess[0])
    for a, b in steps:
        cube = ar.mul(ar.square(y), ar.mul(z(-b, 0.0), y))  # −b·z·y³
        y = ar.add(ar.lincomb([y], [a]), cube)
    return y


def _minimax_ones(rows: np.ndarray) -> np.ndarray | None:
    """x minimising max |rows·x − 1| over the grid the rows sample (an LP in x and the bound t),
    None where the LP fails."""
    n, k = rows.shape
    ones = np.ones((n, 1))
    res = linprog(
        np.r_[np.zeros(k), 1.0],
        A_ub=np.vstack([np.hstack([rows, -ones]), np.hstack([-rows, -ones])]),
        b_ub=np.r_[np.ones(n), -np.ones(n)],
        bounds=[(None, None)] * k + [(0, None)],
    )
    return res.x[:k] if res.success else None


def _minimax_step(r: np.ndarray) -> tuple[float, float]:
    """(a, b) minimising max |a·r − b·r³ − 1| over the error ratios r = y√z (a small LP)."""
    x = _minimax_ones(np.stack([r, -(r**3)], 1))
    if x is None:  # pragma: no cover - the LP is always feasible (t large)
        return 1.5, 0.5
    return float(x[0]), float(x[1])


def invsqrt_plan(
    lo: float, hi: float, tol: float, max_iterations: int
) -> tuple[tuple[float, float], Steps]:
    """The first guess and the fewest steps whose relative error on [lo, hi] is at most ``tol``.

    After yₖ the error ratio r = yₖ√z maps to a·r − b·r³, whatever z is, so each step's (a, b) is
    the minimax choice for the ratios the previous steps leave on a dense grid of the interval
    (Newton's fixed (1.5, 0.5) is one candidate; on the wide variance intervals of LayerNorm the
    minimax steps need about half as many iterations).
    """
    if not 0 < lo <= hi:
        raise ApproximationError(f"1/sqrt needs a positive interval, got [{lo:.3g}, {hi:.3g}]")
    z = np.geomspace(lo, hi, 2048)
    guess = invsqrt_guess(lo, hi)
    r = (guess[0] + guess[1] * z) * np.sqrt(z)
    steps: Steps = []
    while np.max(np.abs(r - 1)) > tol:
        if len(steps) == max_iterations:
            raise ApproximationError(
                f"1/sqrt on [{lo:.3g}, {hi:.3g}] (ratio {hi / lo:.0f}) does not reach relative "
                f"error {tol:g} in {max_iterations} Newton iterations; shrink the LayerNorm "
                "variance range (range loss) or relax the tolerance"
            )
        a, b = _minimax_step(r)
        steps.append((a, b))
        r = a * r - b * r**3
    return guess, steps


INVSQRT_POLY_DEGREE = 3  # LayerNorm's d·p(z) then costs 2 levels above z (packed: 5 per norm)


def invsqrt_poly(lo: float, hi: float, tol: float) -> tuple[tuple[float, ...], float] | None:
    """(coefficients, relative error) of the lowest-degree polynomial p (degree at most
    :data:`INVSQRT_POLY_DEGREE`) whose minimax relative error max |p(z)·√z − 1| on [lo, hi] is at
    most ``tol`` (a small LP on a dense geometric grid), or None. Where the variance interval is
    narrow (the LayerNorm range loss: 3-4.5x once widened) a cubic does what the linear guess and
    one Newton step do (0.9% against 0.7% on [0.228, 1]), and its terms c·d·zᵏ take the norm's
    product with d in the same levels (:meth:`fhe.ckks.packed.PackedProgram.scaled_invsqrt`): one
    level fewer per norm."""
    if not 0 < lo <= hi:
        raise ApproximationError(f"1/sqrt needs a positive interval, got [{lo:.3g}, {hi:.3g}]")
    z = np.geomspace(lo, hi, 2048)
    for degree in range(1, INVSQRT_POLY_DEGREE + 1):
        x = _minimax_ones(np.vander(z, degree + 1, increasing=True) * np.sqrt(z)[:, None])
        if x is None:
            continue
        coeffs = tuple(float(c) for c in x)
        error = float(np.max(np.abs(np.polynomial.polynomial.polyval(z, coeffs) * np.sqrt(z) - 1)))
        if error <= tol:
            return coeffs, error
    return None


def op_steps(op: dict) -> Steps:
    """An invsqrt op's steps (artifacts saved before minimax steps hold Newton's count only)."""
    return [tuple(s) for s in op["steps"]] if "steps" in op else [(1.5, 0.5)] * op["iterations"]


# ------------------------------------------------------------------------------------ activations
def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def gelu_exact(x: np.ndarray) -> np.ndarray:
    """The float model's GELU, 0.5·x·(1 + erf(x/√2)) (used by calibration runs)."""
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def gelu_sigmoid(x: np.ndarray) -> np.ndarray:
    """GELU(x) ≈ x·sigmoid(1.702x) (PowerSoftmax paper App. C, Eq. 10)."""
    return x * sigmoid(1.702 * x)


@dataclass(frozen=True)
class PolyFit:
    """p(t) = Σ coeffs[k]·tᵏ with t = (x − mid)/half ∈ [−1, 1] (the map is folded into the
    producer)."""

    coeffs: tuple[float, ...]
    mid: float
    half: float
    max_error: float

    @property
    def degree(self) -> int:
        return len(self.coeffs) - 1


def chebyshev_fit(
    fn: Callable[[np.ndarray], np.ndarray],
    lo: float,
    hi: float,
    tol: float,
    max_degree: int,
    error_fn: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    name: str = "function",
) -> PolyFit:
    """The lowest-degree Chebyshev interpolant of ``fn`` on [lo, hi] whose max error is ≤ tol.

    ``error_fn(x, p(t))`` turns the fitted values into the error that matters (for GELU, the error
    of x·p instead of p); by default |p − fn|.
    """
    mid, half = (lo + hi) / 2, max((hi - lo) / 2, 1e-9)
    t = np.cos(np.linspace(0, np.pi, 4001))  # dense, endpoint-heavy grid of [-1, 1]
    x = mid + half * t
    best = None
    for deg in range(1, max_degree + 1):
        cheb = C.chebinterpolate(lambda s: fn(mid + half * s), deg)
        coeffs = C.cheb2poly(cheb)
        approx = np.polynomial.polynomial.polyval(t, coeffs)
        err = float(np.max(np.abs(error_fn(x, approx) if error_fn else approx - fn(x))))
        if best is None or err < best.max_error:
            best = PolyFit(tuple(float(c) for c in coeffs), mid, half, err)
        if err <= tol:
            return best
    assert best is not None, f"max_degree must be >= 1, got {max_degree}"
    raise ApproximationError(
        f"{name} on [{lo:.3g}, {hi:.3g}] needs a polynomial of degree > {max_degree} for error "
        f"{tol:g} (degree {best.degree} reaches {best.max_error:.3g}); shrink the interval with "
        "range-loss fine-tuning or relax the tolerance"
    )


def gelu_fit(lo: float, hi: float, tol: float, max_degree: int) -> PolyFit:
    """Fit q(t) ≈ sigmoid(1.702x); GELU is then x·q(t), error measured on x·q."""
    return chebyshev_fit(
        lambda x: sigmoid(1.702 * x),
        lo,
        hi,
        tol,
        max_degree,
        error_fn=lambda x, q: x * q - gelu_sigmoid(x),
        name="GELU",
    )


def relu_fit(lo: float, hi: float, tol: float, max_degree: int) -> PolyFit:
    return chebyshev_fit(lambda x: np.maximum(x, 0.0), lo, hi, tol, max_degree, name="ReLU")


def quad_fit(lo: float, hi: float, tol: float, max_degree: int) -> PolyFit:
    """quad(x) = c₀ + c₁x + c₂x² (models.polynomials.quad) in t = (x − mid)/half: exact, nothing
    fitted (the interval only sets the map that keeps t in [−1, 1], as for every other
    activation)."""
    c0, c1, c2 = QUAD_COEFFS
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    return PolyFit(
        (c0 + c1 * mid + c2 * mid**2, (c1 + 2 * c2 * mid) * half, c2 * half**2), mid, half, 0.0
    )


def abs_fit(lo: float, hi: float, tol: float, max_degree: int) -> PolyFit:
    """|x| with error ≤ tol · max|x| on the interval (the Inhibitor's Manhattan distances, Eq.
    5)."""
    return chebyshev_fit(np.abs, lo, hi, tol * max(abs(lo), abs(hi)), max_degree, name="|x|")


def inhibit_fit(lo: float, hi: float, tol: float, max_degree: int) -> PolyFit:
    """ReLU with error ≤ tol · max|x| (the Inhibitor's (·)⁺ of Eqs. 5-7, on intervals far wider than
    1)."""
    return chebyshev_fit(
        lambda x: np.maximum(x, 0.0),
        lo,
        hi,
        tol * max(abs(lo), abs(hi)),
        max_degree,
        name="ReLU (inhibition)",
    )


def exp_fit(lo: float, hi: float, tol: float, max_degree: int) -> PolyFit:
    """exp with *relative* error ≤ tol (softmax's numerators; the division normalises the scale)."""
    return chebyshev_fit(
        np.exp,
        lo,
        hi,
        tol,
        max_degree,
        error_fn=lambda x, p: (p - np.exp(x)) / np.exp(x),
        name="exp",
    )


def poly_eval(ar: Arith, t: Val, coeffs: tuple[float, ...]) -> Val:
    """Σ cₖ tᵏ in ⌈log₂(deg + 1)⌉ levels, its clear weights included: p = p_low + t^h · p_high with
    h the largest power of two ≤ deg, both halves of degree < h split the same way, and each
    coefficient rides on the lowest power it multiplies (cₖ·t, then products with the powers
    t^(2^j)). Summing every cₖ·tᵏ after the powers (a clear-weighted sum over t¹ … t^deg) takes
    one level more for every degree but a power of two: 3, 5-7, 9-15, … (GELU's 9-10: 4 levels
    instead of 5)."""
    cs = _trimmed(coeffs)
    if len(cs) == 1:
        return ar.add_scalar(ar.lincomb([t], [0.0]), cs[0])
    powers: dict[int, Val] = {1: ar.before_fanout(t, (len(cs) - 1).bit_length())}

    def power(h: int) -> Val:  # t^h for h a power of two, by squaring (depth log₂ h)
        if h not in powers:
            powers[h] = ar.square(power(h // 2))
        return powers[h]

    def split(c: tuple[float, ...]) -> Val | float:  # Σ c[k]·tᵏ, a float when of degree 0
        c = _trimmed(c)
        if len(c) == 1:
            return c[0]
        if len(c) == 2:
            return ar.lincomb([power(1)], [c[1]], c[0])
        h = 1 << ((len(c) - 2).bit_length() - 1)  # the largest power of two ≤ deg
        low, high = split(c[:h]), split(c[h:])
        top = ar.lincomb([power(h)], [high]) if isinstance(high, float) else ar.mul(power(h), high)
        return ar.add_scalar(top, low) if isinstance(low, float) else ar.add(top, low)

    out = split(cs)
    assert not isinstance(out, float)  # degree ≥ 1 here
    return out


def _trimmed(coeffs: tuple[float, ...]) -> tuple[float, ...]:
    """The coefficients without trailing zeros (at least the constant)."""
    n = len(coeffs)
    while n > 1 and coeffs[n - 1] == 0:
        n -= 1
    return tuple(float(c) for c in coeffs[: max(n, 1)]) or (0.0,)


def activation_exact(kind: Activation) -> Callable[[np.ndarray], np.ndarray]:
    """The FFN activation on clear arrays, as calibration runs it (GELU in the float model's erf
    form)."""
    return {
        Activation.GELU: gelu_exact,
        Activation.RELU: lambda z: np.maximum(z, 0.0),
        Activation.QUAD: quad,
    }[kind]


@dataclass(frozen=True)
class SquareForm:
    """c₀ + c₁t + c₂t² = c₂(t + shift)² + offset (completing the square): the shift folds into the
    linear map that produces t and ``scale`` = c₂ and ``offset`` into the one that reads the
    result, so a degree-2 activation costs one squaring and no clear-weighted sum (one level, not
    two)."""

    shift: float
    scale: float
    offset: float

    @classmethod
    def of(cls, coeffs: tuple[float, ...]) -> SquareForm | None:
        """The square form of a degree-2 polynomial, None for any other."""
        if len(coeffs) != 3 or coeffs[2] == 0:
            return None
        c0, c1, c2 = coeffs
        return cls(c1 / (2 * c2), c2, c0 - c1 * c1 / (4 * c2))


def activation_coeffs(kind: Activation, fit: PolyFit) -> tuple[float, ...]:
    """The activation as one polynomial of t (GELU's x·q(t) expanded, Eq. 10)."""
    return gelu_coeffs(fit) if kind is Activation.GELU else tuple(fit.coeffs)


def gelu_coeffs(fit: PolyFit) -> tuple[float, ...]:
    """x·q(t) with x = mid + half·t (Eq. 10), expanded into one polynomial of t of degree deg(q) +
    1: the same function, one level shallower than multiplying x by q(t) after the fact."""
    return tuple(
        float(c) for c in np.polynomial.polynomial.polymul([fit.mid, fit.half], fit.coeffs)
    )


def gelu_eval(ar: Arith, t: Val, fit: PolyFit) -> Val:
    return poly_eval(ar, t, gelu_coeffs(fit))


def power_even(ar: Arith, x: Val, p: int) -> Val:
    """x^p for an even p by square-and-multiply (log₂ p levels when p is a power of two)."""
    result, base, k = None, x, p
    while k:
        if k & 1:
            result = base if result is None else ar.mul(result, base)
        k >>= 1
        if k:
            base = ar.square(base)
    assert result is not None, f"p must be a positive even integer, got {p}"
    return result
