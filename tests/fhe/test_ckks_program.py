"""The CKKS polynomial program in the clear: approximations against the exact functions, the folded
affine program against the float model, level bookkeeping, the parameter planner, clear errors."""

import math

import numpy as np
import pytest
import torch
from ckks_models import tiny
from scipy.special import erf

from fhe.ckks import (
    ApproxConfig,
    ClearArith,
    DepthExceededError,
    PolynomialError,
    Val,
    build_program,
)
from fhe.ckks import approx as A
from fhe.ckks.packed import PackedProgram
from fhe.ckks.planner import DepthError, max_depth, plan_parameters
from fhe.ckks.program import PolyProgram, float_inference_form


# ------------------------------------------------------------------------------ approximations
def test_goldschmidt_meets_its_error_bound_and_the_closed_form():
    lo, hi, tol = 0.05, 1.95, 1e-3
    n = A.goldschmidt_iterations(lo, hi, tol, 20)
    assert (
        A.goldschmidt_scale(1.0, 3.0) == 2.0 and A.goldschmidt_scale(0.1, 3.0, headroom=1.5) == 2.0
    )
    a = np.linspace(lo, hi, 1001)
    y = A.goldschmidt_reciprocal(ClearArith(), Val(a), n).data
    assert np.max(np.abs(a * y - 1)) <= tol
    np.testing.assert_allclose(a * y, 1 - (1 - a) ** (2 ** (n + 1)), rtol=1e-12)  # 1 − e₀^(2ⁿ⁺¹)
    assert (
        np.max(np.abs(a * A.goldschmidt_reciprocal(ClearArith(), Val(a), n - 1).data - 1)) > tol
    )  # n is minimal


def test_goldschmidt_with_rebuild_renews_one_value_per_cut_and_keeps_the_closed_form():
    """With ``rebuild``, where a bootstrapping engine would renew y and e together, y alone is
    renewed and e is rebuilt as 1 − a·y: the same closed form (exact arithmetic) and fewer
    bootstraps than the plain iteration (written out here with the same bookkeeping: at its cut
    y and 1 + e, then e again), for one level more at the end."""
    a_np = np.linspace(0.1, 1.9, 64)
    n, depth = 8, 5

    def plain(ar, a):  # the iteration without the rebuild: both values renewed just in time
        e = ar.add_scalar(ar.neg(a), 1.0)
        y = ar.add_scalar(e, 1.0)
        for _ in range(n):
            e = ar.square(e)
            y = ar.mul(y, ar.add_scalar(e, 1.0))
        return y

    ours = ClearArith(max_depth=depth, bootstrap=True, rebuild=True)
    theirs, unasked = (ClearArith(max_depth=depth, bootstrap=True) for _ in range(2))
    y = A.goldschmidt_reciprocal(ours, ours.encode(a_np), n)
    y_plain = plain(theirs, theirs.encode(a_np))
    A.goldschmidt_reciprocal(unasked, unasked.encode(a_np), n)  # without rebuild: the plain form
    assert unasked.bootstraps == theirs.bootstraps
    np.testing.assert_allclose(a_np * y.data, 1 - (1 - a_np) ** (2 ** (n + 1)), atol=1e-12)
    assert (len(ours.bootstraps), len(theirs.bootstraps)) == (1, 3)
    assert y.level == y_plain.level + 1
    shallow = ClearArith(max_depth=None, rebuild=True)  # no bootstraps (TenSEAL): plain, always
    assert A.goldschmidt_reciprocal(shallow, shallow.encode(a_np), n).level == n + 1
    ref = ClearArith()
    plain(ref, ref.encode(a_np))
    assert shallow.summary()["op_counts"] == ref.summary()["op_counts"]


def test_goldschmidt_rejects_bad_intervals():
    with pytest.raises(A.ApproximationError, match="positive interval"):
        A.goldschmidt_iterations(0.0, 1.0, 1e-2, 20)
    with pytest.raises(A.ApproximationError, match="range-loss"):
        A.goldschmidt_iterations(1e-9, 1.9, 1e-6, 5)
    with pytest.raises(A.ApproximationError, match="does not converge"):
        A.goldschmidt_iterations(1e-9, 2.5, 1e-2, 20)


def test_newton_inverse_sqrt_meets_tolerance():
    lo, hi = 0.02, 1.0
    guess, steps = A.invsqrt_plan(lo, hi, 1e-3, 20)
    z = np.random.uniform(lo, hi, 500)
    y = A.newton_invsqrt(ClearArith(), Val(z), guess, steps).data
    assert np.max(np.abs(y * np.sqrt(z) - 1)) <= 1e-3


