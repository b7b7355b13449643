"""Fold inference-time affine norms into the linear layers that read them.

A :class:`~models.layers.TokenBatchNorm` at inference is y = x·a + b per feature, so a linear layer
reading it computes (x·a + b)Wᵀ + c = x(W·diag(a))ᵀ + (Wb + c): the norm disappears into the
weights. Mean pooling is linear, so the final norm folds into the head. The folded model has
``norm=none`` and the same outputs (to float rounding); both FHE backends compile the folded model.
"""

from __future__ import annotations

import copy
import typing

import torch
from torch import nn

from models.config import NormKind
from models.layers import TokenBatchNorm
from models.transformer import Transformer


def _fold_into(norm: TokenBatchNorm, linears: list[nn.Linear]) -> None:
    a, b = (t.detach().double() for t in norm.inference_affine())
    for lin in linears:
        w = lin.weight.detach().double().clone()  # a copy: the weight is overwritten below
        bias = (
            lin.bias.detach().double()
            if lin.bias is not None
            else torch.zeros(w.shape[0], dtype=torch.float64)
        )
        lin.weight.data.copy_(w * a[None, :])
        if lin.bias is None:
            lin.bias = nn.Parameter(torch.zeros(w.shape[0]))
        lin.bias.data.copy_(bias + w @ b)


def _batchnorm(norm: nn.Module) -> TokenBatchNorm:
    assert isinstance(norm, TokenBatchNorm), f"norm=batchnorm built a {type(norm).__name__}"
    return norm


def _linears(modules) -> list[nn.Linear]:
    return [typing.cast(nn.Linear, m) for m in modules]


def fold_norms(model: Transformer) -> Transformer:
    """A copy of ``model`` with every BatchNorm folded into its readers (``norm=none``); other
    models are returned unchanged."""
    if model.config.norm is not NormKind.BATCHNORM:
        return model
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        for block in model.block_list():
            _fold_into(
                _batchnorm(block.norm1),
                _linears(typing.cast(typing.Any, block.mixer).input_linears()),
            )
            block.norm1 = nn.Identity()
            if block.has_ffn:
                _fold_into(_batchnorm(block.norm2), [block.ffn.fc1])
                block.norm2 = nn.Identity()
        _fold_into(_batchnorm(model.norm), [model.head])
        model.norm = nn.Identity()
    folded = Transformer(model.config.replace(norm=NormKind.NONE))
    folded.load_state_dict(model.state_dict())
    return folded.eval()
