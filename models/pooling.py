"""The client's pooling of a padded text model's decrypted per-position outputs, under either scheme
(``quant.quantizer.decode_output`` for TFHE, ``fhe.ckks.program`` for CKKS): numpy only, so that a
CKKS server imports no torch."""

from __future__ import annotations

import numpy as np

from models.config import Pooling


def mean_over_words(per_position: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(..., T, n) per-position outputs and their (..., T, 1) 0/1 key mask → (..., n), the mean
    over the positions that hold words (the client's last step for a padded text model, under
    either scheme)."""
    return (per_position * mask).sum(axis=-2) / np.maximum(mask.sum(axis=-2), 1.0)


def last_word(per_position: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(..., T, n) per-position outputs and their (..., T, 1) 0/1 key mask → (..., n), the row of
    the last position that holds a word (a next-word model's logits; position 0 when none does):
    :func:`models.transformer.last_kept` on the client's decrypted outputs."""
    order = np.arange(mask.shape[-2])
    last = ((mask[..., 0] > 0.5) * order).argmax(-1)  # (...,)
    return np.take_along_axis(per_position, last[..., None, None], axis=-2)[..., 0, :]


def pool_words(
    per_position: np.ndarray, mask: np.ndarray, pooling: Pooling | str = Pooling.MEAN
) -> np.ndarray:
    """The client's pooling of a padded text model's decrypted per-position outputs: the mean over
    its words, or its last word's row (:class:`~models.config.Pooling`)."""
    if Pooling(pooling) is Pooling.LAST:
        return last_word(per_position, mask)
    return mean_over_words(per_position, mask)
