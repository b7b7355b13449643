"""Quantization-aware training through brevitas (the only module that imports it).

``prepare_qat`` swaps every ``nn.Linear`` for an input-quantizing ``QuantIdentity`` followed by a
brevitas ``QuantLinear`` at the requested bit width (and quantizes the Q/K/V outputs the attention
math reads), so fine-tuning sees the rounding of the integer program. Brevitas's per-tensor weight
scale (max|W| / (2^(b-1) - 1)) is exactly the grid :func:`quant.quantizer.quantize_weight` uses, so
``strip_qat`` copies the fine-tuned float weights back into a plain model whose PTQ export at the
same bit width reproduces the trained weight grid.
"""

from __future__ import annotations

import copy
import warnings

from torch import nn

from models.attention.base import MultiHeadAttention
from models.transformer import Transformer


def _brevitas():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import brevitas.nn as qnn
    return qnn


class QATLinear(nn.Module):
    """QuantIdentity(b) → QuantLinear(b) [→ QuantIdentity(b) for attention projections]."""

    def __init__(self, linear: nn.Linear, bits: int, quantize_output: bool = False) -> None:
        super().__init__()
        qnn = _brevitas()
        self.in_quant = qnn.QuantIdentity(bit_width=bits, return_quant_tensor=False)
        self.linear = qnn.QuantLinear(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            weight_bit_width=bits,
        )
        self.linear.weight.data.copy_(linear.weight.data)
        if linear.bias is not None:
            self.linear.bias.data.copy_(linear.bias.data)
        self.out_quant = (
            qnn.QuantIdentity(bit_width=bits, return_quant_tensor=False)
            if quantize_output
            else None
        )

    def forward(self, x):
        y = self.linear(self.in_quant(x))
        return self.out_quant(y) if self.out_quant is not None else y


def prepare_qat(model: Transformer, bits: int) -> Transformer:
    """A copy of ``model`` whose linear layers are brevitas quantized layers at ``bits`` bits."""
    if not 2 <= bits <= 16:
        raise ValueError(f"--qat-bits must be in [2, 16], got {bits}")
    model = copy.deepcopy(model)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                qkv = isinstance(module, MultiHeadAttention) and name in (
                    "q_proj",
                    "k_proj",
                    "v_proj",
                )
                setattr(module, name, QATLinear(child, bits, quantize_output=qkv))
    _retie(model)
    return model


def _retie(model: Transformer) -> None:
    """A tied K = Q projection is one module under two names; replacing modules by name (which
    visits it once) must keep the two names on one module."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.retie()


def strip_qat(model: Transformer) -> Transformer:
    """Back to plain ``nn.Linear`` layers holding the fine-tuned float weights."""
    model = copy.deepcopy(model)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, QATLinear):
                lin = nn.Linear(
                    child.linear.in_features,
                    child.linear.out_features,
                    bias=child.linear.bias is not None,
                )
                lin.weight.data.copy_(child.linear.weight.data)
                if child.linear.bias is not None:
                    lin.bias.data.copy_(child.linear.bias.data)
                setattr(module, name, lin)
    _retie(model)
    return model
