"""An integer program on disk without code: JSON for the structure, safetensors for the arrays.

A lookup's ``fn`` is a Python function; on disk it becomes its table over every value its input can
take once clipped to the input node's calibrated width and rounded (``rounding_bits``), per element
(so per-channel lookups keep one column per channel). :func:`load_graph` rebuilds a :class:`Graph`
whose lookups read those tables, so ``graph.run`` gives the same integers as the original on every
input the circuit accepts. Nothing is unpickled or executed: the JSON holds names, numbers and
tuples; the safetensors file holds int64 arrays.

The TFHE client artifact carries it (``program.json`` + ``program.safetensors``) so the data owner
can refuse inputs that would overflow a calibrated width before encrypting them, as ``fhe compare``
does with the program in memory. It reveals the quantised weights to whoever holds the client
artifact (who, with ``fhe compile``, is the one who compiled the model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quant.ir import Graph, Node
from quant.ops import round_bit_pattern

FORMAT = 1


@dataclass(frozen=True)
class Table:
    """A lookup as a table: ``values[k, e]`` is the output of element ``e`` for input
    ``start + k * step``."""

    start: int
    step: int
    values: np.ndarray  # (K, *shape)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.int64)
        k = len(self.values)
        tail = self.values.shape[1:]
        flat = self.values.reshape(k, -1)
        lead = x.shape[: x.ndim - len(tail)]
        idx = np.clip((x.reshape(-1, flat.shape[1]) - self.start) // self.step, 0, k - 1)
        out = flat[idx, np.arange(flat.shape[1])[None, :]]
        return out.reshape(*lead, *tail)


def tabulate(graph: Graph, node: Node) -> Table:
    """``node``'s lookup over every input its source can deliver (clipped, then rounded)."""
    src = graph.nodes[node.inputs[0]]
    r = node.attrs.get("rounding_bits", 0)
    lo, hi = src.bit_range()
    step = 1 << r
    first = int(round_bit_pattern(np.asarray(lo, np.int64), r))
    last = int(round_bit_pattern(np.asarray(hi, np.int64), r))
    domain = np.arange(first, last + 1, step, dtype=np.int64)
    shape = tuple(node.attrs["shape"])
    grid = np.broadcast_to(domain.reshape(-1, *([1] * len(shape))), (len(domain), *shape))
    values = np.asarray(node.attrs["fn"](np.ascontiguousarray(grid)), dtype=np.int64)
    return Table(first, step, np.broadcast_to(values, grid.shape).copy())


def _encode(value, key: str, arrays: dict[str, np.ndarray]):
    if isinstance(value, np.ndarray):
        arrays[key] = np.ascontiguousarray(value.astype(np.int64))
        return {"array": key}
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, f"{key}.{i}", arrays) for i, v in enumerate(value)]}
    if isinstance(value, slice):
        return {"slice": [value.start, value.stop, value.step]}
    if value is Ellipsis:
        return {"ellipsis": True}
    raise TypeError(f"cannot store an attribute of type {type(value).__name__} ({key})")


def _decode(value, arrays: dict[str, np.ndarray]):
    if isinstance(value, dict):
        if "array" in value:
            return arrays[value["array"]]
        if "tuple" in value:
            return tuple(_decode(v, arrays) for v in value["tuple"])
        if "slice" in value:
            return slice(*value["slice"])
        if "ellipsis" in value:
            return Ellipsis
        raise ValueError(f"unknown encoded value {sorted(value)}")
    return value


def save_graph(graph: Graph, stem: str | Path) -> tuple[Path, Path]:
    """Writes ``<stem>.json`` and ``<stem>.safetensors``; returns both paths."""
    from safetensors.numpy import save_file

    stem = Path(stem)
    arrays: dict[str, np.ndarray] = {}
    nodes = []
    for node in graph.nodes.values():
        attrs = {}
        for name, value in node.attrs.items():
            if name == "fn":
                table = tabulate(graph, node)
                arrays[f"{node.name}/table"] = table.values
                attrs["fn"] = {
                    "table": f"{node.name}/table",
                    "start": table.start,
                    "step": table.step,
                }
            else:
                attrs[name] = _encode(value, f"{node.name}/{name}", arrays)
        nodes.append(
            {
                "name": node.name,
                "op": node.op,
                "inputs": list(node.inputs),
                "tag": node.tag,
                "lo": node.lo,
                "hi": node.hi,
                "attrs": attrs,
            }
        )
    doc = {"format": FORMAT, "output": graph.output_name, "nodes": nodes}
    json_path, arrays_path = stem.with_suffix(".json"), stem.with_suffix(".safetensors")
    json_path.write_text(json.dumps(doc))
    save_file(arrays, str(arrays_path))
    return json_path, arrays_path


def load_graph(stem: str | Path) -> Graph:
    """The program :func:`save_graph` wrote (``ValueError`` if the files are not one)."""
    from safetensors.numpy import load_file

    stem = Path(stem)
    doc = json.loads(stem.with_suffix(".json").read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"program format {doc.get('format')!r}, this toolkit reads {FORMAT}")
    arrays = load_file(str(stem.with_suffix(".safetensors")))
    graph = Graph()
    for entry in doc["nodes"]:
        attrs = {}
        for name, value in entry["attrs"].items():
            if name == "fn":
                attrs["fn"] = Table(value["start"], value["step"], arrays[value["table"]])
            else:
                attrs[name] = _decode(value, arrays)
        graph.add(entry["name"], entry["op"], tuple(entry["inputs"]), entry["tag"], **attrs)
        node = graph.nodes[entry["name"]]
        node.lo, node.hi = entry["lo"], entry["hi"]
    graph.set_output(doc["output"])
    return graph
