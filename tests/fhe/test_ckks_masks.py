"""Causal and key-padding masks in the polynomial (CKKS) programs, in the clear: the batch program
and the packed one (all offsets in the slots, or offset by offset) against the float model's
inference form (PowerSoftmax paper Eqs. 7 and 11), and against the unpadded review.

The Inhibitor's |x| and ReLU are Chebyshev fits (error ~ activation_tol × the interval), so its
masked programs are held to what its unmasked program achieves against the float model, to the
batch program (packed == batch, exactly), and to padding that changes nothing."""

import numpy as np
import pytest
import torch

from fhe.ckks.packed import PackedProgram
from fhe.ckks.program import build_program, float_inference_form
from models import Transformer, TransformerConfig
from models.text import split_text_model

VOCAB = ["<pad>", "<unk>"] + [f"w{i}" for i in range(30)]
T = 6


INHIBITORS = ("inhibitor", "signed-inhibitor")


def _len(kind: str) -> int:
    return 4 if kind in INHIBITORS else T  # the packed Inhibitor takes power-of-two lengths


def _model(causal: bool, kind: str = "power-softmax", **kw) -> Transformer:
    torch.manual_seed(0)
    power = dict(power_form="length-agnostic", power_eps=0.05) if kind == "power-softmax" else {}
    cfg = TransformerConfig(
        seq_len=_len(kind),
        norm="none",
        d_model=8,
        n_heads=2,
        attention=kind,
        causal=causal,
        ffn_activation="quad",
        **power,
        **kw,
    )
    return Transformer(cfg).double().eval()


def _programs(prog):
    yield "batch", prog.clear
    for slots in (4096, 512):  # every offset in the slots / offset by offset
        packed = PackedProgram(prog, slots)
        yield f"packed({packed.pack_attention})", packed.clear


@pytest.mark.parametrize(
    ("kind", "mean"),
    [("power-softmax", False), ("dot-product", False)]
    + [(k, mean) for k in INHIBITORS for mean in (False, True)],
    ids=lambda v: {True: "mean", False: "sums"}.get(v, v) if not isinstance(v, str) else v,
)
def test_causal_polynomial_programs_equal_the_causal_float_model(kind, mean):
    extra = {"inhibitor_mean": True} if mean else {}  # the Inhibitor's sums as means
    model = _model(True, kind, in_features=5, n_outputs=3, **extra)
    x = 3 * torch.rand(400, _len(kind), 5, dtype=torch.float64)
    prog = build_program(model, x[:360])
    want = float_inference_form(model, x[360:])
    unmasked = Transformer(model.config.replace(causal=False, inhibitor_mean=False)).double().eval()
    unmasked.load_state_dict(model.state_dict())
    reference = float_inference_form(unmasked, x[360:])
    gap = np.abs(want - reference).max()
    # the polynomials' own error: the unmasked program against its float model
    own = np.abs(build_program(unmasked, x[:360]).clear(x[360:].numpy()) - reference).max()
    tol = {"power-softmax": 1e-4, "dot-product": 1e-3}.get(kind, 1.5 * own)
    batch = prog.clear(x[360:].numpy())
    for name, run in _programs(prog):
        got = run(x[360:].numpy())
        assert np.abs(got - want).max() < min(tol, gap / 2), name
        np.testing.assert_allclose(got, batch, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("kind", INHIBITORS)
def test_the_inhibitors_means_without_a_mask_fold_into_the_polynomial_programs(kind):
    """``inhibitor_mean`` without the causal mask: 1 / T folded into the output projection
    (models.fold.fold_means) before the program is built; batch and packed follow the float
    means, not the sums of the same weights."""
    model = _model(False, kind, in_features=5, n_outputs=3, inhibitor_mean=True)
    sums = Transformer(model.config.replace(inhibitor_mean=False)).double().eval()
    sums.load_state_dict(model.state_dict())
    x = 3 * torch.rand(400, _len(kind), 5, dtype=torch.float64)
    prog = build_program(model, x[:360])
    want = float_inference_form(model, x[360:])
    gap = np.abs(want - float_inference_form(sums, x[360:])).max()
    for name, run in _programs(prog):
        assert np.abs(run(x[360:].numpy()) - want).max() < gap / 4, name


@pytest.mark.parametrize(
    ("kind", "causal", "pooling"),
    [
        ("power-softmax", False, "mean"),
        ("power-softmax", True, "mean"),
        ("power-softmax", True, "last"),  # a next-word model: the client keeps the last word's row
        ("activator", False, "mean"),
        ("dot-product", False, "mean"),
        ("dot-product", True, "mean"),
        ("inhibitor", False, "mean"),
        ("signed-inhibitor", True, "mean"),
    ],
    ids=lambda v: {True: "causal", False: "full"}.get(v, v) if not isinstance(v, str) else v,
)
def test_a_padded_review_gives_its_unpadded_logits_through_the_polynomial_programs(
    kind, causal, pooling
):
    token_model = _model(
        causal, kind, in_features=len(VOCAB), n_outputs=2, input_kind="tokens", pooling=pooling
    )
    n_tok = _len(kind)
    ids = torch.randint(2, len(VOCAB), (2040, n_tok))
    for i, n in enumerate(torch.randint(1, n_tok + 1, (2040,)).tolist()):
        ids[i, n:] = 0
    encoder, model = split_text_model(token_model, VOCAB)
    x = encoder.embed_ids(ids).astype(np.float64)
    prog = build_program(model.double(), x[:2000])  # intervals that cover short reviews
    with torch.no_grad():  # each review at its own length: no padding at all
        want = np.stack([token_model(r[None, : int((r != 0).sum())])[0] for r in ids[2000:]])
    garbage = x[2000:].copy()
    pad = garbage[..., -1] == 0
    garbage[..., :-1][pad] = np.random.default_rng(0).normal(0, 0.3, (int(pad.sum()), 8))
    # the activator's own polynomial: ~2e-3; the Inhibitor's |x| and ReLU fits: see the docstring
    batch = prog.clear(x[2000:])
    full = (ids[2000:] != 0).all(1).numpy()  # reviews with no padding: the polynomials' own error
    own = np.abs(batch[full] - want[full]).max()
    tol = {"power-softmax": 1e-3, "dot-product": 1e-3, "activator": 1e-2}.get(kind, 2 * own)
    for name, run in _programs(prog):
        got = run(x[2000:])
        assert np.abs(got - want).max() < tol, name
        np.testing.assert_allclose(got, batch, atol=1e-9, err_msg=name)
        np.testing.assert_allclose(run(garbage), got, atol=1e-9, err_msg=name)
