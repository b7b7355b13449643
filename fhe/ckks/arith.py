"""One arithmetic interface for the polynomial program, with CKKS's level bookkeeping built in.

Every value is a :class:`Val`: data (a numpy array over the batch, or a ciphertext whose SIMD slots
hold the batch) plus its *level*, the number of rescales it went through. A ciphertext × ciphertext
product and a ciphertext × scalar product each cost one level (TenSEAL rescales after every
product); additions cost none. Subclasses implement the raw operations; this base class counts
operations per stage tag, tracks levels and, only when asked, renews an operand that would exceed
the chain's depth: a labelled client-assisted refresh (``refresh=True``: the data owner decrypts and
re-encrypts) or a server-side bootstrap (``bootstrap=True``, engines that have one). Renewal is
just in time: an operand is renewed when its next product would not fit, so a chain of products
gets the fewest renewals, one every ``max_depth`` levels. A value that fans out into several
derived values, each about to take products (:meth:`Arith.before_fanout`: rotated copies, q and
k before the scores, z in every Newton step, a polynomial's input), is bootstrapped once before,
when those products would not fit, rather than each derived value later. A bootstrapping engine
can also renew a stage's inputs as the stage begins (``entry_levels``, chosen per stage by a search
over clear runs: :func:`fhe.ckks.placement.search_entry_levels`), which just-in-time renewal alone
cannot see is cheaper. A bootstrapping engine's fresh input may also hold more levels than a
bootstrapped value (``input_level`` < 0: OpenFHE's whole chain, the levels its bootstrap would use
included, before the first bootstrap); levels count up from there, and the chain's end stays
``max_depth``.

Because the clear and the encrypted evaluation run the same program through the same bookkeeping,
the clear run predicts the encrypted run's depth, operation counts and refreshes exactly.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from fhe.errors import FheError


class DepthExceededError(FheError):
    pass


@dataclass
class Val:
    data: Any
    level: int = 0
    stage: str | None = None  # the stage tag that made it (None: an input or a constant)


OPS = ("ct_ct_mul", "ct_pt_mul", "add", "rescale", "rotation", "client_refresh", "bootstrap")


class Arith:
    """Counts, levels, stage tags and the refresh rule; subclasses supply ``_mul`` & co."""

    def __init__(
        self,
        max_depth: int | None = None,
        refresh: bool = False,
        bootstrap: bool = False,
        entry_levels: Mapping[str, int] | None = None,
        rebuild: bool = False,
        input_level: int = 0,
    ) -> None:
        if refresh and bootstrap:
            raise ValueError("a value is renewed by the client (refresh) or the server (bootstrap)")
        self.max_depth = max_depth
        self.refresh = refresh
        self.bootstrap = bootstrap
        # stage tag -> the highest level at which a value made before that stage enters it; one
        # above is bootstrapped at its first use there (see _enter; the planner's search chooses)
        self.entry_levels = dict(entry_levels or {})
        # Goldschmidt renews y alone and rebuilds e (fhe.ckks.approx.goldschmidt_reciprocal); the
        # planner's search chooses (fhe.ckks.placement.search_placement)
        self.rebuild = bootstrap and rebuild
        # a fresh input's level: below 0 when it holds more levels than a bootstrapped value
        self.input_level = input_level
        self.bootstraps: list[str] = []  # the stage tag of each bootstrap, in run order
        self.tag = "input"
        self.counts: dict[str, Counter] = defaultdict(Counter)
        self.timings_s: dict[str, float] = defaultdict(float)
        self.level_out: dict[str, int] = {}  # tag -> highest level a value reached in it
        self.level_in: dict[str, int] = {}  # tag -> level of the deepest operand entering it
        self.rotation_steps: Counter = (
            Counter()
        )  # packed layout: rotations per step (one Galois key each)

    # ---------------------------------------------------------------- bookkeeping
    @contextmanager
    def stage(self, tag: str) -> Iterator[None]:
        outer, self.tag = self.tag, tag
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings_s[tag] += time.perf_counter() - start
            self.tag = outer

    def _count(self, op: str, n: int = 1) -> None:
        self.counts[self.tag][op] += n

    def _enter(self, v: Val) -> Val:
        """A value made before the current stage, at its first use in it (a product, a rotation, a
        fan-out): bootstrapped first when its level is above the stage's entry level. A stage
        that begins on one fresh ciphertext spends its levels on its own chain, where just-in-time
        renewal would bootstrap each of the values derived from a spent input (issue 28's
        LayerNorm: the centred input, the variance and Newton's iterate, each renewed apart)."""
        limit = self.entry_levels.get(self.tag)
        if not self.bootstrap or limit is None or v.stage == self.tag or v.level <= limit:
            return v
        return self._bootstrap_in_place(v)

    def _ready(self, v: Val) -> Val:
        """The operand of a product: refreshed first when one more level would not fit the chain."""
        v = self._enter(v)
        self.level_in[self.tag] = max(self.level_in.get(self.tag, 0), v.level)
        if self._fits(v):
            return v
        if self.bootstrap:
            return self._bootstrap_in_place(v)
        if not self.refresh:
            raise DepthExceededError(
                f"stage {self.tag!r} needs level {v.level + 1}, beyond the chain's depth "
                f"{self.max_depth}; use a larger poly_modulus_degree, fewer approximation steps, "
                "or the client-assisted refresh"
            )
        self._count("client_refresh")
        v.data, v.level = (
            self._refresh(v.data),
            0,
        )  # in place: every later use sees the fresh ciphertext
        return v

    def _fits(self, v: Val) -> bool:
        """Whether one more product on ``v`` fits the chain."""
        return self.max_depth is None or v.level + 1 <= self.max_depth

    def spent(self, v: Val) -> bool:
        """Whether a product on ``v`` would bootstrap it first (bootstrapping engines only: with one
        chain or client refreshes, never)."""
        return self.bootstrap and not self._fits(v)

    def renew(self, v: Val) -> Val:
        """``v`` bootstrapped now, in place (a program that knows it can rebuild a companion value
        from ``v`` renews ``v`` alone instead of both just in time)."""
        if not self.bootstrap:
            raise ValueError("renew() needs a bootstrapping engine")
        return self._bootstrap_in_place(v)

    def _bootstrap_in_place(self, v: Val) -> Val:
        self._count("bootstrap")
        self.bootstraps.append(self.tag)
        v.data, v.level = self._bootstrap(v.data), 0  # in place, as a refresh
        v.stage = self.tag  # renewed here: a stage input no more
        return v

    def _out(self, data: Any, level: int) -> Val:
        self.level_out[self.tag] = max(self.level_out.get(self.tag, 0), level)
        return Val(data, level, self.tag)

    # ---------------------------------------------------------------- operations
    @staticmethod
    def _shallow_first(a: Val, b: Val) -> tuple[Val, Val]:
        """TenSEAL computes ``a op b`` on a copy of ``a`` but mod-switches ``b`` *in place* when
        ``b`` has more levels left; putting the shallower operand first keeps every operand as it
        was."""
        return (a, b) if a.level <= b.level else (b, a)

    def mul(self, a: Val, b: Val) -> Val:
        a, b = self._shallow_first(self._ready(a), self._ready(b))
        self._count("ct_ct_mul")
        self._count("rescale")
        return self._out(self._mul(a.data, b.data), max(a.level, b.level) + 1)

    def square(self, a: Val) -> Val:
        a = self._ready(a)
        self._count("ct_ct_mul")
        self._count("rescale")
        return self._out(self._square(a.data), a.level + 1)

    def add(self, a: Val, b: Val) -> Val:
        a, b = self._shallow_first(a, b)
        self._count("add")
        return self._out(self._add(a.data, b.data), max(a.level, b.level))

    def add_scalar(self, a: Val, c: float) -> Val:
        if c == 0:
            return a
        self._count("add")
        return self._out(self._add_scalar(a.data, float(c)), a.level)

    def neg(self, a: Val) -> Val:
        return self._out(self._neg(a.data), a.level)

    def sum(self, vals: Sequence[Val]) -> Val:
        out = vals[0]
        for v in vals[1:]:
            out = self.add(out, v)
        return out

    def lincomb(self, vals: Sequence[Val], weights: Sequence[float], bias: float = 0.0) -> Val:
        """Σ wᵢ·xᵢ + b with clear weights: one ct×scalar product per nonzero weight, one level."""
        pairs = [(v, float(w)) for v, w in zip(vals, weights, strict=True) if w != 0]
        if not pairs:  # an all-zero row still yields a ciphertext at the expected level
            pairs = [(vals[0], 0.0)]
        out = None
        for v, w in pairs:  # accumulate as we go: one product alive at a time
            v = self._ready(v)
            self._count("ct_pt_mul")
            self._count("rescale")
            term = Val(self._mul_scalar(v.data, w), v.level + 1, self.tag)
            out = term if out is None else self.add(out, term)
        assert out is not None  # pairs holds at least one term
        return self._out(self.add_scalar(out, bias).data, out.level)

    # ------------------------------------------------------- packed layout (one sample in the
    # slots)
    def rotate(self, a: Val, step: int) -> Val:
        """Slot i of the result holds slot i + step of ``a`` (cyclic over all slots): no level, one
        key switch, and one Galois key per distinct step (counted here, so keys are known before
        keygen)."""
        if step == 0:
            return a
        a = self._enter(a)
        self._count("rotation")
        self.rotation_steps[step] += 1
        return self._out(self._rotate(a.data, step), a.level)

    def before_fanout(self, v: Val, levels: int = 1) -> Val:
        """``v``, about to fan out into values that each take ``levels`` more products (rotated
        copies that each meet a product: baby steps, shifted keys; q and the shifted k, whose
        products are masked; z in every Newton step; a polynomial's powers): bootstrapped first,
        once, when those products would not fit its chain, instead of once per derived value
        later. Where ``levels`` exceed a fresh chain, and for every client refresh, renewal
        stays just in time."""
        if not self.bootstrap:
            return v
        v = self._enter(v)
        if levels == 1:
            return self._ready(v)
        if self.max_depth is None or levels > self.max_depth or v.level + levels <= self.max_depth:
            return v
        return self._bootstrap_in_place(v)

    def dot_plain(self, vals: Sequence[Val], plains: Sequence[np.ndarray]) -> Val:
        """Σ xᵢ ⊙ pᵢ with clear slot vectors pᵢ: one ct×pt product each, one rescale for the sum."""
        vals = [self._ready(v) for v in vals]
        self._count("ct_pt_mul", len(vals))
        self._count("add", len(vals) - 1)
        self._count("rescale")
        level = max(v.level for v in vals) + 1
        return self._out(self._dot_plain([v.data for v in vals], list(plains)), level)

    def add_plain(self, a: Val, plain: np.ndarray) -> Val:
        self._count("add")
        return self._out(self._add_plain(a.data, plain), a.level)

    # ---------------------------------------------------------------- subclass hooks
    def _mul(self, a, b):
        raise NotImplementedError

    def _square(self, a):
        return self._mul(a, a)

    def _add(self, a, b):
        raise NotImplementedError

    def _add_scalar(self, a, c: float):
        raise NotImplementedError

    def _neg(self, a):
        raise NotImplementedError

    def _mul_scalar(self, a, c: float):
        raise NotImplementedError

    def _refresh(self, a):
        raise NotImplementedError

    def _bootstrap(self, a):
        """A server-side bootstrap (engines that have one)."""
        raise NotImplementedError

    def _rotate(self, a, step: int):
        raise NotImplementedError

    def _dot_plain(self, datas: list, plains: list[np.ndarray]):
        raise NotImplementedError

    def _add_plain(self, a, plain: np.ndarray):
        raise NotImplementedError

    # ---------------------------------------------------------------- reporting
    def summary(self) -> dict:
        totals: Counter[str] = Counter()
        for c in self.counts.values():
            totals.update(c)
        return {
            "op_counts": {op: int(totals.get(op, 0)) for op in OPS},
            "op_counts_per_tag": {
                t: {op: int(n) for op, n in c.items()} for t, c in self.counts.items()
            },
            "depth": max(self.level_out.values(), default=0),
            "level_after_tag": dict(self.level_out),
            "rotation_steps": sorted(int(k) for k in self.rotation_steps),
            **({"bootstraps": list(self.bootstraps)} if self.bootstrap else {}),
        }


class ClearArith(Arith):
    """The clear reference: numpy float64 arrays over the batch; exact arithmetic, same bookkeeping.

    ``strict``: raise when an approximated op's input leaves its calibrated interval (else
    count)."""

    def __init__(
        self,
        max_depth: int | None = None,
        refresh: bool = False,
        strict: bool = False,
        bootstrap: bool = False,
        entry_levels: Mapping[str, int] | None = None,
        rebuild: bool = False,
        input_level: int = 0,
    ) -> None:
        super().__init__(max_depth, refresh, bootstrap, entry_levels, rebuild, input_level)
        self.strict = strict
        self.bootstrap_peaks: list[float] = []  # max |value| entering each bootstrap
        self.ranges: dict[str, tuple[float, float]] = {}  # input range of each approximated op
        self.outside: dict[str, int] = {}  # values that fell outside the op's calibrated interval

    def encode(self, x: np.ndarray) -> Val:
        return Val(np.asarray(x, dtype=np.float64), self.input_level)

    def _mul(self, a, b):
        return a * b

    def _add(self, a, b):
        return a + b

    def _add_scalar(self, a, c):
        return a + c

    def _neg(self, a):
        return -a

    def _mul_scalar(self, a, c):
        return a * c

    def _refresh(self, a):
        return a

    def _bootstrap(self, a):
        self.bootstrap_peaks.append(float(np.max(np.abs(a))))
        return a

    def _rotate(self, a, step):
        return np.roll(a, -step, axis=-1)

    def _dot_plain(self, datas, plains):
        return sum(d * p for d, p in zip(datas, plains, strict=True))

    def _add_plain(self, a, plain):
        return a + plain
