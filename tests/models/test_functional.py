"""Each functional form against an independent, loop-by-loop computation of the paper's equation."""

import math

import numpy as np
import pytest
import scipy.fft
import scipy.special
import torch

from models.attention import functional as AF


def rand(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


# -------------------------------------------------------------------------- naive references
# (numpy)
def naive_softmax_attention(q, k, v, mask=None):
    T, d = q.shape
    out = np.zeros_like(v)
    for i in range(T):
        s = np.array([sum(q[i, c] * k[j, c] for c in range(d)) / math.sqrt(d) for j in range(T)])
        if mask is not None:
            s = np.where(mask[i], s, -np.inf)
        e = np.exp(s - s.max())
        w = e / e.sum()
        out[i] = sum(w[j] * v[j] for j in range(T))
    return out


def naive_inhibitor(q, k, v, gamma, alpha, signed):
    T, d = q.shape
    z = np.zeros((T, T))
    for i in range(T):
        for j in range(T):
            z[i, j] = sum(abs(q[i, c] - k[j, c]) for c in range(d)) / gamma  # Eq. (5)
            z[i, j] = max(z[i, j] - alpha, 0.0)  # shifted score
    h = np.zeros_like(v)
    for i in range(T):
        for c in range(v.shape[1]):
            for j in range(T):
                if signed:  # Eq. (7)
                    vp, vn = max(v[j, c], 0.0), min(v[j, c], 0.0)
                    h[i, c] += max(vp - z[i, j], 0.0) + min(vn + z[i, j], 0.0)
                else:  # Eq. (6)
                    h[i, c] += max(v[j, c] - z[i, j], 0.0)
    return h


def naive_power_softmax(x, p, eps, stable, length_agnostic, mask):
    x = x.copy()
    out = np.zeros_like(x)
    L = x.shape[-1]
    for i in range(x.shape[0]):
        row = x[i] * (mask[i] if mask is not None else 1.0)
        if stable:
            row = row / (np.abs(row).max() + 1e-6)
        powers = np.array([r**p for r in row])
        if length_agnostic:  # Eq. (7); with a mask, ε once per kept key (L_i of L)
            kept = L if mask is None else mask[i].sum()
            out[i] = (powers / L) / (eps * kept / L + powers.mean())
        else:
            out[i] = np.abs(powers) / (eps + np.abs(powers).sum())
    return out


# -------------------------------------------------------------------------- dot product
@pytest.mark.parametrize("T,d", [(1, 3), (5, 4), (9, 2)])
def test_dot_product_matches_naive(T, d):
    q, k, v = rand(T, d), rand(T, d), rand(T, d)
    np.testing.assert_allclose(
        AF.dot_product(q, k, v).numpy(),
        naive_softmax_attention(q.numpy(), k.numpy(), v.numpy()),
        rtol=1e-10,
        atol=1e-12,
    )


def test_dot_product_causal_mask():
    T, d = 6, 3
    q, k, v = rand(T, d), rand(T, d), rand(T, d)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    out = AF.dot_product(q, k, v, mask)
    np.testing.assert_allclose(
        out.numpy(),
        naive_softmax_attention(q.numpy(), k.numpy(), v.numpy(), mask.numpy()),
        rtol=1e-10,
    )
    # first position only sees itself
    np.testing.assert_allclose(out[0].numpy(), v[0].numpy(), rtol=1e-12)


# -------------------------------------------------------------------------- inhibitor
@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("T,d", [(1, 2), (4, 2), (7, 5)])
def test_inhibitor_forms_match_paper_equations(T, d, alpha, signed):
    q, k, v = rand(T, d), rand(T, d), rand(T, d)
    gamma = math.sqrt(d)
    ref = naive_inhibitor(q.numpy(), k.numpy(), v.numpy(), gamma, alpha, signed)
    fused = AF.inhibitor(q, k, v, gamma, alpha, signed)
    broad = AF.inhibitor_broadcast(q, k, v, gamma, alpha, signed)
    np.testing.assert_allclose(broad.numpy(), ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(fused.numpy(), ref, rtol=1e-9, atol=1e-9)


def test_inhibitor_batched_heads_and_float32():
    q, k, v = (torch.randn(3, 2, 6, 4) for _ in range(3))
    fused = AF.inhibitor(q, k, v, 2.0, 0.5)
    broad = AF.inhibitor_broadcast(q, k, v, 2.0, 0.5)
    assert fused.dtype == torch.float32 and fused.shape == (3, 2, 6, 4)
    torch.testing.assert_close(fused, broad, rtol=1e-4, atol=1e-4)


def test_unsigned_inhibitor_is_non_negative_and_signed_passes_values_when_scores_vanish():
    q = torch.randn(5, 3, dtype=torch.float64)
    v = torch.randn(5, 3, dtype=torch.float64)
    assert (AF.inhibitor(q, q + 1.0, v, 1.0) >= -1e-12).all()
    # identical queries and keys everywhere + large shift: Z' = 0, so H = Σ_j V_j (Eq. 7 passes V
    # through)
    same = torch.zeros(5, 3, dtype=torch.float64)
    out = AF.inhibitor(same, same, v, 1.0, alpha=0.5, signed=True)
    np.testing.assert_allclose(out.numpy(), v.sum(0, keepdim=True).expand(5, 3).numpy(), rtol=1e-12)


@pytest.mark.parametrize("signed", [False, True])
def test_inhibitor_gradients_match_broadcast_form(signed):
    q, k, v = (torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    AF.inhibitor(q, k, v, 1.5, 0.2, signed).square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    AF.inhibitor_broadcast(q, k, v, 1.5, 0.2, signed).square().sum().backward()
    for g, t in zip(grads, (q, k, v), strict=True):
        torch.testing.assert_close(g, t.grad, rtol=1e-7, atol=1e-9)


# -------------------------------------------------------------------------- PowerSoftmax
@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("eps", [0.0, 1e-3])
@pytest.mark.parametrize("stable", [False, True])
@pytest.mark.parametrize("length_agnostic", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_power_softmax_matches_equations(p, eps, stable, length_agnostic, masked):
    x = rand(5, 7)
    mask = (torch.rand(5, 7) > 0.3).double() if masked else None
    out = AF.power_softmax(x, p, eps, stable, length_agnostic, mask)
    ref = naive_power_softmax(
        x.numpy(), p, eps, stable, length_agnostic, None if mask is None else mask.numpy()
    )
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-10, atol=1e-14)


def test_power_softmax_rows_sum_to_one_and_forms_agree_without_eps():
    x = rand(3, 4, 9)
    plain = AF.power_softmax(x, 4)
    np.testing.assert_allclose(plain.sum(-1).numpy(), 1.0, rtol=1e-12)
    torch.testing.assert_close(AF.power_softmax(x, 4, stable=True), plain)  # Eq. (6) invariance
    torch.testing.assert_close(
        AF.power_softmax(x, 4, length_agnostic=True), plain
    )  # Eq. (7) == Eq. (2)
    # ε bounds the output away from a 1/0: an all-zero row gives zeros, not NaN (Eq. 5)
    assert torch.equal(AF.power_softmax(torch.zeros(1, 4), 4, eps=1e-3), torch.zeros(1, 4))


def test_power_softmax_masked_entries_get_zero_weight_and_odd_p_is_rejected():
    x = rand(4, 6)
    mask = torch.ones(4, 6)
    mask[:, 2] = 0
    out = AF.power_softmax(x, 4, mask=mask)
    assert torch.all(out[:, 2] == 0)
    with pytest.raises(ValueError, match="even"):
        AF.power_softmax(x, 3)


def test_power_softmax_range_is_max_abs_per_example():
    s = torch.zeros(2, 3, 4, 4)
    s[0, 1, 2, 3] = -5.0
    s[1, 0, 0, 0] = 2.0
    assert AF.power_softmax_range(s).item() == pytest.approx(3.5)


# -------------------------------------------------------------------------- DCT
@pytest.mark.parametrize("n", [1, 2, 7, 8, 13, 16])
def test_dct_matrix_is_orthonormal_dct_ii(n):
    D = AF.dct_matrix(n, n, dtype=torch.float64)
    np.testing.assert_allclose((D @ D.T).numpy(), np.eye(n), atol=1e-12)
    x = np.random.randn(n, 3)
    np.testing.assert_allclose(
        (D @ torch.from_numpy(x)).numpy(), scipy.fft.dct(x, axis=0, norm="ortho"), atol=1e-12
    )


@pytest.mark.parametrize("n,m", [(8, 8), (8, 3), (13, 5), (100, 10), (1, 1)])
def test_makhoul_dct_and_inverse_match_matrix(n, m):
    x = rand(2, n, 4)
    D = AF.dct_matrix(n, m, dtype=torch.float64)
    c = AF.dct_ii(x, dim=-2, m=m)
    torch.testing.assert_close(c, D @ x, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(AF.idct_ii(c, n, dim=-2), D.T @ c, rtol=1e-10, atol=1e-10)
    if m == n:
        torch.testing.assert_close(AF.idct_ii(c, n, dim=-2), x, rtol=1e-10, atol=1e-10)


def test_dct_matrix_rejects_bad_sizes():
    with pytest.raises(ValueError):
        AF.dct_matrix(4, 5)


@pytest.mark.parametrize("n,n_bar", [(8, 3), (10, 10), (16, 4)])
def test_dct_attention_algorithm_1_matches_matrix_form(n, n_bar):
    q, k, v = rand(n, 4), rand(n, 4), rand(n, 4)
    D = AF.dct_matrix(n, n_bar, dtype=torch.float64).numpy()
    qb, kb, vb = D @ q.numpy(), D @ k.numpy(), D @ v.numpy()
    ref = D.T @ naive_softmax_attention(qb, kb, vb)
    np.testing.assert_allclose(AF.dct_attention(q, k, v, n_bar).numpy(), ref, rtol=1e-9, atol=1e-10)


def test_dct_attention_algorithm_2_is_exact_without_compression_and_matches_matrix_form():
    n = 9
    q, k, v = rand(n, 3), rand(n, 3), rand(n, 3)
    torch.testing.assert_close(AF.dct_attention(q, k, v, n, ideal=True), AF.dot_product(q, k, v))
    D = AF.dct_matrix(n, 4, dtype=torch.float64)
    e = D.T @ D @ (q @ k.T / math.sqrt(3)) @ D.T @ D
    torch.testing.assert_close(AF.dct_attention(q, k, v, 4, ideal=True), torch.softmax(e, -1) @ v)


# -------------------------------------------------------------------------- GEGLU
@pytest.mark.parametrize("normalize", [False, True])
def test_geglu_matches_equations_8_to_10(normalize):
    u, g = rand(3, 6), rand(3, 6)
    gelu = 0.5 * g.numpy() * (1 + scipy.special.erf(g.numpy() / math.sqrt(2)))

    def ln(a):
        return (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)

    ref = (ln(u.numpy()) * ln(gelu)) if normalize else u.numpy() * gelu
    np.testing.assert_allclose(AF.geglu(u, g, normalize).numpy(), ref, rtol=1e-9, atol=1e-12)
