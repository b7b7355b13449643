"""Encrypted (or simulated) versus clear comparison for the TFHE backend (what ``fhe compare``
prints).

Three predictions per test sample: the float model, the clear integer program, and Concrete's run of
the compiled circuit (``simulate``: Concrete's simulation; ``execute``: encrypt, run, decrypt, in
this process or on Ray workers). The client's overflow policy applies
(:class:`fhe.harness.CompiledModel`): a sample that would take a value outside a calibrated width is
refused, counted, and left out of every figure. The CKKS counterpart is
:func:`fhe.ckks.compare.compare_ckks`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from fhe.errors import FheError
from fhe.schemes import CompareMode
from models.config import as_enum
from models.training import predict


class NothingToCompareError(FheError):
    """Every sample would overflow a calibrated width."""


def compare_tfhe(
    compiled,
    x: torch.Tensor,
    y: np.ndarray,
    mode: CompareMode = CompareMode.SIMULATE,
    workers: int = 0,
    address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_message: Callable[[str], None] | None = None,
) -> dict:
    """Accuracy, agreement and exact-match figures of ``compiled`` on ``x`` (labels ``y``).

    ``mode`` EXECUTE needs keys (``compiled.keygen()``); with ``workers`` or ``address`` the
    samples run on Ray (latency is then the batch's wall time over its size: throughput, not
    latency). ``progress(done, total)`` is called after each sample."""
    mode = as_enum(CompareMode, mode, "mode")
    flt = predict(compiled.program.model, x).numpy()
    x_int = compiled.program.quantize_input(x)
    clear, accepted = compiled.program.run_int_accepted(x_int)  # the reference, and who is refused
    if not accepted.any():
        raise NothingToCompareError(
            f"all {len(accepted)} samples would overflow a calibrated width; compile with --ranges "
            "proven or calibrate on data like them (--calib)"
        )
    todo = x_int[accepted]
    if mode is CompareMode.EXECUTE and (workers or address):
        from fhe.deploy.batch import execute_compiled

        outs, batch = execute_compiled(
            compiled, todo, workers, address, progress and (lambda done: progress(done, len(todo)))
        )
        if on_message:
            on_message(
                f"Ray: {batch.workers} workers, setup {batch.setup_s:.1f} s, "
                f"{batch.throughput:.3f} samples/s"
            )
        latencies = [batch.run_s / len(outs)] * len(outs)
    else:
        outs, latencies = [], []
        backend = compiled.backend
        for i, xi in enumerate(todo):
            start = time.perf_counter()
            outs.append(
                backend.simulate(xi)
                if mode is CompareMode.SIMULATE
                else backend.encrypt_run_decrypt(xi)
            )
            latencies.append(time.perf_counter() - start)
            if progress:
                progress(i + 1, len(todo))
    fhe_out, clear, flt, y = np.stack(outs), clear[accepted], flt[accepted], np.asarray(y)[accepted]
    logits = compiled.program.dequantize_output  # (a client-pooled program: per-token sums)
    pred = {
        "float": flt.argmax(-1),
        "clear": logits(clear).argmax(-1),
        mode.value: logits(fhe_out).argmax(-1),
    }
    return {
        "n": int(len(y)),
        "mode": mode.value,
        "n_bits": compiled.program.config.n_bits,
        "accuracy": {k: float((v == y).mean()) for k, v in pred.items()},
        "agreement": {
            f"{mode.value}_vs_clear": float((pred[mode.value] == pred["clear"]).mean()),
            f"{mode.value}_vs_float": float((pred[mode.value] == pred["float"]).mean()),
            "clear_vs_float": float((pred["clear"] == pred["float"]).mean()),
        },
        "exact_integer_match": float((fhe_out == clear).reshape(len(y), -1).all(axis=-1).mean()),
        "refused_overflow": int((~accepted).sum()),
        "latency_s": {"median": float(np.median(latencies)), "mean": float(np.mean(latencies))},
        "pbs_count": compiled.report()["pbs_count"],
    }
