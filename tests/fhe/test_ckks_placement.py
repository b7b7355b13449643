"""Bootstrap placement by stage entry levels (issue 28): the rule, and the search that sets it.

All in the clear: ClearArith counts bootstraps exactly as the encrypted run places them (the OpenFHE
tests check that count against a real encrypted run of a plan that uses entry levels)."""

import dataclasses
import json

import numpy as np

from fhe.ckks import ClearArith
from fhe.ckks.openfhe.backend import OpenFhePlan
from fhe.ckks.placement import (
    Placement,
    count_bootstraps,
    fewest_fresh_levels,
    search_entry_levels,
    search_placement,
)

DEPTH = 5  # the levels between bootstraps at the 128-bit N = 2^16 chain


def two_chains_from_one_spent_input(ar, x: np.ndarray):
    """Stage ``a`` spends four levels; stage ``b`` derives two values from its output and takes
    two more products of each: the shape of a LayerNorm (the centred input, the variance)."""
    with ar.stage("a"):
        v = ar.encode(x)
        for _ in range(4):
            v = ar.square(v)
    with ar.stage("b"):
        d1, d2 = ar.lincomb([v], [2.0]), ar.lincomb([v], [3.0], 1.0)
        return ar.mul(ar.square(d1), ar.square(d2))


def test_just_in_time_renews_each_derived_value_and_the_entry_rule_renews_their_input_once():
    x = np.linspace(0.5, 1.1, 8)
    run = lambda ar: two_chains_from_one_spent_input(ar, x)  # noqa: E731
    jit = count_bootstraps(run, DEPTH, {})
    assert jit.bootstraps == ["b", "b"]  # d1 and d2, each born with no level left
    entry = count_bootstraps(run, DEPTH, {"b": 0})
    assert entry.bootstraps == ["b"]  # v, once, as b begins
    np.testing.assert_allclose(entry.bootstrap_peaks, [np.max(x**16)])  # what entered: v = x^16
    exact = two_chains_from_one_spent_input(ClearArith(), x).data
    want = (2 * x**16) ** 2 * (3 * x**16 + 1) ** 2
    np.testing.assert_allclose(exact, want)  # the program itself, computed naively


def test_the_search_finds_the_entry_level_and_never_does_worse_than_just_in_time():
    x = np.linspace(0.5, 1.1, 8)
    run = lambda ar: two_chains_from_one_spent_input(ar, x)  # noqa: E731
    levels = search_entry_levels(run, DEPTH)
    assert set(levels) == {"b"} and levels["b"] < 4  # v enters b at level 4
    assert len(count_bootstraps(run, DEPTH, levels).bootstraps) == 1

    def one_chain(ar):  # nothing to gain: the search leaves just in time alone
        with ar.stage("c"):
            v = ar.encode(x)
            for _ in range(12):
                v = ar.square(v)

    assert search_entry_levels(one_chain, DEPTH) == {}
    assert search_entry_levels(lambda ar: ar.square(ar.encode(x)), DEPTH) == {}  # none to place


def test_the_search_refuses_to_bootstrap_a_value_beyond_the_flat_error_bound():
    """Renewing b's one input would save a bootstrap, but that input is 100x larger than the two
    values just in time renews: beyond OpenFHE's flat-error bound, it is refused."""
    x = np.linspace(0.9, 1.0, 8)

    def run(ar):
        with ar.stage("a"):
            v = ar.encode(x)
            for _ in range(3):
                v = ar.square(v)
            big = ar.lincomb([v], [100.0])  # level 4, |big| <= 100
        with ar.stage("b"):
            d1, d2 = ar.lincomb([big], [0.01]), ar.lincomb([big], [0.02])  # level 5, <= 1 and 2
            return ar.mul(ar.square(d1), ar.square(d2))

    jit = count_bootstraps(run, DEPTH, {})
    assert jit.bootstraps == ["b", "b"] and max(jit.bootstrap_peaks) <= 2
    assert search_entry_levels(run, DEPTH, flat_bound=16.0) == {}
    unbounded = search_entry_levels(run, DEPTH)  # no bound: one bootstrap, of |x| = 100
    assert len(count_bootstraps(run, DEPTH, unbounded).bootstraps) == 1
    np.testing.assert_allclose(count_bootstraps(run, DEPTH, unbounded).bootstrap_peaks, [100.0])