def test_minimax_steps_beat_newton_and_cost_two_levels_each():
    """Newton's fixed (1.5, 0.5) from the same guess, computed naively, as the reference."""
    lo, hi, tol = 0.008, 1.0, 1e-2
    guess, steps = A.invsqrt_plan(lo, hi, tol, 20)
    z = np.geomspace(lo, hi, 1000)
    y, newton = guess[0] + guess[1] * z, 0
    while np.max(np.abs(y * np.sqrt(z) - 1)) > tol:
        y, newton = y * (3 - z * y**2) / 2, newton + 1
    assert len(steps) < newton  # 3 minimax steps against 5 Newton ones on this interval
    ar = ClearArith()
    out = A.newton_invsqrt(ar, Val(z), guess, steps)
    assert np.max(np.abs(out.data * np.sqrt(z) - 1)) <= tol
    assert out.level == 1 + 2 * len(steps)  # the first guess, then two levels per step
    newton_steps = A.newton_invsqrt(ClearArith(), Val(z), guess, [(1.5, 0.5)] * newton).data
    np.testing.assert_allclose(newton_steps, y)  # (1.5, 0.5) is Newton's iteration
    with pytest.raises(A.ApproximationError, match="Newton iterations"):
        A.invsqrt_plan(1e-6, 1.0, 1e-3, 2)


def test_invsqrt_polynomial_is_the_lowest_degree_within_the_tolerance():
    """The LP's polynomial against 1/√z computed directly on a grid 25x finer than the LP's."""
    z = np.geomspace(0.228, 1.0, 50001)  # the 2-block recipe model's widened variance interval
    for tol, degree in ((1e-2, 3), (3e-2, 2)):
        coeffs, error = A.invsqrt_poly(0.228, 1.0, tol)
        relative = np.abs(np.polynomial.polynomial.polyval(z, coeffs) * np.sqrt(z) - 1)
        assert len(coeffs) - 1 == degree and relative.max() <= tol
        assert relative.max() == pytest.approx(error, rel=1e-3)
    assert A.invsqrt_poly(0.02, 1.0, 1e-2) is None  # a 50x interval: Newton's steps instead


def test_layernorm_approximations_fold_their_weights_into_the_variance_map():
    """With z known as c·z + b at z's level (a map folds c into its weights), the cubic's
    d·p(z) sits 2 levels above z and Newton's iterate 2 per step (the guess costs none), against
    d·p(z) and the Newton iteration computed directly."""
    rng = np.random.default_rng(0)
    d, z0 = rng.normal(size=64), rng.uniform(0.3, 1.0, 64)

    def z(c: float, b: float) -> Val:  # as PackedProgram.layernorm's variance maps give it
        return Val(c * z0 + b, 3)

    coeffs, _ = A.invsqrt_poly(0.228, 1.0, 1e-2)
    out = PackedProgram.scaled_invsqrt(ClearArith(), Val(d, 1), z, coeffs)
    np.testing.assert_allclose(out.data, d * np.polynomial.polynomial.polyval(z0, coeffs))
    assert out.level == 3 + 2
    guess, steps = A.invsqrt_plan(0.02, 1.0, 1e-2, 20)
    y = A.newton_invsqrt_affine(ClearArith(), z, guess, steps)
    naive = guess[0] + guess[1] * z0
    for a, b in steps:
        naive = a * naive - b * z0 * naive**3
    np.testing.assert_allclose(y.data, naive)
    assert y.level == 3 + 2 * len(steps)
    assert A.newton_invsqrt(ClearArith(), Val(z0, 3), guess, steps).level == 3 + 1 + 2 * len(steps)


def test_gelu_fit_follows_eq10_and_is_close_to_erf_gelu():
    fit = A.gelu_fit(-4.0, 5.0, 1e-2, 31)
    x = np.linspace(-4, 5, 777)
    t = (x - fit.mid) / fit.half
    got = A.gelu_eval(ClearArith(), Val(t), fit).data
    assert np.max(np.abs(got - x / (1 + np.exp(-1.702 * x)))) <= 1e-2  # Eq. 10, computed naively
    assert (
        np.max(np.abs(got - 0.5 * x * (1 + erf(x / math.sqrt(2))))) <= 0.03
    )  # Eq. 10 vs exact GELU
    with pytest.raises(A.ApproximationError, match="degree"):
        A.gelu_fit(-4.0, 5.0, 1e-2, 3)


