"""TFHE defaults, the per-stage cost table, and the pre-flight check before keygen.

The default quantization keeps every programmable bootstrap (PBS) small
(benchmarks/results/tfhe_model.md): activations at 6 bits; Q/K/V at 3 bits, so every T²-sized
attention lookup reads 4 bits and Concrete puts those lookups (half of the digits model's large PBS)
on a cheaper parameter set (N = 2048 instead of 4096: the digits model from ~32 s to ~21 s per
sample); weights and inputs at 4 bits (weights widen the accumulators, and each accumulator bit
above the lookup width costs one small rounding PBS); every lookup input rounded to at most 5 bits
(a 6-bit lookup anywhere adds a parameter set with N = 8192: keys over 1.4 GB); percentile ranges.
Three choices that remove or cheapen lookups (benchmarks/results/digits_design_sweep.md, 3 seeds
each): the head runs per token and the client sums the decrypted per-token logits (mean pooling is
linear; the encrypted output is log2(T) bits narrower, which moved models whose widest value was
the pooled head from 12 to 11 bits and their N = 4096 lookups from 3 to 2 decomposition levels);
the last FFN residual goes straight into that head (W_h·h + (W_h W₂)·a: no requantisation lookups
for it); and the lookups that produce the 3-bit Q/K/V read 4 bits, which puts them with the
attention's 4-bit lookups on N = 2048 instead of 4096, for one more small rounding PBS each.
Together 17.4 s estimated per digits sample instead of 23.6 s, 95.8% instead of 95.9%.
Accuracy of the earlier choices over 5 QAT seeds is in the README. A model trained with ``fhe train
--qat-bits`` records the configuration it was trained for, and compiling it uses that record unless
an option overrides it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from fhe.errors import FheError
from fhe.tfhe.products import product_lookup_bits
from quant import QuantConfig
from quant.config import RangeMode

DEFAULT_QUANT = QuantConfig(
    n_bits=6,
    weight_bits=4,
    input_bits=4,
    attention_bits=3,
    lut_bits=5,
    range_mode=RangeMode.PERCENTILE,
    client_pooling=True,
    fold_last_residual=True,
    attention_lut_bits=4,
)

# Seconds of encrypted run per unit of Concrete's circuit complexity, measured on this project's
# 2-core machine (concrete-python 2.11, loop parallelism on): 5.4e-11 to 6.4e-11 over five whole
# models from 0.5e12 to 1.9e12 (benchmarks/results/tfhe_model.md), in a fast hour. The machine is
# shared and its speed drifts: in slow hours whole models ran 1.9-2.6x longer than this estimate
# (54 s for an estimated 24.5 s, benchmarks/results/peer_concrete_ml.md; MNIST 5360 s for 2094 s
# beside a test run), and Concrete ML's MLP 2.5-3x longer than the same constant gives for its
# circuit. An estimate for planning, not a promise.
SECONDS_PER_COMPLEXITY = 6.0e-11
SLOW_HOUR_FACTOR = 2.6  # the largest measured/estimated ratio of our whole models seen here
KEYGEN_MEMORY_FACTOR = 2.0  # keygen holds the keys and their serialisation at once


class KeysTooLargeError(FheError):
    """The evaluation keys would not fit in this machine's memory."""


def resolve_quant(recorded: dict | None = None, **overrides) -> QuantConfig:
    """The quantization to compile with: what the model file records (else :data:`DEFAULT_QUANT`),
    with every option the user gave (not None) applied on top; ``lut_bits=0`` turns rounding off,
    ``attention_lut_bits=0`` the Q/K/V lookups' own width."""
    base = QuantConfig.from_dict(recorded) if recorded else DEFAULT_QUANT
    changes = {k: v for k, v in overrides.items() if v is not None}
    for name in ("lut_bits", "attention_lut_bits"):
        if changes.get(name) == 0:
            changes[name] = None
    return base.replace(**changes)


def pbs_cost(param) -> float:
    """Relative cost of one PBS with Concrete parameter ``param``: n·ℓ external products, each
    (k+1)² polynomial products of size N by FFT."""
    k, n, big_n = param.glwe_dimension(), param.input_lwe_dimension(), param.polynomial_size()
    return n * param.level() * (k + 1) ** 2 * big_n * math.log2(big_n)


