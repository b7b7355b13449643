"""Reports on an integer program: per-node bit widths and whether it fits TFHE's lookup limit."""

from __future__ import annotations

import numpy as np

from quant.ir import FREE_OPS, LUT_BIT_LIMIT, Graph


def node_rows(graph: Graph) -> list[dict]:
    rows = []
    for n in graph.nodes.values():
        if n.op in FREE_OPS:
            continue
        rows.append(
            {
                "node": n.name,
                "op": n.op,
                "tag": n.tag,
                "shape": list(n.attrs.get("shape", [])),
                "range": [n.lo, n.hi],
                "bits": n.bits,
                "lut_input_bits": n.lut_input_bits(graph),
            }
        )
    return rows


def program_summary(graph: Graph) -> dict:
    """The integer program's widths and lookup counts (max bit width, lookup input bits, PBS
    estimate, per-stage counts) as ``fhe quantize`` reports them."""
    luts = [n for n in graph.nodes.values() if n.op == "lut"]
    lut_bits = [b for n in luts if (b := n.lut_input_bits(graph)) is not None]  # calibrated
    per_tag: dict[str, int] = {}
    for n in graph.nodes.values():
        if n.bits is not None and n.tag:
            per_tag[n.tag] = max(per_tag.get(n.tag, 0), n.bits)
    return {
        "nodes": len(graph.nodes),
        "lut_nodes": len(luts),
        "max_bit_width": graph.max_bit_width(),
        "max_lut_input_bits": max(lut_bits, default=0),
        "fits_tfhe": max(lut_bits, default=0) <= LUT_BIT_LIMIT,
        "pbs_estimate": graph.pbs_estimate(),
        "bit_width_per_tag": per_tag,
    }


def format_program(graph: Graph, limit: int = LUT_BIT_LIMIT) -> str:
    """A Markdown table of the nodes that compute, with a ``!`` on lookups over the TFHE limit."""
    lines = ["| node | op | tag | range | bits | LUT in bits |", "|---|---|---|---|---|---|"]
    for r in node_rows(graph):
        lut = r["lut_input_bits"]
        flag = " !" if lut is not None and lut > limit else ""
        lines.append(
            f"| {r['node']} | {r['op']} | {r['tag']} | [{r['range'][0]}, {r['range'][1]}] | "
            f"{r['bits']} | {'' if lut is None else lut}{flag} |"
        )
    s = program_summary(graph)
    lines += [
        "",
        f"max bit width {s['max_bit_width']}, max table-lookup input {s['max_lut_input_bits']} "
        f"bits (TFHE limit {limit}), estimated PBS {s['pbs_estimate']}, "
        f"{'fits' if s['fits_tfhe'] else 'does NOT fit'} TFHE",
    ]
    return "\n".join(lines)


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of rows of ``outputs`` whose argmax is the label."""
    return float((np.asarray(outputs).argmax(-1) == np.asarray(labels)).mean())
