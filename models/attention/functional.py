"""Pure functional forms of every attention variant: the project's public math API.

Every function takes and returns torch tensors of shape ``(..., T, d)`` (scores are ``(..., T, T)``)
in any float dtype, with no module state, so tests and both FHE backends can call the math directly.

Papers (full texts in ``../shared/papers``):

- Inhibitor: Brännvall, "The Inhibitor: ReLU and Addition-Based Attention for Efficient Transformers
  under Fully Homomorphic Encryption on the Torus" (Eqs. 5-10).
- PowerSoftmax: Zimerman et al., "Power-Softmax: Towards Secure LLM Inference over Encrypted Data"
  (Eqs. 2, 5, 6, 7, 9, 11).
- DCT-Former: Scribano et al., "DCT-Former: Efficient Self-Attention with Discrete Cosine Transform"
  (Algorithms 1 and 2).
- Activator: "Activator: GLU Activation Function as the Core Component of a Vision Transformer"
  (Eqs. 8-10).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "dot_product",
    "inhibitor",
    "inhibitor_broadcast",
    "power_softmax",
    "power_softmax_range",
    "dct_matrix",
    "dct_ii",
    "idct_ii",
    "dct_attention",
    "geglu",
]


# --------------------------------------------------------------------------------------------------
# Dot-product attention
# --------------------------------------------------------------------------------------------------
def dot_product(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(Q Kᵀ / √d) V (Inhibitor paper Eq. 3; PowerSoftmax paper Eq. 1).

    ``mask`` is boolean and broadcastable to ``(..., T, T)``: True keeps a score, False removes it.
    """
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (..., T, T)
    if mask is None:
        return torch.softmax(scores, dim=-1) @ v  # (..., T, d)
    scores = scores.masked_fill(~mask.bool(), float("-inf"))
    # a row with every key masked (a sequence of padding only) attends to nothing: 0, not NaN
    return torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0) @ v  # (..., T, d)


# --------------------------------------------------------------------------------------------------
# Inhibitor
# --------------------------------------------------------------------------------------------------
def _manhattan_scores(q: Tensor, k: Tensor, gamma: float, alpha: float) -> Tensor:
    """Z'_ij = (Z_ij - α)⁺ with Z_ij = Σ_k |Q_ik - K_jk| / γ (Eq. 5 and the shifted score)."""
    z = torch.cdist(q.contiguous(), k.contiguous(), p=1) / gamma  # (..., T, T)  Eq. (5), fused
    return torch.relu(z - alpha) if alpha else z


def inhibitor(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: float,
    alpha: float = 0.0,
    signed: bool = False,
    mask: Tensor | None = None,
) -> Tensor:
    """Inhibitor attention in its memory-saving form (Eqs. 8-10): no ``(..., T, T, d)`` tensor.
    With a ``mask`` (boolean, broadcastable to ``(..., T, T)``; False removes key j from query i's
    sums), :func:`inhibitor_broadcast`: the memory-saving sums cannot skip a key.

    Unsigned (Eq. 9):  H_ik = ½ Σ_j V_jk − ½ Σ_j Z_ij + ½ Σ_j |V_jk − Z_ij|
    Signed   (Eq. 10): H_ik = ½ Σ_j V_jk + ½ Σ_j |V⁺_jk − Z_ij| − ½ Σ_j |V⁻_jk + Z_ij|

    The sums Σ_j |a_jk − Z_ij| are pairwise L1 distances between the rows of Z and the columns of
    V, computed by the fused ``torch.cdist``. Equal to :func:`inhibitor_broadcast` up to rounding.
    """
    if mask is not None:
        return inhibitor_broadcast(q, k, v, gamma, alpha, signed, mask)
    z = _manhattan_scores(q, k, gamma, alpha)  # (..., T, T)
    vt = v.transpose(-2, -1).contiguous()  # (..., d, T)
    half_sum_v = 0.5 * v.sum(dim=-2, keepdim=True)  # (..., 1, d)
    if not signed:
        half_sum_z = 0.5 * z.sum(dim=-1, keepdim=True)  # (..., T, 1)
        return half_sum_v - half_sum_z + 0.5 * torch.cdist(z, vt, p=1)  # Eq. (9)
    v_pos, v_neg = torch.relu(vt), -torch.relu(-vt)  # V⁺, V⁻
    return (
        half_sum_v + 0.5 * torch.cdist(z, v_pos, p=1) - 0.5 * torch.cdist(-z, v_neg, p=1)
    )  # Eq. (10)


