"""The adding problem (Hochreiter & Schmidhuber 1997): sum the two marked numbers of a sequence."""

from __future__ import annotations

import torch

from models.config import InputKind
from models.tasks.base import Metric, TaskData


def make_adding(
    n: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (n, seq_len, 2) with uniform values in [0, 1] and a two-hot marker; y = Σ value·marker."""
    values = torch.rand(n, seq_len, generator=generator)
    markers = torch.zeros(n, seq_len)
    first = torch.randint(0, seq_len // 2, (n,), generator=generator)
    second = torch.randint(seq_len // 2, seq_len, (n,), generator=generator)
    markers[torch.arange(n), first] = 1.0
    markers[torch.arange(n), second] = 1.0
    x = torch.stack([values, markers], dim=-1)
    return x, (values * markers).sum(dim=1)


def load_adding(
    seq_len: int = 100, n_train: int = 20000, n_test: int = 2000, seed: int = 0
) -> TaskData:
    """A fixed synthetic dataset (its seed is independent of the training seed)."""
    if seq_len < 2:
        raise ValueError(f"the adding problem needs seq_len >= 2, got {seq_len}")
    g = torch.Generator().manual_seed(10_000 + seed)
    x_train, y_train = make_adding(n_train, seq_len, g)
    x_test, y_test = make_adding(n_test, seq_len, g)
    return TaskData(
        "adding",
        x_train,
        y_train,
        x_test,
        y_test,
        InputKind.PATCHES,
        2,
        1,
        Metric.MSE,
        meta={"seq_len": seq_len},
    )
