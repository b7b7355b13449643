"""The polynomial program as data: ``program.json`` (configuration, approximations, intervals) and
``program.npz`` (weights, read with ``allow_pickle=False``). Loading a program never runs code from
the file, unlike the pickle it replaces."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from fhe.ckks.approx import ApproxConfig
from fhe.ckks.program import PolyProgram
from models.config import TransformerConfig

FORMAT = "fhe-attention-ckks-program/1"


def _plain(value, arrays: dict[str, np.ndarray], path: str):
    """JSON-able form of ``value``; arrays go to ``arrays`` under ``path`` and leave a reference."""
    if isinstance(value, np.ndarray):
        arrays[path] = value
        return {"__array__": path}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v, arrays, f"{path}/{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, arrays, f"{path}/{i}") for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot store {type(value).__name__} at {path} in a CKKS program")


def _restore(value, arrays):
    if isinstance(value, dict):
        if set(value) == {"__array__"}:
            return arrays[value["__array__"]]
        return {k: _restore(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v, arrays) for v in value]
    return value


def save_program(program: PolyProgram, directory: Path) -> list[Path]:
    arrays: dict[str, np.ndarray] = {}
    doc = {
        "format": FORMAT,
        "config": program.config.to_dict(),
        "approx": dataclasses.asdict(program.approx),
        "weights": _plain(program.weights, arrays, "weights"),
        "ops": _plain(program.ops, arrays, "ops"),
        "calib_ranges": _plain(program.calib_ranges, arrays, "calib_ranges"),
    }
    (directory / "program.json").write_text(json.dumps(doc, indent=1))
    np.savez(directory / "program.npz", **arrays)
    return [directory / "program.json", directory / "program.npz"]


def load_program(directory: Path) -> PolyProgram:
    doc = json.loads((directory / "program.json").read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(
            f"{directory / 'program.json'} is not a CKKS program of this toolkit "
            f"(format {doc.get('format')!r}, expected {FORMAT!r})"
        )
    with np.load(directory / "program.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    ranges = {k: tuple(v) for k, v in _restore(doc["calib_ranges"], arrays).items()}
    return PolyProgram(
        TransformerConfig.from_dict(doc["config"]),
        _restore(doc["weights"], arrays),
        ApproxConfig(**doc["approx"]),
        _restore(doc["ops"], arrays),
        ranges,
    )
