"""BatchNorm folding: the folded model computes the same function with no norm layers."""

import pytest
import torch

from models import AttentionKind, Transformer, TransformerConfig
from models.fold import fold_norms


def _trained_like(kind: AttentionKind) -> Transformer:
    model = Transformer(
        TransformerConfig(
            seq_len=4,
            in_features=6,
            n_outputs=3,
            attention=kind,
            d_model=8,
            n_heads=2,
            norm="batchnorm",
            dct_n_bar=2,
        )
    ).double()
    model.train()
    with torch.no_grad():
        for _ in range(3):  # running statistics that are far from (0, 1)
            model(torch.randn(32, 4, 6, dtype=torch.float64) * 3 + 1)
        for mod in model.modules():
            if hasattr(mod, "running_var"):
                mod.weight.uniform_(0.5, 2.0)
                mod.bias.normal_()
    return model.eval()


@pytest.mark.parametrize("kind", list(AttentionKind), ids=lambda k: k.value)
def test_folded_model_equals_the_batchnorm_model(kind):
    model = _trained_like(kind)
    folded = fold_norms(model)
    assert folded.config.norm.value == "none"
    assert not any(hasattr(m, "running_var") for m in folded.modules())
    x = torch.randn(9, 4, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(folded.double()(x), model(x), rtol=1e-6, atol=1e-6)


def test_models_without_batchnorm_are_returned_as_they_are():
    model = Transformer(TransformerConfig(seq_len=4, in_features=6, n_outputs=3, norm="none"))
    assert fold_norms(model) is model


@pytest.mark.parametrize("signed", [False, True], ids=["inhibitor", "signed-inhibitor"])
def test_the_inhibitors_means_fold_into_its_output_projection(signed):
    kind = AttentionKind.SIGNED_INHIBITOR if signed else AttentionKind.INHIBITOR
    cfg = TransformerConfig(
        seq_len=4,
        in_features=6,
        n_outputs=3,
        attention=kind,
        n_layers=2,
        norm="none",
        inhibitor_mean=True,
    )
    model = Transformer(cfg).double().eval()
    folded = fold_norms(model)
    assert not folded.config.inhibitor_mean
    sums = Transformer(cfg.replace(inhibitor_mean=False)).double().eval()
    sums.load_state_dict(model.state_dict())  # the same weights, summing: another function
    x = torch.randn(9, 4, 6, dtype=torch.float64)
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(folded.double()(x), want, rtol=1e-6, atol=1e-6)
        assert not torch.allclose(sums(x), want, atol=1e-3)
    causal = Transformer(cfg.replace(causal=True))  # one factor per query: kept
    assert fold_norms(causal) is causal