def _param_label(param) -> str:
    return f"N={param.polynomial_size()} k={param.glwe_dimension()} n={param.input_lwe_dimension()}"


def lookup_input_bits(node, graph) -> int | None:
    """Width of what a node's table lookups read: a lookup's (rounded) input, or for an encrypted
    product the operand sum a ± b that its quarter-square lookups read (fhe/tfhe/products.py)."""
    if node.op == "lut":
        return node.lut_input_bits(graph)
    a, b = (graph.nodes[i] for i in node.inputs)
    if a.lo is None or b.lo is None:
        return None
    return product_lookup_bits(a, b)


def stage_table(circuit, graph) -> list[dict]:
    """Per stage (the tags the program's nodes carry): PBS, widest lookup input (after rounding),
    widest integer, parameter sets with their PBS, and the estimated share of the run time (PBS
    weighted by :func:`pbs_cost`)."""
    per_tag = circuit.programmable_bootstrap_count_per_tag_per_parameter
    lut_bits: dict[str, int] = {}
    for node in graph.nodes.values():
        if node.tag and node.op in ("lut", "mul", "matmul"):
            lut_bits[node.tag] = max(lut_bits.get(node.tag, 0), lookup_input_bits(node, graph) or 0)
    rows = []
    for tag in sorted({n.tag for n in graph.nodes.values() if n.tag and n.op != "input"}):
        counts = per_tag.get(tag, {})
        rows.append(
            {
                "tag": tag,
                "pbs": int(sum(counts.values())),
                "lookup_input_bits": lut_bits.get(tag),
                "bit_width": int(circuit.graph.maximum_integer_bit_width(tag_filter=tag)),
                "params": {_param_label(p): int(n) for p, n in counts.items()},
                "cost": sum(pbs_cost(p) * n for p, n in counts.items()),
            }
        )
    total = sum(r["cost"] for r in rows) or 1.0
    for r in rows:
        r["est_time_share"] = round(r.pop("cost") / total, 4)
    return rows


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else a large number."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


@dataclass(frozen=True)
class Preflight:
    evaluation_key_bytes: int
    estimated_latency_s: float
    available_memory_bytes: int

    @property
    def keygen_memory_bytes(self) -> int:
        return int(self.evaluation_key_bytes * KEYGEN_MEMORY_FACTOR)

    def describe(self) -> str:
        return (
            f"expected evaluation keys {self.evaluation_key_bytes / 2**20:.0f} MiB, estimated "
            f"encrypted latency {self.estimated_latency_s:.1f} s per sample on 2 cores, up to "
            f"{self.estimated_latency_s * SLOW_HOUR_FACTOR:.0f} s on a busy or slower machine "
            "(from the circuit's complexity)"
        )

    def check(self) -> None:
        """Raises :class:`KeysTooLargeError` with the fixes when keygen would not fit in memory."""
        if self.keygen_memory_bytes > self.available_memory_bytes:
            raise KeysTooLargeError(
                f"keygen needs about {self.keygen_memory_bytes / 2**30:.1f} GiB "
                f"({self.evaluation_key_bytes / 2**30:.1f} GiB of evaluation keys) but only "
                f"{self.available_memory_bytes / 2**30:.1f} GiB is available. Make the lookups "
                "smaller: --lut-bits 5 (or lower), --attention-bits 4, --weight-bits 4, fewer "
                "tokens (--patch when training), or a smaller --d-model; `--no-run` still prints "
                "the cost report."
            )


def estimated_latency_s(circuit) -> float:
    """Concrete's complexity of ``circuit`` in seconds, at :data:`SECONDS_PER_COMPLEXITY` (measured
    on this project's 2-core machine in a fast hour): an estimate for planning."""
    return float(circuit.complexity) * SECONDS_PER_COMPLEXITY


def preflight(circuit, memory_bytes: int | None = None) -> Preflight:
    keys = int(circuit.size_of_bootstrap_keys + circuit.size_of_keyswitch_keys)
    env_memory = os.environ.get("FHE_AVAILABLE_MEMORY_BYTES")  # tests and constrained deployments
    memory = memory_bytes or (int(env_memory) if env_memory else available_memory_bytes())
    return Preflight(keys, estimated_latency_s(circuit), memory)
