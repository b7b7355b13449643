"""TFHE backend: lowers the integer program (quant.ir.Graph) to a concrete-python circuit.

Every IR op maps to one numpy/concrete operation; every node runs inside ``fhe.tag(node.tag)`` so
Concrete attributes PBS counts and bit widths per layer and attention stage. Table lookups become
``fhe.univariate`` on the node's integer function (preceded by ``fhe.round_bit_pattern`` when the
node rounds), and every computed value carries an ``fhe.hint`` of the bit width calibration fixed
for it (Concrete would otherwise size it from its smaller inputset, and unseen values could wrap
around).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
from concrete import fhe

from fhe.artifacts import verify
from fhe.backends import register_backend
from fhe.errors import KeysMissingError, NotCompiledError
from fhe.schemes import Ranges, Scheme, TfheParams
from fhe.tfhe import restore_sigpipe
from fhe.tfhe.products import product
from fhe.tfhe.recipe import estimated_latency_s, stage_table
from quant.graph_io import load_graph, save_graph
from quant.ir import FREE_OPS, Graph, OverflowPolicy, round_bit_pattern, rounded_bits
from quant.ops import op_spec
from quant.ranges import overflow_risks, widen_to_proven


def _rounded(node, x, src, exact: bool = True):
    """A lookup's input rounded by the node's ``rounding_bits``, with its width pinned.

    Concrete (2.11) re-sizes the result of ``round_bit_pattern`` from the rounded values it sees;
    when they fit one bit fewer than the input, the table is indexed as if the value had been
    shifted by the input's width and reads fn(2·round(x))
    (tests/fhe/test_tfhe.py::test_rounded_lookup_keeps_its_input_width). So the rounded value is
    hinted to the input's width, or one bit more when rounding up overflows it (an unsigned 8-bit
    252 rounded by 3 bits is 256: test_rounding_up_past_the_input_width_is_exact)."""
    r = node.attrs.get("rounding_bits", 0)
    if not r:
        return x
    exactness = fhe.Exactness.EXACT if exact else fhe.Exactness.APPROXIMATE
    rounded = fhe.round_bit_pattern(x, lsbs_to_remove=r, exactness=exactness)
    if src is None or src.lo is None:
        return rounded
    return fhe.hint(rounded, bit_width=max(src.bits, rounded_bits(src.lo, src.hi, r)))


def _lut(node, args, srcs, exact):
    src = srcs[0] if srcs else None
    if node.attrs.get("per_channel"):
        raise ValueError(
            f"{node.name}: per-channel lookups are not lowered to TFHE yet; quantize with "
            "per-tensor weights"
        )
    fn, r = node.attrs["fn"], node.attrs.get("rounding_bits", 0)
    if r and src is not None and src.lo is not None and r >= src.bits:
        # Concrete rounds only values wider than the bits removed; a narrower input is already as
        # cheap
        # as a lookup gets, so its rounding goes into the table instead (same values as the
        # interpreter)
        return fhe.univariate(lambda t: fn(round_bit_pattern(t, r)))(args[0])
    return fhe.univariate(fn)(_rounded(node, args[0], src, exact))


def _slice(
    node, args, srcs, exact
):  # Concrete does not index with Ellipsis: spell the leading axes out
    lead = (slice(None),) * (len(args[0].shape) - len(node.attrs["index"]))
    return args[0][(*lead, *node.attrs["index"])]


CLIENT_PROGRAM = "program"  # program.json + program.safetensors in the client artifact

# The TFHE lowering of every op whose spec (quant.ops) is not traceable as it stands: Concrete
# tracers carry no batch axes, lookups become fhe.univariate, encrypted products quarter squares
# (fhe/tfhe/products.py).
TFHE_LOWERINGS = {
    "lut": _lut,
    "mul": lambda node, args, srcs, exact: product(node.op, args, srcs),
    "matmul": lambda node, args, srcs, exact: product(node.op, args, srcs),
    "reshape": lambda node, args, srcs, exact: np.reshape(args[0], tuple(node.attrs["shape"])),
    "transpose": lambda node, args, srcs, exact: np.transpose(args[0], tuple(node.attrs["axes"])),
    "slice": _slice,
}


def _lower_node(node, args, srcs=(), exact: bool = True):
    """``srcs``: the graph nodes of ``args`` (their calibrated widths)."""
    spec = op_spec(node.op)
    if spec.traceable:
        return spec.evaluate(node.attrs, args)
    if node.op not in TFHE_LOWERINGS:
        raise NotImplementedError(
            f"no TFHE lowering registered for op {node.op!r} (node {node.name!r})"
        )
    return TFHE_LOWERINGS[node.op](node, args, srcs, exact)


def to_concrete_function(graph: Graph, exact_rounding: bool = True):
    """A python function of one encrypted argument ``x`` that Concrete can trace.

    ``exact_rounding=False`` lowers every rounding with Concrete's approximate rounding: no PBS to
    clear the rounded-away bits, and lookups on far smaller parameter sets, at the price of reading
    the neighbouring table entry for inputs close to a rounding boundary (the clear program no
    longer predicts every encrypted value exactly; ``fhe compare`` measures the effect)."""

    def circuit(x):
        env = {}
        for node in graph.nodes.values():
            if node.op == "input":
                env[node.name] = x
                continue
            args = [env[i] for i in node.inputs]
            with fhe.tag(node.tag) if node.tag else contextlib.nullcontext():
                srcs = tuple(graph.nodes[i] for i in node.inputs)
                value = _lower_node(node, args, srcs, exact_rounding)
                if node.bits is not None and node.op not in FREE_OPS:
                    # the width calibration fixed (inputsets may be smaller than calibration sets)
                    value = fhe.hint(value, bit_width=node.bits)
            env[node.name] = value
        return env[graph.output_name]

    return circuit


def _main_params(circuit) -> dict:
    """The bootstrap/keyswitch parameters that carry the most PBS (Table 2's columns)."""
    pbs = circuit.programmable_bootstrap_count_per_parameter
    if not pbs:
        return {}
    bsk = max(pbs, key=lambda p: (pbs[p], p.polynomial_size()))
    ksk_counts = circuit.key_switch_count_per_parameter
    ksk = max(ksk_counts, key=lambda p: ksk_counts[p]) if ksk_counts else None
    return {
        "lwe_dimension": bsk.input_lwe_dimension(),
        "glwe_dimension": bsk.glwe_dimension(),
        "polynomial_size": bsk.polynomial_size(),
        "pbs_base_log": bsk.base_log(),
        "pbs_level": bsk.level(),
        "ks_base_log": None if ksk is None else ksk.base_log(),
        "ks_level": None if ksk is None else ksk.level(),
    }


def _all_params(circuit) -> list[dict]:
    return [
        {
            "lwe_dimension": p.input_lwe_dimension(),
            "glwe_dimension": p.glwe_dimension(),
            "polynomial_size": p.polynomial_size(),
            "pbs_base_log": p.base_log(),
            "pbs_level": p.level(),
            "pbs": int(n),
        }
        for p, n in circuit.programmable_bootstrap_count_per_parameter.items()
    ]


@register_backend(TfheParams)
class TfheBackend:
    """One compiled TFHE circuit of an integer program, with the harness vocabulary."""

    scheme = Scheme.TFHE

    def __init__(
        self, graph: Graph, circuit, params: TfheParams, compile_s: float, meta: dict
    ) -> None:
        self.graph = graph
        self.circuit = circuit
        self.params = params
        self.meta = meta
        self.timings_s: dict[str, float] = {"compile": compile_s}

    # ------------------------------------------------------------------------------ compile
    @classmethod
    def compile(
        cls,
        graph: Graph,
        calib_ints: np.ndarray,
        params: TfheParams,
        meta: dict | None = None,
        simulate_only: bool = False,
        input_range: tuple[int, int] | None = None,
    ) -> TfheBackend:
        """Compiles ``graph`` with an inputset drawn from the calibration integers.

        ``input_range``: the integers the client can send (default: the input's calibrated range).
        With ``params.ranges == "proven"`` every node's width is first widened to hold every value
        those inputs can produce (the graph is changed in place, so the clear program stays the
        circuit's reference)."""
        inp = graph.nodes.get(graph.input_name or "")
        if graph.output_name is None or inp is None or inp.lo is None or inp.hi is None:
            raise NotCompiledError(
                "the integer program is not calibrated; build it with quant.export.export first"
            )
        input_range = input_range or (inp.lo, inp.hi)
        meta = dict(meta or {})
        meta["ranges"] = params.ranges
        if params.ranges is Ranges.PROVEN:
            meta["widened_nodes"] = widen_to_proven(graph, *input_range)
        else:
            meta["overflow_risks"] = overflow_risks(graph, *input_range)
        graph.check_fits()
        rounds = any(n.op == "lut" and n.attrs.get("rounding_bits") for n in graph.nodes.values())
        # Concrete sizes round_bit_pattern from the inputset, not from hints: with rounding, a
        # smaller
        # inputset than the calibration set gave wrong results here, so the whole set is used.
        size = len(calib_ints) if rounds else params.inputset_size
        inputset = [np.asarray(s, dtype=np.int64) for s in calib_ints[:size]]
        config = fhe.Configuration(
            show_progress=False,
            p_error=params.p_error,
            global_p_error=params.global_p_error,
            dataflow_parallelize=params.dataflow_parallelize,
            loop_parallelize=params.loop_parallelize,
            compress_evaluation_keys=params.compress_keys,
            fhe_simulation=True,
            fhe_execution=not simulate_only,
            detect_overflow_in_simulation=False,
        )
        compiler = fhe.Compiler(
            to_concrete_function(graph, params.exact_rounding), {"x": "encrypted"}
        )
        start = time.perf_counter()
        circuit = compiler.compile(inputset, config)
        meta.setdefault("input_shape", list(graph.input_shape))
        return cls(graph, circuit, params, time.perf_counter() - start, meta)

    # ------------------------------------------------------------------------- harness verbs
    def _timed(self, key: str, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        self.timings_s[key] = time.perf_counter() - start
        return out

    @property
    def has_keys(self) -> bool:
        return bool(self.circuit.keys.are_generated)

    def keygen(self, force: bool = False) -> None:
        self._timed("keygen", lambda: self.circuit.keygen(force=force))
        self.meta.pop("evaluation_keys_bytes", None)

    def serialized_key_bytes(self) -> int | None:
        """What the client stores and uploads (seeded when ``params.compress_keys``; the server
        expands them): measured once, when first asked after keygen, so keygen itself only makes
        keys."""
        if not self.circuit.keys.are_generated:
            return None
        if "evaluation_keys_bytes" not in self.meta:
            self.meta["evaluation_keys_bytes"] = len(
                self.circuit.client.evaluation_keys.serialize()
            )
        return self.meta["evaluation_keys_bytes"]

    def encrypt(self, x_int: np.ndarray):
        self._require_keys()
        return self._timed("encrypt", self.circuit.encrypt, np.asarray(x_int, dtype=np.int64))

    def run(self, ct):
        out = self._timed("run", self.circuit.run, ct)
        restore_sigpipe()
        return out

    def decrypt(self, ct) -> np.ndarray:
        return np.asarray(self._timed("decrypt", self.circuit.decrypt, ct))

    def encrypt_run_decrypt(self, x_int: np.ndarray) -> np.ndarray:
        return self.decrypt(self.run(self.encrypt(x_int)))

    def simulate(self, x_int: np.ndarray) -> np.ndarray:
        return np.asarray(
            self._timed("simulate", self.circuit.simulate, np.asarray(x_int, dtype=np.int64))
        )

    def _require_keys(self) -> None:
        if not self.circuit.keys.are_generated:
            raise KeysMissingError(
                "no keys yet: call keygen() (or `fhe compile` then `fhe run`) first"
            )

    # -------------------------------------------------------------------------------- report
    def report(self) -> dict:
        c = self.circuit
        uploaded = self.serialized_key_bytes()
        pbs_per_tag = {t: int(n) for t, n in c.programmable_bootstrap_count_per_tag.items()}
        tags = sorted({n.tag for n in self.graph.nodes.values() if n.tag})
        return {
            "scheme": self.scheme.value,
            "pbs_count": int(c.programmable_bootstrap_count),
            "pbs_per_tag": pbs_per_tag,
            "max_bit_width": int(c.graph.maximum_integer_bit_width()),
            "bit_width_per_tag": {
                t: int(c.graph.maximum_integer_bit_width(tag_filter=t)) for t in tags
            },
            "params": _main_params(c),
            "params_all": _all_params(c),
            "key_sizes_bytes": {
                "secret": int(c.size_of_secret_keys),
                "bootstrap": int(c.size_of_bootstrap_keys),
                "keyswitch": int(c.size_of_keyswitch_keys),
                "evaluation": int(c.size_of_bootstrap_keys + c.size_of_keyswitch_keys),
                **({"evaluation_serialized": uploaded} if uploaded is not None else {}),
            },
            "compressed_keys": self.params.compress_keys,
            "timings_s": {
                k: self.timings_s.get(k) for k in ("compile", "keygen", "encrypt", "run", "decrypt")
            },
            "seq_len": self.meta.get(
                "seq_len", self.graph.input_shape[0] if self.graph.input_shape else None
            ),
            "n_bits": self.params.n_bits,
            "p_error": float(c.p_error),
            "global_p_error": float(c.global_p_error),
            "complexity": float(c.complexity),
            "pbs_estimate_ir": self.graph.pbs_estimate(),
            "exact_rounding": self.params.exact_rounding,
            "ranges": self.params.ranges,
            "overflow_risks": self.meta.get("overflow_risks", []),
            "stages": stage_table(c, self.graph),
            "estimated_latency_s": estimated_latency_s(c),
        }

    # --------------------------------------------------------------------------- artifacts
    def save(self, directory: str | Path, include_secret_key: bool = False) -> dict[str, Path]:
        """Writes ``server/`` (circuit + evaluation keys only) and ``client/`` (specs, quantization
        and, only if ``include_secret_key``, the secret keys)."""
        directory = Path(directory)
        server, client = directory / "server", directory / "client"
        for d in (server, client):
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
        self.circuit.server.save(server / "server.zip")
        keys = (
            self.circuit.client.evaluation_keys.serialize()
            if self.circuit.keys.are_generated
            else None
        )
        if keys is not None:
            self.meta["evaluation_keys_bytes"] = len(keys)
            (server / "evaluation_keys.bin").write_bytes(keys)
        meta = json.dumps(self.meta, indent=2, default=_jsonable)
        (server / "meta.json").write_text(meta)
        self.circuit.client.save(client / "client.zip")
        (client / "meta.json").write_text(meta)
        save_graph(self.graph, client / CLIENT_PROGRAM)  # the client's overflow check
        if include_secret_key:
            self._require_keys()
            (client / "keys.bin").write_bytes(self.circuit.keys.serialize())
        return {"server": server, "client": client}


def _jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"cannot serialise {type(v).__name__}")


class TfheServer:
    """What the server holds: the compiled circuit and the client's evaluation keys. No secret
    key."""

    def __init__(self, directory: str | Path) -> None:
        directory = Path(directory)
        verify(directory, "server")
        missing = [f for f in ("server.zip", "evaluation_keys.bin") if not (directory / f).exists()]
        if missing:
            raise FileNotFoundError(
                f"server artifact {directory} lacks {missing}; run `fhe compile ... --out DIR` "
                "(keys are generated at compile time)"
            )
        self.server = fhe.Server.load(directory / "server.zip")
        self.evaluation_keys = fhe.EvaluationKeys.deserialize(
            (directory / "evaluation_keys.bin").read_bytes()
        )

    def run(self, serialized_ct: bytes) -> bytes:
        ct = fhe.Value.deserialize(serialized_ct)
        out = self.server.run(ct, evaluation_keys=self.evaluation_keys).serialize()
        restore_sigpipe()
        return out


class TfheClient:
    """What the data owner holds: client specs, quantization metadata and the secret keys."""

    def __init__(self, directory: str | Path) -> None:
        directory = Path(directory)
        verify(directory, "client")
        if not (directory / "keys.bin").exists():
            raise KeysMissingError(
                f"{directory} holds no secret keys (saved without include_secret_key)"
            )
        self.client = fhe.Client.load(directory / "client.zip")
        self.client.keys = fhe.Keys.deserialize((directory / "keys.bin").read_bytes())
        self.meta = json.loads((directory / "meta.json").read_text())
        program = directory / CLIENT_PROGRAM
        # artifacts of earlier versions carry no program: their inputs cannot be checked
        self.program = load_graph(program) if program.with_suffix(".json").exists() else None

    def overflowing(self, x_int: np.ndarray) -> dict[str, int] | None:
        """Nodes (and entry counts) that ``x_int`` pushes outside their calibrated widths, from
        the clear program this artifact carries (``None``: an artifact without one)."""
        if self.program is None:
            return None
        return self.program.run(np.asarray(x_int, dtype=np.int64), OverflowPolicy.CLIP)[1]

    def encrypt(self, x_int: np.ndarray) -> bytes:
        return self.client.encrypt(np.asarray(x_int, dtype=np.int64)).serialize()

    def decrypt(self, serialized: bytes) -> np.ndarray:
        return np.asarray(self.client.decrypt(fhe.Value.deserialize(serialized)))
