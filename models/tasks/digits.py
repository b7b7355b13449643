"""sklearn's bundled 8×8 digits: each image is a sequence of 8 tokens (rows) of 8 pixels, or of 4
tokens (4×4 patches) of 16 pixels with ``patch=4``."""

from __future__ import annotations

import numpy as np
import torch

from models.config import InputKind
from models.tasks.base import Metric, TaskData, to_patches

PIXEL_MAX = 16.0  # digits pixels are integers 0..16


def load_digits_task(
    test_fraction: float = 0.2, seed: int = 0, patch: int | None = None
) -> TaskData:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = to_patches((data.images / PIXEL_MAX).astype(np.float32), patch)  # (N, T, F)
    y = data.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return TaskData(
        "digits",
        torch.from_numpy(x_tr),
        torch.from_numpy(y_tr),
        torch.from_numpy(x_te),
        torch.from_numpy(y_te),
        InputKind.PATCHES,
        x.shape[-1],
        10,
        Metric.ACCURACY,
        meta={"pixel_scale": PIXEL_MAX, "patch": patch},
    )
