"""Single-head attention circuits per sequence length: the Inhibitor paper's TFHE study (Tables
2-4).

Each circuit takes one encrypted integer tensor (T, 3d) holding Q | K | V at ``n_bits`` bits (values
in [-1, 1] on a uniform grid) and returns the attention output H (T, d). They are built with the
same lowering code as whole models (quant.export), so what is measured here is what models compile
to.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from models.attention import functional as AF
from models.config import AttentionKind
from models.registry import KindRegistry
from quant.config import QuantConfig
from quant.ir import Graph
from quant.lowering import Lowering, QValue
from quant.mixers.dct import lower_dct
from quant.mixers.geglu import lower_geglu
from quant.mixers.inhibitor import lower_inhibitor
from quant.mixers.softmax import exp_scores, lower_normalized, power_scores
from quant.quantizer import Quantizer

_ALIASES = {"geglu": AttentionKind.GEGLU_ONLY}  # the name `fhe report --variants` used first


def attention_kind(name: str | AttentionKind) -> AttentionKind:
    """The kind a circuit name means (``geglu`` is ``geglu-only``)."""
    if isinstance(name, AttentionKind):
        return name
    return _ALIASES[name] if name in _ALIASES else AttentionKind(name)


@dataclass(frozen=True)
class CircuitSpec:
    """One attention circuit: the kind (a registered core, :data:`CORES`), T, d and widths."""

    variant: AttentionKind
    seq_len: int
    d: int = 2
    n_bits: int = 6
    lut_bits: int | None = None  # round lookup inputs down to this width (None: exact widths)
    alpha: float = 0.5  # Inhibitor shift (the paper's setting)
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "variant", attention_kind(self.variant))
        if self.seq_len < 1 or self.d < 1:
            raise ValueError(f"seq_len and d must be >= 1, got {self.seq_len}, {self.d}")
        if not 2 <= self.n_bits <= 12:
            raise ValueError(f"n_bits must be in [2, 12], got {self.n_bits}")

    @property
    def name(self) -> str:
        return f"{self.variant.value}-T{self.seq_len}-d{self.d}-b{self.n_bits}"


@dataclass
class BuiltCircuit:
    spec: CircuitSpec
    graph: Graph
    calib_ints: np.ndarray  # (N, T, 3d) inputset
    output_scale: float | np.ndarray
    reference: Callable[[np.ndarray], np.ndarray]  # float attention of the dequantized input


class _InhibitorParams:
    def __init__(self, d: int, alpha: float, signed: bool) -> None:
        self.gamma, self.alpha, self.signed = math.sqrt(d), alpha, signed
        self.tie_qk = False  # the circuits take Q and K as separate inputs


class _DctParams:
    def __init__(self, n_bar: int) -> None:
        self.n_bar = n_bar


# ---------------------------------------------------------------------------------------- the cores
Lower = Callable[
    [Lowering, CircuitSpec, QValue, QValue, QValue, Quantizer], QValue
]  # (q, k, v) -> H
Reference = Callable[[CircuitSpec, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Core:
    """One variant's attention: its integer program (the whole-model lowering code) and its float
    equation."""

    lower: Lower
    reference: Reference


CORES: KindRegistry[Core] = KindRegistry("attention circuit")
register_core = CORES.register


def core(variant: AttentionKind) -> Core:
    registered = ", ".join(v.value for v in CORES.kinds())
    return CORES.require(variant, ValueError, "the attention circuits", f"registered: {registered}")


def _inhibitor_lower(low, spec, q, k, v, grid):
    params = _InhibitorParams(spec.d, spec.alpha, spec.variant is AttentionKind.SIGNED_INHIBITOR)
    return lower_inhibitor(low, params, q, k, v, grid, "c.attn")


def _inhibitor_reference(spec, q, k, v):
    return AF.inhibitor(
        q, k, v, math.sqrt(spec.d), spec.alpha, spec.variant is AttentionKind.SIGNED_INHIBITOR
    )


def _power_reference(spec, q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(spec.d)
    return AF.power_softmax(s, 4, 1e-3, length_agnostic=True) @ v


def _geglu_lower(low, spec, q, k, v, grid):
    unit = _geglu_unit(spec.d, spec.seed)
    gated, down = lower_geglu(
        low, unit, low.reshape(v, (spec.seq_len, spec.d), "c.v.flat"), "c.geglu"
    )
    return low.linear(gated, down.weight, down.bias, "c.geglu.down", "c.geglu")


def _geglu_reference(spec, q, k, v):
    unit = _geglu_unit(spec.d, spec.seed)
    return unit.down(unit.up_value(v) * torch.nn.functional.gelu(unit.up_gate(v)))


register_core(AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR)(
    Core(_inhibitor_lower, _inhibitor_reference)
)
register_core(AttentionKind.DOT_PRODUCT)(
    Core(
        lambda low, spec, q, k, v, grid: lower_normalized(low, q, k, v, "c.attn", exp_scores()),
        lambda spec, q, k, v: AF.dot_product(q, k, v),
    )
)
register_core(AttentionKind.POWER_SOFTMAX)(
    Core(
        lambda low, spec, q, k, v, grid: lower_normalized(
            low, q, k, v, "c.attn", power_scores(4), eps=1e-3, length_agnostic=True
        ),
        _power_reference,
    )
)
register_core(AttentionKind.DCT)(
    Core(
        lambda low, spec, q, k, v, grid: lower_dct(
            low, _DctParams(max(1, spec.seq_len // 2)), q, k, v, "c.attn"
        ),
        lambda spec, q, k, v: AF.dct_attention(q, k, v, max(1, spec.seq_len // 2)),
    )
)
register_core(AttentionKind.GEGLU_ONLY)(Core(_geglu_lower, _geglu_reference))


def _geglu_unit(d: int, seed: int) -> nn.Module:
    """A GEGLU unit with seeded random weights: the same unit for the circuit and its reference."""
    g = torch.Generator().manual_seed(seed)
    unit = nn.Module()
    for name in ("up_value", "up_gate", "down"):
        lin = nn.Linear(d, d).double()
        with torch.no_grad():
            lin.weight.copy_(torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d))
            lin.bias.zero_()
        setattr(unit, name, lin)
    return unit


# ------------------------------------------------------------------------------------------
# building
def build(spec: CircuitSpec, n_calib: int = 64) -> BuiltCircuit:
    """The integer program of one attention circuit, calibrated on random inputs in [-1, 1]."""
    T, d = spec.seq_len, spec.d
    attention = core(spec.variant)
    gen = torch.Generator().manual_seed(spec.seed)
    x = torch.rand(n_calib, T, 3 * d, generator=gen, dtype=torch.float64) * 2 - 1
    config = QuantConfig(n_bits=spec.n_bits, lut_bits=spec.lut_bits)
    low = Lowering(config)
    grid = Quantizer(1.0 / (2 ** (spec.n_bits - 1) - 1), 0, spec.n_bits, True)
    low.quantizers["input"] = grid  # fixed grid, not fitted
    inp, _ = low.input(x)

    def head(lo: int, label: str) -> QValue:  # (T, d) -> (1, T, d)
        part = low.slice_last(inp, lo * d, (lo + 1) * d, f"c.{label}")
        return low.reshape(part, (1, T, d), f"c.{label}.h")

    out = attention.lower(low, spec, head(0, "q"), head(1, "k"), head(2, "v"), grid)
    if out.shape != (T, d):
        out = low.reshape(out, (T, d), "c.out")
    low.graph.set_output(out.node)
    calib_ints = grid.quantize_np(x.numpy())
    low.graph.calibrate(calib_ints)
    return BuiltCircuit(spec, low.graph, calib_ints, out.scale, _reference(spec, grid, attention))


def _reference(
    spec: CircuitSpec, grid: Quantizer, attention: Core
) -> Callable[[np.ndarray], np.ndarray]:
    """The float attention (models.attention.functional) on the dequantized input, for error
    reports."""
    d = spec.d

    def ref(x_int: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.asarray(x_int, dtype=np.float64) * grid.scale)
        with torch.no_grad():
            return attention.reference(spec, x[..., :d], x[..., d : 2 * d], x[..., 2 * d :]).numpy()

    return ref
