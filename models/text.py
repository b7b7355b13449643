"""Text on the client: tokens to the vectors an encrypted program reads.

A text model (``fhe train --task imdb --words 256 --seq-len 16``) is split in two
(:func:`split_text_model`):

- the **front end**, which the client runs in the clear (:class:`TextEncoder`): the tokenizer, the
  vocabulary, the embedding table, the segment means and the positions;
- the **encrypted program**, a model of :attr:`~models.config.InputKind.EMBEDDED` inputs: the
  blocks, the final norm, the pooling and the head.

Why the client embeds: an encrypted lookup over a 10,000-word vocabulary is a 14-bit table per
embedding column under TFHE and has no polynomial form under CKKS. What this reveals to the server:
nothing but the bucket (the program's ``seq_len``); the client holds the embedding table, which is
part of the model.

Segments: the first ``words`` words of a review are cut into ``seq_len`` contiguous segments of
(nearly) equal length and each segment is the mean of its words' embeddings
(:func:`models.segments.segment_means`; with ``segment_norm``, scaled to unit RMS, so that a
one-sentence review reaches the program at the size of a long one). Every position then holds
real words, whatever the review's length, so no padding mask enters the encrypted program and the
sequence-length bucket is all the server learns. It is a client-side reduction of the sequence
(fewer positions to attend over: T² lookups under TFHE), reported as such.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from models.config import InputKind, Pooling, TransformerConfig
from models.segments import segment_means, word_vectors
from models.transformer import Transformer

TEXT_JSON = "text.json"
TEXT_TENSORS = "text.safetensors"
TOKENIZER = "imdb-regex-v1"  # models.tasks.imdb.tokenize: lower-case [a-z0-9']+ words, no HTML tags


@dataclass(frozen=True)
class TextEncoder:
    """The client's front end of a text model: text → (T, d_model) vectors, in the clear.

    ``padded``: the model attends over ``words`` word positions (no segments), right-padded; each
    row then carries one more column, the key mask (1: a word, 0: padding), which the program
    reads encrypted (the server never learns the review's length). ``labels``: the names of the
    outputs, when the task has them (a next-word model's words). ``keep_last``: a text longer
    than ``words`` keeps its last words, not its first (a next-word model predicts the word after
    the text). ``segment_norm``: each segment mean (``padded``: each word's vector) is scaled to
    unit RMS before its position is added (:func:`models.segments.unit_rms`)."""

    vocab: tuple[str, ...]
    words: int
    embedding: np.ndarray  # (V, d_model), row 0 (padding) zero
    positions: np.ndarray  # (T, d_model)
    padded: bool = False
    labels: tuple[str, ...] | None = None
    keep_last: bool = False
    segment_norm: bool = False

    def __post_init__(self) -> None:
        emb, pos = np.asarray(self.embedding), np.asarray(self.positions)
        if emb.ndim != 2 or emb.shape[0] != len(self.vocab):
            raise ValueError(
                f"the embedding table has shape {emb.shape}, not one row per word of the "
                f"{len(self.vocab)}-word vocabulary: the vocabulary does not match the model"
            )
        if pos.ndim != 2 or pos.shape[1] != emb.shape[1]:
            raise ValueError(
                f"positions of shape {pos.shape} do not match embeddings of width {emb.shape[1]}"
            )
        if self.padded and self.words != pos.shape[0]:
            raise ValueError(f"a padded front end reads one word per position, not {self.words}")

    def label_of(self, output: int) -> str | None:
        """The name of output ``output`` (a next-word model's word), or None."""
        return self.labels[output] if self.labels and 0 <= output < len(self.labels) else None

    @property
    def seq_len(self) -> int:
        return int(self.positions.shape[0])

    def ids(self, texts: list[str]) -> Tensor:
        """Token ids (N, words): the first ``words`` words (the last, ``keep_last``), unknown ones
        as <unk>, right-padded."""
        from models.tasks.imdb import encode, tokenize

        if self.keep_last:
            texts = [" ".join(tokenize(t)[-self.words :]) for t in texts]
        return encode(list(texts), list(self.vocab), self.words)

    def truncation_note(self, text: str) -> str | None:
        """What the client leaves out of a text longer than the model reads, or None."""
        from models.tasks.imdb import tokenize

        n = len(tokenize(text))
        if n <= self.words:
            return None
        which = "last" if self.keep_last else "first"
        return f"note: the text has {n} words; the model reads its {which} {self.words}"

    def embed_ids(self, ids: Tensor | np.ndarray) -> np.ndarray:
        """(N, words) ids → (N, T, d_model) float32 (the model's precision; every path rounds the
        same way): segment means of the embeddings + positions; ``padded``: each word's embedding
        + its position, and the key mask column (N, T, d_model + 1). ``segment_norm``: each
        segment mean, or word embedding, at unit RMS first (padding stays 0)."""
        ids = torch.as_tensor(np.asarray(ids), dtype=torch.long)
        if ids.ndim != 2 or ids.shape[1] > self.words:
            raise ValueError(
                f"expected token ids of shape (N, <= {self.words}), got {tuple(ids.shape)}"
            )
        if int(ids.min()) < 0 or int(ids.max()) >= len(self.vocab):
            raise ValueError(f"token ids must lie in [0, {len(self.vocab)})")
        table = torch.as_tensor(self.embedding, dtype=torch.float64)
        positions = torch.as_tensor(self.positions, dtype=torch.float64)
        if self.padded:  # the model's own padding: id 0, embedding row 0 (zero)
            ids = torch.nn.functional.pad(ids, (0, self.words - ids.shape[1]))
            mask = (ids != 0).to(torch.float64)[..., None]
            words = word_vectors(table[ids], self.segment_norm)
            return torch.cat([words + positions, mask], dim=-1).float().numpy()
        means = segment_means(table[ids], ids, self.seq_len, self.segment_norm)
        return (means + positions).float().numpy()

    def encode(self, texts: list[str]) -> np.ndarray:
        """Texts → (N, T, d_model): what the client quantizes (TFHE) or packs (CKKS) and
        encrypts. A text with no word the tokenizer keeps is refused (ValueError)."""
        ids = self.ids(texts)
        empty = [i for i in range(len(ids)) if not ids[i].any()]
        if empty:
            which = "the text" if len(ids) == 1 else f"text {empty[0]}"
            raise ValueError(
                f"{which} has no words (the tokenizer keeps letters, digits and apostrophes); "
                "there is nothing to classify"
            )
        return self.embed_ids(ids)

    # ----------------------------------------------------------------------- files (no pickle)
    def save(self, folder: str | Path) -> None:
        from safetensors.numpy import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {
            "tokenizer": TOKENIZER,
            "words": self.words,
            "padded": self.padded,
            "vocab": list(self.vocab),
            "labels": None if self.labels is None else list(self.labels),
            "keep_last": self.keep_last,
            "segment_norm": self.segment_norm,
        }
        (folder / TEXT_JSON).write_text(json.dumps(meta))
        save_file(
            {"embedding": self.embedding.astype(np.float32), "positions": self.positions},
            str(folder / TEXT_TENSORS),
        )

    @classmethod
    def load(cls, folder: str | Path) -> TextEncoder:
        from safetensors.numpy import load_file

        folder = Path(folder)
        if not (folder / TEXT_JSON).exists():
            raise FileNotFoundError(
                f"{folder} has no {TEXT_JSON}: its model takes feature vectors, not text"
            )
        meta = json.loads((folder / TEXT_JSON).read_text())
        if meta.get("tokenizer") != TOKENIZER:
            raise ValueError(f"{folder / TEXT_JSON}: unknown tokenizer {meta.get('tokenizer')!r}")
        tensors = load_file(str(folder / TEXT_TENSORS))
        return cls(
            tuple(meta["vocab"]),
            int(meta["words"]),
            tensors["embedding"].astype(np.float64),
            tensors["positions"].astype(np.float64),
            bool(meta.get("padded", False)),
            None if meta.get("labels") is None else tuple(meta["labels"]),
            bool(meta.get("keep_last", False)),
            bool(meta.get("segment_norm", False)),  # artifacts from before it: plain means
        )


class NoEncryptedTextError(ValueError):
    """A token model whose front end cannot move to the client as it is."""


def split_text_model(model, vocab: list[str], labels: list[str] | None = None):
    """(:class:`TextEncoder`, the model of embedded inputs) for a token model: model(ids) ==
    program_model(encoder.embed_ids(ids)) up to float rounding.

    A model trained with ``words`` reads segment means (no padding reaches the program). One that
    attends over padded word positions keeps its key-padding mask: the client sends the mask as
    one more input column, encrypted, and the program masks the padding keys and pools over the
    words only (:attr:`TextEncoder.padded`). ``labels``: the outputs' names (the task's)."""
    cfg: TransformerConfig = model.config
    if cfg.input_kind is not InputKind.TOKENS:
        raise NoEncryptedTextError("not a token model")
    padded = cfg.words is None
    if padded and not cfg.mask_padding:
        raise NoEncryptedTextError(
            "this token model was trained attending to its padding (a model file from before "
            "masks); retrain it, with --words N (N words pooled into --seq-len segments on the "
            "client) or without (padding masked, the mask encrypted)"
        )
    encoder = TextEncoder(
        tuple(vocab),
        cfg.words or cfg.seq_len,
        model.embed.weight.detach().double().numpy().copy(),
        model.pos.detach().double().numpy()[: cfg.seq_len].copy(),
        padded,
        None if labels is None else tuple(labels),
        keep_last=cfg.pooling is Pooling.LAST,
        segment_norm=cfg.segment_norm,
    )
    inner = cfg.replace(
        input_kind=InputKind.EMBEDDED,
        in_features=cfg.d_model + int(padded),  # + the key mask column
        words=None,
        segment_norm=False,  # the client's
        mask_padding=padded,
    )
    program_model = Transformer(inner)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(("embed.", "pos"))}
    program_model.load_state_dict(state, strict=False)
    program_model.eval()
    return encoder, program_model


def join_text_model(model, program_model):
    """``model`` (a token model) with the program's weights (blocks, norms, head) of
    ``program_model`` (its split, e.g. after QAT through the integer program, norms folded): the
    inverse of :func:`split_text_model`, keeping ``model``'s embedding table and positions."""

    def front(key: str) -> bool:
        return key.startswith(("embed.", "pos"))

    folded = program_model.config  # QAT folds norms and means (models.fold.fold_norms)
    joined = Transformer(
        model.config.replace(norm=folded.norm, inhibitor_mean=folded.inhibitor_mean)
    )
    state = {k: v for k, v in model.state_dict().items() if front(k)}
    state.update({k: v for k, v in program_model.state_dict().items() if not front(k)})
    joined.load_state_dict(state)
    return joined.eval()


def embedded_task(data, encoder: TextEncoder):
    """``data`` (a token task) as the program of a split model reads it: every sample's
    (T, d_model) client vectors (:meth:`TextEncoder.embed_ids`; padded: and the key mask column)."""
    import dataclasses

    return dataclasses.replace(
        data,
        x_train=torch.from_numpy(encoder.embed_ids(data.x_train)),
        x_test=torch.from_numpy(encoder.embed_ids(data.x_test)),
        input_kind=InputKind.EMBEDDED,
        in_features=int(encoder.embedding.shape[1]) + int(encoder.padded),
    )
