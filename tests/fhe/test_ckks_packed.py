"""The packed CKKS layout: layouts and BSGS maps against dense numpy, the clear packed program
against the batch program (the same function through rotations and masks), the plan, and real SEAL
runs."""

import json
import weakref

import numpy as np
import pytest
import tenseal as ts
import torch
from ckks_models import secret_key_windows, tiny
from hypothesis import given, settings
from hypothesis import strategies as st

from fhe.ckks import ApproxConfig, ClearArith, PolynomialError, build_program
from fhe.ckks import approx as A
from fhe.ckks.backend_packed import PackedClient, PackedServer
from fhe.ckks.mixers import PACKED_LOWERINGS
from fhe.ckks.packed import PackedProgram, min_slots
from fhe.ckks.packing import Layout, Rotations, apply_maps, linear_map, rotate_and_sum
from fhe.errors import FheError
from fhe.harness import compile_model
from fhe.schemes import CkksParams
from models.config import AttentionKind

LOOSE = ApproxConfig(reciprocal_tol=0.05, activation_tol=0.05)


# ------------------------------------------------------------------------------ layouts and maps
@settings(max_examples=40, deadline=None)
@given(
    t=st.integers(1, 6),
    cin=st.integers(1, 5),
    cout=st.integers(1, 7),
    stride_extra=st.integers(0, 1),
    seed=st.integers(0, 2**16),
)
def test_linear_map_equals_the_dense_matrix(t, cin, cout, stride_extra, seed):
    rng = np.random.default_rng(seed)
    stride = max(8, 1 << max(cin, cout).bit_length()) << stride_extra
    src, dst = Layout(t, cin, stride), Layout(t, cout, stride)
    m = rng.normal(size=(dst.size, src.size)) * (rng.random((dst.size, src.size)) < 0.6)
    x = rng.normal(size=src.size)
    n_slots = 4 * max(src.period, dst.period)
    ar = ClearArith()
    out = apply_maps(
        ar,
        [(ar.encode(src.place(x, n_slots)), linear_map(m, src, dst, n_slots))],
        dst.place(np.ones(dst.size), n_slots),
        Rotations(ar),
        n_slots,
    )
    np.testing.assert_allclose(dst.read(out.data), m @ x + 1, atol=1e-12)
    np.testing.assert_allclose(
        out.data, dst.place(m @ x + 1, n_slots), atol=1e-12
    )  # replicated, zero padding
    assert out.level == 1  # one level whatever the number of diagonals


def test_position_wise_maps_need_few_diagonals_and_rotations():
    w = np.random.default_rng(0).normal(size=(16, 8))
    src, dst = Layout(8, 8, 32), Layout(8, 16, 32)
    lm = linear_map(np.kron(np.eye(8), w), src, dst, 1024)
    assert lm.n_diagonals <= 8 + 16 - 1  # c − o only: not T'·stride
    ar = ClearArith()
    apply_maps(ar, [(ar.encode(src.place(np.ones(src.size), 1024)), lm)], None, Rotations(ar), 1024)
    assert ar.summary()["op_counts"]["rotation"] <= 2 * int(np.ceil(np.sqrt(lm.n_diagonals))) + 2


def test_rotate_and_sum_both_directions():
    ar = ClearArith()
    x = ar.encode(np.arange(16.0))
    fwd = rotate_and_sum(ar, x, 1, 4).data
    assert fwd[0] == 0 + 1 + 2 + 3 and fwd[13] == 13 + 14 + 15 + 0
    back = rotate_and_sum(ar, x, -1, 4, 16).data
    assert back[3] == 0 + 1 + 2 + 3 and back[0] == 0 + 15 + 14 + 13
    with pytest.raises(ValueError, match="power-of-two"):
        rotate_and_sum(ar, x, 1, 3)


