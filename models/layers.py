"""Building blocks shared by every encoder: norms and the feed-forward network."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.config import Activation, NormKind, TransformerConfig
from models.polynomials import quad


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


class RangedLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (the same parameters and checkpoint keys) that, while training tracks
    ranges, records the norm range loss: max(0, log max σ² − log min σ² − log κ) over the batch's
    positions, σ² + eps each (κ: ``range_threshold`` holds log κ).

    Under CKKS a LayerNorm's 1/√(σ² + eps) runs Newton-type steps over the calibrated interval of
    σ² + eps, and the steps grow with its max/min ratio (fhe.ckks.approx.invsqrt_plan: 1 step for
    a ratio within about 5x after the compiler's margin, 3 for 40x). The hinge keeps the ratio
    near κ, as the PowerSoftmax paper's range losses keep the attention scores and activation
    inputs in a polynomial's interval (its Alg. 1); issue 28's 2-block model went from 2-4 steps
    per norm to 1 with κ = 3, and then to a cubic (fhe.ckks.approx.invsqrt_poly: a level fewer;
    benchmarks/results/ckks_deep.md)."""

    def __init__(self, d_model: int) -> None:
        super().__init__(d_model)
        self.track_range = False
        self.range_threshold = 0.0  # log κ
        self.last_range: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.track_range:
            log_var = torch.log(x.var(-1, unbiased=False) + self.eps)
            self.last_range = (log_var.max() - log_var.min() - self.range_threshold).clamp_min(0)
        return super().forward(x)


def make_norm(config: TransformerConfig) -> nn.Module:
    """LayerNorm, foldable BatchNorm, or identity when ``norm=none`` (no encrypted 1/√var)."""
    if config.norm is NormKind.LAYERNORM:
        return RangedLayerNorm(config.d_model)
    if config.norm is NormKind.BATCHNORM:
        return TokenBatchNorm(config.d_model)
    return nn.Identity()


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
