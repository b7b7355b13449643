"""Next-word prediction (``--task imdb-lm``): the windows and their labels, the last word's pooling
(``Pooling.LAST``) against the causal model's per-position outputs, and the client's decoding."""

import csv
import gzip

import numpy as np
import pytest
import torch

from models.config import Pooling, TransformerConfig
from models.pooling import last_word, pool_words
from models.tasks import load_task
from models.tasks.imdb import tokenize
from models.transformer import Transformer, last_kept
from quant.quantizer import decode_output

TEXTS = [
    "The film was a mess and the plot was dull, but the actor was great.",
    "I loved it. The best story of the year; the scenes are beautiful and the music is fun.",
    "Awful. Boring from the first scene to the last, and the ending is the worst of all.",
]


@pytest.fixture
def corpus(tmp_path):
    for name, n in (("imdb_train_6000.csv.gz", 30), ("imdb_test_4000.csv.gz", 6)):
        with gzip.open(tmp_path / name, "wt", encoding="utf-8", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["text", "label"])
            w.writeheader()
            for i in range(n):
                w.writerow({"text": TEXTS[i % 3], "label": i % 2})
    return tmp_path


def test_each_window_is_labelled_with_the_word_that_follows_it(corpus):
    data = load_task("imdb-lm", data_dir=corpus, seq_len=8)
    vocab, labels = data.meta["vocab"], data.meta["labels"]
    assert data.pooling is Pooling.LAST and data.n_outputs == len(labels) <= 64
    docs = [tokenize(t) for t in TEXTS]
    for x, y in zip(data.x_train.tolist(), data.y_train.tolist(), strict=True):
        n = sum(1 for i in x if i)
        assert 2 <= n <= 8 and all(i == 0 for i in x[n:])  # right-padded, >= seq_len // 4 words
        window = [vocab[i] for i in x[:n]]
        # the window occurs in one of the texts, followed by its label
        assert any(
            d[s : s + n] == window and d[s + n] == labels[y]
            for d in docs
            for s in range(0, len(d) - n)
        ), (window, labels[y])


def _lm(kind: str = "inhibitor") -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        seq_len=6, in_features=20, n_outputs=7, input_kind="tokens", attention=kind, d_model=8,
        n_heads=2, n_layers=2, norm="none", causal=True, pooling="last",
    )  # fmt: skip
    return Transformer(cfg).eval()


@pytest.mark.parametrize("kind", ["dot-product", "inhibitor", "power-softmax"])
def test_the_next_word_logits_are_the_causal_models_output_at_the_last_word(kind):
    """A causal model's output at position i reads words 0..i only, so the logits of a window of
    n words (padded) are the head at position n - 1 of any longer text that starts with it."""
    model = _lm(kind)
    full = torch.tensor([[3, 5, 7, 2, 9, 4]])
    with torch.no_grad():
        per_position = model.head(model.features(full))[0]  # (T, n_out), nothing padded
        for n in range(1, 7):
            window = torch.zeros(1, 6, dtype=torch.long)
            window[0, :n] = full[0, :n]
            torch.testing.assert_close(model(window)[0], per_position[n - 1])


def test_pooling_last_needs_word_positions():
    cfg = dict(seq_len=4, in_features=3, n_outputs=2, pooling="last")
    with pytest.raises(ValueError, match="word positions"):
        TransformerConfig(**cfg)  # patches: no last word
    with pytest.raises(ValueError, match="word positions"):
        TransformerConfig(**cfg, input_kind="tokens", words=8)  # segments
    TransformerConfig(**cfg, input_kind="tokens")


def test_the_client_keeps_the_last_words_row():
    rng = np.random.default_rng(0)
    per = rng.normal(size=(3, 5, 4))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=float)[..., None]
    np.testing.assert_array_equal(last_word(per, mask), per[[0, 1, 2], [2, 4, 0]])
    torch.testing.assert_close(
        last_kept(torch.from_numpy(per), torch.from_numpy(mask[..., 0] > 0)),
        torch.from_numpy(per[[0, 1, 2], [2, 4, 0]]),
    )
    np.testing.assert_array_equal(pool_words(per, mask, "last"), last_word(per, mask))
    # the TFHE program's output: integers times the scale, the mask as the last column
    y = np.concatenate([np.round(per * 10), mask], axis=-1)
    decoded = decode_output(y, 0.1, True, masked=True, pooling=Pooling.LAST)
    np.testing.assert_allclose(decoded, np.round(per[[0, 1, 2], [2, 4, 0]] * 10) * 0.1)


def test_a_next_word_models_client_reads_the_last_words_of_a_long_text(tmp_path):
    """The front end of a next-word model keeps the text's last words (the word after them is the
    prediction), says what it left out, and round-trips through its files (no pickle)."""
    from models.text import TextEncoder, split_text_model

    model = _lm()
    vocab = ["<pad>", "<unk>", *[f"w{i}" for i in range(18)]]
    labels = [f"w{i}" for i in range(7)]
    text, inner = split_text_model(model, vocab, labels)
    assert text.keep_last and text.label_of(3) == "w3" and text.label_of(99) is None
    long = " ".join(f"w{i}" for i in range(10))  # 10 words, the model reads 6
    assert text.ids([long])[0].tolist() == [vocab.index(f"w{i}") for i in range(4, 10)]
    assert text.truncation_note(long) == "note: the text has 10 words; the model reads its last 6"
    assert text.truncation_note("w1 w2") is None
    # the split model on the client's vectors == the token model on the kept words
    with torch.no_grad():
        expect = model(text.ids([long]))
        got = inner(torch.from_numpy(text.encode([long])))
    torch.testing.assert_close(got, expect, atol=1e-5, rtol=1e-5)
    text.save(tmp_path)
    again = TextEncoder.load(tmp_path)
    assert again.keep_last and again.labels == tuple(labels)
    np.testing.assert_array_equal(again.encode([long]), text.encode([long]))
