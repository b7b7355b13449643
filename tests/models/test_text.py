"""The text front end (models/text.py): segment means, the client/program split, its files."""

import json

import numpy as np
import pytest
import torch

from models.config import InputKind, TransformerConfig
from models.segments import segment_matrix
from models.text import NoEncryptedTextError, TextEncoder, split_text_model
from models.transformer import Transformer

VOCAB = ["<pad>", "<unk>", "good", "bad", "film", "plot", "great", "awful"]


def _segments_naive(ids: list[int], T: int) -> list[list[int]]:
    """The word positions of each segment, written out with integer arithmetic."""
    n = max(1, sum(1 for i in ids if i != 0))
    out = []
    for t in range(T):
        start = t * n // T
        end = max((t + 1) * n // T, start + 1)
        out.append(list(range(start, end)))
    return out


@pytest.mark.parametrize("n_words", [0, 1, 3, 8, 13, 32])
def test_segments_are_contiguous_nonempty_and_average_their_words(n_words):
    L, T = 32, 8
    ids = torch.zeros(1, L, dtype=torch.long)
    ids[0, :n_words] = torch.arange(n_words) % 6 + 2
    m = segment_matrix(ids, T)[0]
    assert torch.allclose(m.sum(-1), torch.ones(T))  # each row a mean
    for t, words in enumerate(_segments_naive(ids[0].tolist(), T)):
        want = torch.zeros(L)
        want[words] = 1.0 / len(words)
        assert torch.allclose(m[t], want), (t, words)
    if n_words >= T:  # every word in exactly one segment, none from the padding
        assert ((m > 0).sum(0)[:n_words] == 1).all() and (m[:, n_words:] == 0).all()


def _text_model(**kw) -> Transformer:
    cfg = TransformerConfig(
        seq_len=4,
        in_features=len(VOCAB),
        n_outputs=2,
        input_kind=InputKind.TOKENS,
        attention=kw.pop("attention", "inhibitor"),
        d_model=8,
        n_heads=2,
        norm="batchnorm",
        words=12,
        **kw,
    )
    torch.manual_seed(1)
    model = Transformer(cfg)
    with torch.no_grad():  # running statistics that are not the identity
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.mark.parametrize("segment_norm", [False, True], ids=["", "norm"])
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
@pytest.mark.parametrize("attention", ["inhibitor", "dot-product", "power-softmax"])
def test_the_split_model_on_client_vectors_equals_the_token_model(attention, causal, segment_norm):
    model = _text_model(attention=attention, causal=causal, segment_norm=segment_norm)
    ids = torch.randint(2, len(VOCAB), (5, 12))
    ids[0, 7:] = 0  # a short review, right-padded
    ids[1, 2:] = 0  # shorter than the bucket: words repeat
    encoder, program_model = split_text_model(model, VOCAB)
    assert program_model.config.input_kind is InputKind.EMBEDDED
    assert program_model.config.causal is causal
    assert encoder.segment_norm is segment_norm and not program_model.config.segment_norm
    program_model.requires_grad_(True)  # its input layer is the client's: it never trains
    assert not program_model.embed.weight.requires_grad and not program_model.pos.requires_grad
    assert all(p.requires_grad for p in program_model.blocks.parameters())
    with torch.no_grad():
        want = model(ids).double().numpy()
        got = program_model(torch.from_numpy(encoder.embed_ids(ids))).double().numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_segment_norm_scales_each_segment_mean_to_unit_rms_and_a_short_review_to_a_long_ones_size():
    """models.segments.unit_rms against the RMS written out per segment, on the client's vectors;
    and what it is for: without it a review of single-word segments reaches the program several
    times larger than one of many-word segments, with it at the same RMS."""
    plain = _text_model()
    normed = _text_model(segment_norm=True)  # the same weights (same seed)
    enc_plain, _ = split_text_model(plain, VOCAB)
    enc_norm, program_norm = split_text_model(normed, VOCAB)
    ids = torch.tensor([[2, 3, 4, 5, 6, 7, 2, 3, 4, 5, 6, 7], [6, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    means = enc_plain.embed_ids(ids) - enc_plain.positions  # (2, 4, 8) segment means
    want = np.stack(
        [[row / np.sqrt(np.mean(row * row) + 1e-6) for row in sample] for sample in means]
    )
    got = enc_norm.embed_ids(ids) - enc_norm.positions
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(np.sqrt((got**2).mean(-1)), 1.0, atol=1e-4)
    rms = np.sqrt((means**2).mean(-1)).mean(-1)  # long review's means of 3 words vs single words
    assert rms[1] > 1.3 * rms[0]
    with torch.no_grad():  # the token model computes the same front end
        np.testing.assert_allclose(
            normed(ids).numpy(),
            program_norm(torch.from_numpy(enc_norm.embed_ids(ids))).numpy(),
            atol=1e-5,
        )
    with pytest.raises(ValueError, match="segment_norm scales the client's word vectors"):
        TransformerConfig(seq_len=4, in_features=8, n_outputs=2, segment_norm=True)  # patches


def test_padding_does_not_change_a_reviews_logits():
    model = _text_model()
    ids = torch.tensor([[2, 3, 4, 5, 6, 7, 2]])
    padded = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded), model(ids))


def test_the_encoder_round_trips_through_json_and_safetensors(tmp_path):
    encoder, _ = split_text_model(_text_model(), VOCAB)
    encoder.save(tmp_path)
    back = TextEncoder.load(tmp_path)
    assert back.vocab == encoder.vocab and back.words == 12 and back.seq_len == 4
    text = "A good film, a GREAT plot... not awful! <br />unseenword"
    ids = back.ids([text])
    assert ids[0, :9].tolist() == [1, 2, 4, 1, 6, 5, 1, 7, 1] and ids[0, 9:].eq(0).all()
    np.testing.assert_allclose(back.encode([text]), encoder.encode([text]), atol=1e-6)
    meta = json.loads((tmp_path / "text.json").read_text())
    assert meta["segment_norm"] is False
    normed, _ = split_text_model(_text_model(segment_norm=True), VOCAB)
    normed.save(tmp_path / "norm")
    assert TextEncoder.load(tmp_path / "norm").segment_norm
    np.testing.assert_allclose(
        TextEncoder.load(tmp_path / "norm").encode([text]), normed.encode([text]), atol=1e-6
    )
    old = json.loads((tmp_path / "norm" / "text.json").read_text())
    del old["segment_norm"]  # a client folder from before segment_norm: plain means
    (tmp_path / "norm" / "text.json").write_text(json.dumps(old))
    assert not TextEncoder.load(tmp_path / "norm").segment_norm
    (tmp_path / "text.json").write_text(json.dumps({**meta, "vocab": meta["vocab"][:-1]}))
    with pytest.raises(ValueError, match="the vocabulary does not match the model"):
        TextEncoder.load(tmp_path)  # another model's vocabulary: refused, not a wrong answer
    (tmp_path / "text.json").write_text('{"tokenizer": "bpe", "words": 3, "vocab": []}')
    with pytest.raises(ValueError, match="unknown tokenizer"):
        TextEncoder.load(tmp_path)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 8\)"):
        encoder.embed_ids(np.array([[3, 99]]))
    with pytest.raises(ValueError, match="text 1 has no words"):
        encoder.encode(["good", " <br /> ... "])


def test_a_padded_model_splits_with_its_mask_and_an_old_unmasked_one_is_refused():
    cfg = TransformerConfig(seq_len=12, in_features=8, n_outputs=2, input_kind=InputKind.TOKENS)
    encoder, program_model = split_text_model(Transformer(cfg), VOCAB)
    assert encoder.padded and program_model.config.in_features == cfg.d_model + 1
    ids = torch.tensor([[2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    assert encoder.embed_ids(ids)[0, :, -1].tolist() == [1.0] * 3 + [0.0] * 9  # the key mask
    old = cfg.replace(mask_padding=False)  # a file from before masks attended to its padding
    with pytest.raises(NoEncryptedTextError, match="--words"):
        split_text_model(Transformer(old), VOCAB)
    with pytest.raises(ValueError, match="words=3"):
        TransformerConfig(seq_len=4, in_features=8, n_outputs=2, input_kind="tokens", words=3)


@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_a_padded_model_with_segment_norm_scales_each_word_and_splits_exactly(causal, tmp_path):
    """Padded word positions with ``segment_norm``: each word's vector at unit RMS (the RMS
    written out here), padding left at 0 and masked; the client's vectors through the program
    model give the token model's logits, and the padding does not change them."""
    cfg = TransformerConfig(
        seq_len=12,
        in_features=len(VOCAB),
        n_outputs=3,
        input_kind=InputKind.TOKENS,
        attention="inhibitor",
        d_model=8,
        causal=causal,
        segment_norm=True,
    )
    torch.manual_seed(3)
    model = Transformer(cfg).eval()
    plain_cfg = cfg.replace(segment_norm=False)
    plain = Transformer(plain_cfg).eval()
    plain.load_state_dict(model.state_dict())  # the same weights, no norm
    encoder, program_model = split_text_model(model, VOCAB)
    plain_encoder, _ = split_text_model(plain, VOCAB)
    assert encoder.padded and encoder.segment_norm and not program_model.config.segment_norm
    ids = torch.tensor([[2, 3, 4, 5, 6, 7, 2, 3, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    words = plain_encoder.embed_ids(ids)[..., :-1] - encoder.positions  # each word's embedding
    rms = np.sqrt((words**2).mean(-1, keepdims=True) + 1e-6)
    want = np.where(ids.numpy()[..., None] != 0, words / rms, 0.0)
    got = encoder.embed_ids(ids)
    np.testing.assert_allclose(got[..., :-1] - encoder.positions, want, atol=1e-5)
    np.testing.assert_array_equal(got[..., -1], (ids != 0).float().numpy())  # the key mask
    with torch.no_grad():
        logits = model(ids)
        np.testing.assert_allclose(
            program_model(torch.from_numpy(got)).numpy(), logits.numpy(), atol=1e-5
        )
        assert not torch.allclose(logits, plain(ids), atol=1e-3)  # the norm changes the model
        torch.testing.assert_close(model(ids[:1, :8]), logits[:1])  # padding changes nothing
    encoder.save(tmp_path)  # the client's files keep the norm
    np.testing.assert_allclose(TextEncoder.load(tmp_path).embed_ids(ids), got, atol=1e-6)


def test_joining_a_folded_program_back_gives_the_program_on_client_vectors():
    from models.fold import fold_norms
    from models.text import join_text_model

    model = _text_model()
    encoder, program_model = split_text_model(model, VOCAB)
    folded = fold_norms(program_model)  # what QAT through the integer program returns
    with torch.no_grad():
        for p in folded.head.parameters():
            p.add_(0.1)  # as if fine-tuned
        joined = join_text_model(model, folded)
        ids = torch.randint(2, len(VOCAB), (3, 12))
        want = folded(torch.from_numpy(encoder.embed_ids(ids)))
        torch.testing.assert_close(joined(ids), want, atol=1e-5, rtol=1e-5)
    assert joined.config.norm.value == "none" and joined.config.words == 12