def test_rotations_are_made_once_and_held_while_their_input_lives():
    """Rotations: each copy made once and shared; a dropped input takes its copies with it (an
    engine's server frees their ciphertexts), step 0 included (it is the input itself)."""
    ar = ClearArith()
    rot = Rotations(ar)
    x = ar.encode(np.arange(16.0))
    copies = [weakref.ref(rot.of(x, step)) for step in (0, 1, 2)]
    assert copies[0]() is x and rot.of(x, 1) is copies[1]()
    np.testing.assert_array_equal(copies[2]().data, np.roll(np.arange(16.0), -2))
    assert ar.summary()["op_counts"]["rotation"] == 2
    del x
    assert all(ref() is None for ref in copies)
    y = ar.encode(np.ones(16))
    rot.of(y, 1)  # a new input, wherever it lives: its own copies
    assert ar.summary()["op_counts"]["rotation"] == 3


def test_layout_round_trip_and_bad_layouts():
    lay = Layout(3, 5)
    assert (lay.stride, lay.period) == (8, 32)
    v = np.arange(15.0)
    slots = lay.place(v, 128)
    np.testing.assert_array_equal(lay.read(slots), v)
    assert slots[5:8].tolist() == [0, 0, 0] and np.array_equal(slots[:32], slots[32:64])
    with pytest.raises(ValueError, match="invalid layout"):
        Layout(3, 5, stride=4)
    with pytest.raises(ValueError, match="invalid layout"):
        Layout(3, 5, 8, 32, offset=16)


# ------------------------------------------------------------------------------ the packed program
CASES = {
    "power-softmax": dict(),
    "odd-T-and-widths": dict(
        seq_len=5, in_features=3, d_model=6, n_heads=2
    ),  # padding, 3-wide heads
    "T'=16, 4 heads": dict(seq_len=9, d_model=8, n_heads=4),
    "two-layers": dict(n_layers=2, seq_len=6, d_model=8),
    "dot-product": dict(attention="dot-product"),
    "dot-product, T=5 (padding keys)": dict(attention="dot-product", seq_len=5),
    "dct": dict(attention="dct", seq_len=6),
    "layernorm": dict(norm="layernorm", seq_len=5),
    "activator, layernorm": dict(attention="activator", norm="layernorm"),
    "geglu-only": dict(attention="geglu-only"),
    "activator": dict(attention="activator", seq_len=3),
    "quad FFN (square form)": dict(ffn_activation="quad"),
}


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_packed_clear_program_equals_the_batch_program(overrides):
    model = tiny(**overrides)
    cfg = model.config
    x = np.random.default_rng(1).normal(size=(40, cfg.seq_len, cfg.in_features))
    program = build_program(model, x)
    packed = PackedProgram(program, 4096)
    np.testing.assert_allclose(packed.clear(x[:6]), program.clear(x[:6]), atol=1e-9)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # an overflow is a failure, not NaN == NaN
@pytest.mark.parametrize("approximation", ["cubic", "newton"])
def test_packed_layernorm_equals_the_batch_program_with_either_approximation(approximation):
    """A LayerNorm model's packed program (1/√ folded into the variance maps) against the batch
    program, with a cubic (least squares on the norm's interval) and with Newton's steps; the
    cubic's packed norm takes 5 levels from its input (centring, square, variance maps, d·p(z) in
    two)."""
    # weights whose norm variances a cubic follows within 14% (at d = 4 they spread too far; with
    # other seeds an error of 20% can push Goldschmidt's input out of its interval)
    torch.manual_seed(7)
    model = tiny(norm="layernorm", seq_len=5, d_model=16)
    x = np.random.default_rng(1).normal(size=(40, 5, model.config.in_features))
    program = build_program(model, x)
    for name, op in program.ops.items():
        if op["kind"] != "invsqrt":
            continue
        op = {k: v for k, v in op.items() if k not in ("poly", "degree", "guess", "steps")}
        if approximation == "cubic":  # least relative error on the interval
            z = np.geomspace(*op["interval"], 512)
            rows = np.vander(z, 4, increasing=True) * np.sqrt(z)[:, None]
            op["poly"] = tuple(np.linalg.lstsq(rows, np.ones_like(z), rcond=None)[0])
        else:
            op["guess"], op["steps"] = A.invsqrt_plan(*op["interval"], 1e-3, 20)
        program.ops[name] = op
    norms = [op for op in program.ops.values() if op["kind"] == "invsqrt"]
    assert all(("poly" in op) == (approximation == "cubic") for op in norms) and norms
    packed = PackedProgram(program, 4096)
    want = program.clear(x[:6])
    assert np.isfinite(want).all() and np.abs(want).max() < 1e3
    np.testing.assert_allclose(packed.clear(x[:6]), want, atol=1e-9)
    ar = ClearArith()
    packed.clear(x[:1], ar)
    if approximation == "cubic":
        assert ar.level_out["block0.norm1"] == 5


