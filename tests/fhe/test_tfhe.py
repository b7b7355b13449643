"""TFHE backend: the Concrete circuit against the clear integer program (simulated and encrypted),
reports, and the client/server split."""

import re

import numpy as np
import pytest

from circuits.attention import CORES, CircuitSpec, build
from fhe.artifacts import atomic_save
from fhe.schemes import TfheParams
from fhe.tfhe.backend import TfheBackend, TfheClient, TfheServer
from fhe.tfhe.products import product_lookup_bits
from models.config import AttentionKind
from quant.config import QuantConfig
from quant.ir import Graph, value_bits
from quant.steps import split_step_lookups

REPORT_KEYS = {
    "scheme",
    "pbs_count",
    "pbs_per_tag",
    "max_bit_width",
    "bit_width_per_tag",
    "params",
    "key_sizes_bytes",
    "timings_s",
    "seq_len",
    "n_bits",
}
PARAM_KEYS = {
    "lwe_dimension",
    "glwe_dimension",
    "polynomial_size",
    "pbs_base_log",
    "pbs_level",
    "ks_base_log",
    "ks_level",
}


def compile_circuit(variant, T=2, n_bits=3, simulate_only=True, lut_bits=None):
    built = build(CircuitSpec(variant, T, d=2, n_bits=n_bits, lut_bits=lut_bits))
    params = TfheParams(quant=QuantConfig(n_bits=n_bits), inputset_size=64)
    backend = TfheBackend.compile(
        built.graph, built.calib_ints, params, meta={"seq_len": T}, simulate_only=simulate_only
    )
    return built, backend


@pytest.mark.parametrize("variant", CORES.kinds(), ids=lambda v: v.value)
def test_simulated_circuit_equals_clear_integer_program(variant):
    built, backend = compile_circuit(variant, lut_bits=5)
    xs = built.calib_ints[:8]
    clear, _ = built.graph.run(xs)
    sims = np.stack([backend.simulate(x) for x in xs])
    np.testing.assert_array_equal(sims, clear)
    rep = backend.report()
    assert rep.keys() >= REPORT_KEYS and rep["params"].keys() >= PARAM_KEYS
    assert rep["pbs_count"] > 0 and rep["seq_len"] == 2
    assert any(
        tag.endswith("scores") or tag.endswith("geglu") or tag.endswith("softmax")
        for tag in rep["pbs_per_tag"]
    )


def test_mixed_sign_products_are_exact():
    """Regression for concrete-python 2.11: unsigned × signed products came out wrong."""
    g = Graph()
    g.add("x", "input", shape=(2, 4))
    g.add("u", "lut", ("x",), fn=lambda t: np.abs(t) * 2, shape=(2, 4))  # unsigned
    g.add("mul", "mul", ("u", "x"), shape=(2, 4))
    g.add("ut", "transpose", ("u",), axes=(1, 0))
    g.add("mm", "matmul", ("x", "ut"), shape=(2, 2), inner=4)
    g.add("out", "add", ("mm", "mm"))
    g.set_output("out")
    rng = np.random.default_rng(0)
    xs = rng.integers(-15, 16, (40, 2, 4))
    g.calibrate(xs)
    backend = TfheBackend.compile(g, xs, TfheParams(inputset_size=40), simulate_only=True)
    for x in xs[:10]:
        np.testing.assert_array_equal(backend.simulate(x), g.run(x[None])[0][0])


def test_an_unsigned_by_signed_product_reads_one_bit_less_and_stays_exact():
    """Probabilities times V: u in [0, 15] by v in [-8, 7]. u ± v spans [-8, 23], 6 bits; with v
    shifted to [0, 15] (fhe/tfhe/products.py) the quarter-square lookups read 5, in Concrete's own
    circuit, and all 256 pairs, elementwise and in a 16x16 matmul, equal the clear products."""
    g = Graph()
    g.add("x", "input", shape=(256, 2))
    g.add("a", "slice", ("x",), index=(0,))
    g.add("v", "slice", ("x",), index=(1,))
    g.add("u", "lut", ("a",), fn=lambda t: t + 8, shape=(256,))  # unsigned [0, 15]
    g.add("mul", "mul", ("u", "v"), shape=(256,))
    g.add("u2", "reshape", ("u",), shape=(16, 16), from_shape=(256,))
    g.add("v2", "reshape", ("v",), shape=(16, 16), from_shape=(256,))
    g.add("mm", "matmul", ("u2", "v2"), shape=(16, 16), inner=16)
    g.add("mmf", "reshape", ("mm",), shape=(256,), from_shape=(16, 16))
    g.add("out", "concat", ("mul", "mmf"), axis=-1)
    g.set_output("out")
    vals = np.arange(-8, 8)
    x = np.stack([np.repeat(vals, 16), np.tile(vals, 16)], -1)  # every (u, v) pair once
    xs = np.stack([x, x[::-1], np.roll(x, 3, 0)])
    g.calibrate(xs)
    assert product_lookup_bits(g.nodes["u"], g.nodes["v"]) == 5
    assert value_bits(0 - 8, 15 + 7) == 6  # u ± v unshifted
    backend = TfheBackend.compile(g, xs, TfheParams(inputset_size=3), simulate_only=True)
    for xi in xs:
        np.testing.assert_array_equal(backend.simulate(xi), g.run(xi[None])[0][0])
    lookup_inputs = re.findall(
        r"apply_lookup_table\"\(%\w+, %\w+\) : \(tensor<[x\d]*!FHE\.e(s?int)<(\d+)>",
        backend.circuit.mlir,
    )
    assert lookup_inputs[0] == ("sint", "4")  # u's own lookup
    assert len(lookup_inputs) == 5 and all(int(w) == 5 for _, w in lookup_inputs[1:])


