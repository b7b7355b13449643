"""Causal attention in the integer program (PowerSoftmax paper Eq. 11's mask, j <= i): the program
equals its fake-quantized forward exactly, follows the causal float model (not the same weights
without the mask), never lets a position read a later one, and spends its lookups on the kept
pairs only."""

import numpy as np
import pytest
import torch

from models import Transformer, TransformerConfig
from models.config import AttentionKind
from quant import OverflowPolicy, QuantConfig
from quant.export import export
from quant.mixers._causal import causal_pairs

T = 6
CASES = [
    (AttentionKind.DOT_PRODUCT, {}),
    (AttentionKind.INHIBITOR, {}),
    (AttentionKind.INHIBITOR, {"tie_qk": True}),
    (AttentionKind.SIGNED_INHIBITOR, {}),
    (AttentionKind.POWER_SOFTMAX, {"power_form": "length-agnostic", "power_eps": 0.05}),
    (AttentionKind.INHIBITOR, {"tie_qk": True, "inhibitor_mean": True}),  # sums as means
    (AttentionKind.SIGNED_INHIBITOR, {"inhibitor_mean": True}),
]
IDS = [
    "dot-product",
    "inhibitor",
    "inhibitor-tied",
    "signed-inhibitor",
    "power-softmax",
    "inhibitor-tied-mean",
    "signed-inhibitor-mean",
]


def _model(kind, causal=True, **kw) -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        seq_len=T,
        in_features=5,
        n_outputs=3,
        attention=kind,
        d_model=8,
        n_heads=2,
        norm="none",
        causal=causal,
        **kw,
    )
    model = Transformer(cfg).double().eval()
    with torch.no_grad():  # larger scores, so that the mask visibly matters for every kind
        for name, p in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(2.0)
    return model


@pytest.mark.parametrize(("kind", "kw"), CASES, ids=IDS)
def test_causal_program_follows_the_causal_float_model(kind, kw):
    model = _model(kind, **kw)
    x = torch.rand(200, T, 5, dtype=torch.float64)
    program = export(model, x, QuantConfig(n_bits=10))
    held = x[:60]  # calibration samples: no value outside its calibrated width
    out, clipped = program.run_int(program.quantize_input(held), OverflowPolicy.CLIP)
    assert not clipped
    got = program.dequantize_output(out)
    np.testing.assert_allclose(got, program.fake_forward(held), rtol=1e-9, atol=1e-9)
    unmasked = Transformer(model.config.replace(causal=False, inhibitor_mean=False)).double().eval()
    unmasked.load_state_dict(model.state_dict())
    with torch.no_grad():
        ref, ref_unmasked = model(held).numpy(), unmasked(held).numpy()
    err = np.abs(got - ref).max()
    assert err < 0.2 * np.abs(ref - ref_unmasked).max()  # the mask matters more than rounding
    assert err < 0.02
    if model.config.inhibitor_mean:  # the means matter more than rounding too
        sums = Transformer(model.config.replace(inhibitor_mean=False)).double().eval()
        sums.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert err < 0.2 * np.abs(ref - sums(held).numpy()).max()


@pytest.mark.parametrize(("kind", "kw"), CASES, ids=IDS)
def test_a_causal_program_never_reads_a_later_position(kind, kw):
    model = _model(kind, **kw)
    x = torch.rand(200, T, 5, dtype=torch.float64)
    program = export(model, x, QuantConfig(n_bits=8))
    sample = program.quantize_input(x[:1])
    later = sample.copy()
    later[:, 4:] = program.quantize_input(x[1:2])[:, 4:]
    runs = []
    for s in (sample, later):
        record: dict[str, np.ndarray] = {}
        program.graph.run(s, OverflowPolicy.CLIP, record=record)
        runs.append(record["block0.mix.merge"])  # (1, T, C): the attention's output
    np.testing.assert_array_equal(runs[0][:, :4], runs[1][:, :4])
    assert not np.array_equal(runs[0][:, 4:], runs[1][:, 4:])


@pytest.mark.parametrize(("kind", "kw"), CASES[1:4], ids=IDS[1:4])
def test_causal_inhibitor_looks_up_only_the_kept_pairs(kind, kw):
    x = torch.rand(100, T, 5, dtype=torch.float64)
    sizes = {}
    for causal in (False, True):
        program = export(_model(kind, causal, **kw), x, QuantConfig(n_bits=6))
        sizes[causal] = {
            n.name: int(np.prod(n.attrs["shape"]))
            for n in program.graph.nodes.values()
            if n.op == "lut" and n.name.endswith(("attn.relu", "attn.relu.pos", "attn.abs"))
        }
    heads, d_head, kept = 2, 4, len(causal_pairs(T))
    for name, size in sizes[True].items():
        if name.endswith("abs") and kw.get("tie_qk"):  # |q_i − q_j| once per pair either way
            assert size == sizes[False][name]
        else:
            assert size == heads * kept * d_head
            assert sizes[False][name] == heads * T * T * d_head
