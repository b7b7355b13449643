"""Shared multi-head plumbing: Q/K/V projections, head split and merge, output projection."""

from __future__ import annotations

from torch import Tensor, nn

from models.config import TransformerConfig


class MultiHeadAttention(nn.Module):
    """Subclasses implement :meth:`attend` on per-head tensors ``(B, nh, T, dh)``."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.d_head = config.d_head
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def input_linears(self) -> list[nn.Linear]:
        """The linear layers that read the mixer's input (a preceding norm folds into them)."""
        return [self.q_proj, self.k_proj, self.v_proj]

    def split(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, nh, T, dh)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape  # batch, sequence length, d_model
        q, k, v = self.split(self.q_proj(x)), self.split(self.k_proj(x)), self.split(self.v_proj(x))
        h = self.attend(q, k, v)  # (B, nh, T, dh)
        return self.out_proj(h.transpose(1, 2).reshape(B, T, C))  # (B, T, C)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError
