"""The integer program's operations, one registered :class:`OpSpec` each.

A spec is the one place an op's meaning lives: its semantics on integer arrays (the interpreter,
``quant.ir``), how many programmable bootstraps it costs under TFHE (the estimate and the reports),
whether it is layout only, and whether its numpy spelling also runs on Concrete tracers (then the
TFHE lowering is the same function). Backends keep their own per-op lowering tables (the TFHE one in
``fhe/tfhe/backend.py``, the interval rules in ``quant/ranges.py``) keyed by these names, and a
test checks every spec has both. Adding an op: register a spec here, a lowering there, an interval
rule.

Arrays carry any leading batch axes, so every axis argument is negative. :func:`ops_table` renders
the table below from the registry (``tests/quant/test_ops.py`` checks they agree).

Attributes are typed: each spec declares the attributes its nodes must carry and may carry, with
their types (:data:`ATTRIBUTE_TYPES`), and :meth:`OpSpec.check_attrs` refuses a node that lacks one,
carries an unknown one or one of the wrong type, when the graph is built (``Graph.add``), not when a
backend first reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Evaluate = Callable[[dict, list], object]

_INT = (int, np.integer)
_ARRAY_OR_INT = (np.ndarray, int, np.integer)
ATTRIBUTE_TYPES: dict[str, type | tuple[type, ...]] = {  # one meaning (and type) per attribute name
    "weight": np.ndarray,
    "bias": np.ndarray,
    "value": _ARRAY_OR_INT,  # clear integer operands
    "shape": tuple,
    "from_shape": tuple,
    "axes": tuple,
    "index": tuple,
    "out_range": tuple,
    "axis": _INT,
    "inner": _INT,
    "rounding_bits": _INT,
    "dtype_bits": _INT,
    "keepdims": bool,
    "per_channel": bool,
    "signed": bool,
    # a lookup's table, as a function of the integer input (abc.Callable works with isinstance)
    "fn": Callable,  # type: ignore[dict-item]
}


def _elements(attrs: dict) -> int:
    return int(np.prod(attrs["shape"]))


def round_bit_pattern(x: np.ndarray, lsbs: int) -> np.ndarray:
    """Round to the nearest multiple of 2^lsbs, ties upwards (concrete's ``round_bit_pattern``)."""
    if lsbs <= 0:
        return x
    step = 1 << lsbs
    return ((x + (step >> 1)) >> lsbs) << lsbs


@dataclass(frozen=True)
class OpSpec:
    name: str
    semantics: str  # for the docs
    tfhe_cost: str  # for the docs
    evaluate: Evaluate  # (attrs, input arrays) -> output array, with leading batch axes
    pbs: Callable[[dict], int] | None = (
        None  # programmable bootstraps of one node under TFHE (None: none)
    )
    free: bool = False  # layout only: no arithmetic, no width of its own
    traceable: bool = False  # ``evaluate`` also runs on Concrete tracers (it is the TFHE lowering)
    required: tuple[
        str, ...
    ] = ()  # attributes every node of this op carries (types: ATTRIBUTE_TYPES)
    optional: tuple[str, ...] = ()

    def check_attrs(self, node: str, attrs: dict) -> None:
        """Raises ValueError naming ``node`` if ``attrs`` lacks, adds or mistypes an attribute."""
        missing = [a for a in self.required if a not in attrs]
        unknown = [a for a in attrs if a not in self.required and a not in self.optional]
        problems = ([f"missing attribute(s) {missing}"] if missing else []) + (
            [f"unknown attribute(s) {unknown}"] if unknown else []
        )
        if problems:
            raise ValueError(f"node {node!r} ({self.name}): " + "; ".join(problems))
        for a, v in attrs.items():
            expected = ATTRIBUTE_TYPES[a]
            if not isinstance(v, expected):
                raise ValueError(
                    f"node {node!r} ({self.name}): attribute {a!r} is a {type(v).__name__}, "
                    f"expected {getattr(expected, '__name__', expected)}"
                )

    @property
    def bootstraps(self) -> bool:
        return self.pbs is not None

    def pbs_count(self, attrs: dict) -> int:
        return 0 if self.pbs is None else self.pbs(attrs)


OPS: dict[str, OpSpec] = {}


def register_op(spec: OpSpec) -> OpSpec:
    if spec.name in OPS:
        raise ValueError(f"op {spec.name!r} is already registered")
    OPS[spec.name] = spec
    return spec


def op_spec(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"no op {name!r} is registered (known: {', '.join(OPS)})") from None


def free_ops() -> tuple[str, ...]:
    return tuple(n for n, s in OPS.items() if s.free)


def _lut(a: dict, args: list) -> np.ndarray:
    return np.asarray(
        a["fn"](round_bit_pattern(args[0], a.get("rounding_bits", 0))), dtype=np.int64
    )


def _reshape(a: dict, args: list) -> np.ndarray:
    x = args[0]
    return x.reshape(x.shape[: x.ndim - len(a["from_shape"])] + tuple(a["shape"]))


def _transpose(a: dict, args: list) -> np.ndarray:
    lead = args[0].ndim - len(a["axes"])
    return np.transpose(args[0], tuple(range(lead)) + tuple(lead + i for i in a["axes"]))


for _spec in (
    OpSpec(
        "linear",
        "x @ W + b (clear integer W, b)",
        "leveled (no PBS)",
        lambda a, args: args[0] @ a["weight"] + a["bias"],
        traceable=True,
        required=("weight", "bias"),
    ),
    OpSpec(
        "matmul_left",
        "W @ x along the sequence axis (clear W)",
        "leveled",
        lambda a, args: np.matmul(a["weight"], args[0]),
        traceable=True,
        required=("weight",),
    ),
    OpSpec(
        "add_const",
        "x + c (clear integer c, broadcast)",
        "leveled",
        lambda a, args: args[0] + a["value"],
        traceable=True,
        required=("value",),
    ),
    OpSpec(
        "mul_const",
        "x * c (clear integer c)",
        "leveled",
        lambda a, args: args[0] * a["value"],
        traceable=True,
        required=("value",),
    ),
    OpSpec(
        "add",
        "x + y (encrypted, same scale)",
        "leveled",
        lambda a, args: args[0] + args[1],
        traceable=True,
    ),
    OpSpec(
        "sub",
        "x - y (encrypted, same scale)",
        "leveled",
        lambda a, args: args[0] - args[1],
        traceable=True,
    ),
    OpSpec("neg", "-x", "leveled", lambda a, args: -args[0], traceable=True),
    OpSpec(
        "sum",
        "sum over `axis`",
        "leveled",
        lambda a, args: np.sum(args[0], axis=a["axis"], keepdims=a.get("keepdims", False)),
        traceable=True,
        required=("axis",),
        optional=("keepdims",),
    ),
    OpSpec(
        "lut",
        "fn(round(x)): univariate table lookup, input rounded by `rounding_bits` first",
        "1 PBS per element (+ the small PBS of exact rounding)",
        _lut,
        pbs=lambda a: _elements(a) * (2 if a.get("rounding_bits", 0) else 1),
        required=("fn", "shape"),
        optional=("rounding_bits", "per_channel", "out_range"),
    ),
    OpSpec(
        "mul",
        "x * y elementwise, both encrypted",
        "2 PBS per element (quarter squares)",
        lambda a, args: args[0] * args[1],
        pbs=lambda a: 2 * _elements(a),
        required=("shape",),
    ),
    OpSpec(
        "matmul",
        "x @ y, both encrypted",
        "2 PBS per product (quarter squares)",
        lambda a, args: np.matmul(args[0], args[1]),
        pbs=lambda a: 2 * _elements(a) * a["inner"],
        required=("shape", "inner"),
    ),
    OpSpec(
        "reshape",
        "reshape to `shape`",
        "free",
        _reshape,
        free=True,
        required=("shape", "from_shape"),
    ),
    OpSpec("transpose", "permute axes", "free", _transpose, free=True, required=("axes",)),
    OpSpec(
        "expand_dims",
        "insert an axis",
        "free",
        lambda a, args: np.expand_dims(args[0], a["axis"]),
        free=True,
        traceable=True,
        required=("axis",),
    ),
    OpSpec(
        "slice",
        "index with `index`",
        "free",
        lambda a, args: args[0][(Ellipsis, *a["index"])],
        free=True,
        required=("index",),
    ),
    OpSpec(
        "concat",
        "concatenate along `axis`",
        "free",
        lambda a, args: np.concatenate(tuple(args), axis=a["axis"]),
        free=True,
        traceable=True,
        required=("axis",),
    ),
):
    register_op(_spec)


def ops_table() -> str:
    """The registry as a Markdown table (op, semantics, TFHE cost)."""
    rows = [
        "| op | semantics | TFHE cost |",
        "|---|---|---|",
        "| input | the client's quantized integers | encryption |",
    ]
    rows += [f"| {s.name} | {s.semantics} | {s.tfhe_cost} |" for s in OPS.values()]
    return "\n".join(rows)
