"""Export a trained Transformer to an integer program (post-training quantization).

Each sub-layer of the model is lowered by one function below, with the paper equation it implements;
the token mixer by the lowering registered for its attention kind (``quant/mixers/``). Norm policy
under TFHE: BatchNorm is folded into the neighbouring linear layers (free); LayerNorm divides by an
encrypted √variance, which has no cheap integer form, so exporting a LayerNorm model is a clear
:class:`ExportError` that names ``--norm batchnorm`` and ``--norm none``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from models.config import InputKind, NormKind, Pooling
from models.fold import fold_norms
from models.layers import activation_fn
from models.transformer import Block, Transformer, last_kept
from quant.config import QuantConfig
from quant.ir import Graph, OverflowPolicy
from quant.lowering import Fitted, Lowering, QValue, Range
from quant.mixers import NoLoweringError, mixer_lowering
from quant.quantizer import Quantizer, decode_output
from quant.steps import split_step_lookups


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

    @property
    def masked(self) -> bool:
        """The input carries the client's key mask (a padded text model, :mod:`models.text`): the
        program outputs (T, n_out + 1), per-position logits of the words and the mask, and the
        client takes their masked mean (:func:`masked_pooled_head`)."""
        return self.model.config.key_mask_column

    @property
    def client_pools(self) -> bool:
        """The program outputs per-token logits (T, n_out) and the client sums them (mean pooling
        and the head are linear, so the pooled logits are that sum): see
        :func:`lower_transformer`."""
        return self.config.client_pooling or self.masked

    # --------------------------------------------------------------------------------- client side
    def quantize_input(self, x: Tensor | np.ndarray) -> np.ndarray:
        """Client-side quantization. Policy: inputs outside the calibrated range are clipped
        (saturated) to it; :meth:`input_clip_count` counts how many entries that affected."""
        return self.input_quantizer.quantize_np(np.asarray(x, dtype=np.float64))

    def input_clip_count(self, x: Tensor | np.ndarray) -> int:
        x = np.asarray(x, dtype=np.float64)
        return self.input_quantizer.clipped_count(x[..., :-1] if self.masked else x)

    def dequantize_output(self, y: np.ndarray) -> np.ndarray:
        return decode_output(
            y, self.output_scale, self.client_pools, self.masked, self.model.config.pooling
        )

    # ---------------------------------------------------------------------------------- evaluation
    def run_int(self, x_int: np.ndarray, policy: OverflowPolicy = OverflowPolicy.ERROR):
        """The clear integer program on quantized inputs: (integer outputs, clipped counts per
        node)."""
        x_int = np.asarray(x_int)
        if x_int.ndim == len(self.graph.input_shape):  # one sample
            return self.graph.run(x_int, policy)
        return self.graph.run_batched(x_int, policy)

    def run_int_accepted(self, x_int: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The clear program on each quantized sample, saturating, and the mask of the samples the
        client accepts (:meth:`quant.ir.Graph.run_accepted`)."""
        return self.graph.run_accepted(x_int)

    def forward(
        self, x: Tensor | np.ndarray, policy: OverflowPolicy = OverflowPolicy.ERROR
    ) -> np.ndarray:
        """Float in, dequantized float out, through the integer program."""
        y, _ = self.run_int(self.quantize_input(x), policy)
        return self.dequantize_output(y)

    def fake_forward(self, x: Tensor, batch_size: int = 128) -> np.ndarray:
        """The fake-quantized torch forward with the fitted quantizers (the integer program's
        twin)."""
        x = torch.as_tensor(x)
        outs = []
        for i in range(0, len(x), batch_size):
            low = Lowering(self.config, self.fitted)
            with torch.no_grad():
                outs.append(lower_transformer(low, self.model, x[i : i + batch_size]).fake.numpy())
        return np.concatenate(outs)


def export(
    model: Transformer, calib_x: Tensor, config: QuantConfig | None = None
) -> QuantizedProgram:
    """Quantize ``model`` on calibration inputs ``calib_x`` (N, T, F) and calibrate the program."""
    config = config or QuantConfig()
    model = fold_norms(model.eval())  # BatchNorm: folded into the linear layers, free under TFHE
    low = Lowering(config)
    with torch.no_grad():
        out = lower_transformer(low, model, torch.as_tensor(calib_x))
    low.graph.set_output(out.node)  # per-token logits when config.client_pooling
    calib_int = low.quantizers["input"].quantize_np(np.asarray(calib_x, dtype=np.float64))
    low.graph.calibrate(calib_int)
    if config.step_lut_bits:  # the same integers, on narrower lookups
        split_step_lookups(low.graph, config.step_lut_bits)
    return QuantizedProgram(
        low.graph,
        low.quantizers["input"],
        out.scale,
        low.fitted,
        config,
        model,
        calibration=low.ranges,
    )


