"""Segment pooling: a review's words cut into T contiguous segments, each the mean of its words'
embeddings (the text front end of :mod:`models.text`; the token model computes the same in its
forward pass)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["segment_matrix", "segment_means"]


def segment_matrix(ids: Tensor, seq_len: int) -> Tensor:
    """(B, seq_len, L): row t averages the words of segment t of each sample's non-padding prefix.

    With n real words (right-padded ids, 0 = padding; n = 0 counts as one padding word), segment
    t covers words [⌊t·n/T⌋, max(⌊(t+1)·n/T⌋, ⌊t·n/T⌋ + 1)): contiguous, in order, never empty (a
    review of fewer than T words repeats words)."""
    B, L = ids.shape
    n = (ids != 0).sum(1).clamp_min(1)[:, None]  # (B, 1)
    t = torch.arange(seq_len, device=ids.device)[None]  # (1, T)
    start = torch.div(t * n, seq_len, rounding_mode="floor")
    end = torch.maximum(torch.div((t + 1) * n, seq_len, rounding_mode="floor"), start + 1)
    w = torch.arange(L, device=ids.device)[None, None]  # (1, 1, L)
    inside = (w >= start[..., None]) & (w < end[..., None])  # (B, T, L)
    return inside.float() / (end - start)[..., None].float()


def segment_means(embedded: Tensor, ids: Tensor, seq_len: int) -> Tensor:
    """(B, L, C) word embeddings → (B, seq_len, C) segment means (:func:`segment_matrix`)."""
    return segment_matrix(ids, seq_len).to(embedded.dtype) @ embedded
