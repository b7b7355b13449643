"""Segment pooling: a review's words cut into T contiguous segments, each the mean of its words'
embeddings (the text front end of :mod:`models.text`; the token model computes the same in its
forward pass), optionally scaled to unit RMS (:func:`unit_rms`)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["segment_matrix", "segment_means", "unit_rms", "word_vectors"]

RMS_EPS = 1e-6  # keeps an all-zero vector (a padding segment) at zero


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


def segment_means(embedded: Tensor, ids: Tensor, seq_len: int, normalize: bool = False) -> Tensor:
    """(B, L, C) word embeddings → (B, seq_len, C) segment means (:func:`segment_matrix`), each
    scaled to unit RMS with ``normalize`` (:func:`unit_rms`)."""
    means = segment_matrix(ids, seq_len).to(embedded.dtype) @ embedded
    return unit_rms(means) if normalize else means


def word_vectors(embedded: Tensor, normalize: bool = False) -> Tensor:
    """(B, L, C) word embeddings of a padded input, each at unit RMS with ``normalize`` (every word
    a segment of one; padding, a zero vector, stays 0): the padded twin of :func:`segment_means`."""
    return unit_rms(embedded) if normalize else embedded


def unit_rms(v: Tensor) -> Tensor:
    """``v / sqrt(mean(v², -1) + ε)``: every vector of the last axis at RMS 1 (a zero one stays 0).

    Why for segments: the mean of a segment of k words shrinks with k (the words' embeddings
    partly cancel), so a one-sentence review's segments, single words, are several times larger
    than a long review's. Scaled to one RMS, both reach the encrypted program at the same size, and
    a TFHE program calibrated on long reviews does not refuse short ones (docs/text.md). A padded
    word-level model scales each word's vector the same way (a segment of one word)."""
    return v * torch.rsqrt((v * v).mean(-1, keepdim=True) + RMS_EPS)
