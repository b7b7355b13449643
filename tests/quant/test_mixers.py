"""The per-kind lowering registries: every attention kind has an integer lowering, and a gap is one
clear error naming the kind and the backend."""

import pytest
import torch

from fhe.ckks.mixers import NoPolyLoweringError, poly_mixer, registered_poly_mixers
from models.config import AttentionKind, TransformerConfig
from models.transformer import Transformer
from quant import QuantConfig
from quant import mixers as quant_mixers
from quant.export import ExportError, export
from quant.mixers import registered_mixers


def test_every_attention_kind_has_an_integer_lowering():
    assert set(registered_mixers()) == set(AttentionKind)


def test_a_missing_integer_lowering_is_named(monkeypatch):
    monkeypatch.delitem(quant_mixers.LOWERINGS.entries, AttentionKind.INHIBITOR)
    model = Transformer(
        TransformerConfig(
            seq_len=3,
            in_features=4,
            n_outputs=2,
            attention="inhibitor",
            d_model=4,
            n_heads=1,
            norm="none",
        )
    )
    with pytest.raises(
        ExportError, match="no lowering registered for inhibitor under the integer program"
    ):
        export(model, torch.rand(8, 3, 4), QuantConfig(n_bits=4))


def test_every_attention_kind_has_a_polynomial_lowering():
    assert set(registered_poly_mixers()) == set(AttentionKind)


def test_a_missing_polynomial_lowering_is_named_with_the_alternative(monkeypatch):
    from fhe.ckks import mixers as poly_mixers

    monkeypatch.delitem(poly_mixers.LOWERINGS.entries, AttentionKind.INHIBITOR)
    with pytest.raises(
        NoPolyLoweringError, match="no lowering registered for inhibitor under CKKS.*--scheme tfhe"
    ):
        poly_mixer(AttentionKind.INHIBITOR)
