"""Where a bootstrapping engine renews values: a search over the stages' entry levels.

Just-in-time renewal (:class:`fhe.ckks.arith.Arith`) bootstraps an operand when its next product
would not fit. That is the fewest renewals along one chain of products, but a stage that derives
several values from one spent input renews each of them apart: issue 28's LayerNorm bootstrapped
the centred input, the variance and Newton's iterate separately, up to 5 times per norm, where
renewing its one input as it begins would have left it levels for most of its chain.

The rule searched here: for stage ``s``, a value made before ``s`` whose level is above
``entry_levels[s]`` is bootstrapped at its first use in ``s`` (``Arith._enter``). Every stage
without an entry is just in time. The search is greedy over clear runs of the program: stage by
stage in run order, each level from 0 (renew every non-fresh input) up is tried, and a choice is
kept when it strictly lowers the whole program's bootstrap count; two passes, since a later stage's
choice can make an earlier one's pay. The count is exact, not estimated: the clear run executes
the same operations and the same level bookkeeping as the encrypted one, and placement depends on
the program alone, never on the data.

Precision: a bootstrap's error grows with the magnitude it receives beyond the engine's flat bound
(OpenFHE: |x| <= 16, ``ckks_bootstrap.md``). A choice is refused when it would bootstrap a larger
value than both that bound and the largest just-in-time bootstrap does, on the samples searched
over. Without this rule the search moved a tiny PowerSoftmax model's bootstrap onto a value of 104
(just in time: 28) and its encrypted error rose from under 2e-3 to 7e-3.
"""

from __future__ import annotations

from collections.abc import Callable

from fhe.ckks.arith import ClearArith

Run = Callable[[ClearArith], object]  # one clear run of the whole program (its result unused)
PASSES = 2


def count_bootstraps(run: Run, max_depth: int, entry_levels: dict[str, int]) -> ClearArith:
    """The clear run with these entry levels (its ``bootstraps`` list the stage of each)."""
    ar = ClearArith(max_depth=max_depth, bootstrap=True, entry_levels=entry_levels)
    run(ar)
    return ar


def search_entry_levels(
    run: Run, max_depth: int, flat_bound: float = float("inf")
) -> dict[str, int]:
    """Entry levels that bootstrap no more than just-in-time renewal, and fewer where the greedy
    search finds them (``{}`` when just in time is as good); none that bootstraps a value larger
    than ``flat_bound`` and than every just-in-time bootstrap's input."""
    first = count_bootstraps(run, max_depth, {})
    best = len(first.bootstraps)
    if best == 0:
        return {}
    ceiling = max(flat_bound, *first.bootstrap_peaks)
    stages = list(first.counts)  # every stage tag, in the order the program first entered it
    chosen: dict[str, int] = {}
    for _ in range(PASSES):
        improved = False
        for stage in stages:
            for level in range(max_depth):  # max_depth itself: never (just in time)
                trial = {**chosen, stage: level}
                ar = count_bootstraps(run, max_depth, trial)
                n = len(ar.bootstraps)
                if n < best and max(ar.bootstrap_peaks, default=0.0) <= ceiling:
                    best, chosen, improved = n, trial, True
        if not improved:
            break
    return chosen
