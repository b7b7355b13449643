"""Uniform quantizers: float <-> integer with a scale (and, for inputs, a zero-point)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.config import Pooling
from models.pooling import pool_words


@dataclass(frozen=True)
class Quantizer:
    """q = clip(round(x / scale) + zero_point, qmin, qmax); x ≈ (q - zero_point) * scale."""

    scale: float
    zero_point: int
    n_bits: int
    signed: bool

    @property
    def qmin(self) -> int:
        return -(2 ** (self.n_bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        return 2 ** (self.n_bits - 1) - 1 if self.signed else 2**self.n_bits - 1

    @classmethod
    def fit(cls, lo: float, hi: float, n_bits: int, symmetric: bool = True) -> Quantizer:
        """Symmetric: signed, zero-point 0, scale = max|x| / qmax (unsigned when lo >= 0).
        Asymmetric: unsigned, the range [min(lo, 0), max(hi, 0)] spread over 2^n levels."""
        lo, hi = float(min(lo, 0.0)), float(max(hi, 0.0))
        if symmetric:
            signed = lo < 0
            qmax = 2 ** (n_bits - 1) - 1 if signed else 2**n_bits - 1
            scale = max(abs(lo), abs(hi)) / qmax
            return cls(scale if scale > 0 else 1.0, 0, n_bits, signed)
        scale = (hi - lo) / (2**n_bits - 1)
        scale = scale if scale > 0 else 1.0
        return cls(scale, int(round(-lo / scale)), n_bits, False)

    def quantize_np(self, x: np.ndarray) -> np.ndarray:
        q = np.round(np.asarray(x, dtype=np.float64) / self.scale) + self.zero_point
        return np.clip(q, self.qmin, self.qmax).astype(np.int64)

    def fake(self, x: torch.Tensor) -> torch.Tensor:
        """Quantize-dequantize in torch, with the zero-point removed: returns (q - zp) * scale."""
        q = torch.clamp(torch.round(x / self.scale) + self.zero_point, self.qmin, self.qmax)
        return (q - self.zero_point) * self.scale

    def clipped_count(self, x: np.ndarray) -> int:
        q = np.round(np.asarray(x, dtype=np.float64) / self.scale) + self.zero_point
        return int(((q < self.qmin) | (q > self.qmax)).sum())


def quantize_weight(w: np.ndarray, n_bits: int, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric signed weights; ``w`` is (in, out) and per-channel scales are per output column.

    Returns (integer weights, scale of shape (out,) or ()).
    """
    qmax = 2 ** (n_bits - 1) - 1
    amax = np.abs(w).max(axis=0) if per_channel else np.abs(w).max()
    scale = np.where(amax > 0, amax / qmax, 1.0)
    return np.clip(np.round(w / scale), -qmax, qmax).astype(np.int64), np.asarray(
        scale, dtype=np.float64
    )


def decode_output(
    y: np.ndarray,
    scale,
    client_pools: bool,
    masked: bool = False,
    pooling: Pooling | str = Pooling.MEAN,
) -> np.ndarray:
    """The client's decoding of the program's integer output: times its scale, then (for a program
    that outputs per-token logits, ``client_pools``) summed over the token axis. ``masked``: the
    last column holds the key mask, and the rows are pooled over the words by ``pooling`` (the
    masked mean of a padded text model, quant.export.masked_pooled_head, or the last word's
    row)."""
    y = np.asarray(y, dtype=np.float64)
    if masked:
        return pool_words(y[..., :-1] * np.asarray(scale, dtype=np.float64), y[..., -1:], pooling)
    out = y * np.asarray(scale, dtype=np.float64)
    return out.sum(axis=-2) if client_pools else out
