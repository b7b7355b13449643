"""Export a trained Transformer to an integer program (post-training quantization).

Each sub-layer of the model is lowered by one function below, with the paper equation it implements.
Norm policy under TFHE: LayerNorm divides by an encrypted √variance, which has no cheap integer form;
the TFHE path therefore recommends and supports ``--norm none`` (Inhibitor paper: "FFN and
normalization are left unchanged", our models train fine without it at 1-2 layers). Exporting a
LayerNorm model is a clear :class:`ExportError` that says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from models.attention import functional as AF
from models.config import Activation, AttentionKind, InputKind, NormKind
from models.fold import fold_norms
from models.transformer import Block, Transformer
from quant.config import QuantConfig
from quant.ir import Graph, OverflowPolicy
from quant.lowering import Fitted, Lowering, QValue, Range
from quant.quantizer import Quantizer


class ExportError(ValueError):
    """The model uses an operation the integer program cannot express (yet)."""


@dataclass
class QuantizedProgram:
    """A calibrated integer program plus what the client needs: input quantizer and output scale."""

    graph: Graph
    input_quantizer: Quantizer
    output_scale: np.ndarray | float
    fitted: Fitted
    config: QuantConfig
    model: Transformer
    calibration: dict[str, Range] = field(default_factory=dict)

    # --------------------------------------------------------------------------------- client side
    def quantize_input(self, x: Tensor | np.ndarray) -> np.ndarray:
        """Client-side quantization. Policy: inputs outside the calibrated range are clipped (saturated)
        to it; :meth:`input_clip_count` counts how many entries that affected."""
        return self.input_quantizer.quantize_np(np.asarray(x, dtype=np.float64))

    def input_clip_count(self, x: Tensor | np.ndarray) -> int:
        return self.input_quantizer.clipped_count(np.asarray(x, dtype=np.float64))

    def dequantize_output(self, y: np.ndarray) -> np.ndarray:
        return np.asarray(y, dtype=np.float64) * self.output_scale

    # ---------------------------------------------------------------------------------- evaluation
    def run_int(self, x_int: np.ndarray, policy: OverflowPolicy = OverflowPolicy.ERROR):
        """The clear integer program on quantized inputs: (integer outputs, clipped counts per node)."""
        x_int = np.asarray(x_int)
        if x_int.ndim == len(self.graph.input_shape):  # one sample
            return self.graph.run(x_int, policy)
        return self.graph.run_batched(x_int, policy)

    def forward(self, x: Tensor | np.ndarray, policy: OverflowPolicy = OverflowPolicy.ERROR) -> np.ndarray:
        """Float in, dequantized float out, through the integer program."""
        y, _ = self.run_int(self.quantize_input(x), policy)
        return self.dequantize_output(y)

    def fake_forward(self, x: Tensor, batch_size: int = 128) -> np.ndarray:
        """The fake-quantized torch forward with the fitted quantizers (the integer program's twin)."""
        x = torch.as_tensor(x)
        outs = []
        for i in range(0, len(x), batch_size):
            low = Lowering(self.config, self.fitted)
            with torch.no_grad():
                outs.append(lower_transformer(low, self.model, x[i : i + batch_size]).fake.numpy())
        return np.concatenate(outs)


def export(model: Transformer, calib_x: Tensor, config: QuantConfig | None = None) -> QuantizedProgram:
    """Quantize ``model`` on calibration inputs ``calib_x`` (N, T, F) and calibrate the program."""
    config = config or QuantConfig()
    model = fold_norms(model.eval())  # BatchNorm: folded into the linear layers, free under TFHE
    low = Lowering(config)
    with torch.no_grad():
        out = lower_transformer(low, model, torch.as_tensor(calib_x))
    low.graph.set_output(out.node)
    calib_int = low.quantizers["input"].quantize_np(np.asarray(calib_x, dtype=np.float64))
    low.graph.calibrate(calib_int)
    return QuantizedProgram(low.graph, low.quantizers["input"], out.scale, low.fitted, config, model,
                            calibration=low.ranges)


# ------------------------------------------------------------------------------------------------
# The model, sub-layer by sub-layer
# ------------------------------------------------------------------------------------------------
def check_exportable(model: Transformer) -> None:
    cfg = model.config
    if cfg.input_kind is InputKind.TOKENS:
        raise ExportError("token-id inputs (embedding table lookups on encrypted ids) are not supported by the "
                          "integer program yet; export a model with patch (feature-vector) inputs")
    if cfg.norm is NormKind.LAYERNORM:
        raise ExportError("LayerNorm has no TFHE integer lowering (it divides by an encrypted square root of the "
                          "variance). Retrain with `--norm batchnorm` (folded into the linear layers at export: "
                          "free under encryption; the `fhe train` default) or `--norm none`.")
    if cfg.attention is AttentionKind.DCT and cfg.dct_ideal:
        raise ExportError("DCT-Former Algorithm 2 ('ideal') is an evaluation device with a full T×T matrix; "
                          "export the efficient Algorithm 1 (dct_ideal=False)")


def lower_transformer(low: Lowering, model: Transformer, x: Tensor) -> QValue:
    check_exportable(model)
    cfg = model.config
    inp, _ = low.input(x)
    T = inp.shape[0]
    h = low.linear(inp, model.embed.weight, model.embed.bias, "embed", "embed")
    h = low.add_const(h, model.pos[:T], "embed.pos", "embed")
    h = low.requant(h, "embed.out", "embed", signed=True)
    for b, block in enumerate(model.blocks):
        h = lower_block(low, block, h, f"block{b}", cfg)
    pooled = low.sum(h, -2, "pool", "head")  # mean pooling: the 1/T goes into the output scale
    out = low.linear(pooled, model.head.weight, model.head.bias, "head", "head", bias_multiplier=T)
    out.scale = out.scale / T
    out.fake = out.fake / T
    return out


def lower_block(low: Lowering, block: Block, h: QValue, name: str, cfg) -> QValue:
    mixed, proj = lower_mixer(low, block.mixer, h, f"{name}.mix", cfg)
    h = residual(low, h, mixed, proj, f"{name}.res1", f"{name}.mix.proj")
    if block.has_ffn:
        ffn = block.ffn
        a = low.linear(h, ffn.fc1.weight, ffn.fc1.bias, f"{name}.ffn.fc1", f"{name}.ffn")
        act = torch.relu if cfg.ffn_activation is Activation.RELU else torch.nn.functional.gelu
        a = low.lut(a, act, f"{name}.ffn.act", f"{name}.ffn")  # Eq. (4): (XW₁ᵀ + b₁)⁺
        h = residual(low, h, a, ffn.fc2, f"{name}.res2", f"{name}.ffn")
    return h


def residual(low: Lowering, h: QValue, x: QValue, layer: torch.nn.Linear, name: str, tag: str) -> QValue:
    """h + layer(x), then requantized to n bits: one table lookup per element.

    The branch's linear layer is quantized straight onto a refinement of h's grid: h is multiplied by a
    clear integer m (leveled) and the layer's integer weights are round(W·s_x·m / s_h), with m chosen so
    they span the weight bit width. The sum is then a plain integer addition, and the only lookup is the
    requantisation of the sum (no separate lookup to bring the branch onto h's scale).
    """
    if isinstance(h.scale, np.ndarray) or isinstance(x.scale, np.ndarray):
        raise ValueError(f"{name}: the residual needs per-tensor scales")
    qmax_w = 2 ** (low.config.w_bits - 1) - 1
    amax_w = float(layer.weight.detach().abs().max()) or 1.0
    m = max(1, round(qmax_w * h.scale / (amax_w * x.scale)))
    skip = low.mul_const(h, m, f"{name}.skip", name)
    branch = low.linear(x, layer.weight, layer.bias, f"{name}.branch", tag, out_scale=h.scale / m)
    s = low.add(skip, branch, f"{name}.sum", name)
    return low.requant(s, f"{name}.out", name, signed=True)


def lower_mixer(low: Lowering, mixer, h: QValue, name: str, cfg) -> tuple[QValue, torch.nn.Linear]:
    """The token mixer up to its output projection: (its value, the projection layer)."""
    kind = cfg.attention
    if kind in (AttentionKind.ACTIVATOR, AttentionKind.GEGLU_ONLY):
        return lower_geglu(low, mixer, h, name)
    nh, dh = cfg.n_heads, cfg.d_head
    T = h.shape[0]

    def heads(x: QValue, label: str) -> QValue:  # (T, C) -> (nh, T, dh)
        x = low.reshape(x, (T, nh, dh), f"{name}.{label}.split")
        return low.transpose(x, (1, 0, 2), f"{name}.{label}.heads")

    q_acc = low.linear(h, mixer.q_proj.weight, mixer.q_proj.bias, f"{name}.q", f"{name}.qkv")
    k_acc = low.linear(h, mixer.k_proj.weight, mixer.k_proj.bias, f"{name}.k", f"{name}.qkv")
    v_acc = low.linear(h, mixer.v_proj.weight, mixer.v_proj.bias, f"{name}.v", f"{name}.qkv")
    if kind in (AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR):
        # Q and K share one quantizer: Eq. (5) subtracts them.
        q_qk = low.fit(f"{name}.qk", torch.cat([q_acc.fake, k_acc.fake]), signed=True)
        q = heads(low.requant(q_acc, f"{name}.q.out", f"{name}.qkv", quantizer=q_qk), "q")
        k = heads(low.requant(k_acc, f"{name}.k.out", f"{name}.qkv", quantizer=q_qk), "k")
        v = heads(low.requant(v_acc, f"{name}.v.out", f"{name}.qkv", signed=True), "v")
        out = lower_inhibitor(low, mixer, q, k, v, f"{name}.attn")
    else:
        q = heads(low.requant(q_acc, f"{name}.q.out", f"{name}.qkv", signed=True), "q")
        k = heads(low.requant(k_acc, f"{name}.k.out", f"{name}.qkv", signed=True), "k")
        v = heads(low.requant(v_acc, f"{name}.v.out", f"{name}.qkv", signed=True), "v")
        if kind is AttentionKind.DCT:
            out = lower_dct(low, mixer, q, k, v, f"{name}.attn")
        elif kind is AttentionKind.POWER_SOFTMAX:
            out = lower_normalized(low, q, k, v, f"{name}.attn", power_scores(mixer.p), eps=mixer.inference_eps,
                                   length_agnostic=True)
        else:
            out = lower_normalized(low, q, k, v, f"{name}.attn", exp_scores())
    out = low.transpose(out, (1, 0, 2), f"{name}.merge.t")  # (T, nh, dh)
    out = low.reshape(out, (T, nh * dh), f"{name}.merge")
    return out, mixer.out_proj  # the residual applies the output projection (no lookup in between)


# ------------------------------------------------------------------------------------------------
# Attention mechanisms
# ------------------------------------------------------------------------------------------------
def lower_inhibitor(low: Lowering, mixer, q: QValue, k: QValue, v: QValue, name: str) -> QValue:
    """Inhibitor, Eqs. (5)-(7), written with integer subtraction, |·| and ReLU lookups only.

    Z'_ij = (Σ_k |Q_ik − K_jk| / γ − α)⁺ is requantized directly onto V's scale and saturated at
    max|V|: any larger score already inhibits every value completely, so saturation is exact.
    """
    tag_s, tag_h = f"{name}.scores", f"{name}.inhibit"
    diff = low.sub(low.expand_dims(q, -2, f"{name}.q.e"), low.expand_dims(k, -3, f"{name}.k.e"),
                   f"{name}.diff", tag_s)  # (nh, T, T, dh)
    dist = low.sum(low.lut_exact(diff, torch.abs, f"{name}.abs", tag_s), -1, f"{name}.l1", tag_s)  # Eq. (5)
    v_q = low.quantizers[f"{name[: -len('.attn')]}.v.out"]
    z_q = Quantizer(v_q.scale, 0, v_q.n_bits - 1, False)  # [0, max|V|] on V's grid
    gamma, alpha = mixer.gamma, mixer.alpha
    z = low.lut(dist, lambda t: torch.relu(t / gamma - alpha), f"{name}.z", tag_s, quantizer=z_q)  # Z'
    z = low.expand_dims(z, -1, f"{name}.z.e")  # (nh, T, T, 1)
    if not mixer.signed:
        t = low.sub(low.expand_dims(v, -3, f"{name}.v.e"), z, f"{name}.vz", tag_h)  # V_jk − Z'_ij
        t = low.lut_exact(t, torch.relu, f"{name}.relu", tag_h)  # Eq. (6)
        return low.sum(t, -2, f"{name}.h", tag_h)
    v_pos = low.lut_exact(v, torch.relu, f"{name}.v.pos", tag_h)  # V⁺
    v_neg = low.sub(v, v_pos, f"{name}.v.neg", tag_h)  # V⁻ = V − V⁺, free
    pos = low.sub(low.expand_dims(v_pos, -3, f"{name}.vp.e"), z, f"{name}.vpz", tag_h)
    pos = low.lut_exact(pos, torch.relu, f"{name}.relu.pos", tag_h)  # (V⁺ − Z')⁺
    neg = low.add(low.expand_dims(v_neg, -3, f"{name}.vn.e"), z, f"{name}.vnz", tag_h)
    neg = low.lut_exact(neg, lambda t: torch.clamp(t, max=0), f"{name}.relu.neg", tag_h)  # (V⁻ + Z')⁻
    both = low.add(pos, neg, f"{name}.pn", tag_h)
    return low.sum(both, -2, f"{name}.h", tag_h)  # Eq. (7)


def row_max(low: Lowering, s: QValue, name: str, tag: str) -> QValue:
    """max over the last axis by a tree of max(a, b) = b + (a − b)⁺: one ReLU lookup per comparison,
    L − 1 per row. Returns shape (..., 1)."""
    level = 0
    while s.shape[-1] > 1:
        n = s.shape[-1]
        half = n // 2
        a = low.slice_last(s, 0, half, f"{name}.max{level}.a")
        b = low.slice_last(s, half, 2 * half, f"{name}.max{level}.b")
        gap = low.lut_exact(low.sub(a, b, f"{name}.max{level}.d", tag), torch.relu, f"{name}.max{level}.relu", tag,
                            rounding=True)  # an approximate maximum is enough: softmax is shift-invariant
        m = low.add(b, gap, f"{name}.max{level}", tag)
        if n % 2:  # carry the odd element to the next level
            rest = low.slice_last(s, n - 1, n, f"{name}.max{level}.rest")
            m = _concat_last(low, m, rest, f"{name}.max{level}.cat")
        s, level = m, level + 1
    return s


def _concat_last(low: Lowering, a: QValue, b: QValue, name: str) -> QValue:
    node = low.graph.add(name, "concat", (a.node, b.node), axis=-1)
    return low._out(node, a.scale, torch.cat([a.fake, b.fake], dim=-1))


def exp_scores() -> Callable[[Lowering, QValue, str, float], QValue]:
    """softmax numerator exp(c·(s − max_j s)): the row maximum is subtracted exactly as in float
    softmax (shift invariance), so the largest numerator of every row is 1 and the sum is >= 1."""

    def fn(low: Lowering, s: QValue, name: str, c: float) -> QValue:
        m = row_max(low, s, f"{name}.rowmax", f"{name}.softmax")
        shifted = low.sub(s, m, f"{name}.shift", f"{name}.softmax")  # <= 0
        return low.lut(shifted, lambda t: torch.exp(t * c), f"{name}.exp", f"{name}.softmax", signed=False)

    return fn


def power_scores(p: int) -> Callable[[Lowering, QValue, str, float], QValue]:
    def fn(low: Lowering, s: QValue, name: str, c: float) -> QValue:
        return low.lut(s, lambda t: (t * c).pow(p), f"{name}.pow", f"{name}.softmax", signed=False)

    return fn


def lower_normalized(low: Lowering, q: QValue, k: QValue, v: QValue, name: str,
                     numerator: Callable[[Lowering, QValue, str, float], QValue], eps: float = 0.0,
                     length_agnostic: bool = False) -> QValue:
    """N(σ(QKᵀ/√d)) V (PowerSoftmax paper Eq. 3) with σ = exp (softmax, Eq. 1) or x^p (Eq. 2).

    The division becomes a reciprocal lookup on the row sum and one encrypted product per score.
    PowerSoftmax uses its length-agnostic inference form (Eq. 7): (x^p / L) / (ε + mean x^p).
    """
    tag = f"{name}.softmax"
    d = q.shape[-1]
    kt = low.transpose(k, (0, 2, 1), f"{name}.kT")
    s = low.matmul(q, kt, f"{name}.qk", f"{name}.scores")  # (nh, T, T)
    e = numerator(low, s, name, 1.0 / math.sqrt(d))  # σ(s/√d) in one lookup on the product's accumulator
    den = low.sum(e, -1, f"{name}.den", tag, keepdims=True)  # (nh, T, 1)
    L = s.shape[-1]
    e_scale = e.scale

    def recip(t: Tensor) -> Tensor:
        if length_agnostic:  # Eq. (7): 1 / (L (ε + mean))
            return 1.0 / (L * (eps + t / L)).clamp_min(e_scale)
        return 1.0 / (eps + t).clamp_min(e_scale)  # Eq. (5); at least one quantum avoids 1/0

    r = low.lut(den, recip, f"{name}.recip", tag, signed=False)
    a = low.mul(e, r, f"{name}.norm", tag)  # (nh, T, T)
    a = low.requant(a, f"{name}.probs", tag, signed=False)
    return low.matmul(a, v, f"{name}.av", f"{name}.values")


def lower_dct(low: Lowering, mixer, q: QValue, k: QValue, v: QValue, name: str) -> QValue:
    """DCT-Former Algorithm 1: compress Q, K, V with the clear D̄ (n̄ × T), attend over n̄ positions,
    expand with D̄ᵀ. The DCT matrices are clear constants, so both transforms are leveled."""
    T = q.shape[-2]
    D = AF.dct_matrix(T, min(mixer.n_bar, T), dtype=torch.float64).numpy()
    qb, kb, vb = (low.requant(low.matmul_left(D, t, f"{name}.dct.{lbl}", f"{name}.dct"), f"{name}.dct.{lbl}.out",
                              f"{name}.dct", signed=True) for t, lbl in ((q, "q"), (k, "k"), (v, "v")))
    a = lower_normalized(low, qb, kb, vb, name, exp_scores())  # (nh, n̄, dh)
    a = low.requant(a, f"{name}.compressed", f"{name}.dct", signed=True)
    return low.matmul_left(D.T.copy(), a, f"{name}.idct", f"{name}.dct")


def lower_geglu(low: Lowering, unit, h: QValue, name: str) -> tuple[QValue, torch.nn.Linear]:
    """Activator GEGLU unit (Eqs. 8-10) without inner norms: Down(Up₁x ⊙ GELU(Up₂x))."""
    u = low.linear(h, unit.up_value.weight, unit.up_value.bias, f"{name}.up", f"{name}.geglu")
    g = low.linear(h, unit.up_gate.weight, unit.up_gate.bias, f"{name}.gate", f"{name}.geglu")
    u = low.requant(u, f"{name}.up.out", f"{name}.geglu", signed=True)  # P1
    g = low.lut(g, torch.nn.functional.gelu, f"{name}.gelu", f"{name}.geglu", signed=True)  # P2
    p = low.requant(low.mul(u, g, f"{name}.prod", f"{name}.geglu"), f"{name}.prod.out", f"{name}.geglu",
                    signed=True)
    return p, unit.down
