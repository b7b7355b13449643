"""The encoder: shapes, gradients, every kind, module forms, config validation, save/load."""

import pytest
import torch

from models import AttentionKind, InputKind, NormKind, Transformer, TransformerConfig
from models.attention.base import MultiHeadAttention
from models.attention.inhibitor import InhibitorAttention
from models.attention.power_softmax import (
    PowerSoftmaxAttention,
    activation_range_loss,
    norm_range_loss,
    range_loss,
    set_range_tracking,
)
from models.layers import FeedForward, RangedLayerNorm
from models.training import load_checkpoint, save_checkpoint

KINDS = list(AttentionKind)


def make(kind, **kw):
    base = dict(seq_len=8, in_features=8, n_outputs=10, attention=kind, d_model=16, n_heads=2)
    base.update(kw)
    return Transformer(TransformerConfig(**base))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize("norm", list(NormKind), ids=lambda n: n.value)
def test_every_kind_gives_logits_and_gradients_everywhere(kind, norm):
    model = make(kind, norm=norm, n_layers=2, ffn_activation="gelu")
    out = model(torch.randn(3, 8, 8))
    assert out.shape == (3, 10)
    out.logsumexp(-1).sum().backward()
    missing = [
        n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()
    ]
    assert not missing, f"no finite gradient for {missing}"


def test_token_inputs_pool_over_non_padding_positions():
    model = make(AttentionKind.DOT_PRODUCT, input_kind=InputKind.TOKENS, in_features=50).eval()
    x = torch.randint(2, 50, (2, 8))
    assert model(x).shape == (2, 10)
    assert model(torch.zeros(1, 8, dtype=torch.long)).isfinite().all()


def test_inhibitor_module_memory_efficient_equals_broadcast():
    model = make(AttentionKind.SIGNED_INHIBITOR).double().eval()
    x = torch.randn(4, 8, 8, dtype=torch.float64)
    attn = model.blocks[0].mixer
    assert isinstance(attn, InhibitorAttention) and attn.memory_efficient
    fused = model(x)
    attn.memory_efficient = False
    torch.testing.assert_close(model(x), fused, rtol=1e-10, atol=1e-10)


def test_power_softmax_range_loss_tracks_max_score():
    model = make(AttentionKind.POWER_SOFTMAX, n_layers=2)
    set_range_tracking(model, True)
    model(torch.randn(2, 8, 8))
    loss = range_loss(model)
    layers = [m for m in model.modules() if isinstance(m, PowerSoftmaxAttention)]
    assert loss.item() == pytest.approx(sum(m.last_range.item() for m in layers))
    assert loss.item() > 0
    loss.backward()


def test_softmax_scores_join_the_range_loss_as_their_naive_maximum():
    """Softmax's exp is a polynomial under CKKS, so its scores take Eq. (9)'s range loss too: per
    sample the max over heads and positions of |q·k|/√d_head, computed here by hand from the
    attention's own input, less the hinge threshold, averaged over the batch."""
    model = make(AttentionKind.DOT_PRODUCT)
    attn = next(m for m in model.modules() if isinstance(m, MultiHeadAttention))
    seen = {}
    attn.register_forward_pre_hook(lambda _m, args: seen.setdefault("x", args[0].detach()))
    set_range_tracking(model, True, threshold=0.5)
    model(torch.randn(3, 8, 8))
    x = seen["x"]
    q, k = attn.q_proj(x).detach(), attn.k_proj(x).detach()
    dh = attn.d_head
    per_sample = [
        max(
            abs(float(q[b, i, h * dh : (h + 1) * dh] @ k[b, j, h * dh : (h + 1) * dh])) / dh**0.5
            for h in range(attn.n_heads)
            for i in range(8)
            for j in range(8)
        )
        for b in range(3)
    ]
    expected = sum(max(m - 0.5, 0.0) for m in per_sample) / 3
    assert range_loss(model).item() == pytest.approx(expected, rel=1e-5)
    ffn = [m for m in model.modules() if isinstance(m, FeedForward)]
    assert activation_range_loss(model).item() == pytest.approx(  # the FFN's alone
        sum(m.last_range.item() for m in ffn)
    )


