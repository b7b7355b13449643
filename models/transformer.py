"""The transformer encoder classifier/regressor whose attention kind is a config field."""

from __future__ import annotations

import typing

import torch
from torch import Tensor, nn

from models.attention import build_attention
from models.config import InputKind, Pooling, TransformerConfig
from models.layers import FeedForward, make_norm
from models.segments import segment_means, word_vectors


def last_kept(h: Tensor, kept: Tensor) -> Tensor:
    """(B, T, C) outputs and their (B, T) key mask → (B, C), the row of the last kept position
    (the last word of a right-padded text; position 0 when nothing is kept)."""
    order = torch.arange(h.shape[-2], device=h.device)
    last = (kept.to(torch.long) * order).argmax(-1)  # (B,)
    return h[torch.arange(h.shape[0], device=h.device), last]


def _takes_mask(mixer: nn.Module, mask: Tensor | None) -> bool:
    return mask is not None and getattr(mixer, "supports_mask", False)


class Block(nn.Module):
    """Pre-norm block: x + mix(norm(x)), then x + FFN(norm(x)) (no FFN for GEGLU-only, Eqs.
    12-14)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm1 = make_norm(config)
        self.mixer = build_attention(config)
        self.has_ffn = config.has_ffn
        if self.has_ffn:
            self.norm2 = make_norm(config)
            self.ffn = FeedForward(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:  # (B, T, C)
        """``mask``: the attention mask (:meth:`Transformer.attention_mask`), for the kinds that
        take one; token-local mixers and DCT-Former's transform mix without it."""
        h = self.norm1(x)
        x = x + self.drop(self.mixer(h, mask) if _takes_mask(self.mixer, mask) else self.mixer(h))
        if self.has_ffn:
            x = x + self.ffn(self.norm2(x))
        return x


class Transformer(nn.Module):
    """Embedding (token table or linear patch projection) + learned positions, N blocks, final norm,
    pooling (the mean over positions, padding excluded; or the last word's, ``Pooling.LAST``) and a
    linear head."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        embed = (
            nn.Embedding(config.in_features, config.d_model, padding_idx=0)
            if config.input_kind is InputKind.TOKENS
            else nn.Linear(config.in_features, config.d_model)
        )
        self.pos = nn.Parameter(torch.randn(config.seq_len, config.d_model) * 0.02)
        if isinstance(embed, nn.Linear) and config.input_kind is InputKind.EMBEDDED:
            with torch.no_grad():  # the client embedded: the identity (mask column dropped)
                embed.weight.copy_(torch.eye(config.d_model, config.in_features))
                embed.bias.zero_()
                self.pos.zero_()
        self.embed: nn.Module = embed
        self.requires_grad_(True)  # an embedded model's input layer stays fixed (requires_grad_)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = make_norm(config)
        self.head = nn.Linear(config.d_model, config.n_outputs)

    def block_list(self) -> list[Block]:
        """The blocks, typed (``self.blocks`` is a ModuleList of them)."""
        return [typing.cast(Block, b) for b in self.blocks]

    def requires_grad_(self, requires_grad: bool = True) -> Transformer:
        """As :meth:`torch.nn.Module.requires_grad_`, except that an embedded model's input layer
        (the identity and zero positions: the client computed them) never trains, whoever asks."""
        super().requires_grad_(requires_grad)
        if self.config.input_kind is InputKind.EMBEDDED:
            self.embed.requires_grad_(False)
            self.pos.requires_grad_(False)
        return self

    def features(self, x: Tensor) -> Tensor:
        """Encoder output before pooling, (B, T, C)."""
        T, words = x.shape[1], self.config.words
        if (words or self.config.seq_len) < T:
            raise ValueError(
                f"input has {T} positions but the model was built for "
                f"{f'words={words}' if words else f'seq_len={self.config.seq_len}'}"
            )
        mask = self.attention_mask(x)
        if words:  # the text front end (models.text): segment means of the word embeddings
            means = segment_means(self.embed(x), x, self.config.seq_len, self.config.segment_norm)
            h = means + self.pos
        else:  # with segment_norm (padded words): each word's vector at unit RMS
            h = word_vectors(self.embed(x), self.config.segment_norm) + self.pos[:T]
        for block in self.blocks:
            h = block(h, mask)
        return self.norm(h)

    def attention_mask(self, x: Tensor) -> Tensor | None:
        """(B or 1, 1, T, T), True where query i may attend key j: keys that are not padding (token
        inputs with ``mask_padding``) and, with ``causal``, j <= i (PowerSoftmax paper Eq. 11's
        M); None when nothing is masked."""
        cfg = self.config
        T = cfg.seq_len if cfg.words else x.shape[1]
        mask = None
        keep = self.kept_positions(x)
        if keep is not None:
            mask = keep[:, None, None, :]  # (B, 1, 1, T): padding keys out
        if self.config.causal:
            tril = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # (T, T)
            mask = tril[None, None] if mask is None else mask & tril
        return mask

    def kept_positions(self, x: Tensor) -> Tensor | None:
        """(B, T) bool, False at padding, for a model that masks it (``mask_padding``): token ids
        0, or an embedded input's key mask column (the client's, :mod:`models.text`); else None."""
        cfg = self.config
        if not cfg.mask_padding or cfg.words:
            return None
        if cfg.input_kind is InputKind.TOKENS:
            return x != 0
        if cfg.key_mask_column:
            return x[..., -1] > 0.5
        return None

    def forward(self, x: Tensor) -> Tensor:
        h = self.features(x)  # (B, T, C)
        kept = self.kept_positions(x)
        if self.config.pooling is Pooling.LAST and kept is not None:  # the next word's logits
            return self.head(last_kept(h, kept))
        if kept is not None:
            keep = kept.unsqueeze(-1).to(h.dtype)  # (B, T, 1): mean over non-padding positions
            pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        else:
            pooled = h.mean(dim=1)
        return self.head(pooled)  # (B, n_outputs)