class LiveCopies(ClearArith):
    """A clear run that counts, as the head begins, the rotated copies still alive (what an
    engine's server would still hold)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[weakref.ref] = []
        self.alive_at_head: int | None = None

    def _rotate(self, a, step):
        if self.tag == "head" and self.alive_at_head is None:
            self.alive_at_head = sum(ref() is not None for ref in self.copies)
        out = super()._rotate(a, step)
        self.copies.append(weakref.ref(out))
        return out


def test_a_compacted_residual_stream_computes_the_same_and_holds_less():
    """PackedProgram.compact: the residual stream made one ciphertext at each block's first norm.
    The same outputs as the lazy stream and the batch program, one level per compacted block on
    one chain (blocks 1 and 2 here), fewer products in the last norm, and fewer rotated copies
    alive at the end; a model without a norm is left as it was."""
    torch.manual_seed(3)
    model = tiny(norm="layernorm", n_layers=3, seq_len=5, d_model=8)
    x = np.random.default_rng(1).normal(size=(40, 5, model.config.in_features))
    program = build_program(model, x)
    runs = {}
    for compact in (False, True):
        packed = PackedProgram(program, 4096, compact_residual=compact)
        np.testing.assert_allclose(packed.clear(x[:4]), program.clear(x[:4]), atol=1e-9)
        ar = LiveCopies()
        packed.clear(x[:1], ar)
        runs[compact] = ar
    lazy, compacted = runs[False], runs[True]
    assert compacted.summary()["depth"] == lazy.summary()["depth"] + 2
    # the final norm reads the last block's compacted stream and its two new terms, not all 7
    assert compacted.counts["final_norm"]["ct_pt_mul"] < lazy.counts["final_norm"]["ct_pt_mul"]
    assert compacted.alive_at_head is not None and lazy.alive_at_head is not None
    assert compacted.alive_at_head < lazy.alive_at_head
    # no norm: nothing compacted, the same operations
    plain = build_program(tiny(n_layers=2, seq_len=5), x)
    counts = []
    for compact in (False, True):
        ar = ClearArith()
        PackedProgram(plain, 4096, compact_residual=compact).clear(x[:1], ar)
        counts.append(ar.summary()["op_counts"])
    assert counts[0] == counts[1]


INHIBITOR_CASES = {
    "inhibitor": dict(attention="inhibitor"),
    "inhibitor, T=8, 2 heads of 4": dict(attention="inhibitor", seq_len=8, d_model=8),
    "signed-inhibitor, 4 heads": dict(attention="signed-inhibitor", d_model=8, n_heads=4),
}


@pytest.mark.parametrize("overrides", INHIBITOR_CASES.values(), ids=INHIBITOR_CASES.keys())
@pytest.mark.parametrize(
    "side_by_side", [True, False], ids=["offsets side by side", "offset by offset"]
)
def test_packed_inhibitor_equals_the_batch_program(overrides, side_by_side):
    """Eqs. 5-7 through rotations, masks and one head-sum map give the batch program's numbers."""
    model = tiny(**overrides)
    cfg = model.config
    x = np.random.default_rng(4).normal(size=(40, cfg.seq_len, cfg.in_features))
    program = build_program(model, x, LOOSE)
    packed = PackedProgram(
        program, 4096 if side_by_side else min_slots(program)
    )  # one block: no room
    assert packed.pack_attention == side_by_side
    np.testing.assert_allclose(packed.clear(x[:6]), program.clear(x[:6]), atol=1e-9)


