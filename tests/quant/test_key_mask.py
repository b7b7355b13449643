"""The client's encrypted key mask in the integer program (a text model over padded word
positions, models.text): padding keys are masked inside attention and the client pools over its
words. The program equals its fake-quantized forward exactly, follows the float token model, and
its output does not depend on what the padding positions hold."""

import numpy as np
import pytest
import torch

from models import Transformer, TransformerConfig
from models.config import AttentionKind
from models.text import split_text_model
from quant import OverflowPolicy, QuantConfig
from quant.export import export
from quant.quantizer import decode_output

VOCAB = ["<pad>", "<unk>"] + [f"w{i}" for i in range(30)]
T = 10
CASES = [
    (AttentionKind.INHIBITOR, {}),
    (AttentionKind.INHIBITOR, {"tie_qk": True}),
    (AttentionKind.SIGNED_INHIBITOR, {}),
    (AttentionKind.DOT_PRODUCT, {}),
    (AttentionKind.POWER_SOFTMAX, {"power_form": "length-agnostic", "power_eps": 0.05}),
    (AttentionKind.ACTIVATOR, {}),  # token-local: the mask reaches the pooling only
]
IDS = ["inhibitor", "inhibitor-tied", "signed-inhibitor", "dot-product", "power-softmax", "act"]


def _split(kind, causal: bool, pooling: str = "mean", **kw):
    torch.manual_seed(0)
    cfg = TransformerConfig(
        seq_len=T,
        in_features=len(VOCAB),
        n_outputs=2,
        input_kind="tokens",
        attention=kind,
        d_model=8,
        n_heads=2,
        norm="none",
        causal=causal,
        pooling=pooling,
        **kw,
    )
    model = Transformer(cfg).double().eval()
    ids = torch.randint(2, len(VOCAB), (300, T))
    for i, n in enumerate(torch.randint(1, T + 1, (300,)).tolist()):
        ids[i, n:] = 0  # right-padded reviews of 1 to T words
    encoder, program_model = split_text_model(model, VOCAB)
    return model, ids, torch.from_numpy(encoder.embed_ids(ids)).double(), program_model.double()


PADDED = [  # causal is an option of the kinds that take a mask
    pytest.param(kind, kw, causal, "mean", id=f"{name}{'-causal' if causal else ''}")
    for (kind, kw), name in zip(CASES, IDS, strict=True)
    for causal in (False, True)
    if kind is not AttentionKind.ACTIVATOR or not causal
] + [  # next-word models: the client keeps the last word's row
    pytest.param(*CASES[i], True, "last", id=f"{IDS[i]}-next-word")
    for i in (1, 3, 4)  # Inhibitor (K = Q), dot-product, PowerSoftmax
]


@pytest.mark.parametrize(("kind", "kw", "causal", "pooling"), PADDED)
def test_a_padded_input_gives_the_unpadded_logits_through_the_program(kind, kw, causal, pooling):
    model, ids, x, program_model = _split(kind, causal, pooling, **kw)
    program = export(program_model, x[:250], QuantConfig(n_bits=10))
    assert program.masked and program.client_pools
    _check_padded_program(program, model, ids, x, pooling)


def _check_padded_program(program, model, ids, x, pooling: str) -> None:
    """The program's per-position logits and mask, decoded, equal its twin and the float model on
    each review at its own length, whatever the padding positions hold."""
    out, clipped = program.run_int(program.quantize_input(x[:50]), OverflowPolicy.CLIP)
    assert not clipped and out.shape == (50, T, 3)  # per-position logits and the mask
    assert out[..., -1].tolist() == (ids[:50] != 0).long().tolist()
    got = program.dequantize_output(out)
    np.testing.assert_allclose(got, program.fake_forward(x[:50]), rtol=1e-9, atol=1e-9)
    with torch.no_grad():
        want = np.stack([model(ids[i : i + 1, : int((ids[i] != 0).sum())])[0] for i in range(50)])
    # each review at its own length, no padding at all (one row's rounding, not a mean of them)
    assert np.abs(got - want).max() < (0.03 if pooling == "mean" else 0.05)
    # whatever the padding positions hold, the words' integers and the decoded logits stay
    garbage = x[:50].clone()
    pad = garbage[..., -1] == 0
    garbage[..., :-1][pad] = 0.3 * torch.randn(int(pad.sum()), 8, dtype=torch.float64)
    again, _ = program.run_int(program.quantize_input(garbage), OverflowPolicy.CLIP)
    np.testing.assert_array_equal(again[~pad.numpy()], out[~pad.numpy()])
    np.testing.assert_array_equal(program.dequantize_output(again), got)


def test_masked_pooling_decodes_the_mean_over_words():
    y = np.array([[[4, -2, 1], [2, 6, 1], [9, 9, 0]]])  # two words, then a padding position
    np.testing.assert_allclose(decode_output(y, 0.5, True, masked=True), [[1.5, 1.0]])


def test_the_mask_costs_one_lookup_per_key_value():
    _, _, x, program_model = _split(AttentionKind.INHIBITOR, False)
    program = export(program_model, x[:100], QuantConfig(n_bits=6))
    masked = {
        n.name: n.attrs["shape"]
        for n in program.graph.nodes.values()
        if n.op == "lut" and ("masked" in n.name or n.name == "input.mask")
    }
    assert masked == {
        "input.mask": (T, 1),  # the client's column as exact 0/1 integers
        "block0.mix.v.masked": (2, T, 4),  # V per head: padding keys inhibit nothing
    }
    # V is signed; v − lo + K·m is unsigned, one bit wider (v + K·m would need two more)
    g = program.graph
    v, kept = g.nodes["block0.mix.v.out"], g.nodes["block0.mix.v.masked"]
    assert v.lo is not None and v.lo < 0 and v.bits is not None
    assert kept.lut_input_bits(g) == v.bits + 1


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_a_padded_programs_last_residual_folds_into_its_head(pooling):
    """With ``fold_last_residual`` (the TFHE recipe's), a padded model's last FFN residual goes
    straight into its per-position head, as an unpadded model's does: no requantisation lookups
    there, the same decoded logits (masked mean or last word) up to that requantisation's rounding,
    and the padding positions still change nothing."""
    model, ids, x, program_model = _split(AttentionKind.INHIBITOR, True, pooling, tie_qk=True)
    plain = QuantConfig(n_bits=10, client_pooling=True)
    folded = export(program_model, x[:250], plain.replace(fold_last_residual=True))
    unfolded = export(program_model, x[:250], plain)

    def luts(program):
        return {n.name for n in program.graph.nodes.values() if n.op == "lut"}

    assert "block0.res2.out" in luts(unfolded)
    assert luts(folded) == luts(unfolded) - {"block0.res2.out"}  # that requantisation, no other
    assert folded.graph.nodes["head.out"].op == "concat"  # the logits beside the mask, as before
    _check_padded_program(folded, model, ids, x, pooling)
