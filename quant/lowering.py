"""The primitive of post-training quantization: build the integer program and its fake-quantized
float twin side by side, fitting each requantisation point on the calibration data as it goes.

With ``differentiable=True`` the fake-quantized twin carries gradients (straight-through estimators
on every rounding, clipped at each quantizer's range): training through it is quantization-aware
training of the integer program itself (:mod:`quant.program_qat`), so the exported program computes
exactly the forward that training saw.

Every value is a :class:`QValue`: an integer graph node whose float meaning is ``int * scale``
(scale per tensor, or per channel on the last axis), together with the fake-quantized float64 tensor
of the same value on the current batch. In *fit* mode each requantisation point fits its quantizer
on the calibration batch (sequential calibration: ranges are those the quantized model really sees);
in *apply* mode it reuses the fitted quantizers, so running it on held-out inputs gives the
fake-quantized forward that the integer program must match.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from quant.config import QuantConfig, RangeMode
from quant.ir import Graph, lut_rounding, round_bit_pattern
from quant.quantizer import Quantizer, quantize_weight

Scale = float | np.ndarray


@dataclass
class QValue:
    node: str
    scale: Scale
    fake: Tensor  # (N, *shape) float64, equal to int * scale

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.fake.shape[1:])


@dataclass
class Fitted:
    """What calibration fixes: a quantizer per requantisation point, rounding bits per lookup."""

    quantizers: dict[str, Quantizer] = field(default_factory=dict)
    rounding: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Range:
    lo: float
    hi: float


def _ste(exact: Tensor, smooth: Tensor) -> Tensor:
    """``exact`` in the forward pass, the gradient of ``smooth`` in the backward pass."""
    return smooth + (exact - smooth).detach()


def _scale_t(scale: Scale) -> Tensor | float:
    return (
        torch.from_numpy(np.asarray(scale, dtype=np.float64))
        if isinstance(scale, np.ndarray)
        else scale
    )


class Lowering:
    """Emits graph nodes and computes fake-quantized tensors for one pass over a batch."""

    def __init__(
        self,
        config: QuantConfig,
        fitted: Fitted | None = None,
        keep_values: bool = False,
        differentiable: bool = False,
    ) -> None:
        self.config = config
        self.differentiable = differentiable
        self.fitting = fitted is None
        self.fitted = Fitted() if fitted is None else fitted
        self.quantizers = self.fitted.quantizers
        self.ranges: dict[str, Range] = {}  # float range of every named point on this batch
        self.graph = Graph()
        self.keep_values = keep_values
        self.values: dict[
            str, QValue
        ] = {}  # node name -> QValue on this batch (diagnostics; opt-in: memory)
        # (T, 1) of 0/1 integers, 0 at padding: the client's encrypted key mask (models.text),
        # read by the mixers that mask padding keys; None when the input carries none
        self.key_mask: QValue | None = None

    def _fake(self, q: Quantizer, t: Tensor) -> Tensor:
        """q's quantize-dequantize of ``t``; straight-through (inside q's range) when
        differentiable."""
        out = q.fake(t)
        if not self.differentiable:
            return out
        lo, hi = (q.qmin - q.zero_point) * q.scale, (q.qmax - q.zero_point) * q.scale
        return _ste(out, torch.clamp(t, lo, hi))

    def _const(self, exact: np.ndarray, value: Tensor | np.ndarray | None) -> Tensor:
        """A quantized constant (weights, biases) as a tensor; straight-through to ``value`` when
        differentiable and ``value`` is a tensor (a model parameter)."""
        out = torch.from_numpy(np.asarray(exact, dtype=np.float64))
        if self.differentiable and isinstance(value, Tensor):
            return _ste(out, value.double())
        return out

    def _out(self, node: str, scale: Scale, fake: Tensor) -> QValue:
        value = QValue(node, scale, fake)
        if self.keep_values:
            self.values[node] = value
        return value

    # ------------------------------------------------------------------------------ bookkeeping
    def record(self, name: str, t: Tensor) -> None:
        t = t.detach()
        self.ranges[name] = Range(float(t.min()), float(t.max()))

    def fit(
        self, point: str, values: Tensor, bits: int | None = None, signed: bool | None = None
    ) -> Quantizer:
        """The quantizer of ``point``: fitted on ``values`` in fit mode (unless one was given in
        advance), reused otherwise."""
        if self.fitting and point in self.quantizers:
            return self.quantizers[point]
        if not self.fitting:
            try:
                return self.quantizers[point]
            except KeyError:
                raise KeyError(
                    f"no fitted quantizer for {point!r}: the model changed since calibration"
                ) from None
        bits = bits or self.config.bits_for(point)
        v = values.detach().flatten().double()
        if self.config.range_mode is RangeMode.PERCENTILE and v.numel() > 100:
            hi_q = self.config.percentile / 100.0
            lo, hi = (
                float(torch.quantile(v[:1_000_000], 1 - hi_q)),
                float(torch.quantile(v[:1_000_000], hi_q)),
            )
        else:
            lo, hi = float(v.min()), float(v.max())
        if signed is False:
            lo = 0.0
        q = Quantizer.fit(lo, hi, bits, symmetric=self.config.symmetric or signed is not None)
        if signed is True and not q.signed:
            q = Quantizer(max(abs(lo), abs(hi)) / (2 ** (bits - 1) - 1) or 1.0, 0, bits, True)
        self.quantizers[point] = q
        return q

    # -------------------------------------------------------------------------------- the input
    def input(
        self, x: Tensor, name: str = "input", fit_on: Tensor | None = None
    ) -> tuple[QValue, Quantizer]:
        """The encrypted input; its quantizer is fitted on ``fit_on`` (default: ``x``)."""
        x = x.double()
        q = self.fit(name, x if fit_on is None else fit_on.double(), self.config.in_bits)
        self.record(name, x)
        node = self.graph.add(
            name,
            "input",
            tag="input",
            shape=tuple(x.shape[1:]),
            dtype_bits=q.n_bits,
            signed=q.signed,
        )
        if q.zero_point:
            node = self.graph.add(
                f"{name}.center", "add_const", (node,), tag="input", value=np.int64(-q.zero_point)
            )
        return self._out(node, q.scale, self._fake(q, x)), q

    # ---------------------------------------------------------------------------- leveled ops
    def linear(
        self,
        x: QValue,
        weight: Tensor,
        bias: Tensor | None,
        name: str,
        tag: str,
        bias_multiplier: float = 1.0,
        out_scale: float | None = None,
    ) -> QValue:
        """x @ Wᵀ + b with clear integer weights; the output scale is s_x · s_w.

        ``bias_multiplier`` scales the bias before quantization (a pooled sum instead of a mean);
        ``out_scale`` fixes the output scale (the weight grid becomes out_scale / s_x).
        """
        if isinstance(x.scale, np.ndarray):
            raise ValueError(f"{name}: a linear layer needs a per-tensor input scale")
        w = weight.detach().double().numpy().T  # (in, out)
        per_channel = self.config.weight_granularity.value == "per-channel" and out_scale is None
        if out_scale is None:
            w_int, s_w = quantize_weight(w, self.config.w_bits, per_channel)
        else:
            s_w = np.asarray(out_scale / x.scale, dtype=np.float64)
            w_int = np.round(w / s_w).astype(np.int64)
        scale = x.scale * s_w
        b = (
            np.zeros(w.shape[1])
            if bias is None
            else bias.detach().double().numpy() * bias_multiplier
        )
        b_int = np.round(b / scale).astype(np.int64)
        node = self.graph.add(name, "linear", (x.node,), tag=tag, weight=w_int, bias=b_int)
        b_t = None if bias is None else bias * bias_multiplier
        fake = x.fake @ self._const(w_int * s_w, weight.T) + self._const(b_int * scale, b_t)
        self.record(name, fake)
        return self._out(node, scale if per_channel else float(scale), fake)

    def matmul_left(
        self,
        matrix: np.ndarray,
        x: QValue,
        name: str,
        tag: str,
        integer: bool = False,
        denominator: int = 1,
    ) -> QValue:
        """M @ x along the sequence axis (axis -2) with a clear matrix M quantized to
        weight_bits; ``integer``: M is already an integer matrix (a selection, e.g. pair
        differences), used as it is, so x's scale is kept, or divided by ``denominator``: the
        product is (M / denominator) @ x, exactly, on a grid ``denominator`` times finer."""
        if isinstance(x.scale, np.ndarray):
            raise ValueError(f"{name}: needs a per-tensor input scale")
        if denominator != 1 and not integer:
            raise ValueError(f"{name}: a denominator needs integer=True")
        s_m: float | np.ndarray
        if integer:
            m_int, s_m = np.asarray(matrix, dtype=np.int64), 1.0 / denominator
            if not np.array_equal(m_int, matrix):
                raise ValueError(f"{name}: integer=True needs an integer matrix")
        else:
            m_int, s_m = quantize_weight(
                matrix.reshape(-1, 1), self.config.w_bits, per_channel=False
            )
            m_int = m_int.reshape(matrix.shape)
        node = self.graph.add(name, "matmul_left", (x.node,), tag=tag, weight=m_int)
        fake = torch.from_numpy(m_int * float(s_m)) @ x.fake
        self.record(name, fake)
        return self._out(node, x.scale * float(s_m), fake)

    def add_const(self, x: QValue, value: Tensor | np.ndarray, name: str, tag: str) -> QValue:
        """x + c, with the float constant c quantized to x's scale."""
        v = (
            value.detach().double().numpy()
            if isinstance(value, Tensor)
            else np.asarray(value, dtype=np.float64)
        )
        c_int = np.round(v / x.scale).astype(np.int64)
        node = self.graph.add(name, "add_const", (x.node,), tag=tag, value=c_int)
        fake = x.fake + self._const(c_int * x.scale, value)
        self.record(name, fake)
        return self._out(node, x.scale, fake)

    def rescaled(self, x: QValue, factor: float) -> QValue:
        """x times a public constant, free: the same integers read on a scale ``factor`` times
        the old one (no node)."""
        return self._out(x.node, _mul_scale(x.scale, factor), x.fake * factor)

    def mul_const(self, x: QValue, m: int, name: str, tag: str) -> QValue:
        """x · m for a clear integer m: the same values on a grid m times finer (leveled)."""
        node = self.graph.add(name, "mul_const", (x.node,), tag=tag, value=np.int64(m))
        return self._out(node, _mul_scale(x.scale, 1.0 / m), x.fake)  # same real values, finer grid

    def keep(self, x: QValue, mask: QValue, bounds: tuple[int, int], name: str, tag: str) -> QValue:
        """x · m for an encrypted m in {0, 1} (broadcast), in one lookup per element: with x in
        ``bounds`` = [lo, hi] and K = hi − lo + 1, u = x − lo + K·m puts the kept values in
        [K, 2K − 1] and the others in [0, K − 1], and the table returns u − K + lo from K up, 0
        below. u is unsigned with one input bit more than x, and no product (x + K·m, unshifted,
        would span both signs for a signed x: two bits more, and on the next-word model a 5-bit
        lookup of its own, whose parameter set and keyswitch keys cost 0.41 GiB of its 2.47)."""
        lo, hi = bounds
        k = hi - lo + 1
        km = self.graph.add(f"{name}.km", "mul_const", (mask.node,), tag=tag, value=np.int64(k))
        x0 = x.node  # x − lo, in [0, K − 1]
        if lo:
            x0 = self.graph.add(f"{name}.x0", "add_const", (x0,), tag=tag, value=np.int64(-lo))
        u = self.graph.add(f"{name}.u", "add", (x0, km), tag=tag)

        def table(ints: np.ndarray, k=k, lo=lo) -> np.ndarray:
            ints = np.asarray(ints, dtype=np.int64)
            return np.where(ints >= k, ints - k + lo, 0)

        shape = tuple(np.broadcast_shapes(x.shape, mask.shape))
        node = self.graph.add(
            name, "lut", (u,), tag=tag, fn=table, shape=shape, out_range=(min(lo, 0), max(hi, 0))
        )
        fake = x.fake * mask.fake
        self.record(name, fake)
        return self._out(node, x.scale, fake)

    def add_count(self, x: QValue, count: QValue, value: float, name: str, tag: str) -> QValue:
        """x + value · n for an encrypted integer count n (e.g. kept keys), with ``value`` rounded
        to x's grid (leveled)."""
        c = int(round(value / float(x.scale)))
        cn = self.graph.add(f"{name}.c", "mul_const", (count.node,), tag=tag, value=np.int64(c))
        node = self.graph.add(name, "add", (x.node, cn), tag=tag)
        fake = x.fake + c * float(x.scale) * count.fake
        self.record(name, fake)
        return self._out(node, x.scale, fake)

    def _same_scale(self, a: QValue, b: QValue, what: str) -> None:
        if not np.allclose(a.scale, b.scale, rtol=1e-12):
            raise ValueError(f"{what}: operands have different scales {a.scale} and {b.scale}")

    def add(self, a: QValue, b: QValue, name: str, tag: str) -> QValue:
        self._same_scale(a, b, name)
        node = self.graph.add(name, "add", (a.node, b.node), tag=tag)
        fake = a.fake + b.fake
        self.record(name, fake)
        return self._out(node, a.scale, fake)

    def sub(self, a: QValue, b: QValue, name: str, tag: str) -> QValue:
        self._same_scale(a, b, name)
        node = self.graph.add(name, "sub", (a.node, b.node), tag=tag)
        fake = a.fake - b.fake
        self.record(name, fake)
        return self._out(node, a.scale, fake)

    def sum(self, x: QValue, axis: int, name: str, tag: str, keepdims: bool = False) -> QValue:
        if axis >= 0:
            raise ValueError("use a negative axis (the batch axis is implicit)")
        node = self.graph.add(name, "sum", (x.node,), tag=tag, axis=axis, keepdims=keepdims)
        fake = x.fake.sum(dim=axis, keepdim=keepdims)
        self.record(name, fake)
        return self._out(node, x.scale, fake)

    # ---------------------------------------------------------------------------- free reshapes
    def expand_dims(self, x: QValue, axis: int, name: str) -> QValue:
        node = self.graph.add(name, "expand_dims", (x.node,), axis=axis)
        return self._out(node, x.scale, x.fake.unsqueeze(axis))

    def reshape(self, x: QValue, shape: tuple[int, ...], name: str) -> QValue:
        node = self.graph.add(name, "reshape", (x.node,), shape=tuple(shape), from_shape=x.shape)
        return self._out(node, x.scale, x.fake.reshape(x.fake.shape[0], *shape))

    def slice_last(self, x: QValue, start: int, stop: int, name: str) -> QValue:
        """x[..., start:stop] (free)."""
        node = self.graph.add(name, "slice", (x.node,), index=(slice(start, stop),))
        return self._out(node, x.scale, x.fake[..., start:stop])

    def transpose(self, x: QValue, axes: tuple[int, ...], name: str) -> QValue:
        node = self.graph.add(name, "transpose", (x.node,), axes=tuple(axes))
        return self._out(node, x.scale, x.fake.permute(0, *(a + 1 for a in axes)))

    # ------------------------------------------------------------------------- PBS operations
    def lut(
        self,
        x: QValue,
        fn: Callable[[Tensor], Tensor],
        point: str,
        tag: str,
        bits: int | None = None,
        signed: bool | None = None,
        quantizer: Quantizer | None = None,
        lut_bits: int | None = None,
    ) -> QValue:
        """y = quantize(fn(x)): one table lookup that fuses dequantisation, the float function and
        requantisation. ``quantizer`` forces the output quantizer; otherwise it is fitted at
        ``point``. ``lut_bits`` replaces the configuration's rounding target for this lookup."""
        r = self._rounding_for(point, x, lut_bits)
        x_in = self._rounded(x, r)
        y = fn(x_in)
        self.record(point + ".in", x.fake)
        self.record(point, y)
        q = quantizer or self.fit(point, y, bits, signed)
        scale_t = _scale_t(x.scale)

        def table(ints: np.ndarray, q=q, scale_t=scale_t, fn=fn) -> np.ndarray:
            vals = fn(torch.from_numpy(np.asarray(ints, dtype=np.float64)) * scale_t)
            return q.quantize_np(vals.numpy()) - q.zero_point

        node = self.graph.add(
            point,
            "lut",
            (x.node,),
            tag=tag,
            fn=table,
            shape=x.shape,
            rounding_bits=r,
            per_channel=isinstance(x.scale, np.ndarray),
            out_range=(q.qmin - q.zero_point, q.qmax - q.zero_point),
        )
        return self._out(node, q.scale, self._fake(q, y))

    def lut_exact(
        self,
        x: QValue,
        fn_int: Callable[[Tensor], Tensor],
        name: str,
        tag: str,
        rounding: bool = False,
    ) -> QValue:
        """A lookup that commutes with positive scaling (ReLU, |x|, min(x, 0)): the scale is kept
        and the table is the integer function itself (no requantisation). With ``rounding`` the
        input is rounded like any lookup's (``lut_bits``), for uses that tolerate it (a softmax's
        row maximum)."""
        r = self._rounding_for(name, x) if rounding else 0
        node = self.graph.add(
            name,
            "lut",
            (x.node,),
            tag=tag,
            shape=x.shape,
            rounding_bits=r,
            fn=lambda ints: fn_int(torch.from_numpy(np.asarray(ints))).numpy(),
            per_channel=False,
        )
        fake = fn_int(self._rounded(x, r)) if r else fn_int(x.fake)
        self.record(name, fake)
        return self._out(node, x.scale, fake)

    def requant(
        self,
        x: QValue,
        point: str,
        tag: str,
        bits: int | None = None,
        signed: bool | None = None,
        quantizer: Quantizer | None = None,
        lut_bits: int | None = None,
    ) -> QValue:
        return self.lut(x, lambda t: t, point, tag, bits, signed, quantizer, lut_bits)

    def mul(self, a: QValue, b: QValue, name: str, tag: str) -> QValue:
        """Elementwise product of two encrypted values (numpy broadcasting)."""
        fake = a.fake * b.fake
        node = self.graph.add(name, "mul", (a.node, b.node), tag=tag, shape=tuple(fake.shape[1:]))
        self.record(name, fake)
        return self._out(node, _mul_scale(a.scale, b.scale), fake)

    def matmul(self, a: QValue, b: QValue, name: str, tag: str) -> QValue:
        """Encrypted × encrypted matrix product (QKᵀ, S·V)."""
        if isinstance(a.scale, np.ndarray) or isinstance(b.scale, np.ndarray):
            raise ValueError(f"{name}: encrypted matmul needs per-tensor scales")
        fake = a.fake @ b.fake
        node = self.graph.add(
            name,
            "matmul",
            (a.node, b.node),
            tag=tag,
            shape=tuple(fake.shape[1:]),
            inner=a.shape[-1],
        )
        self.record(name, fake)
        return self._out(node, a.scale * b.scale, fake)

    def _rounding_for(self, point: str, x: QValue, lut_bits: int | None = None) -> int:
        """Fixed ``rounding_bits``, or with ``lut_bits`` the fewest LSBs that bring this lookup's
        calibrated input down to ``lut_bits`` bits once rounded (stored with the quantizers for
        apply mode). Rounding the largest values up can carry into one more bit (an unsigned 11-bit
        2040 rounded by 6 bits is 2048): the lookup would then read lut_bits + 1 bits and land on a
        larger parameter set, so one more LSB is removed instead."""
        if self.config.lut_bits is None:
            return self.config.rounding_bits
        if self.fitting:
            ints = torch.round(x.fake.detach() / _scale_t(x.scale))
            target = self.config.lut_bits_for(point, lut_bits)
            assert target is not None  # lut_bits is set
            self.fitted.rounding[point] = lut_rounding(int(ints.min()), int(ints.max()), target)
        return self.fitted.rounding[point]

    def _rounded(self, x: QValue, r: int) -> Tensor:
        """The fake twin of a LUT input: the integers recovered from ``x.fake`` (exact: it equals
        int * scale up to float rounding), rounded by ``r`` bits like the program, times the scale.
        Evaluating the lookup's function on ``int * scale`` in both paths makes ties round alike."""
        scale_t = _scale_t(x.scale)
        ints = torch.round(x.fake.detach() / scale_t).to(torch.int64).numpy()
        out = torch.from_numpy(round_bit_pattern(ints, r).astype(np.float64)) * scale_t
        return _ste(out, x.fake) if self.differentiable else out


def _mul_scale(a: Scale, b: Scale) -> Scale:
    out = np.asarray(a) * np.asarray(b)
    return out if out.ndim else float(out)