def test_quad_is_exact_and_its_square_form_saves_the_weighted_sum():
    fit = A.quad_fit(-3.0, 5.0, 1e-2, 31)
    x = np.linspace(-3, 5, 101)
    t = (x - fit.mid) / fit.half
    naive = 0.125 * x**2 + 0.25 * x + 0.5  # MPCFormer's quad, computed directly
    np.testing.assert_allclose(np.polynomial.polynomial.polyval(t, fit.coeffs), naive, atol=1e-12)
    sq = A.SquareForm.of(fit.coeffs)
    ar = ClearArith()
    out = ar.square(Val(t + sq.shift))
    np.testing.assert_allclose(sq.scale * out.data + sq.offset, naive, atol=1e-12)
    assert out.level == 1 and A.poly_eval(ClearArith(), Val(t), fit.coeffs).level == 2
    assert (
        A.SquareForm.of((1.0, 2.0, 0.0)) is None and A.SquareForm.of((1.0, 2.0, 3.0, 4.0)) is None
    )


def test_poly_eval_value_and_depth():
    coeffs = (0.5, -1.0, 0.25, 0.0, 2.0, 0.0, 0.0, 0.0, -0.125)
    t = np.linspace(-1, 1, 101)
    ar = ClearArith()
    out = A.poly_eval(ar, Val(t), coeffs)
    np.testing.assert_allclose(out.data, np.polynomial.polynomial.polyval(t, coeffs), atol=1e-12)
    assert out.level == math.ceil(math.log2(8 + 1))  # the weights ride on the lowest powers
    assert A.power_even(ClearArith(), Val(t), 4).level == 2


def test_poly_eval_takes_log2_of_degree_plus_one_levels_for_every_degree():
    """⌈log₂(deg + 1)⌉ levels, the clear weights included (GELU's degree 9-10: 4 levels, where
    summing cₖ·tᵏ after the powers takes 5), against numpy's polyval on random coefficients."""
    rng = np.random.default_rng(0)
    t = np.linspace(-1, 1, 101)
    for deg in range(1, 17):
        coeffs = tuple(rng.normal(size=deg + 1))
        out = A.poly_eval(ClearArith(), Val(t), coeffs)
        np.testing.assert_allclose(
            out.data, np.polynomial.polynomial.polyval(t, coeffs), atol=1e-12
        )
        assert out.level == math.ceil(math.log2(deg + 1)), deg
    sparse = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0)  # 3t⁹, trailing zeros
    out = A.poly_eval(ClearArith(), Val(t), sparse)
    np.testing.assert_allclose(out.data, 3 * t**9, atol=1e-12)
    assert out.level == 4


# ------------------------------------------------------------------------------ levels
def test_levels_and_refresh_rule():
    ar = ClearArith(max_depth=2)
    x = Val(np.ones(3))
    y = ar.lincomb([x, x], [0.5, 0.25], 1.0)
    assert y.level == 1 and np.allclose(y.data, 1.75)
    z = ar.square(y)
    assert z.level == 2
    with pytest.raises(DepthExceededError, match="refresh"):
        ar.mul(z, y)
    ar = ClearArith(max_depth=2, refresh=True)
    z = Val(np.full(3, 2.0), 2)
    w = ar.mul(z, z)
    assert (
        w.level == 1
        and np.allclose(w.data, 4.0)
        and ar.summary()["op_counts"]["client_refresh"] == 1
    )


# ------------------------------------------------------------------------------ planner
def test_planner_depths_match_the_128_bit_table():
    assert [max_depth(n, 40) for n in (8192, 16384, 32768)] == [2, 7, 19]
    plan = plan_parameters(5)
    assert plan.poly_modulus_degree == 16384 and plan.coeff_mod_bit_sizes == (
        60,
        40,
        40,
        40,
        40,
        40,
        60,
    )
    assert plan_parameters(19).poly_modulus_degree == 32768
    with pytest.raises(DepthError, match=r"depth 25.*attn 20.*--refresh"):
        plan_parameters(25, depth_per_tag={"attn": 20, "head": 25})
    refreshed = plan_parameters(25, refresh=True)
    assert refreshed.refresh and refreshed.depth == 7 and refreshed.poly_modulus_degree == 16384


