"""Key-padding and causal masks: the masked paper equations against their naive sums, a padded
sequence against the unpadded one (every kind that takes a mask), a causal model that never reads a
later token, and the lowerings that refuse what they cannot compute yet."""

import pytest
import torch

from models.attention import functional as AF
from models.config import MASKED_KINDS, AttentionKind, InputKind, TransformerConfig
from models.transformer import Transformer

T, L = 7, 4  # padded length, real length


def _qkv(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, T, 3, generator=g, dtype=torch.float64) for _ in range(3)]


def _key_mask() -> torch.Tensor:
    return (torch.arange(T) < L)[None, None, None, :]  # (1, 1, 1, T)


def test_the_masked_inhibitor_sums_eq_6_over_the_kept_keys_only():
    q, k, v = _qkv()
    gamma, alpha = 1.5, 0.5
    got = AF.inhibitor(q, k, v, gamma, alpha, mask=_key_mask())
    want = torch.zeros_like(v)
    for i in range(T):
        for j in range(L):  # Eq. (6), written out: H_ik = Σ_j (V_jk − Z'_ij)⁺ over kept keys
            z = torch.relu(
                (q[..., i, :] - k[..., j, :]).abs().sum(-1, keepdim=True) / gamma - alpha
            )
            want[..., i, :] += torch.relu(v[..., j, :] - z)
    torch.testing.assert_close(got, want)


ATTENTIONS = {
    "dot-product": lambda q, k, v, m=None: AF.dot_product(q, k, v, m),
    "inhibitor": lambda q, k, v, m=None: AF.inhibitor(q, k, v, 1.7, 0.5, mask=m),
    "signed-inhibitor": lambda q, k, v, m=None: AF.inhibitor(q, k, v, 1.7, 0.5, True, mask=m),
    "power-softmax-stable": lambda q, k, v, m=None: (
        AF.power_softmax(q @ k.transpose(-2, -1), 4, 1e-3, stable=True, mask=m) @ v
    ),
    "power-softmax-length-agnostic": lambda q, k, v, m=None: (
        AF.power_softmax(q @ k.transpose(-2, -1), 2, 0.5, length_agnostic=True, mask=m) @ v
    ),
}


@pytest.mark.parametrize("name", ATTENTIONS)
def test_masked_padding_keys_change_nothing(name):
    fn = ATTENTIONS[name]
    q, k, v = _qkv(1)
    padded = fn(q, k, v, _key_mask())[..., :L, :]
    alone = fn(q[..., :L, :], k[..., :L, :], v[..., :L, :])
    torch.testing.assert_close(padded, alone)


def _model(kind: AttentionKind, **extra) -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        seq_len=12,
        in_features=50,
        n_outputs=3,
        input_kind=InputKind.TOKENS,
        attention=kind,
        d_model=8,
        n_heads=2,
        n_layers=2,
        norm="batchnorm",
        **extra,
    )
    model = Transformer(cfg).double()
    model.eval()
    return model