# ------------------------------------------------------------------------------------------------
# The model, sub-layer by sub-layer
# ------------------------------------------------------------------------------------------------
def check_exportable(model: Transformer) -> None:
    cfg = model.config
    if cfg.input_kind is InputKind.TOKENS:
        raise ExportError(
            "token-id inputs: the client embeds its words (an encrypted lookup over the vocabulary "
            "is a 14-bit table per embedding column); split the model first "
            "(models.text.split_text_model; `fhe compile` does it for models trained with --words)"
        )
    if cfg.norm is NormKind.LAYERNORM:
        raise ExportError(
            "LayerNorm has no TFHE integer lowering (it divides by an encrypted square root of the "
            "variance). Retrain with `--norm batchnorm` (folded into the linear layers at export: "
            "free under encryption; the `fhe train` default) or `--norm none`."
        )


def lower_transformer(low: Lowering, model: Transformer, x: Tensor) -> QValue:
    check_exportable(model)
    cfg = model.config
    masked = cfg.key_mask_column
    inp, _ = low.input(x, fit_on=x[..., :-1] if masked else None)  # the mask column: 0 or 1
    T = inp.shape[0]
    if masked:  # the client's vectors and its key mask (models.text, padded)
        h = low.slice_last(inp, 0, cfg.d_model, "input.x")
        low.key_mask = key_mask(low, inp, cfg.d_model)
    elif cfg.input_kind is InputKind.EMBEDDED:  # the client embedded (models.text): h₀ is it
        h = inp
    else:
        embed = typing.cast(torch.nn.Linear, model.embed)  # an image model's input layer
        h = low.linear(inp, embed.weight, embed.bias, "embed", "embed")
        h = low.add_const(h, model.pos[:T], "embed.pos", "embed")
        h = low.requant(h, "embed.out", "embed", signed=True)
    blocks = model.block_list()
    fold = low.config.client_pooling and low.config.fold_last_residual and blocks[-1].has_ffn
    for b, block in enumerate(blocks):
        last = fold and b == len(blocks) - 1
        h = lower_block(low, block, h, f"block{b}", cfg, head=model.head if last else None)
    if masked:
        assert low.key_mask is not None  # set above for a masked model
        y = h if fold else low.linear(h, model.head.weight, model.head.bias, "head", "head")
        return masked_pooled_head(low, model, y, low.key_mask)
    if fold:  # h is already the per-token logits
        return _pooled_by_client(h, T)
    if low.config.client_pooling:
        return client_pooled_head(low, model, h)
    pooled = low.sum(h, -2, "pool", "head")  # mean pooling: the 1/T goes into the output scale
    out = low.linear(pooled, model.head.weight, model.head.bias, "head", "head", bias_multiplier=T)
    out.scale = out.scale / T
    out.fake = out.fake / T
    return out


def client_pooled_head(low: Lowering, model: Transformer, h: QValue) -> QValue:
    """The head per token, W h_t + b, with mean pooling left to the client: logits =
    (1/T) Σ_t (W h_t + b), a sum of the T decrypted outputs (:func:`decode_output`).

    The encrypted output then holds T·n_out values about log2(T) bits narrower than the pooled
    sum; Concrete sizes the parameters of the lookups that feed it from that width and from the
    weights' norm over fewer terms (d_model instead of T·d_model). The returned value's ``fake``
    is the pooled logits (what training and the twin compare), its node the per-token program
    output."""
    out = low.linear(h, model.head.weight, model.head.bias, "head", "head")
    return _pooled_by_client(out, h.shape[0])


def key_mask(low: Lowering, inp: QValue, column: int) -> QValue:
    """The client's key mask (input ``column``), quantized with the inputs (1 → at least one
    quantum, 0 → 0), as exact 0/1 integers of scale 1: one lookup per position. The column is
    taken by a clear one-hot product, not a slice: Concrete 2.11 fails to compile a lookup read
    straight from a slice of the input ("Transforming FHE boolean ops failed")."""
    if round(1.0 / float(inp.scale)) < 1:
        raise ExportError(
            f"the inputs' quantum {float(inp.scale):.3g} is too coarse to carry the key mask"
        )
    one_hot = np.zeros((inp.shape[-1], 1), dtype=np.int64)
    one_hot[column] = 1
    node = low.graph.add(
        "input.m", "linear", (inp.node,), tag="input", weight=one_hot, bias=np.zeros(1, np.int64)
    )
    m = QValue(node, inp.scale, inp.fake[..., column : column + 1])
    # the integers 0 and 1, on a signed grid (they join signed sums)
    zero_one = Quantizer(1.0, 0, 2, True)
    return low.lut(m, lambda t: (t > 0).to(t.dtype), "input.mask", "input", quantizer=zero_one)