def inhibitor_broadcast(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: float,
    alpha: float = 0.0,
    signed: bool = False,
    mask: Tensor | None = None,
) -> Tensor:
    """Inhibitor attention written as the paper states it (Eqs. 5-7), with a broadcast (T, T, d)
    tensor.

    Eq. (6): H_ik = Σ_j (V_jk − Z'_ij)⁺;  Eq. (7): H_ik = Σ_j (V⁺_jk − Z'_ij)⁺ + Σ_j (V⁻_jk +
    Z'_ij)⁻. Memory O(T²d): kept for evaluation and as the reference of the integer lowering.
    ``mask`` (boolean, broadcastable to ``(..., T, T)``): the sums over j skip the keys it removes.
    """
    diff = (q.unsqueeze(-2) - k.unsqueeze(-3)).abs()  # (..., T, T, d)
    z = diff.sum(-1) / gamma  # (..., T, T)  Eq. (5)
    if alpha:
        z = torch.relu(z - alpha)
    zz = z.unsqueeze(-1)  # (..., T, T, 1)
    vv = v.unsqueeze(-3)  # (..., 1, T, d)
    keep = 1.0 if mask is None else mask.to(z.dtype).unsqueeze(-1)  # (..., T, T, 1)
    if not signed:
        return (torch.relu(vv - zz) * keep).sum(-2)  # Eq. (6)
    pos = torch.relu(torch.relu(vv) - zz)
    neg = -torch.relu(-(-torch.relu(-vv) + zz))  # (V⁻ + Z)⁻
    return ((pos + neg) * keep).sum(-2)  # Eq. (7)


# --------------------------------------------------------------------------------------------------
# PowerSoftmax
# --------------------------------------------------------------------------------------------------
def power_softmax(
    x: Tensor,
    p: int = 4,
    eps: float = 0.0,
    stable: bool = False,
    length_agnostic: bool = False,
    mask: Tensor | None = None,
    delta: float = 1e-6,
) -> Tensor:
    """PowerSoftmax over the last axis of the scores ``x`` (PowerSoftmax paper).

    - Eq. (11), masked form: ``x ⊙ M`` with ``M`` in [0, 1] (multiplicative, not additive −∞).
    - Eq. (6), stable form: ``x / c`` with ``c = ‖x‖∞ + δ`` per row (the result is invariant to c).
    - Eq. (2): ``x_j^p / Σ_i x_i^p`` for an even ``p``.
    - Eq. (5), ε-Lipschitz division: ``|x_j^p| / (ε + ‖x^p‖₁)``.
    - Eq. (7), length-agnostic form: ``(x_j^p / L) / (ε + Mean_i x_i^p)``, where ``1/L`` is a clear
      constant, so the divisor stays O(1) as the length L grows. With ε = 0 it equals Eq. (2).
      With a mask, ε counts once per kept key, ``(x_j^p / L) / (ε·Σ_i M_i / L + Mean_i x_i^p)``,
      so a row's weights do not depend on how many keys were masked (a padded sequence attends
      as the unpadded one; under CKKS, Σ_i M_i is a sum of the encrypted mask, no product).
    """
    if p <= 0 or p % 2:
        raise ValueError(f"PowerSoftmax needs a positive even power p, got p={p}")
    if mask is not None:
        x = x * mask.to(x.dtype)  # Eq. (11)
    if stable:
        x = x / (x.abs().amax(dim=-1, keepdim=True) + delta)  # Eq. (6)
    xp = x.pow(p)  # σ_p, non-negative for an even p
    if length_agnostic:
        length = x.shape[-1]
        if mask is None:
            return (xp / length) / (eps + xp.mean(dim=-1, keepdim=True))  # Eq. (7)
        kept = mask.to(x.dtype).expand_as(x).sum(dim=-1, keepdim=True)  # keys per row
        return (xp / length) / (eps * kept / length + xp.mean(dim=-1, keepdim=True))
    return xp / (eps + xp.sum(dim=-1, keepdim=True))  # Eqs. (2), (5)


def power_softmax_range(scores: Tensor, threshold: float = 0.0) -> Tensor:
    """max_c |z_c| for one layer's PowerSoftmax inputs ``(B, C, T, T)``: the summand of Eq. (9).

    Returns the batch mean of the per-example maximum over heads and positions; summing this over
    layers gives the range loss L_PowerSoftmax. ``threshold`` > 0 turns it into a hinge, (max − t)⁺,
    which only penalises ranges beyond what the polynomial approximation was sized for (with 0 it is
    Eq. 9 exactly).
    """
    return (scores.abs().flatten(1).amax(dim=1) - threshold).clamp_min(0).mean()


