"""The packed layout's linear algebra: one sample's vectors in the slots of one ciphertext.

Layout. A vector of T positions × C channels is stored position-major, slot t·C' + c, with C' the
stride (a power of two ≥ C; one stride for a whole program) and T' the next power of two of T
(padding slots hold 0), in a block of p = T'·C' slots that repeats through all N/2 slots
(*replicated*). A rotation of the whole ciphertext is then a cyclic rotation of every block:
rotating by r·C' moves each position r places along, cyclically, which is how attention pairs query
t with key (t + r) mod T' without a mask (a padding position holds zeros, so its score is 0).

Clear matrices by the diagonal method (Halevi and Shoup, "Algorithms in HElib", 2014): for an input
of period p, y = Σₖ diagₖ ⊙ rot(x, k) over k < p with diagₖ[i] = M[i, i + k]; with baby steps b < n₁
and giant steps g·n₁ (Halevi and Shoup, "Faster homomorphic linear transformations in HElib", 2018),
y = Σ_g rot(Σ_b rot(diag_{g n₁ + b}, −g n₁) ⊙ rot(x, b), g n₁): about 2√(number of diagonals)
rotations instead of one per diagonal, and the baby-step rotations of an input are shared by every
map that reads it. Only the diagonals that are not zero are used, so a position-wise map (I_T ⊗ W
with equal strides) needs 2C − 1 of them whatever T is.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from fhe.ckks.arith import Arith, Val


def pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


@dataclass(frozen=True)
class Layout:
    """Where a (T, C) activation lives in one block of ``period`` slots: slot t·stride + c.

    ``stride`` defaults to the next power of two of C and ``period`` to T'·stride; a program gives
    all its activations one stride, so a position-wise map has at most 2·stride − 1 diagonals."""

    positions: int  # T
    channels: int  # C
    stride: int = 0  # 0: pow2(C)
    period: int = 0  # 0: pow2(T) · stride
    offset: int = 0  # first slot inside the block (packed attention puts offset r in block r)

    def __post_init__(self) -> None:
        if not self.stride:
            object.__setattr__(self, "stride", pow2(self.channels))
        if not self.period:
            object.__setattr__(self, "period", pow2(self.positions) * self.stride)
        if (
            self.stride < self.channels
            or self.period & (self.period - 1)
            or self.offset + self.positions * self.stride > self.period
        ):
            raise ValueError(f"invalid layout {self}")

    @property
    def size(self) -> int:
        return self.positions * self.channels

    def slots_of(self) -> np.ndarray:
        """The slot of each logical value (position-major order) inside one block."""
        t, c = np.divmod(np.arange(self.size), self.channels)
        return self.offset + t * self.stride + c

    def place(self, values: np.ndarray, n_slots: int) -> np.ndarray:
        """Logical values (T·C,) → the replicated slot vector (n_slots,)."""
        block = np.zeros(self.period)
        block[self.slots_of()] = values
        return np.tile(block, n_slots // self.period)

    def read(self, slots: np.ndarray) -> np.ndarray:
        """A slot vector (…, n_slots) → the logical values of its first block (…, T·C)."""
        return np.asarray(slots)[..., self.slots_of()]


@dataclass
class PVec:
    """A packed value: one ciphertext (or clear slot vector) and the layout of what it holds."""

    val: Val
    layout: Layout
    clean: bool = True  # padding slots hold 0 (false after a polynomial: p(0) need not be 0)


@dataclass(frozen=True)
class LinearMap:
    """A clear matrix between two layouts, as BSGS groups of diagonals: {giant index g: {baby b:
    plain}}, diagonal k = g·n₁ + b with g signed (k taken in (−period/2, period/2])."""

    groups: dict[int, dict[int, np.ndarray]]
    out: Layout
    n1: int

    @property
    def n_diagonals(self) -> int:
        return sum(len(g) for g in self.groups.values())


def _diagonals(m: np.ndarray, src: Layout, dst: Layout) -> tuple[np.ndarray, np.ndarray]:
    """(steps k, diagonals (K, L)) of the slot-level matrix, one period L = max(periods) each."""
    period = max(src.period, dst.period)
    big = np.zeros((dst.period, src.period))
    big[np.ix_(dst.slots_of(), src.slots_of())] = m
    rows = np.arange(period)
    ks = np.arange(src.period)
    diags = big[(rows % dst.period)[None, :], ((rows[None, :] + ks[:, None]) % src.period)]
    keep = np.abs(diags).max(axis=1) > 0
    return ks[keep], diags[keep]


def linear_map(m: np.ndarray, src: Layout, dst: Layout, n_slots: int, n1: int = 8) -> LinearMap:
    """The BSGS plan of ``m`` (dst.size × src.size, logical order) for replicated inputs of layout
    ``src``.

    One baby-step size ``n1`` for a whole program keeps its Galois keys few: baby steps 1 … n1 − 1,
    and giant steps applied Horner-wise (rotations by ±n1 only, see :func:`apply_maps`)."""
    if m.shape != (dst.size, src.size):
        raise ValueError(f"matrix {m.shape} does not map {src} to {dst}")
    if max(src.period, dst.period) > n_slots:
        raise ValueError(
            f"a block of {max(src.period, dst.period)} slots does not fit {n_slots} slots"
        )
    ks, diags = _diagonals(m, src, dst)
    reps = n_slots // diags.shape[1] if len(ks) else 1
    groups: dict[int, dict[int, np.ndarray]] = {}
    for k, d in zip(ks.tolist(), diags, strict=True):
        signed = k - src.period if k > src.period // 2 else k
        g, b = divmod(signed, n1)
        groups.setdefault(g, {})[b] = np.tile(np.roll(d, g * n1), reps)
    return LinearMap(groups, dst, n1)


class Rotations:
    """Baby-step rotations of each input, computed once per program run and shared by its maps,
    and held only while the input lives: a value the program drops takes its copies with it (on a
    server, their ciphertexts are freed). The cache holds its inputs weakly, and step 0 (the input
    itself) is not stored: it would keep the input alive."""

    def __init__(self, ar: Arith) -> None:
        self.ar = ar
        self._cache: dict[int, tuple[weakref.ref[Val], dict[int, Val]]] = {}

    def of(self, x: Val, step: int) -> Val:
        entry = self._cache.get(id(x))
        if entry is None or entry[0]() is not x:  # new, or an id reused after a value was freed
            entry = self._cache[id(x)] = (weakref.ref(x, self._drop(id(x))), {})
            self.ar.before_fanout(x)  # in place: the copies then start from a fresh value
        rots = entry[1]
        if step == 0:
            return x
        if step not in rots:
            rots[step] = self.ar.rotate(x, step)
        return rots[step]

    def _drop(self, key: int) -> Callable[[weakref.ref], None]:
        """The callback that removes a dead input's entry (and its copies) from the cache."""

        def drop(ref: weakref.ref) -> None:
            if self._cache.get(key, (None,))[0] is ref:
                del self._cache[key]

        return drop

    def forget(self, vals: Iterable[Val]) -> None:
        """Drop the copies of ``vals``, values the program will not read again through a map but
        that live on elsewhere (the input, which ``PackedProgram.forward`` keeps): the engine may
        then free the copies' ciphertexts before the values die."""
        for x in vals:
            self._cache.pop(id(x), None)


