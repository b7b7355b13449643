"""IMDB sentiment from the CSV subsets: a regex word tokenizer and a vocabulary built on train."""

from __future__ import annotations

import csv
import gzip
import re
from collections import Counter
from pathlib import Path

import torch

from models.config import InputKind
from models.tasks.base import Metric, TaskData, require_file

OPTION = "--data-dir (or FHE_IMDB_DIR)"
PAD, UNK = 0, 1
_TOKEN = re.compile(r"[a-z0-9']+")
_TAG = re.compile(r"<[^>]+>")


def tokenize(text: str) -> list[str]:
    """Lower-case words, HTML line breaks removed."""
    return _TOKEN.findall(_TAG.sub(" ", text.lower()))


def read_csv(path: Path) -> tuple[list[str], list[int]]:
    require_file(path, OPTION, "expected imdb_train_6000.csv.gz and imdb_test_4000.csv.gz")
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    return [r["text"] for r in rows], [int(r["label"]) for r in rows]


def build_vocab(texts: list[str], size: int) -> list[str]:
    """The ``size - 2`` most frequent training words after <pad> and <unk> (ties broken
    alphabetically)."""
    counts = Counter(w for t in texts for w in tokenize(t))
    words = sorted(counts, key=lambda w: (-counts[w], w))[: size - 2]
    return ["<pad>", "<unk>", *words]


def encode(texts: list[str], vocab: list[str], seq_len: int) -> torch.Tensor:
    """Token ids (N, seq_len): the first ``seq_len`` words, right-padded with 0."""
    index = {w: i for i, w in enumerate(vocab)}
    out = torch.zeros(len(texts), seq_len, dtype=torch.long)
    for row, text in enumerate(texts):
        ids = [index.get(w, UNK) for w in tokenize(text)[:seq_len]]
        if ids:
            out[row, : len(ids)] = torch.tensor(ids)
    return out


def load_imdb(data_dir: str | Path, seq_len: int = 128, vocab_size: int = 10000) -> TaskData:
    data_dir = Path(data_dir)
    tr_text, tr_y = read_csv(data_dir / "imdb_train_6000.csv.gz")
    te_text, te_y = read_csv(data_dir / "imdb_test_4000.csv.gz")
    vocab = build_vocab(tr_text, vocab_size)
    return TaskData(
        "imdb",
        encode(tr_text, vocab, seq_len),
        torch.tensor(tr_y),
        encode(te_text, vocab, seq_len),
        torch.tensor(te_y),
        InputKind.TOKENS,
        len(vocab),
        2,
        Metric.ACCURACY,
        meta={"vocab": vocab, "seq_len": seq_len},
    )
