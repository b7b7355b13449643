"""Next-word prediction on the IMDB review text: a small causal language model's task.

Each sample is a window of a review, L words from a window start (L drawn between ``seq_len // 4``
and ``seq_len``, so windows are right-padded to ``seq_len`` and the key mask matters), and its
label is the word that follows the window. The model predicts the ``n_outputs`` most frequent
training words (64: about 45% of all words), and only windows followed by one of them are kept: a
10,000-way head would be 10,000 encrypted outputs per position, and an ``<other>`` class would
take half the labels (a model that always says ``<other>`` scores 56%). Up to ``per_review``
windows per training review, one per test review (the 4000-review test split: about 4000
samples). Input words keep the whole 10,000-word vocabulary.

The model (:attr:`~models.config.Pooling.LAST`, causal) reads the window's words and predicts from
its last word's output; under encryption the program returns every position's logits beside the
encrypted mask and the client keeps its last word's row, so the server learns the bucket only.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from models.config import InputKind, Pooling
from models.tasks.base import Metric, TaskData
from models.tasks.imdb import UNK, build_vocab, read_csv, tokenize

N_OUTPUTS = 64  # the words a model predicts: the 64 most frequent
WINDOWS_PER_REVIEW = 8


def output_words(texts: list[str], n_outputs: int) -> list[str]:
    """The ``n_outputs`` most frequent training words (ties broken alphabetically)."""
    counts = Counter(w for t in texts for w in tokenize(t))
    return sorted(counts, key=lambda w: (-counts[w], w))[:n_outputs]


def windows(
    texts: list[str],
    vocab: list[str],
    targets: list[str],
    seq_len: int,
    per_review: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (N, seq_len) right-padded, next-word class (N,)): up to ``per_review`` windows of each
    text, starting every ``seq_len`` words, each of a random length in [max(1, seq_len // 4),
    seq_len] among those followed by a word of ``targets``."""
    index = {w: i for i, w in enumerate(vocab)}
    klass = {w: i for i, w in enumerate(targets)}
    lo = max(1, seq_len // 4)
    xs, ys = [], []
    for text in texts:
        words = tokenize(text)
        for start in range(0, len(words), seq_len)[:per_review]:
            ends = [
                n
                for n in range(lo, seq_len + 1)
                if start + n < len(words) and words[start + n] in klass
            ]
            if not ends:
                continue
            n = ends[int(torch.randint(len(ends), (1,), generator=generator))]
            row = torch.zeros(seq_len, dtype=torch.long)
            row[:n] = torch.tensor([index.get(w, UNK) for w in words[start : start + n]])
            xs.append(row)
            ys.append(klass[words[start + n]])
    return torch.stack(xs), torch.tensor(ys)


def load_imdb_lm(
    data_dir: str | Path,
    seq_len: int = 16,
    vocab_size: int = 10000,
    n_outputs: int = N_OUTPUTS,
    per_review: int = WINDOWS_PER_REVIEW,
) -> TaskData:
    data_dir = Path(data_dir)
    tr_text, _ = read_csv(data_dir / "imdb_train_6000.csv.gz")
    te_text, _ = read_csv(data_dir / "imdb_test_4000.csv.gz")
    vocab = build_vocab(tr_text, vocab_size)
    targets = output_words(tr_text, n_outputs)
    g = torch.Generator().manual_seed(20_000 + seq_len)  # a fixed dataset, apart from --seed
    x_train, y_train = windows(tr_text, vocab, targets, seq_len, per_review, g)
    x_test, y_test = windows(te_text, vocab, targets, seq_len, 1, g)
    return TaskData(
        "imdb-lm",
        x_train,
        y_train,
        x_test,
        y_test,
        InputKind.TOKENS,
        len(vocab),
        len(targets),
        Metric.ACCURACY,
        meta={"vocab": vocab, "seq_len": seq_len, "labels": targets},
        pooling=Pooling.LAST,
    )
