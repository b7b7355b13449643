"""Fold inference-time affine norms (and the Inhibitor's means, :func:`fold_means`) into the
linear layers that read them.

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
    """A copy of ``model`` with every BatchNorm folded into its readers (``norm=none``) and the
    Inhibitor's means without a causal mask into its output projections (:func:`fold_means`);
    other models are returned unchanged."""
    model = fold_means(model)
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


def fold_means(model: Transformer) -> Transformer:
    """A copy of an ``inhibitor_mean`` model without the causal mask as the sums model it equals:
    every query's sums times 1 / T (:func:`models.config.inhibitor_mean_scale`) are the sums read
    by an output projection W / T. The programs (TFHE, CKKS) are lowered from this form; QAT
    trains it too, where its program came 0.1-0.9 points closer to the float model than QAT on
    the unfolded means did, on every seed of 0-2 (one-off trials, docs/text.md). The causal means
    stay: each query has its own factor, which one projection cannot hold."""
    cfg = model.config
    if not cfg.inhibitor_mean or cfg.causal:
        return model
    folded = Transformer(cfg.replace(inhibitor_mean=False))
    folded.load_state_dict(model.state_dict())
    with torch.no_grad():
        for block in folded.block_list():
            typing.cast(typing.Any, block.mixer).out_proj.weight.mul_(1.0 / cfg.seq_len)
    return folded.eval()