def test_packed_attention_and_per_offset_attention_agree():
    """When the T' offsets do not fit the slots side by side, attention runs offset by offset."""
    program = build_program(tiny(), np.random.default_rng(2).normal(size=(40, 4, 3)))
    side_by_side, one_by_one = PackedProgram(program, 4096), PackedProgram(program, 32)
    assert side_by_side.pack_attention and not one_by_one.pack_attention
    x = np.random.default_rng(3).normal(size=(5, 4, 3))
    np.testing.assert_allclose(side_by_side.clear(x), one_by_one.clear(x), atol=1e-9)
    ar_a, ar_b = ClearArith(), ClearArith()
    side_by_side.forward(ar_a, ar_a.encode(side_by_side.encode_input(x[0])))
    one_by_one.forward(ar_b, ar_b.encode(one_by_one.encode_input(x[0])))
    assert ar_a.summary()["op_counts"]["ct_ct_mul"] < ar_b.summary()["op_counts"]["ct_ct_mul"]


def test_packed_refuses_what_it_does_not_lower(monkeypatch):
    x = np.random.default_rng(0).normal(size=(30, 4, 3))
    program = build_program(tiny(), x)
    monkeypatch.delitem(
        PACKED_LOWERINGS.entries, AttentionKind.POWER_SOFTMAX
    )  # a kind with no packed lowering
    with pytest.raises(
        PolynomialError,
        match="no lowering registered for power-softmax under CKKS in the packed layout .*use "
        "--layout batch",
    ):
        PackedProgram(program, 4096)
    monkeypatch.undo()
    x5 = np.random.default_rng(0).normal(size=(30, 5, 3))
    with pytest.raises(FheError, match="power-of-two sequence length"):
        PackedProgram(build_program(tiny(attention="inhibitor", seq_len=5), x5, LOOSE), 4096).clear(
            x5[:1]
        )
    with pytest.raises(ValueError, match="one sample of shape"):
        PackedProgram(program, 4096).encode_input(x[:2])
    with pytest.raises(FheError, match="refresh"):
        compile_model(tiny(), torch.from_numpy(x), CkksParams(layout="packed", refresh=True))


# ------------------------------------------------------------------------------ encrypted (SEAL)
@pytest.fixture(scope="module")
def packed_geglu():
    calib = torch.randn(300, 4, 3, dtype=torch.float64)
    cm = compile_model(
        tiny(attention="geglu-only"), calib, CkksParams(approx=LOOSE, layout="packed")
    )
    cm.keygen()
    return cm


def test_packed_encrypted_run_matches_the_clear_program(packed_geglu):
    cm = packed_geglu
    x = torch.randn(3, 4, 3, dtype=torch.float64).numpy()
    enc, clear = cm.encrypt_run_decrypt(x), cm.clear(x)
    assert enc.shape == clear.shape == (3, 3)
    assert np.max(np.abs(enc - clear)) < 1e-3 * max(1.0, np.abs(clear).max())
    rep = cm.report()
    assert rep["layout"] == "packed" and "one query" in rep["layout_reason"]
    assert rep["poly_modulus_degree"] == 16384 and rep["op_counts"]["rotation"] > 0
    assert rep["galois_keys_count"] == len(rep["rotation_steps"]) > 0
    assert rep["key_sizes_bytes"]["galois_keys"] > 0
    # the planner's counts are the encrypted run's counts
    assert cm.backend.last_run["op_counts"] == rep["op_counts"]
    assert cm.backend.last_run["depth"] == rep["depth"]


def test_packed_artifacts_run_and_hold_no_secret_key(packed_geglu, tmp_path):
    cm = packed_geglu
    paths = cm.save(tmp_path, include_secret_key=True)
    assert not (
        paths["client"] / "program.npz"
    ).exists()  # the client gets layouts, not the weights
    server = PackedServer(paths["server"])
    assert server.context.is_public() and not server.context.has_secret_key()
    secret = secret_key_windows(cm.backend.client_ctx)
    assert len(secret) > 10
    server_bytes = b"".join(p.read_bytes() for p in paths["server"].iterdir())
    assert all(w in (paths["client"] / "context.secret").read_bytes() for w in secret)
    assert not any(w in server_bytes for w in secret)
    client = PackedClient(paths["client"])
    x = torch.randn(2, 4, 3, dtype=torch.float64).numpy()
    out = client.decrypt(server.run(client.encrypt(x)))
    np.testing.assert_allclose(out, cm.clear(x), atol=1e-3)
    assert isinstance(
        ts.context_from((paths["server"] / "context.public").read_bytes()), ts.Context
    )


