"""Causal attention in the integer program (PowerSoftmax paper Eq. 11's mask M_ij = [j <= i]).

The mask is public (it depends on positions only), so it is folded into the program as clear 0/1
matrices on the flattened (query, key) axis: the T(T + 1)/2 kept pairs are gathered before a
table lookup and scattered back (or summed per query) after it. Gathers and scatters are clear
integer matrix products: no PBS, and the lookups run on the kept pairs only (about half of T²).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from models.config import causal_mean_factors
from quant.lowering import Lowering, QValue


@cache
def causal_pairs(T: int) -> tuple[tuple[int, int], ...]:
    """The kept (query i, key j) pairs, j <= i, row by row."""
    return tuple((i, j) for i in range(T) for j in range(i + 1))


def _gather_matrix(T: int) -> np.ndarray:
    """(P, T·T): row p picks entry i·T + j of a flattened (T, T) score matrix."""
    g = np.zeros((len(causal_pairs(T)), T * T), dtype=np.int64)
    for p, (i, j) in enumerate(causal_pairs(T)):
        g[p, i * T + j] = 1
    return g


def _pair_matrix(T: int, side: int) -> np.ndarray:
    """(P, T): row p picks position i (``side`` 0, the query) or j (``side`` 1, the key)."""
    m = np.zeros((len(causal_pairs(T)), T), dtype=np.int64)
    for p, pair in enumerate(causal_pairs(T)):
        m[p, pair[side]] = 1
    return m


def gather(low: Lowering, x: QValue, name: str, tag: str) -> QValue:
    """(nh, T, T, ...) -> (nh, P, ...): the kept pairs of a per-pair tensor (a trailing axis of
    size 1 is added to a (nh, T, T) one)."""
    nh, T = x.shape[0], x.shape[1]
    rest = x.shape[3:] or (1,)
    flat = low.reshape(x, (nh, T * T, *rest), f"{name}.flat")
    return low.matmul_left(_gather_matrix(T), flat, name, tag, integer=True)


def scatter(low: Lowering, x: QValue, T: int, name: str, tag: str) -> QValue:
    """(nh, P, 1) -> (nh, T, T): the kept pairs back in place, 0 where the mask removes a key."""
    full = low.matmul_left(_gather_matrix(T).T.copy(), x, name, tag, integer=True)
    return low.reshape(full, (x.shape[0], T, T), f"{name}.square")


def keys(low: Lowering, x: QValue, name: str, tag: str) -> QValue:
    """(nh, T, d) -> (nh, P, d): each pair's key row x_j."""
    return low.matmul_left(_pair_matrix(x.shape[1], 1), x, name, tag, integer=True)


def sum_per_query(
    low: Lowering, x: QValue, T: int, name: str, tag: str, mean_len: int | None = None
) -> QValue:
    """(nh, P, d) -> (nh, T, d): Σ over each query's kept keys (j <= i); ``mean_len`` (the
    model's seq_len, ``TransformerConfig.inhibitor_mean``): times m_i / n ≈ 1 / (i + 1) of
    :func:`models.config.causal_mean_factors`, the clear integers m_i in the same matrix and n in
    the scale (no lookup; a wider sum)."""
    rows = _pair_matrix(T, 0).T.copy()  # (T, P)
    if mean_len is None:
        return low.matmul_left(rows, x, name, tag, integer=True)
    m, n = causal_mean_factors(mean_len)
    return low.matmul_left(rows * m[:T, None], x, name, tag, integer=True, denominator=n)


def diagonal_filled(low: Lowering, s: QValue, name: str, tag: str) -> QValue:
    """(nh, T, T) -> (nh, T, T) with every removed score s_ij (j > i) replaced by s_ii, a kept one:
    the row maximum of the result is the maximum over the kept keys (no PBS)."""
    nh, T, _ = s.shape
    m = np.zeros((T * T, T * T), dtype=np.int64)
    for i in range(T):
        for j in range(T):
            m[i * T + j, i * T + min(i, j)] = 1
    flat = low.reshape(s, (nh, T * T, 1), f"{name}.flat")
    filled = low.matmul_left(m, flat, name, tag, integer=True)
    return low.reshape(filled, (nh, T, T), f"{name}.square")


def kept_per_query(T: int) -> np.ndarray:
    """(T, 1): how many keys query i keeps (i + 1)."""
    return np.arange(1, T + 1, dtype=np.float64)[:, None]
