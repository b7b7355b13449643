"""Sensible per-task defaults for model size and training, used by the CLI and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskPreset:
    d_model: int
    n_heads: int
    n_layers: int
    epochs: int
    batch_size: int
    lr: float


PRESETS: dict[str, TaskPreset] = {
    "adding": TaskPreset(d_model=32, n_heads=2, n_layers=1, epochs=10, batch_size=64, lr=2e-3),
    "digits": TaskPreset(d_model=32, n_heads=2, n_layers=1, epochs=30, batch_size=64, lr=3e-3),
    "mnist": TaskPreset(d_model=64, n_heads=4, n_layers=1, epochs=10, batch_size=128, lr=3e-3),
    "imdb": TaskPreset(d_model=64, n_heads=2, n_layers=1, epochs=5, batch_size=64, lr=2e-3),
    "imdb-lm": TaskPreset(d_model=16, n_heads=1, n_layers=1, epochs=10, batch_size=128, lr=3e-3),
}