def test_a_value_made_in_the_stage_or_fresh_enough_is_not_renewed_on_entry():
    ar = ClearArith(max_depth=DEPTH, bootstrap=True, entry_levels={"b": 2})
    with ar.stage("a"):
        low, high = ar.square(ar.encode(np.ones(2))), ar.encode(np.ones(2))
        for _ in range(3):
            high = ar.square(high)
    with ar.stage("b"):
        assert ar.square(low).level == 2 and ar.bootstraps == []  # entered at level 1 <= 2
        inner = ar.square(ar.square(ar.square(low)))  # made in b: just in time only
        assert inner.level == 4 and ar.bootstraps == []
        assert ar.rotate(high, 1).level == 0 and ar.bootstraps == ["b"]  # 3 > 2: renewed first
        assert high.level == 0 and high.stage == "b"  # in place, and a stage input no more
        ar.square(high)
        assert ar.bootstraps == ["b"]
    free = ClearArith(max_depth=DEPTH, entry_levels={"b": 0})  # no bootstrapping: no entry rule
    with free.stage("a"):
        u = free.square(free.encode(np.ones(2)))
    with free.stage("b"):
        assert free.square(u).level == 2 and free.counts["b"]["bootstrap"] == 0


def test_plans_keep_their_placement_and_older_plans_read_as_just_in_time_and_plain():
    plan = OpenFhePlan(
        ring_dim=4096,
        secure=False,
        slots=8,
        scale_bits=52,
        first_mod_bits=60,
        large_digits=5,
        level_budget=(3, 2),
        bootstrap_depth=19,
        levels_after=6,
        program_depth=12,
        bootstrap_tags=("b",),
        peaks=(1.0,),
        rotation_steps=(1,),
        entry_levels=(("b", 0),),
    )
    plan = dataclasses.replace(plan, rebuild=True, compact_residual=True)
    d = json.loads(json.dumps(plan.to_dict()))  # as meta.json holds it
    assert OpenFhePlan.from_dict(d) == plan
    del d["entry_levels"], d["rebuild"], d["compact_residual"]
    older = OpenFhePlan.from_dict(d)
    assert older.entry_levels == () and older.rebuild is False  # planned plain, just in time
    assert older.compact_residual is False  # its residual stream lazy, as planned
    assert older.fresh_levels == 0 and older.encoding_level == 19  # queries as encoded before
    assert dataclasses.replace(plan, fresh_levels=19).encoding_level == 0  # the chain's top


def squares(n: int):
    """A chain of ``n`` products on the input (the run the counts below are made on)."""

    def run(ar):
        v = ar.encode(np.array([1.0, -1.0]))
        for _ in range(n):
            v = ar.square(v)

    return run


def test_a_fresh_input_spends_its_extra_levels_before_the_first_bootstrap():
    # 16 products, 5 levels between bootstraps: 3 bootstraps with a bootstrap's levels (5+5+5+1);
    # 9 levels more on the fresh input: 1 (14+2), and none for 14 products
    assert len(count_bootstraps(squares(16), DEPTH, {}).bootstraps) == 3
    assert len(count_bootstraps(squares(16), DEPTH, {}, fresh_levels=9).bootstraps) == 1
    assert len(count_bootstraps(squares(14), DEPTH, {}, fresh_levels=9).bootstraps) == 0
    ar = ClearArith(max_depth=DEPTH, bootstrap=True, input_level=-9)
    assert ar.encode(np.ones(2)).level == -9


