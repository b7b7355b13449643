"""Building blocks shared by every encoder: norms and the feed-forward network."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.config import Activation, NormKind, TransformerConfig


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the feature axis of (B, T, C) activations, statistics pooled over batch and
    tokens.

    At inference it is the per-feature affine map x·a + b (:meth:`inference_affine`), which
    :func:`models.fold.fold_norms` merges into the linear layers that read it: normalisation that
    costs nothing under encryption (no encrypted 1/√variance, unlike LayerNorm)."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)

    def inference_affine(self) -> tuple[Tensor, Tensor]:
        """(a, b) with eval-mode output x·a + b."""
        assert self.running_var is not None and self.running_mean is not None  # tracked stats
        a = self.weight / torch.sqrt(self.running_var + self.eps)
        return a, self.bias - self.running_mean * a


def make_norm(config: TransformerConfig) -> nn.Module:
    """LayerNorm, foldable BatchNorm, or identity when ``norm=none`` (no encrypted 1/√var)."""
    if config.norm is NormKind.LAYERNORM:
        return nn.LayerNorm(config.d_model)
    if config.norm is NormKind.BATCHNORM:
        return TokenBatchNorm(config.d_model)
    return nn.Identity()


QUAD_COEFFS = (0.5, 0.25, 0.125)  # quad(x) = c₀ + c₁x + c₂x²


def quad(x: Tensor) -> Tensor:
    """0.125x² + 0.25x + 0.5: the degree-2 stand-in for GELU of MPCFormer (Li et al., 2023), which
    a CKKS program evaluates exactly (one squaring) where GELU needs a fitted polynomial."""
    c0, c1, c2 = QUAD_COEFFS
    return c2 * x * x + c1 * x + c0


class Quad(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return quad(x)


def activation_fn(kind: Activation):
    """The FFN activation as a function of a tensor (the integer program's tables read it)."""
    return {
        Activation.RELU: torch.relu,
        Activation.GELU: nn.functional.gelu,
        Activation.QUAD: quad,
    }[kind]


def make_activation(kind: Activation) -> nn.Module:
    return {Activation.RELU: nn.ReLU, Activation.GELU: nn.GELU, Activation.QUAD: Quad}[kind]()


class FeedForward(nn.Module):
    """H = act(X W₁ᵀ + b₁) W₂ + b₂ (Inhibitor paper Eq. 4 with ReLU; GELU optional)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.ffn_dim)
        self.act = make_activation(config.ffn_activation)
        self.fc2 = nn.Linear(config.ffn_dim, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.track_range = False  # activation range loss (PowerSoftmax paper, Alg. 1 step 2)
        self.range_threshold = 0.0
        self.last_range: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        u = self.fc1(x)
        if self.track_range:
            self.last_range = (
                (u.abs().flatten(1).amax(dim=1) - self.range_threshold).clamp_min(0).mean()
            )
        return self.drop(self.fc2(self.act(u)))