def apply_maps(
    ar: Arith,
    terms: list[tuple[Val, LinearMap]],
    bias: np.ndarray | None,
    rotations: Rotations,
    n_slots: int,
) -> Val:
    """Σ Mₖ xₖ (+ bias) = Σ_g rot(I_g, g·n₁), I_g the products of giant group g of every term summed
    before one rescale. Giant steps run Horner-wise, rot(rot(I_2, n₁) + I_1, n₁) + I_0: rotations by
    ±n₁ only (two Galois keys), one per giant group, shared by all terms (a rotation is linear)."""
    n1 = terms[0][1].n1
    if any(lm.n1 != n1 for _, lm in terms):
        raise ValueError("terms of one map sum need the same baby-step size")
    inner: dict[int, Val] = {}
    for g in sorted({g for _, lm in terms for g in lm.groups}):
        vals, plains = [], []
        for x, lm in terms:
            for b, plain in lm.groups.get(g, {}).items():
                vals.append(rotations.of(x, b))
                plains.append(plain)
        inner[g] = ar.dot_plain(vals, plains)
    out: Val | None
    if not inner:  # an all-zero map still yields a ciphertext at the expected level
        out = ar.lincomb([terms[0][0]], [0.0])
    else:
        out = inner.get(0)
        for sign in (1, -1):
            gs = [g for g in inner if g * sign > 0]
            acc: Val | None = None
            for g in range(max(gs, key=abs, default=0), 0, -sign):  # Horner, outermost giant first
                # the first g is the outermost group, one of inner's
                acc = inner[g] if acc is None else (ar.add(acc, inner[g]) if g in inner else acc)
                acc = ar.rotate(acc, (sign * n1) % n_slots)
            if acc is not None:
                out = acc if out is None else ar.add(out, acc)
    assert out is not None  # inner is not empty
    if bias is not None and np.any(bias):
        out = ar.add_plain(out, bias)
    return out


def rotate_and_sum(ar: Arith, x: Val, step: int, count: int, n_slots: int | None = None) -> Val:
    """Σ_{j < count} rot(x, j·step) for a power-of-two count: log₂(count) rotations, no level. A
    negative step (with ``n_slots``) sums the values *before* each slot: a broadcast to the next
    ones."""
    if count & (count - 1):
        raise ValueError(f"rotate_and_sum needs a power-of-two count, got {count}")
    if step < 0 and n_slots is None:
        raise ValueError("a negative step (a broadcast) needs n_slots")
    wrap = n_slots or 1  # only a negative step wraps, and it has n_slots
    while count > 1:
        x = ar.add(x, ar.rotate(x, step % wrap if step < 0 else step))
        step, count = step * 2, count // 2
    return x