def test_galois_key_memory_formula_bounds_the_saved_keys(packed_geglu, tmp_path):
    rep = packed_geglu.report()
    saved = packed_geglu.save(tmp_path, include_secret_key=False)["server"] / "galois.keys"
    on_disk = saved.stat().st_size  # SEAL's compressed serialisation
    assert (
        0.5 * rep["key_sizes_bytes"]["galois_keys"]
        < on_disk
        <= 1.01 * rep["key_sizes_bytes"]["galois_keys"]
    )


def test_cli_compiles_and_runs_a_packed_model(tmp_path):
    from click.testing import CliRunner

    from fhe_cli import main

    model = tmp_path / "g.pt"
    res = CliRunner().invoke(
        main,
        [
            "train",
            "--task",
            "digits",
            "--attention",
            "geglu-only",
            "--norm",
            "none",
            "--d-model",
            "4",
            "--epochs",
            "1",
            "--quiet",
            "-o",
            str(model),
        ],
    )
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(
        main,
        [
            "compile",
            str(model),
            "--scheme",
            "ckks",  # --layout auto: one query, so packed
            "--calib",
            "500",
            "--activation-tol",
            "0.05",
            "--json",
            str(tmp_path / "r.json"),
            "--out",
            str(tmp_path / "art"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "packed layout; auto: one query" in res.output and "rotation steps" in res.output
    reason = json.loads((tmp_path / "r.json").read_text())["layout_reason"]
    assert reason.startswith("auto: one query")
    err = float(res.output.split("max |error|")[1].split()[0])
    assert err < 1e-2
    res = CliRunner().invoke(main, ["run", str(tmp_path / "art"), "--sample", "3"])
    assert res.exit_code == 0, res.output
    assert "encrypted prediction" in res.output


def test_the_shallow_recipe_trains_and_plans_one_query_at_n_16384(tmp_path):
    """fhe train with x², quad and ε = 1, then fhe compile --scheme ckks: the packed layout (auto)
    at depth 10 fits N = 16384 with 45-bit outer primes and a 34-bit scale."""
    from click.testing import CliRunner

    from fhe_cli import main

    model = tmp_path / "q.pt"
    train = [
        "train",
        "--task",
        "digits",
        "--attention",
        "power-softmax",
        "--norm",
        "none",
        "--ffn-activation",
        "quad",
        "--power-p",
        "2",
        "--power-form",
        "length-agnostic",
        "--power-eps",
        "1.0",
        "--d-model",
        "8",
        "--heads",
        "2",
        "--epochs",
        "2",
        "--range-loss",
        "0.1",
        "--range-threshold",
        "1.0",
        "--quiet",
        "-o",
    ]
    res = CliRunner().invoke(main, [*train, str(model)])
    assert res.exit_code == 0, res.output
    args = "--scheme ckks --no-run --outer-bits 45 --scale-bits 34 --reciprocal-tol 5e-2"
    res = CliRunner().invoke(
        main, ["compile", str(model), *args.split(), "--json", str(tmp_path / "r.json")]
    )
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["layout"] == "packed" and rep["poly_modulus_degree"] == 16384
    assert rep["coeff_mod_bit_sizes"][0] == 45 and rep["scale_bits"] == 34
    assert (
        rep["depth_per_tag"]["block0.ffn.quad"] - rep["depth_per_tag"]["block0.attention.values"]
        == 2
    )
    assert rep["approximations"]["block0.ffn.quad"]["max_error"] == 0.0  # exact, nothing fitted


@pytest.mark.slow
def test_packed_inhibitor_runs_encrypted():
    """The Inhibitor packed, under SEAL: depth ~22 needs N = 32768 at 2^33 (~50 s keygen, ~25 s a
    query)."""
    calib = torch.randn(300, 4, 3, dtype=torch.float64)
    cm = compile_model(
        tiny(attention="inhibitor"), calib, CkksParams(approx=LOOSE, layout="packed", scale_bits=33)
    )
    cm.keygen()
    x = torch.randn(2, 4, 3, dtype=torch.float64).numpy()
    got = cm.backend.decrypt(cm.backend.run(cm.backend.encrypt(x)))
    clear = cm.backend.simulate_packed(x)
    assert np.max(np.abs(got - clear)) < 1e-2 * max(1.0, np.abs(clear).max())