REVIEWS = torch.tensor(
    [[5, 17, 3, 44, 9, 0, 0, 0, 0, 0, 0, 0], [8, 2, 31, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
)


@pytest.mark.parametrize(
    "kind, extra",
    [(k, {}) for k in MASKED_KINDS]
    + [(AttentionKind.POWER_SOFTMAX, {"power_form": "length-agnostic"})],
    ids=lambda v: getattr(v, "value", "") or ",".join(f"{a}={b}" for a, b in v.items()),
)
def test_a_padded_review_gives_the_logits_of_the_unpadded_one(kind, extra):
    model = _model(kind, **extra)
    with torch.no_grad():
        for review in REVIEWS:
            length = int((review != 0).sum())
            torch.testing.assert_close(model(review[None]), model(review[None, :length]))


def test_without_the_mask_padding_changes_the_logits():
    model = _model(AttentionKind.INHIBITOR, mask_padding=False)
    review = REVIEWS[0]
    with torch.no_grad():
        assert not torch.allclose(model(review[None]), model(review[None, :5]))


@pytest.mark.parametrize("kind", MASKED_KINDS, ids=lambda k: k.value)
def test_a_causal_position_never_reads_a_later_token(kind):
    model = _model(kind, causal=True)
    x = torch.tensor([[4, 8, 15, 16, 23, 42, 7, 1]])
    later = x.clone()
    later[0, 5:] = torch.tensor([1, 2, 3])
    with torch.no_grad():
        a, b = model.features(x), model.features(later)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_model_files_from_before_masks_keep_attending_to_padding():
    cfg = _model(AttentionKind.DOT_PRODUCT).config.to_dict()
    del cfg["mask_padding"], cfg["causal"]
    assert TransformerConfig.from_dict(cfg).mask_padding is False
    assert TransformerConfig.from_dict({**cfg, "mask_padding": True}).mask_padding is True


def test_causal_is_refused_where_it_has_no_meaning_and_lowers_everywhere_else():
    with pytest.raises(ValueError, match="causal attention is an option"):
        _model(AttentionKind.DCT, causal=True)
    from fhe.ckks.program import MASKED_KINDS, check_model
    from quant.export import check_exportable

    causal = TransformerConfig(seq_len=4, in_features=4, n_outputs=2, causal=True, norm="none")
    for kind in MASKED_KINDS:  # every masked kind has a causal integer and polynomial program
        check_exportable(Transformer(causal.replace(attention=kind)))
        check_model(causal.replace(attention=kind))


@pytest.mark.parametrize("signed", [False, True], ids=["inhibitor", "signed-inhibitor"])
def test_a_causal_mean_inhibitor_scales_each_querys_sums_eq_6_7_by_its_public_constant(signed):
    kind = AttentionKind.SIGNED_INHIBITOR if signed else AttentionKind.INHIBITOR
    mixer = _model(kind, causal=True, inhibitor_mean=True).blocks[0].mixer
    q, k, v = _qkv(2)  # (2, 2, T, 3), T = 7 <= seq_len 12
    got = mixer.attend(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())
    want = torch.zeros_like(v)
    for i in range(T):
        for j in range(i + 1):  # over the keys j <= i
            want[..., i, :] += _eq_6_7_term(mixer, q, k, v, i, j, signed)
        n = 4 * 16  # 4 · 2^⌈log2 12⌉: query i's factor round(n / (i + 1)) / n
        want[..., i, :] *= round(n / (i + 1)) / n
    torch.testing.assert_close(got, want)


def _eq_6_7_term(mixer, q, k, v, i: int, j: int, signed: bool) -> torch.Tensor:
    """Key j's term in query i's sum, Eqs. (6)-(7) written out."""
    z = torch.relu(
        (q[..., i, :] - k[..., j, :]).abs().sum(-1, keepdim=True) / mixer.gamma - mixer.alpha
    )
    vj = v[..., j, :]
    if signed:
        return torch.relu(torch.relu(vj) - z) - torch.relu(torch.relu(-vj) - z)
    return torch.relu(vj - z)


@pytest.mark.parametrize("signed", [False, True], ids=["inhibitor", "signed-inhibitor"])
def test_an_inhibitor_mean_without_the_mask_divides_eq_6_7_by_the_length(signed):
    kind = AttentionKind.SIGNED_INHIBITOR if signed else AttentionKind.INHIBITOR
    mixer = _model(kind, inhibitor_mean=True).blocks[0].mixer
    q, k, v = _qkv(2)  # T = 7 keys; the factor is the model's, 1 / seq_len = 1 / 12
    want = torch.zeros_like(v)
    for i in range(T):
        for j in range(T):
            want[..., i, :] += _eq_6_7_term(mixer, q, k, v, i, j, signed) / 12
    torch.testing.assert_close(mixer.attend(q, k, v), want)


def test_a_causal_mean_model_keeps_padding_and_position_rules():
    model = _model(AttentionKind.INHIBITOR, causal=True, inhibitor_mean=True)
    with torch.no_grad():
        for review in REVIEWS:  # the factor is the position's: a padded review, its logits
            length = int((review != 0).sum())
            torch.testing.assert_close(model(review[None]), model(review[None, :length]))
    plain = _model(AttentionKind.INHIBITOR, causal=True)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(model(REVIEWS), plain(REVIEWS))
    for kind in (AttentionKind.POWER_SOFTMAX, AttentionKind.DOT_PRODUCT):
        with pytest.raises(ValueError, match="inhibitor_mean is an option of Inhibitor"):
            _model(kind, causal=True, inhibitor_mean=True)
    legacy = {**model.config.to_dict(), "causal_mean": True}  # the option's first name
    del legacy["inhibitor_mean"]
    assert TransformerConfig.from_dict(legacy).inhibitor_mean