def test_the_placement_keeps_the_fewest_fresh_levels_that_give_its_count():
    # 30 products with up to 19 levels more: 2 bootstraps (24+5+1); 15 levels more still give 2
    # (20+5+5), 14 give 3 (19+5+5+1)
    best = search_placement(squares(30), DEPTH, fresh_levels=19)
    assert (best.bootstraps, best.fresh_levels) == (2, 15)
    assert len(count_bootstraps(squares(30), DEPTH, {}, fresh_levels=14).bootstraps) == 3
    # a program that fits the fresh chain: no bootstrap, and only the levels it uses
    assert search_placement(squares(16), DEPTH, fresh_levels=19) == Placement({}, False, 0, 11)
    # held to the ceiling: fewer levels that would bootstrap beyond it are refused
    wide = Placement({}, False, 2, 19)
    assert fewest_fresh_levels(squares(30), DEPTH, wide, ceiling=0.5) == wide


def three_stages(ar, x: np.ndarray):
    """s0 spends four levels on two values and joins them; s1 rescales; s2 derives three values
    from that and spends two levels on each before joining them (a small stand-in for a block)."""
    v = ar.encode(x)
    with ar.stage("s0"):
        a, b = ar.lincomb([v], [1.0]), ar.lincomb([v], [1.1])
        for _ in range(4):
            a, b = ar.square(a), ar.square(b)
        v = ar.mul(a, b)
    with ar.stage("s1"):
        v = ar.lincomb([v], [1.0])
    with ar.stage("s2"):
        parts = [ar.lincomb([v], [1.0 + 0.1 * j]) for j in range(3)]
        for _ in range(2):
            parts = [ar.square(p) for p in parts]
        return ar.mul(ar.mul(parts[0], parts[1]), parts[2])


def test_the_search_reaches_the_fewest_bootstraps_where_one_descent_stops_short():
    """Every entry-level choice enumerated (6 per stage) as the reference: the descent from just
    in time alone stops at 4 bootstraps, the search's other starts reach the true minimum, 3."""
    import itertools

    from fhe.ckks.placement import _descend

    x = np.linspace(0.5, 1.0, 4)
    run = lambda ar: three_stages(ar, x)  # noqa: E731
    stages = list(count_bootstraps(run, DEPTH, {}).counts)
    assert stages == ["s0", "s1", "s2"]

    def count(entry):
        return len(count_bootstraps(run, DEPTH, entry).bootstraps)

    fewest = min(
        count({s: k for s, k in zip(stages, choice, strict=True) if k is not None})
        for choice in itertools.product([None, *range(DEPTH)], repeat=len(stages))
    )
    assert fewest == 3 and count({}) == 5
    assert _descend(count, lambda e: True, stages, DEPTH, {})[0] == 4  # one start: stuck above
    assert count(search_entry_levels(run, DEPTH)) == fewest


def test_the_rebuild_form_is_chosen_when_it_saves_bootstraps_and_refused_beyond_the_ceiling():
    """search_placement runs the program in both forms (``ar.rebuild``); a stand-in program whose
    rebuild form bootstraps once where the plain form does twice. Its one bootstrap is of a value
    of ``size``: chosen at 2, refused at 50 (beyond the flat bound 16 and the plain form's 2)."""
    from fhe.ckks.placement import search_placement

    x = np.linspace(0.5, 1.0, 4)

    def program(size: float):
        def run(ar):
            with ar.stage("s"):
                v = ar.lincomb([ar.encode(x)], [1.0])
                if ar.rebuild:  # one chain: renewed once, at |v| <= size
                    v = ar.lincomb([v], [size])
                    for _ in range(5):
                        v = ar.mul(v, ar.encode(np.ones(4)))
                    return ar.square(v)
                a, b = ar.lincomb([v], [2.0]), ar.lincomb([v], [1.5])  # two, each renewed
                for _ in range(4):
                    a, b = ar.mul(a, ar.encode(np.ones(4))), ar.mul(b, ar.encode(np.ones(4)))
                return ar.mul(ar.square(a), ar.square(b))

        return run

    small, large = (
        search_placement(program(2.0), DEPTH, 16.0),
        search_placement(program(50.0), DEPTH, 16.0),
    )
    assert (small.rebuild, small.bootstraps) == (True, 1)
    assert (large.rebuild, large.bootstraps) == (False, 2)
    plain = count_bootstraps(program(50.0), DEPTH, {})
    assert max(plain.bootstrap_peaks) <= 2.0 and len(plain.bootstraps) == 2