# ------------------------------------------------------------------------------ the program
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"power_form": "stable"},
        {"norm": "layernorm"},
        {"ffn_activation": "relu", "n_layers": 2},
        {"attention": "activator", "ffn_activation": "relu"},
        {"attention": "geglu-only", "norm": "layernorm"},
        {"ffn_activation": "quad"},
        {"attention": "inhibitor", "tie_qk": True},  # K = Q: k_proj.* names q_proj's weights
    ],
)
def test_exact_program_equals_the_float_inference_form(overrides):
    """With exact non-linear functions (calibration mode) the folded affine program is the model."""
    model = tiny(**overrides)
    x = torch.randn(16, 4, 3, dtype=torch.float64)
    program = PolyProgram(
        model.config, {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    )
    got = program.clear(x.numpy())
    np.testing.assert_allclose(got, float_inference_form(model, x), atol=1e-9)


def test_a_quad_model_is_computed_exactly_one_level_per_activation():
    """quad has no approximation error: the polynomial program is the float model up to the
    attention's division (Goldschmidt to 1e-9 here), and its FFN stage costs two levels (the map to
    t, one squaring), fewer than a fitted ReLU."""
    calib = torch.randn(200, 4, 3, dtype=torch.float64)
    depths = {}
    for act in ("quad", "relu"):
        model = tiny(ffn_activation=act)
        program = build_program(
            model, calib, ApproxConfig(activation_tol=0.05, reciprocal_tol=1e-9)
        )
        ar = ClearArith()
        got = program.clear(calib[:50].numpy(), ar)
        if act == "quad":
            np.testing.assert_allclose(got, float_inference_form(model, calib[:50]), atol=1e-7)
        levels = ar.summary()["level_after_tag"]
        tags = list(levels)
        ffn = next(t for t in tags if t.endswith(f"ffn.{act}"))
        depths[act] = levels[ffn] - levels[tags[tags.index(ffn) - 1]]
    assert depths["quad"] == 2 < depths["relu"]


def test_polynomial_program_tracks_the_float_model():
    model = tiny(norm="layernorm")
    calib, test = (
        torch.randn(400, 4, 3, dtype=torch.float64),
        torch.randn(200, 4, 3, dtype=torch.float64),
    )
    program = build_program(
        model, calib, ApproxConfig(reciprocal_tol=1e-3, activation_tol=1e-3, invsqrt_tol=1e-3)
    )
    assert {op["kind"] for op in program.ops.values()} == {"reciprocal", "gelu", "invsqrt"}
    ar = ClearArith()
    got = program.clear(test.numpy(), ar)
    ref = float_inference_form(model, test)
    assert np.mean((got - ref) ** 2) < 1e-4
    assert sum(ar.outside.values()) <= 0.01 * len(
        test
    )  # held-out values stay inside the widened intervals
    ar = ClearArith()
    with np.errstate(
        all="ignore"
    ):  # polynomials far outside their interval overflow, as they should
        program.clear(10 * test.numpy(), ar)
    assert sum(ar.outside.values()) > 0  # and inputs far outside calibration are counted
    with (
        pytest.raises(PolynomialError, match=r"outside the interval calibration covered.*--calib"),
        np.errstate(all="ignore"),
    ):
        program.clear(10 * test.numpy(), ClearArith(strict=True))


@pytest.mark.parametrize(
    "kind,tol",
    [("dot-product", 0.01), ("dct", 0.01), ("inhibitor", 0.15), ("signed-inhibitor", 0.15)],
)
def test_every_attention_kind_has_a_polynomial_program_close_to_the_float_model(kind, tol):
    """exp + Goldschmidt for softmax (and DCT-Former's clear sequence maps), |x| and ReLU
    polynomials for the Inhibitor: the clear polynomial program against the float model on inputs
    like the calibration's."""
    model = tiny(attention=kind)
    calib, test = (
        torch.randn(400, 4, 3, dtype=torch.float64),
        torch.randn(100, 4, 3, dtype=torch.float64),
    )
    program = build_program(model, calib, ApproxConfig(activation_tol=0.02))
    with torch.no_grad():
        want = model(test).numpy()
    got = program.clear(test.numpy())
    assert np.max(np.abs(got - want)) < tol * max(1.0, np.abs(want).max())
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.9
    kinds = {op["kind"] for op in program.ops.values()}
    assert kinds >= (
        {"exp", "reciprocal"} if kind in ("dot-product", "dct") else {"abs", "inhibit"}
    )


def test_dct_ideal_form_is_refused():
    from fhe.errors import FheError

    with pytest.raises(FheError, match="evaluation only"):
        build_program(tiny(attention="dct", dct_ideal=True), torch.randn(8, 4, 3))


def test_token_inputs_fail_clearly():
    with pytest.raises(PolynomialError, match="embedding lookup"):
        build_program(tiny(input_kind="tokens", in_features=20), torch.randint(0, 20, (8, 4)))


# ------------------------------------------------------------------------------ softmax kernels
def test_softmax_kernels_against_exact_functions():
    from fhe.ckks.softmax import SoftmaxKernel, exact_power_softmax, exact_softmax

    rng = np.random.default_rng(1)
    rows = rng.normal(0, 1.0, (3000, 16))
    test = rng.normal(0, 1.0, (100, 16))
    depths, products = {}, {}
    for kind, ref, tol in (
        ("power", exact_power_softmax(test, 4, 0.05), 1e-2),
        ("taylor", exact_softmax(test), 1e-2),
        ("square", exact_softmax(test), 0.1),
    ):
        kernel = SoftmaxKernel(kind, 16).calibrate(rows)
        ar = ClearArith()
        got = kernel.clear(test, ar)
        assert np.max(np.abs(got - ref)) <= tol * ref.max(), (
            kind
        )  # Goldschmidt's relative tolerance
        depths[kind] = ar.summary()["depth"]
        products[kind] = ar.summary()["op_counts"]["ct_ct_mul"]
    assert depths["power"] <= depths["taylor"] < depths["square"]
    assert products["power"] < min(products["square"], products["taylor"])


def test_hinge_range_loss_is_eq9_beyond_the_threshold():
    from models.attention import functional as AF

    scores = torch.tensor(
        [[[[0.5, -2.0], [1.0, 0.1]]], [[[0.3, 0.2], [-0.4, 0.1]]]]
    )  # per-example max 2.0, 0.4
    assert AF.power_softmax_range(scores).item() == pytest.approx((2.0 + 0.4) / 2)
    assert AF.power_softmax_range(scores, threshold=1.0).item() == pytest.approx((1.0 + 0.0) / 2)


def test_inputs_of_the_wrong_shape_fail_clearly():
    program = build_program(tiny(), torch.randn(50, 4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"4 positions × 3 features = 12 input values.*got 15"):
        program.clear(np.zeros((2, 5, 3)))


def test_program_files_round_trip_without_pickle(tmp_path):
    from fhe.ckks.serialize import load_program, save_program

    model = tiny(norm="layernorm")
    program = build_program(model, torch.randn(200, 4, 3, dtype=torch.float64))
    paths = save_program(program, tmp_path)
    assert {p.name for p in paths} == {"program.json", "program.npz"}
    again = load_program(tmp_path)
    x = torch.randn(20, 4, 3, dtype=torch.float64).numpy()
    np.testing.assert_array_equal(again.clear(x), program.clear(x))
    (tmp_path / "program.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not a CKKS program"):
        load_program(tmp_path)


def levels_above_z(op: dict) -> int:
    """The levels a packed LayerNorm takes from its variance z to its output: d·p(z) with the
    cubic 2, else the guess at z's level, 2 per Newton step and the product with d."""
    return 2 if "poly" in op else 2 * op["iterations"] + 1


def test_the_norm_range_loss_narrows_the_variance_intervals_and_cuts_newton_steps():
    """Trained with the norm range loss (κ = 2), a LayerNorm model's calibrated variance intervals
    (max/min) are all narrower than any of the same training's without it, so its encrypted 1/√
    takes fewer levels (issue 28's 2-block model: 2-3 Newton steps per norm to a cubic)."""
    from fhe import api

    def trained(weight: float) -> tuple[list[float], int]:
        request = api.TrainRequest(
            task="digits",
            **dict(d_model=8, heads=1, layers=1, epochs=4, limit=512),
            **dict(attention="power-softmax", power_form="length-agnostic", power_eps=0.05),
            **dict(norm="layernorm", ffn_activation="gelu"),
            **dict(norm_range_loss=weight, norm_range_ratio=2.0),
        )
        outcome = api.train_model(request, progress=False)
        program = build_program(outcome.model.double().eval(), outcome.data.x_train[:256].double())
        norms = [op for op in program.ops.values() if op["kind"] == "invsqrt"]
        ratios = [hi / lo for lo, hi in (op["calibrated"] for op in norms)]
        return ratios, sum(levels_above_z(op) for op in norms)

    (plain, plain_steps), (ranged, ranged_steps) = trained(0.0), trained(1.0)
    assert len(plain) == len(ranged) == 3  # two norms in the block, the final one
    assert max(ranged) < min(plain)
    assert ranged_steps < plain_steps