# --------------------------------------------------------------------------------------------------
# DCT-Former
# --------------------------------------------------------------------------------------------------
def dct_matrix(n: int, m: int, dtype: torch.dtype = torch.float32, device=None) -> Tensor:
    """The first ``m`` rows of the orthonormal DCT-II matrix of size n: D̄ ∈ R^{m×n}.

    D_kj = s_k cos(π (2j + 1) k / (2n)), s_0 = √(1/n), s_k = √(2/n).
    """
    if not 0 < m <= n:
        raise ValueError(f"need 0 < m <= n, got n={n}, m={m}")
    k = torch.arange(m, dtype=torch.float64, device=device).unsqueeze(1)
    j = torch.arange(n, dtype=torch.float64, device=device).unsqueeze(0)
    d = torch.cos(math.pi * (2 * j + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d.to(dtype)


def dct_ii(x: Tensor, dim: int = -2, m: int | None = None) -> Tensor:
    """Orthonormal DCT-II along ``dim`` by Makhoul's FFT algorithm; keeps the first ``m``
    coefficients.

    Works for any length without a precomputed matrix; equals ``dct_matrix(n, m) @ x`` along
    ``dim``.
    """
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    # Makhoul (1980): reorder even samples ascending, odd samples descending, then one FFT.
    v = torch.cat([x[..., ::2], x[..., 1::2].flip(-1)], dim=-1)
    spec = torch.fft.fft(v.to(torch.float64 if x.dtype == torch.float64 else torch.float32), dim=-1)
    k = torch.arange(n, device=x.device, dtype=spec.real.dtype)
    w = torch.exp(-1j * math.pi * k / (2 * n)).to(spec.dtype)
    out = (spec * w).real * math.sqrt(2.0 / n)
    out[..., 0] = out[..., 0] / math.sqrt(2.0)
    if m is not None:
        out = out[..., :m]
    return out.to(x.dtype).movedim(-1, dim)


def idct_ii(c: Tensor, n: int, dim: int = -2) -> Tensor:
    """Inverse of :func:`dct_ii` (D̄ᵀ c): zero-pads ``m`` coefficients back to length ``n``
    first."""
    c = c.movedim(dim, -1)
    m = c.shape[-1]
    if m < n:
        c = F.pad(c, (0, n - m))
    dt = torch.float64 if c.dtype == torch.float64 else torch.float32
    k = torch.arange(n, device=c.device, dtype=dt)
    scale = torch.full((n,), math.sqrt(2.0 / n), device=c.device, dtype=dt)
    scale[0] = math.sqrt(1.0 / n)
    w = torch.exp(1j * math.pi * k / (2 * n))
    v = torch.fft.ifft(c.to(dt) * scale * w * n, dim=-1).real  # Makhoul's inverse
    x = torch.empty_like(v)
    half = (n + 1) // 2
    x[..., ::2] = v[..., :half]
    x[..., 1::2] = v[..., half:].flip(-1)
    return x.to(c.dtype).movedim(-1, dim)


def dct_attention(q: Tensor, k: Tensor, v: Tensor, n_bar: int, ideal: bool = False) -> Tensor:
    """DCT-Former attention, output ``(..., T, d)``.

    Algorithm 1 (efficient): Q̄ = D̄Q, K̄ = D̄K, V̄ = D̄V (n̄ × d each), Ā = softmax(Q̄K̄ᵀ/√d) V̄,
    output D̄ᵀĀ. Cost O(n̄²) in the sequence dimension instead of O(n²).
    Algorithm 2 (``ideal=True``, evaluation only): E = QKᵀ/√d is formed explicitly, compressed and
    reconstructed with a 2-D DCT (Ẽ = D̄ᵀD̄ E D̄ᵀD̄), then softmax(Ẽ) V: no softmax relaxation,
    O(n²).
    """
    n = q.shape[-2]
    n_bar = min(n_bar, n)
    if ideal:
        e = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, T)
        e = idct_ii(dct_ii(e, dim=-2, m=n_bar), n, dim=-2)
        e = idct_ii(dct_ii(e, dim=-1, m=n_bar), n, dim=-1)
        return torch.softmax(e, dim=-1) @ v
    qb, kb, vb = (dct_ii(t, dim=-2, m=n_bar) for t in (q, k, v))  # (..., n̄, d)
    a = dot_product(qb, kb, vb)  # (..., n̄, d)
    return idct_ii(a, n, dim=-2)  # (..., T, d)


# --------------------------------------------------------------------------------------------------
# Activator (GEGLU)
# --------------------------------------------------------------------------------------------------
def geglu(u: Tensor, g: Tensor, normalize: bool = True, eps: float = 1e-5) -> Tensor:
    """The Activator's gating product P1 * P2 (Activator paper Eqs. 8-10).

    ``u`` and ``g`` are the two up-projections. P1 = LN(u) (Eq. 8), P2 = LN(GELU(g)) (Eq. 9); the
    block then applies the down projection and the residual (Eq. 10). ``normalize=False`` drops the
    inner LayerNorms (an FHE-friendly configuration).
    """
    gate = F.gelu(g)
    if normalize:
        u = F.layer_norm(u, u.shape[-1:], eps=eps)
        gate = F.layer_norm(gate, gate.shape[-1:], eps=eps)
    return u * gate
