"""MNIST from the original IDX files: each image is a sequence of 28 rows of 28 pixels."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import torch

from models.config import InputKind
from models.tasks.base import DataFileError, Metric, TaskData, require_file, to_patches

OPTION = "--data-dir (or FHE_MNIST_DIR)"


def _read_bytes(path: Path) -> bytes:
    """Reads ``path``, ``path.gz``, or the ``path.gz.partNN`` pieces joined in order."""
    if path.exists():
        raw = path.read_bytes()
        return gzip.decompress(raw) if path.suffix == ".gz" else raw
    gz = path if path.suffix == ".gz" else path.with_name(path.name + ".gz")
    if gz.exists():
        return gzip.decompress(gz.read_bytes())
    parts = sorted(gz.parent.glob(gz.name + ".part*"))
    if parts:
        return gzip.decompress(b"".join(p.read_bytes() for p in parts))
    raise DataFileError(
        f"MNIST file not found: {gz} (nor its .partNN pieces); set the folder with {OPTION}"
    )


def read_idx(path: Path) -> np.ndarray:
    """Parses an IDX file (magic 2049 labels, 2051 images)."""
    raw = _read_bytes(path)
    magic = struct.unpack(">I", raw[:4])[0]
    if magic == 2049:
        n = struct.unpack(">I", raw[4:8])[0]
        return np.frombuffer(raw, dtype=np.uint8, count=n, offset=8)
    if magic == 2051:
        n, rows, cols = struct.unpack(">III", raw[4:16])
        return np.frombuffer(raw, dtype=np.uint8, count=n * rows * cols, offset=16).reshape(
            n, rows, cols
        )
    raise ValueError(f"{path}: not an IDX file (magic {magic})")


def load_mnist(
    data_dir: str | Path,
    n_train: int | None = None,
    n_test: int | None = None,
    patch: int | None = None,
) -> TaskData:
    data_dir = Path(data_dir)
    require_file(data_dir, OPTION, "it should hold the MNIST IDX .gz files")
    x_tr = read_idx(data_dir / "train-images-idx3-ubyte.gz")[:n_train]
    y_tr = read_idx(data_dir / "train-labels-idx1-ubyte.gz")[:n_train]
    x_te = read_idx(data_dir / "t10k-images-idx3-ubyte.gz")[:n_test]
    y_te = read_idx(data_dir / "t10k-labels-idx1-ubyte.gz")[:n_test]

    def to_x(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(to_patches(a.astype(np.float32) / 255.0, patch))

    def to_y(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.int64))

    return TaskData(
        "mnist",
        to_x(x_tr),
        to_y(y_tr),
        to_x(x_te),
        to_y(y_te),
        InputKind.PATCHES,
        28 if patch is None else patch * patch,
        10,
        Metric.ACCURACY,
        meta={"pixel_scale": 255.0, "patch": patch},
    )
