"""quant.graph_io: a program saved as JSON + safetensors (lookups as tables, no code) and loaded
back runs to the same integers, clipped counts included, as the program in memory, for every
attention kind, on calibration-like inputs and on the edge inputs that overflow its widths."""

import json

import numpy as np
import pytest
import torch
from test_export import tiny  # the export tests' small model (tests/quant is on sys.path)

from models import AttentionKind
from quant import QuantConfig
from quant.export import export
from quant.graph_io import load_graph, save_graph


def _program(kind: AttentionKind):
    model = tiny(kind, seq_len=4)
    calib = torch.rand(128, 4, 5, dtype=torch.float64)
    return export(model, calib, QuantConfig(n_bits=5, rounding_bits=1))


@pytest.mark.parametrize("kind", list(AttentionKind), ids=lambda k: k.value)
def test_a_saved_program_runs_like_the_one_in_memory(kind, tmp_path):
    program = _program(kind)
    graph = program.graph
    q = program.input_quantizer
    # calibrated on inputs near the zero point only, so inputs anywhere in range overflow
    narrow = np.random.default_rng(1).integers(-1, 2, size=(64, *graph.input_shape))
    graph.calibrate(np.clip(narrow + q.zero_point, q.qmin, q.qmax))
    save_graph(graph, tmp_path / "program")
    loaded = load_graph(tmp_path / "program")
    rng = np.random.default_rng(0)
    inputs = [
        program.quantize_input(torch.rand(64, 4, 5, dtype=torch.float64)),
        rng.integers(q.qmin, q.qmax + 1, size=(64, *graph.input_shape)),  # anywhere in range
        np.full((1, *graph.input_shape), q.qmax),
        np.full((1, *graph.input_shape), q.qmin),
    ]
    overflowed = 0
    for x in inputs:
        want, want_clipped = graph.run(x, "clip")
        got, got_clipped = loaded.run(x, "clip")
        np.testing.assert_array_equal(got, want)
        assert got_clipped == want_clipped
        overflowed += sum(want_clipped.values())
    assert [(n.name, n.op, n.lo, n.hi) for n in loaded.nodes.values()] == [
        (n.name, n.op, n.lo, n.hi) for n in graph.nodes.values()
    ]
    assert overflowed > 0, "the edge inputs should overflow the narrow calibration"


def test_the_files_hold_no_code(tmp_path):
    program = _program(AttentionKind.INHIBITOR)
    json_path, arrays_path = save_graph(program.graph, tmp_path / "program")
    doc = json.loads(json_path.read_text())
    luts = [n for n in doc["nodes"] if n["op"] == "lut"]
    assert luts and all(set(n["attrs"]["fn"]) == {"table", "start", "step"} for n in luts)
    assert b"pickle" not in arrays_path.read_bytes()[:4096]
    (tmp_path / "bad.json").write_text(json.dumps({"format": 99, "nodes": []}))
    (tmp_path / "bad.safetensors").write_bytes(arrays_path.read_bytes())
    with pytest.raises(ValueError, match="format"):
        load_graph(tmp_path / "bad")
