"""Shared multi-head plumbing: Q/K/V projections, head split and merge, output projection."""

from __future__ import annotations

from torch import Tensor, nn

from models.attention import functional as AF
from models.config import TransformerConfig


class MultiHeadAttention(nn.Module):
    """Subclasses implement :meth:`attend` on per-head tensors ``(B, nh, T, dh)``; those whose
    attention takes a mask (``supports_mask``) receive one, boolean and broadcastable to
    ``(B, nh, T, T)``: True where query i may attend key j."""

    supports_mask = False

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        # the range loss (PowerSoftmax paper Eq. 9): kinds whose scores meet a polynomial under
        # CKKS (PowerSoftmax's x^p, softmax's exp) record max |score| here while training tracks it
        self.track_range = False
        self.range_threshold = 0.0
        self.last_range: Tensor | None = None
        self.n_heads = config.n_heads
        self.d_head = config.d_head
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.tie_qk = config.tie_qk
        # tied: one module under both names (checkpoints and the CKKS lowering read k_proj.*)
        self.k_proj = self.q_proj if self.tie_qk else nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def record_range(self, scores: Tensor) -> None:
        """Keep Eq. (9)'s summand for ``scores`` ``(B, nh, T, T)`` when range tracking is on."""
        if self.track_range:
            self.last_range = AF.power_softmax_range(scores, self.range_threshold)

    def input_linears(self) -> list[nn.Linear]:
        """The linear layers that read the mixer's input (a preceding norm folds into them)."""
        if self.tie_qk:
            return [self.q_proj, self.v_proj]
        return [self.q_proj, self.k_proj, self.v_proj]

    def retie(self) -> None:
        """Point k_proj at q_proj again (after a pass that replaced modules by name)."""
        if self.tie_qk:
            self.k_proj = self.q_proj

    def split(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, nh, T, dh)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        B, T, C = x.shape  # batch, sequence length, d_model
        q, v = self.split(self.q_proj(x)), self.split(self.v_proj(x))
        k = q if self.tie_qk else self.split(self.k_proj(x))
        if mask is None:
            h = self.attend(q, k, v)  # (B, nh, T, dh)
        elif self.supports_mask:
            h = self.attend(q, k, v, mask)
        else:
            raise ValueError(f"{type(self).__name__} takes no attention mask")
        return self.out_proj(h.transpose(1, 2).reshape(B, T, C))  # (B, T, C)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
    ) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError
