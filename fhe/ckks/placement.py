"""Where a bootstrapping engine renews values: a search over the stages' entry levels.

Just-in-time renewal (:class:`fhe.ckks.arith.Arith`) bootstraps an operand when its next product
would not fit. That is the fewest renewals along one chain of products, but a stage that derives
several values from one spent input renews each of them apart: issue 28's LayerNorm bootstrapped
the centred input, the variance and Newton's iterate separately, up to 5 times per norm, where
renewing its one input as it begins would have left it levels for most of its chain.

The rule searched here: for stage ``s``, a value made before ``s`` whose level is above
``entry_levels[s]`` is bootstrapped at its first use in ``s`` (``Arith._enter``). Every stage
without an entry is just in time. The search is a descent over clear runs of the program from
several starts (:func:`search_entry_levels`): stage by stage in run order, each level from 0 (renew
every non-fresh input) up, or none, is tried, and a choice is kept when it strictly lowers the
whole program's bootstrap count; sweeps repeat, since a later stage's choice can make an earlier
one's pay. The count is exact, not estimated: the clear run executes
the same operations and the same level bookkeeping as the encrypted one, and placement depends on
the program alone, never on the data.

A fresh query may hold more levels than a bootstrapped value: OpenFHE's client can encode at the
top of the chain, the levels a bootstrap would use included (24 at N = 2^16 against 5). The
program then runs that far before its first bootstrap; a program that fits needs none, nor
bootstrapping keys. The search runs with the most fresh levels, then keeps the fewest that give the
same count (:func:`fewest_fresh_levels`): each level above costs the server dearer operations and
the client a larger ciphertext.

Precision: a bootstrap's error grows with the magnitude it receives beyond the engine's flat bound
(OpenFHE: |x| <= 16, ``ckks_bootstrap.md``). A choice is refused when it would bootstrap a larger
value than both that bound and the largest just-in-time bootstrap does, on the samples searched
over. Without this rule the search moved a tiny PowerSoftmax model's bootstrap onto a value of 104
(just in time: 28) and its encrypted error rose from under 2e-3 to 7e-3.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fhe.ckks.arith import ClearArith

Run = Callable[[ClearArith], object]  # one clear run of the whole program (its result unused)
PASSES = 4  # sweeps of one descent (each start settles in 2-3 on the digits models)


@dataclass(frozen=True)
class Placement:
    """Where a plan's bootstraps go: the stages' entry levels, and whether Goldschmidt renews y
    alone (``rebuild``, :func:`fhe.ckks.approx.goldschmidt_reciprocal`); ``bootstraps`` per run."""

    entry_levels: dict[str, int]
    rebuild: bool
    bootstraps: int
    fresh_levels: int = 0  # levels a fresh input holds beyond a bootstrapped value


def count_bootstraps(
    run: Run,
    max_depth: int,
    entry_levels: dict[str, int],
    rebuild: bool = False,
    fresh_levels: int = 0,
) -> ClearArith:
    """The clear run with these entry levels (its ``bootstraps`` list the stage of each), its input
    holding ``fresh_levels`` more than a bootstrapped value."""
    ar = ClearArith(
        max_depth=max_depth,
        bootstrap=True,
        entry_levels=entry_levels,
        rebuild=rebuild,
        input_level=-fresh_levels,
    )
    run(ar)
    return ar


def search_placement(
    run: Run,
    max_depth: int,
    flat_bound: float = float("inf"),
    check: Run | None = None,
    fresh_levels: int = 0,
) -> Placement:
    """The fewest bootstraps over both Goldschmidt forms, each with its searched entry levels
    (:func:`search_entry_levels`); the plain form on a tie. Both are held to the plain form's
    just-in-time ceiling: renewing y alone leaves the reciprocal one level deeper, which can move
    a later cut onto a larger value (a tiny test model's attention output: 116 against 28, and an
    encrypted error of 9e-3 against the test's 2e-3 bound), and such a placement is refused.
    ``check``: a run on more samples, whose peaks are held to the ceiling (the count is the
    program's, the same on any sample). ``fresh_levels``: the most levels a fresh input may hold
    beyond a bootstrapped value; the placement keeps the fewest that give its count
    (:func:`fewest_fresh_levels`)."""
    check = check or run
    plain = count_bootstraps(check, max_depth, {}, False, fresh_levels)
    ceiling = max(flat_bound, *plain.bootstrap_peaks, 0.0)
    best: Placement | None = None
    for rebuild in (False, True):
        first = None if rebuild else plain  # the plain form's just-in-time count, made once
        entry = search_entry_levels(
            run,
            max_depth,
            ceiling=ceiling,
            rebuild=rebuild,
            check=check,
            just_in_time=first,
            fresh_levels=fresh_levels,
        )
        ar = (
            plain
            if (entry, rebuild) == ({}, False)
            else count_bootstraps(check, max_depth, entry, rebuild, fresh_levels)
        )
        if max(ar.bootstrap_peaks, default=0.0) > ceiling:
            continue
        if best is None or len(ar.bootstraps) < best.bootstraps:
            best = Placement(entry, rebuild, len(ar.bootstraps), fresh_levels)
    assert best is not None  # the plain form just in time is within its own ceiling
    return fewest_fresh_levels(check, max_depth, best, ceiling)


def fewest_fresh_levels(
    run: Run, max_depth: int, placement: Placement, ceiling: float
) -> Placement:
    """``placement`` with the fewest fresh levels that keep its bootstrap count within ``ceiling``.

    A fresh input's extra levels cost the client a larger ciphertext and the server dearer
    operations (at N = 2^16, a rotation at OpenFHE level 0, the top of its 25-level chain, took
    154 ms against 31 ms at level 19), and past some point they save no bootstrap: the rest of the
    program is bootstrapped as often either way."""
    for fresh in range(placement.fresh_levels):
        ar = count_bootstraps(run, max_depth, placement.entry_levels, placement.rebuild, fresh)
        if (
            len(ar.bootstraps) <= placement.bootstraps
            and max(ar.bootstrap_peaks, default=0.0) <= ceiling
        ):
            return Placement(placement.entry_levels, placement.rebuild, len(ar.bootstraps), fresh)
    return placement


def search_entry_levels(
    run: Run,
    max_depth: int,
    flat_bound: float = float("inf"),
    *,
    ceiling: float | None = None,
    rebuild: bool = False,
    check: Run | None = None,
    just_in_time: ClearArith | None = None,
    fresh_levels: int = 0,
) -> dict[str, int]:
    """Entry levels that bootstrap no more than just-in-time renewal, and fewer where the search
    finds them (``{}`` when just in time is as good); none that bootstraps a value larger than
    ``ceiling``, by default ``flat_bound`` or every just-in-time bootstrap's input if larger.

    A descent from several starts: just in time, then every stage at one entry level (0 up to
    ``max_depth`` − 1). Each descent tries, stage by stage in run order, every level and no entry,
    keeps a change when it strictly lowers the count, and sweeps again until a sweep changes
    nothing (at most ``PASSES``); the fewest bootstraps over the starts wins (the earliest start
    on a tie). One start alone stops where no single stage's change pays: on issue 28's 2-block
    model, just in time's descent stopped at 27 bootstraps where the start at level 1 reached
    24 (and simulated annealing over the same choices, in one-off runs, no fewer).

    Placements are counted on ``run``; one that would be kept is first held to the ceiling on
    ``check`` as well (more samples: their peaks), so that most trials cost one sample's run.
    ``just_in_time``: that placement's count on ``check`` (else ``run``), if the caller has it.
    ``fresh_levels``: the levels a fresh input holds beyond a bootstrapped value."""
    first = just_in_time
    if first is None:
        first = count_bootstraps(check or run, max_depth, {}, rebuild, fresh_levels)
    if not first.bootstraps:
        return {}
    if ceiling is None:
        ceiling = max(flat_bound, *first.bootstrap_peaks)
    stages = list(first.counts)  # every stage tag, in the order the program first entered it

    seen: dict[frozenset, float] = {}  # descents revisit placements: the count is deterministic

    def count(entry: dict[str, int]) -> float:  # inf: refused (beyond the ceiling)
        key = frozenset(entry.items())
        if key not in seen:
            ar = count_bootstraps(run, max_depth, entry, rebuild, fresh_levels)
            within = max(ar.bootstrap_peaks, default=0.0) <= ceiling
            seen[key] = len(ar.bootstraps) if within else math.inf
        return seen[key]

    def within(entry: dict[str, int]) -> bool:  # on the check samples too
        if check is None:
            return True
        ar = count_bootstraps(check, max_depth, entry, rebuild, fresh_levels)
        return max(ar.bootstrap_peaks, default=0.0) <= ceiling

    best = math.inf
    chosen: dict[str, int] = {}
    starts: list[dict[str, int]] = [{}, *(dict.fromkeys(stages, k) for k in range(max_depth))]
    for start in starts:
        n, entry = _descend(count, within, stages, max_depth, start)
        if n < best:
            best, chosen = n, entry
    return chosen


def _descend(
    count: Callable[[dict[str, int]], float],
    within: Callable[[dict[str, int]], bool],
    stages: list[str],
    max_depth: int,
    start: dict,
) -> tuple[float, dict[str, int]]:
    """(count, entry levels) where changing one stage's entry no longer lowers the count among the
    placements ``within`` accepts (a start it refuses counts as refused: any accepted one is
    better)."""
    chosen = dict(start)
    best = count(start) if within(start) else math.inf
    for _ in range(PASSES):
        improved = False
        for stage in stages:
            for level in (None, *range(max_depth)):  # None: just in time for this stage
                trial = {k: v for k, v in chosen.items() if k != stage}
                if level is not None:
                    trial[stage] = level
                if trial == chosen:
                    continue
                n = count(trial)
                if n < best and within(trial):
                    best, chosen, improved = n, trial, True
        if not improved:
            break
    return best, chosen
