"""A task: train/test tensors, the model input shape, and how to score predictions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch
from torch import Tensor

from models.config import InputKind, Pooling


class Metric(str, Enum):
    ACCURACY = "accuracy"  # higher is better, classification
    MSE = "mse"  # lower is better, regression


@dataclass
class TaskData:
    """Tensors of one task. ``x`` is (N, T, F) float for patch inputs, (N, T) long for tokens."""

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    input_kind: InputKind
    in_features: int
    n_outputs: int
    metric: Metric
    meta: dict = field(default_factory=dict)  # what is needed to rebuild inputs (e.g. a vocabulary)
    pooling: Pooling = Pooling.MEAN  # LAST: a next-word task (the label follows the last word)

    @property
    def seq_len(self) -> int:
        return int(self.x_train.shape[1])

    def loss_fn(self) -> Callable[[Tensor, Tensor], Tensor]:
        if self.metric is Metric.MSE:
            return lambda out, y: torch.nn.functional.mse_loss(out.squeeze(-1), y)
        return torch.nn.functional.cross_entropy

    def score(self, outputs: Tensor, y: Tensor) -> float:
        return score(self.metric, outputs, y)


def score(metric: Metric, outputs: Tensor, y: Tensor) -> float:
    """Accuracy (fraction of argmax hits) or mean squared error of ``outputs`` against ``y``."""
    if metric is Metric.MSE:
        return float(((outputs.reshape(-1).double() - y.reshape(-1).double()) ** 2).mean())
    return float((outputs.argmax(-1) == y).double().mean())


class DataFileError(FileNotFoundError):
    """A data file is missing; the message names the option that sets its path."""


def require_file(path, option: str, hint: str = "") -> None:
    from pathlib import Path

    if not Path(path).exists():
        raise DataFileError(
            f"data file not found: {path} (set it with {option}){'; ' + hint if hint else ''}"
        )


def to_patches(images, patch: int | None):
    """(N, H, W) images as sequences: rows (``patch`` None: H tokens of W pixels) or non-overlapping
    ``patch``×``patch`` squares in row-major order ((H/p)·(W/p) tokens of p² pixels). Fewer tokens
    make attention cheaper under encryption (its cost grows with T²)."""
    if patch is None:
        return images
    n, h, w = images.shape
    if patch < 1 or h % patch or w % patch:
        raise ValueError(f"--patch {patch} must divide the image size {h}x{w}")
    x = images.reshape(n, h // patch, patch, w // patch, patch).transpose(0, 1, 3, 2, 4)
    return x.reshape(n, (h // patch) * (w // patch), patch * patch)
