"""Tasks: the adding problem, sklearn digits, MNIST, IMDB sentiment and IMDB next-word
prediction, loaded from path options."""

from __future__ import annotations

import os
from pathlib import Path

from models.tasks.base import DataFileError, Metric, TaskData, score

TASKS = ("adding", "digits", "mnist", "imdb", "imdb-lm")


def default_data_dir(task: str) -> Path:
    """``FHE_<TASK>_DIR``, else ``FHE_DATA_DIR/<task>``, else ``../shared/data/<task>`` beside the
    repo (imdb-lm reads the imdb files)."""
    task = "imdb" if task == "imdb-lm" else task
    env = os.environ.get(f"FHE_{task.upper()}_DIR")
    if env:
        return Path(env)
    root = os.environ.get("FHE_DATA_DIR")
    if root:
        return Path(root) / task
    return Path(__file__).resolve().parents[2].parent / "shared" / "data" / task


def load_task(
    name: str,
    data_dir: str | Path | None = None,
    seq_len: int | None = None,
    seed: int = 0,
    limit: int | None = None,
    patch: int | None = None,
) -> TaskData:
    """Loads a task by name. ``seq_len`` applies to adding (default 100), imdb (default 128) and
    imdb-lm (default 16);
    ``patch`` (digits, mnist) makes tokens of patch×patch pixels instead of rows; ``limit`` caps the
    number of training samples (quick runs)."""
    if patch is not None and name not in ("digits", "mnist"):
        raise ValueError(f"--patch applies to image tasks (digits, mnist), not {name}")
    if name == "adding":
        from models.tasks.adding import load_adding

        data = load_adding(seq_len or 100, seed=0)
    elif name == "digits":
        from models.tasks.digits import load_digits_task

        data = load_digits_task(seed=0, patch=patch)
    elif name == "mnist":
        from models.tasks.mnist import load_mnist

        data = load_mnist(data_dir or default_data_dir("mnist"), patch=patch)
    elif name == "imdb":
        from models.tasks.imdb import load_imdb

        data = load_imdb(data_dir or default_data_dir("imdb"), seq_len=seq_len or 128)
    elif name == "imdb-lm":
        from models.tasks.imdb_lm import load_imdb_lm

        data = load_imdb_lm(data_dir or default_data_dir("imdb"), seq_len=seq_len or 16)
    else:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    if limit is not None:
        data.x_train, data.y_train = data.x_train[:limit], data.y_train[:limit]
    return data


def load_task_of(
    record: dict, data_dir: str | Path | None = None, seq_len: int | None = None
) -> TaskData:
    """The task a model was trained on, from the task record its checkpoint or artifact stores."""
    meta = record.get("meta") or {}
    return load_task(record["name"], data_dir=data_dir, seq_len=seq_len, patch=meta.get("patch"))


__all__ = [
    "TASKS",
    "load_task_of",
    "DataFileError",
    "Metric",
    "TaskData",
    "default_data_dir",
    "load_task",
    "score",
]