def _lookup_input_widths(mlir: str) -> list[int]:
    """The input width of every table lookup in Concrete's MLIR."""
    found = re.findall(
        r"apply_lookup_table\"\(%\w+, %\w+\) : \(tensor<[x\d]*!FHE\.e(?:s?int)<(\d+)>", mlir
    )
    return [int(w) for w in found]


def test_a_lookup_split_into_comparisons_reads_four_bits_and_stays_exact():
    """z = min(x // 3, 3) on a 6-bit x (the Inhibitor's z at 3-bit V: four levels): one 6-bit
    lookup, or three comparisons that each round x + c (quant/steps.py) and read 4 bits in
    Concrete's own circuit. Every 6-bit input, simulated, equals the table."""
    g = Graph()
    g.add("x", "input", shape=(64,))
    g.add("z", "lut", ("x",), fn=lambda t: np.minimum(t // 3, 3), shape=(64,))
    g.set_output("z")
    xs = np.stack([np.arange(64), np.arange(64)[::-1], np.roll(np.arange(64), 7)])
    g.calibrate(xs)
    whole = TfheBackend.compile(g, xs, TfheParams(inputset_size=3), simulate_only=True)
    assert _lookup_input_widths(whole.circuit.mlir) == [6]
    assert split_step_lookups(g, 4) == ["z"]
    split = TfheBackend.compile(g, xs, TfheParams(inputset_size=3), simulate_only=True)
    assert _lookup_input_widths(split.circuit.mlir) == [4, 4, 4]
    for xi in xs:
        np.testing.assert_array_equal(split.simulate(xi), np.minimum(xi // 3, 3))


def test_inhibitor_uses_about_half_the_pbs_of_dot_product():
    _, inh = compile_circuit(AttentionKind.INHIBITOR, T=4)
    _, dot = compile_circuit(AttentionKind.DOT_PRODUCT, T=4)
    assert inh.report()["pbs_count"] * 1.8 < dot.report()["pbs_count"]


@pytest.fixture(scope="module")
def keyed_inhibitor():
    built, backend = compile_circuit(AttentionKind.INHIBITOR, T=2, n_bits=3, simulate_only=False)
    backend.keygen()
    return built, backend


def test_encrypted_inhibitor_equals_clear_program(keyed_inhibitor):
    built, backend = keyed_inhibitor
    xs = built.calib_ints[:3]
    clear, _ = built.graph.run(xs)
    for x, want in zip(xs, clear, strict=True):
        np.testing.assert_array_equal(backend.encrypt_run_decrypt(x), want)
    timings = backend.report()["timings_s"]
    assert all(
        timings[k] is not None and timings[k] > 0
        for k in ("compile", "keygen", "encrypt", "run", "decrypt")
    )


def _secret_key_windows(backend) -> list[bytes]:
    keyset = backend.circuit.keys._keyset  # concrete's Keyset: the only handle on raw secret keys
    windows = []
    for sk in keyset.get_client_keys().get_secret_keys():
        raw = sk.serialize()
        mid = len(raw) // 2
        windows.append(raw[mid : mid + 256])
    return windows


def test_server_artifact_holds_no_secret_key_and_serves_the_client(keyed_inhibitor, tmp_path):
    built, backend = keyed_inhibitor
    paths = atomic_save(tmp_path / "public", backend.save, "tfhe")
    server_files = sorted(p.name for p in paths["server"].iterdir())
    assert server_files == ["evaluation_keys.bin", "manifest.json", "meta.json", "server.zip"]
    assert not (paths["client"] / "keys.bin").exists()  # secret keys only on explicit request
    windows = _secret_key_windows(backend)
    assert windows and all(len(w) == 256 for w in windows)
    for f in paths["server"].iterdir():
        blob = f.read_bytes()
        assert not any(w in blob for w in windows), f"secret key material found in {f.name}"
    # the same check can fail: the client artifact saved with its keys does contain them
    with_keys = atomic_save(
        tmp_path / "private", lambda d: backend.save(d, include_secret_key=True), "tfhe"
    )
    assert any(w in (with_keys["client"] / "keys.bin").read_bytes() for w in windows)
    # the client encrypts, the server computes with evaluation keys only, the client decrypts
    client, server = TfheClient(with_keys["client"]), TfheServer(paths["server"])
    x = built.calib_ints[5]
    want, _ = built.graph.run(x[None])
    np.testing.assert_array_equal(client.decrypt(server.run(client.encrypt(x))), want[0])


def test_rounded_lookup_keeps_its_input_width():
    """Regression (issue 13): a 9-bit input rounded by 2 bits whose rounded range fits 8 bits made
    Concrete 2.11 evaluate the table at twice the rounded input (x = 75 gave fn(152) instead of
    fn(76))."""
    g = Graph()
    g.add("x", "input", shape=(1,))
    g.add(
        "a", "add_const", ("x",), value=np.int64(0)
    )  # a computed value: the lowering hints its width
    g.add(
        "y",
        "lut",
        ("a",),
        fn=lambda t: np.clip(np.round(t / 50), 0, 7).astype(np.int64),
        shape=(1,),
        rounding_bits=2,
    )
    g.set_output("y")
    xs = np.arange(0, 240).reshape(-1, 1)
    g.calibrate(xs)
    g.nodes["a"].lo, g.nodes["a"].hi = (
        0,
        300,
    )  # a 9-bit input whose calibration set fits 8 bits once rounded
    backend = TfheBackend.compile(g, xs, TfheParams(inputset_size=240), simulate_only=True)
    sims = np.stack([backend.simulate(x) for x in xs])
    np.testing.assert_array_equal(sims, g.run(xs)[0])
    assert int(backend.simulate(np.array([75]))[0]) == 2


def test_rounding_up_past_the_input_width_is_exact():
    """Regression: an unsigned 8-bit input up to 252 rounded by 3 bits reaches 256 (9 bits); pinning
    the rounded value to the input's 8 bits wrapped it to 0 (a softmax denominator's reciprocal,
    issue 9)."""
    g = Graph()
    g.add("x", "input", shape=(1,))
    g.add("a", "add_const", ("x",), value=np.int64(0))
    g.add(
        "y",
        "lut",
        ("a",),
        fn=lambda t: (4096 // np.maximum(t, 1)).astype(np.int64),
        shape=(1,),
        rounding_bits=3,
    )
    g.set_output("y")
    xs = np.arange(63, 253).reshape(-1, 1)
    g.calibrate(xs)
    backend = TfheBackend.compile(g, xs, TfheParams(inputset_size=len(xs)), simulate_only=True)
    np.testing.assert_array_equal(np.stack([backend.simulate(x) for x in xs]), g.run(xs)[0])


def test_first_divergence_names_the_miscompiled_lookup(monkeypatch):
    """With the rounding fix removed (the unhinted lowering of issue 13), the bisection over program
    prefixes names the rounded lookup that Concrete miscompiles, not the nodes before or after
    it."""
    import concrete.fhe as cfhe

    import fhe.tfhe.backend as tfhe_backend
    from fhe.tfhe.divergence import first_divergence

    def unfixed(node, x, src, exact=True):
        return cfhe.round_bit_pattern(x, lsbs_to_remove=node.attrs["rounding_bits"])

    g = Graph()
    g.add("x", "input", shape=(1,))
    g.add("a", "add_const", ("x",), value=np.int64(0))
    g.add(
        "y",
        "lut",
        ("a",),
        fn=lambda t: np.clip(np.round(t / 50), 0, 7).astype(np.int64),
        shape=(1,),
        rounding_bits=2,
    )
    g.add("z", "add_const", ("y",), value=np.int64(3))
    g.set_output("z")
    xs = np.arange(0, 240).reshape(-1, 1)
    g.calibrate(xs)
    g.nodes["a"].lo, g.nodes["a"].hi = 0, 300
    params = TfheParams(inputset_size=240)
    assert (
        first_divergence(g, np.array([75]), xs, params) is None
    )  # the fixed lowering: nothing diverges
    monkeypatch.setattr(tfhe_backend, "_rounded", unfixed)
    found = first_divergence(g, np.array([75]), xs, params)
    assert found is not None and found.node == "y" and found.max_abs_diff == 1


_SIGPIPE_SCRIPT = """
import socket
import numpy as np
from fhe.schemes import TfheParams
from fhe.tfhe.backend import TfheBackend
from quant.ir import Graph

g = Graph()
g.add("x", "input", shape=(2,))
g.add("y", "lut", ("x",), fn=lambda t: t // 2, shape=(2,))
g.set_output("y")
calib = np.arange(16).reshape(8, 2) % 8
g.calibrate(calib)
backend = TfheBackend.compile(g, calib, TfheParams(inputset_size=8), meta={}, input_range=(0, 7))
backend.keygen()
print(backend.encrypt_run_decrypt(np.array([3, 5])).tolist())
a, b = socket.socketpair()
b.close()
try:
    a.send(b"x")
except BrokenPipeError:
    print("BrokenPipeError")
"""


def test_a_closed_socket_after_an_encrypted_run_raises_instead_of_aborting():
    """Concrete's runtime (HPX) installs a SIGPIPE handler that aborts the process; after a run the
    backend puts back Python's disposition, so a write to a closed socket raises BrokenPipeError (a
    client that hangs up, `fhe compare ... | head`) instead of killing the process."""
    import subprocess
    import sys
    from pathlib import Path

    res = subprocess.run(
        [sys.executable, "-c", _SIGPIPE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["[1,", "2]", "BrokenPipeError"]