def masked_pooled_head(low: Lowering, model: Transformer, y: QValue, m: QValue) -> QValue:
    """The head per position of a padded input, y_t = W h_t + b (``y``; with the last residual
    folded in, :func:`residual_into_head`), beside the mask m_t: (T, n_out + 1). The client weighs
    the decrypted rows by m_t and divides by Σ m_t, its number of words, which the server never
    learns (:func:`~quant.quantizer.decode_output` with ``masked``): the masked mean pooling of the
    float model, at no cost in the program. A next-word model (``Pooling.LAST``) outputs the same,
    and the client keeps its last word's row."""
    out = low.graph.add("head.out", "concat", (y.node, m.node), axis=-1)
    if model.config.pooling is Pooling.LAST:
        pooled = last_kept(y.fake, m.fake[..., 0] > 0.5)
    else:
        pooled = (y.fake * m.fake).sum(dim=-2) / m.fake.sum(dim=-2).clamp_min(1.0)
    return QValue(out, y.scale, pooled)


def _pooled_by_client(out: QValue, T: int) -> QValue:
    """Per-token logits (T, n_out) whose mean over tokens the client takes: the scale carries the
    1/T, the fake value is the pooled logits."""
    out.scale = out.scale / T
    out.fake = out.fake.sum(dim=-2) / T
    return out


def lower_block(
    low: Lowering, block: Block, h: QValue, name: str, cfg, head: torch.nn.Linear | None = None
) -> QValue:
    """One block; with ``head``, the block's second residual folded into the head (per-token
    logits, :func:`residual_into_head`)."""
    mixed, proj = lower_mixer(low, block.mixer, h, f"{name}.mix", cfg)
    h = residual(low, h, mixed, proj, f"{name}.res1", f"{name}.mix.proj")
    if block.has_ffn:
        ffn = block.ffn
        a = low.linear(h, ffn.fc1.weight, ffn.fc1.bias, f"{name}.ffn.fc1", f"{name}.ffn")
        act = activation_fn(cfg.ffn_activation)
        a = low.lut(a, act, f"{name}.ffn.act", f"{name}.ffn")  # Eq. (4): (XW₁ᵀ + b₁)⁺
        if head is not None:
            return residual_into_head(low, h, a, ffn.fc2, head, "head")
        h = residual(low, h, a, ffn.fc2, f"{name}.res2", f"{name}.ffn")
    return h


def residual_into_head(
    low: Lowering, h: QValue, a: QValue, fc2: torch.nn.Linear, head: torch.nn.Linear, tag: str
) -> QValue:
    """The last block's h + fc2(a) and the head, per token, with no requantisation between them:
    W_h (h + W₂a + b₂) + b_h = W_h·h + (W_h W₂)·a + (W_h b₂ + b_h), two linear layers with clear
    weights on one output grid (:func:`sum_of_linears`), summed: no lookups for the second
    residual (the output is decrypted and pooled by the client)."""
    skip = (h, head.weight, None)
    branch = (a, head.weight @ fc2.weight, head.weight @ fc2.bias + head.bias)
    return sum_of_linears(low, skip, branch, "head", tag)


Term = tuple[QValue, Tensor, "Tensor | None"]


def sum_of_linears(low: Lowering, first: Term, second: Term, name: str, tag: str) -> QValue:
    """x₁W₁ᵀ + b₁ + x₂W₂ᵀ + b₂ (each term ``(x, W, b or None)``) on one output grid: the coarser of
    the two grids on which a term's weights span the weight bits, so both terms' clear weights stay
    within them (the finer term loses some precision; a finer grid widened the output and, on
    digits, the parameters of the lookups that feed it). One integer addition, no lookup."""
    qmax_w = 2 ** (low.config.w_bits - 1) - 1

    def grid(x: QValue, w: torch.Tensor) -> float:  # the output scale at which max|w| is qmax_w
        return float(w.detach().abs().max()) * x.scale / qmax_w

    scale = max(grid(first[0], first[1]), grid(second[0], second[1])) or 1.0
    one = low.linear(*first, f"{name}.skip", tag, out_scale=scale)
    two = low.linear(*second, f"{name}.branch", tag, out_scale=scale)
    return low.add(one, two, name, tag)


def residual(
    low: Lowering, h: QValue, x: QValue, layer: torch.nn.Linear, name: str, tag: str
) -> QValue:
    """h + layer(x), then requantized to n bits: one table lookup per element.

    The branch's linear layer is quantized straight onto a refinement of h's grid: h is multiplied
    by a clear integer m (leveled) and the layer's integer weights are round(W·s_x·m / s_h), with m
    chosen so they span the weight bit width. The sum is then a plain integer addition, and the only
    lookup is the requantisation of the sum (no separate lookup to bring the branch onto h's scale).
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
    """The token mixer up to its output projection: (its value, the projection layer), by the
    lowering registered for the model's attention kind (quant/mixers/)."""
    try:
        return mixer_lowering(cfg.attention)(low, mixer, h, name, cfg)
    except NoLoweringError as exc:
        raise ExportError(str(exc)) from exc