def test_the_norm_range_loss_is_the_hinge_on_the_spread_of_layernorm_input_variances():
    """Per LayerNorm, log(max σ²) − log(min σ²) over the batch's positions (σ² + eps each, computed
    here by hand from the norm's own input) less log κ, clamped at 0, summed over the norms; the
    other range losses leave the norms out, and the module keeps nn.LayerNorm's checkpoint keys."""
    import math

    model = make(AttentionKind.POWER_SOFTMAX, n_layers=2, norm="layernorm")
    norms = [m for m in model.modules() if isinstance(m, RangedLayerNorm)]
    assert len(norms) == 5  # two per block and the final one
    seen: dict[int, torch.Tensor] = {}

    def keep(i: int):
        def hook(_module, args) -> None:  # returns None: the input goes on unchanged
            seen.setdefault(i, args[0].detach())

        return hook

    for i, m in enumerate(norms):
        m.register_forward_pre_hook(keep(i))
    set_range_tracking(model, True, norm_ratio=2.0)
    model(torch.randn(3, 8, 8) * torch.linspace(0.2, 3.0, 8)[None, :, None])
    expected = 0.0
    for i in range(len(norms)):
        x = seen[i]
        var = [float(x[b, t].var(unbiased=False)) + 1e-5 for b in range(3) for t in range(8)]
        expected += max(math.log(max(var)) - math.log(min(var)) - math.log(2.0), 0.0)
    loss = norm_range_loss(model)
    assert expected > 0 and loss.item() == pytest.approx(expected, rel=1e-5)
    assert activation_range_loss(model).item() == pytest.approx(
        sum(m.last_range.item() for m in model.modules() if isinstance(m, FeedForward))
    )
    loss.backward()
    assert model.blocks[0].mixer.q_proj.weight.grad is not None  # it trains what feeds the norms
    assert set(RangedLayerNorm(8).state_dict()) == set(torch.nn.LayerNorm(8).state_dict())


def test_power_softmax_inference_form_matches_training_form_when_eps_is_zero():
    model = make(AttentionKind.POWER_SOFTMAX, power_eps=0.0).double().eval()
    assert model.blocks[0].mixer.inference_eps == 0.0
    x = torch.randn(3, 8, 8, dtype=torch.float64)
    train_form = model(x)
    model.blocks[0].mixer.inference_form = True
    torch.testing.assert_close(model(x), train_form)


def test_geglu_only_has_no_ffn_and_activator_has_one():
    assert not make(AttentionKind.GEGLU_ONLY).blocks[0].has_ffn
    assert make(AttentionKind.ACTIVATOR).blocks[0].has_ffn


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(d_model=10, n_heads=3), "divisible"),
        (dict(power_p=3), "even"),
        (dict(dct_n_bar=9), "dct_n_bar"),
        (dict(attention="nope"), "nope"),
        (dict(seq_len=0), "seq_len"),
    ],
)
def test_config_validation(bad, match):
    kw = dict(seq_len=8, in_features=8, n_outputs=10)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**kw)


def test_too_long_input_is_a_clear_error():
    with pytest.raises(ValueError, match="seq_len=8"):
        make(AttentionKind.INHIBITOR)(torch.randn(1, 9, 8))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_save_and_load_reproduce_outputs(tmp_path, kind):
    model = make(kind, norm="none").eval()
    x = torch.randn(5, 8, 8)
    path = tmp_path / "model.pt"
    save_checkpoint(path, model)
    loaded = load_checkpoint(path)
    assert loaded.model.config == model.config
    assert torch.equal(loaded.model(x), model(x))


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="fhe train"):
        load_checkpoint(tmp_path / "missing.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not"):
        load_checkpoint(junk)
