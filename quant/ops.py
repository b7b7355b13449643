"""The integer program's operations, one registered :class:`OpSpec` each.

A spec is the one place an op's meaning lives: its semantics on integer arrays (the interpreter,
``quant.ir``), how many programmable bootstraps it costs under TFHE (the estimate and the reports),
whether it is layout only, and whether its numpy spelling also runs on Concrete tracers (then the TFHE
lowering is the same function). Backends keep their own per-op lowering tables (the TFHE one in
``fhe/backends/tfhe.py``, the interval rules in ``quant/ranges.py``) keyed by these names, and a test
checks every spec has both. Adding an op: register a spec here, a lowering there, an interval rule.

Arrays carry any leading batch axes, so every axis argument is negative. :func:`ops_table` renders the
table below from the registry (``tests/quant/test_ops.py`` checks they agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Evaluate = Callable[[dict, list], object]


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
    pbs: Callable[[dict], int] | None = None  # programmable bootstraps of one node under TFHE (None: none)
    free: bool = False  # layout only: no arithmetic, no width of its own
    traceable: bool = False  # ``evaluate`` also runs on Concrete tracers (it is the TFHE lowering)

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
    return np.asarray(a["fn"](round_bit_pattern(args[0], a.get("rounding_bits", 0))), dtype=np.int64)


def _reshape(a: dict, args: list) -> np.ndarray:
    x = args[0]
    return x.reshape(x.shape[: x.ndim - len(a["from_shape"])] + tuple(a["shape"]))


def _transpose(a: dict, args: list) -> np.ndarray:
    lead = args[0].ndim - len(a["axes"])
    return np.transpose(args[0], tuple(range(lead)) + tuple(lead + i for i in a["axes"]))


for _spec in (
    OpSpec("linear", "x @ W + b (clear integer W, b)", "leveled (no PBS)",
           lambda a, args: args[0] @ a["weight"] + a["bias"], traceable=True),
    OpSpec("matmul_left", "W @ x along the sequence axis (clear W)", "leveled",
           lambda a, args: np.matmul(a["weight"], args[0]), traceable=True),
    OpSpec("add_const", "x + c (clear integer c, broadcast)", "leveled",
           lambda a, args: args[0] + a["value"], traceable=True),
    OpSpec("mul_const", "x * c (clear integer c)", "leveled", lambda a, args: args[0] * a["value"], traceable=True),
    OpSpec("add", "x + y (encrypted, same scale)", "leveled", lambda a, args: args[0] + args[1], traceable=True),
    OpSpec("sub", "x - y (encrypted, same scale)", "leveled", lambda a, args: args[0] - args[1], traceable=True),
    OpSpec("neg", "-x", "leveled", lambda a, args: -args[0], traceable=True),
    OpSpec("sum", "sum over `axis`", "leveled",
           lambda a, args: np.sum(args[0], axis=a["axis"], keepdims=a.get("keepdims", False)), traceable=True),
    OpSpec("lut", "fn(round(x)): univariate table lookup, input rounded by `rounding_bits` first",
           "1 PBS per element (+ the small PBS of exact rounding)", _lut,
           pbs=lambda a: _elements(a) * (2 if a.get("rounding_bits", 0) else 1)),
    OpSpec("mul", "x * y elementwise, both encrypted", "2 PBS per element (quarter squares)",
           lambda a, args: args[0] * args[1], pbs=lambda a: 2 * _elements(a)),
    OpSpec("matmul", "x @ y, both encrypted", "2 PBS per product (quarter squares)",
           lambda a, args: np.matmul(args[0], args[1]), pbs=lambda a: 2 * _elements(a) * a["inner"]),
    OpSpec("reshape", "reshape to `shape`", "free", _reshape, free=True),
    OpSpec("transpose", "permute axes", "free", _transpose, free=True),
    OpSpec("expand_dims", "insert an axis", "free", lambda a, args: np.expand_dims(args[0], a["axis"]),
           free=True, traceable=True),
    OpSpec("slice", "index with `index`", "free", lambda a, args: args[0][(Ellipsis, *a["index"])], free=True),
    OpSpec("concat", "concatenate along `axis`", "free",
           lambda a, args: np.concatenate(tuple(args), axis=a["axis"]), free=True, traceable=True),
):
    register_op(_spec)


def ops_table() -> str:
    """The registry as a Markdown table (op, semantics, TFHE cost)."""
    rows = ["| op | semantics | TFHE cost |", "|---|---|---|",
            "| input | the client's quantized integers | encryption |"]
    rows += [f"| {s.name} | {s.semantics} | {s.tfhe_cost} |" for s in OPS.values()]
    return "\n".join(rows)
