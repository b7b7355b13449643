"""The integer program: a small graph of integer operations, and its numpy interpreter.

Every value is an integer array; after calibration every node also carries its integer range and
signed bit width. The TFHE backend lowers this same graph to concrete-python; nothing here depends
on an FHE library. Shapes exclude the batch axis; the interpreter accepts any leading batch axes, so
all axis arguments are negative.

Ops (``Node.op``): registered specs in :mod:`quant.ops` (semantics, TFHE cost, layout or not), where
:func:`quant.ops.ops_table` renders them; the interpreter below reads them. A ``lut`` node may carry
``rounding_bits`` r: its input is first rounded to a multiple of 2^r (concrete's
``round_bit_pattern``, ties away from zero upwards), so the table lookup runs on fewer bits; the
interpreter applies exactly the same rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from quant.ops import OpSpec, free_ops, op_spec, round_bit_pattern  # noqa: F401 - round_bit_pattern is re-exported

LUT_BIT_LIMIT = 16  # concrete-python's table lookups take at most 16-bit inputs
FREE_OPS = free_ops()  # layout only: no arithmetic
# the program's one input: its attributes are declared like an op's (it has no semantics to
# evaluate)
INPUT_SPEC = OpSpec(
    "input",
    "the client's quantized integers",
    "encryption",
    lambda a, args: None,
    required=("shape",),
    optional=("dtype_bits", "signed"),
)


class OverflowPolicy(str, Enum):
    """What the interpreter does with a value outside the bit width fixed at calibration."""

    ERROR = "error"  # raise RangeOverflowError naming the node
    CLIP = "clip"  # saturate to the representable range and count the clipped entries


class RangeOverflowError(ValueError):
    pass


class BitWidthError(ValueError):
    pass


def signed_bits(lo: int, hi: int) -> int:
    """Bits of the smallest signed integer type holding [lo, hi] (concrete's convention)."""
    m = max(-int(lo), int(hi) + 1, 1)
    return int(np.ceil(np.log2(m))) + 1


def unsigned_bits(hi: int) -> int:
    return max(1, int(np.ceil(np.log2(int(hi) + 1))))


def value_bits(lo: int, hi: int) -> int:
    """Concrete's bit width for a value: unsigned if it never goes negative."""
    return unsigned_bits(hi) if lo >= 0 else signed_bits(lo, hi)


def rounded_bits(lo: int, hi: int, lsbs: int) -> int:
    """Width of the values in [lo, hi] once rounded by ``lsbs`` bits (rounding up can add a bit)."""
    return value_bits(
        int(round_bit_pattern(np.array(lo), lsbs)), int(round_bit_pattern(np.array(hi), lsbs))
    )


def lut_rounding(lo: int, hi: int, lut_bits: int) -> int:
    """The fewest LSBs to round away so that the values in [lo, hi], rounded, index a table of
    ``lut_bits`` bits: the input's width minus lut_bits, or one more when rounding up carries."""
    lsbs = max(0, value_bits(lo, hi) - lut_bits)
    while lsbs and rounded_bits(lo, hi, lsbs) - lsbs > lut_bits:
        lsbs += 1
    return lsbs


@dataclass
class Node:
    name: str
    op: str
    inputs: tuple[str, ...] = ()
    attrs: dict = field(default_factory=dict)
    tag: str = ""
    lo: int | None = None  # calibrated integer range
    hi: int | None = None

    @property
    def bits(self) -> int | None:
        return None if self.lo is None or self.hi is None else value_bits(self.lo, self.hi)

    def bit_range(self) -> tuple[int, int]:
        """The integers its calibrated width holds (unsigned when its range starts at 0)."""
        bits = self.bits
        assert bits is not None and self.lo is not None, f"{self.name} is not calibrated"
        return (0, 2**bits - 1) if self.lo >= 0 else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)

    @property
    def is_pbs(self) -> bool:
        return self.op != "input" and op_spec(self.op).bootstraps

    def lut_input_bits(self, graph: Graph) -> int | None:
        """Bit width of the table-lookup input after rounding (LUT nodes only)."""
        if self.op != "lut":
            return None
        src = graph.nodes[self.inputs[0]]
        if src.lo is None or src.hi is None:
            return None
        r = self.attrs.get("rounding_bits", 0)
        return max(rounded_bits(src.lo, src.hi, r) - r, 1)


