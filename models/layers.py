"""Building blocks shared by every encoder: norms and the feed-forward network."""

from __future__ import annotations

from torch import Tensor, nn

from models.config import Activation, NormKind, TransformerConfig


def make_norm(config: TransformerConfig) -> nn.Module:
    """LayerNorm, or identity when ``norm=none`` (the TFHE-friendly choice: no encrypted 1/√var)."""
    return nn.LayerNorm(config.d_model) if config.norm is NormKind.LAYERNORM else nn.Identity()


def make_activation(kind: Activation) -> nn.Module:
    return nn.ReLU() if kind is Activation.RELU else nn.GELU()


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
            self.last_range = (u.abs().flatten(1).amax(dim=1) - self.range_threshold).clamp_min(0).mean()
        return self.drop(self.fc2(self.act(u)))