class Graph:
    """An ordered integer program with one input and one output."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.input_name: str | None = None
        self.output_name: str | None = None
        self.input_shape: tuple[int, ...] = ()

    # --------------------------------------------------------------------------------- building
    def add(self, name: str, op: str, inputs: tuple[str, ...] = (), tag: str = "", **attrs) -> str:
        if name in self.nodes:
            raise ValueError(f"duplicate node name {name!r}")
        for i in inputs:
            if i not in self.nodes:
                raise ValueError(f"node {name!r} uses unknown input {i!r}")
        (INPUT_SPEC if op == "input" else op_spec(op)).check_attrs(name, attrs)
        self.nodes[name] = Node(name, op, tuple(inputs), attrs, tag)
        if op == "input":
            self.input_name = name
            self.input_shape = tuple(attrs["shape"])
        return name

    def set_output(self, name: str) -> None:
        self.output_name = name

    # ------------------------------------------------------------------------------- evaluation
    def run(
        self,
        x: np.ndarray,
        policy: OverflowPolicy = OverflowPolicy.ERROR,
        record: dict[str, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, dict[str, int]]:
        """Interprets the program on integer input ``x`` of shape (..., *input_shape).

        Once calibrated, a value outside its node's bit width is handled by ``policy``; returns the
        output and the number of clipped entries per node.
        """
        policy = OverflowPolicy(policy)  # accept the string values too
        env: dict[str, np.ndarray] = {}
        clipped: dict[str, int] = {}
        for node in self.nodes.values():
            args = [env[i] for i in node.inputs]
            out = _evaluate(node, args, x)
            if node.lo is not None:
                out = self._check(node, out, policy, clipped)
            env[node.name] = out
            if record is not None:
                record[node.name] = out
        assert self.output_name is not None, "the graph has no output"
        return env[self.output_name], clipped

    def run_accepted(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The program on each sample of ``x`` (its leading axis), saturating: (outputs, a mask of
        the samples that kept every value within its calibrated width). The others are the ones the
        client refuses: the clear run saturates a value the encrypted circuit would wrap around."""
        runs = [self.run(xi[None], OverflowPolicy.CLIP) for xi in np.asarray(x)]
        clear = np.concatenate([out for out, _ in runs])
        return clear, np.array([not clipped for _, clipped in runs], dtype=bool)

    @staticmethod
    def _check(
        node: Node, out: np.ndarray, policy: OverflowPolicy, clipped: dict[str, int]
    ) -> np.ndarray:
        lo, hi = node.bit_range()  # only calibrated nodes are checked
        bad = (out < lo) | (out > hi)
        n_bad = int(bad.sum())
        if not n_bad:
            return out
        if policy is OverflowPolicy.ERROR:
            raise RangeOverflowError(
                f"node {node.name!r} ({node.op}, tag {node.tag!r}) produced {n_bad} value(s) "
                f"outside its calibrated {node.bits}-bit range [{lo}, {hi}] (seen [{out.min()}, "
                f"{out.max()}]); under encryption they would wrap around. Calibrate on more "
                "representative data, or use policy 'clip'."
            )
        clipped[node.name] = clipped.get(node.name, 0) + n_bad
        return np.clip(out, lo, hi)

    def calibrate(self, x: np.ndarray, batch_size: int = 64) -> None:
        """Sets every node's integer range from a run on calibration inputs ``x`` (in batches, so
        memory stays bounded by one batch of the largest intermediate).

        A requantising lookup's range is widened to its quantizer's full output range, so values
        that calibration did not show but the quantizer can produce never count as overflow."""
        for node in self.nodes.values():
            node.lo = node.hi = None
        lo: dict[str, int] = {}
        hi: dict[str, int] = {}
        for i in range(0, len(x), batch_size):
            record: dict[str, np.ndarray] = {}
            self.run(x[i : i + batch_size], record=record)
            for name, val in record.items():
                lo[name] = min(lo.get(name, int(val.min())), int(val.min()))
                hi[name] = max(hi.get(name, int(val.max())), int(val.max()))
        for name, node in self.nodes.items():
            if "out_range" in node.attrs:
                out_lo, out_hi = node.attrs["out_range"]
                lo[name], hi[name] = min(lo[name], out_lo), max(hi[name], out_hi)
            node.lo, node.hi = lo[name], hi[name]

    def run_batched(
        self, x: np.ndarray, policy: OverflowPolicy = OverflowPolicy.ERROR, batch_size: int = 128
    ) -> tuple[np.ndarray, dict[str, int]]:
        """:meth:`run` over batches of the leading axis, with clipped counts summed."""
        outs, clipped = [], {}  # type: list[np.ndarray], dict[str, int]
        for i in range(0, len(x), batch_size):
            out, c = self.run(x[i : i + batch_size], policy)
            outs.append(out)
            for k, v in c.items():
                clipped[k] = clipped.get(k, 0) + v
        return np.concatenate(outs), clipped

    # ---------------------------------------------------------------------------------- reports
    def max_bit_width(self) -> int:
        return max(n.bits for n in self.nodes.values() if n.bits is not None)

    def max_lut_input_bits(self) -> int:
        return max((n.lut_input_bits(self) or 0) for n in self.nodes.values())

    def pbs_estimate(self) -> int:
        """Programmable bootstraps the program needs, from each op's spec (quant.ops): 1 per LUT
        element (2 when its input is rounded first: exact rounding costs one more), 2 per encrypted
        product."""
        return sum(op_spec(n.op).pbs_count(n.attrs) for n in self.nodes.values() if n.op != "input")

    def check_fits(self, limit: int = LUT_BIT_LIMIT) -> None:
        """Raises BitWidthError naming the first table lookup whose input exceeds ``limit`` bits."""
        for node in self.nodes.values():
            bits = node.lut_input_bits(self)
            if bits is not None and bits > limit:
                src = self.nodes[node.inputs[0]]
                raise BitWidthError(
                    f"table lookup {node.name!r} (tag {node.tag!r}) reads {bits}-bit input from "
                    f"{src.name!r} (range [{src.lo}, {src.hi}]), above TFHE's {limit}-bit limit. "
                    "Use fewer bits (--n-bits), or round before the lookup (--rounding-bits "
                    f"{bits - limit} or more)."
                )


def _evaluate(node: Node, args: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    if node.op == "input":
        return np.asarray(x, dtype=np.int64)
    return np.asarray(op_spec(node.op).evaluate(node.attrs, args))
