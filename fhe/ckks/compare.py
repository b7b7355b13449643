"""Encrypted versus clear comparison for the CKKS backend (what ``fhe compare --scheme ckks``
prints).

Four predictions per test sample: the float model as trained, the float model in its inference form
(length-agnostic PowerSoftmax, Eq. 7: the function the polynomial program approximates), the clear
polynomial program, and the encrypted run (the batch layout packs up to N/2 samples per ciphertext;
the packed layout runs one sample per ciphertext, so its latency per batch is that of one query).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from fhe.ckks.arith import ClearArith
from fhe.ckks.program import float_inference_form
from models.training import predict


def batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def compare_ckks(
    compiled,
    x: torch.Tensor,
    y: np.ndarray,
    execute: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """``fhe compare --scheme ckks``: float, float inference form, clear polynomial program and
    (``execute``) encrypted outputs of the samples ``x``, with accuracies against ``y``, argmax
    agreement and errors between them."""
    backend = compiled.backend
    x_np = np.asarray(x, dtype=np.float64)
    outputs = {
        "float": predict(compiled.model, x).double().numpy(),
        "float_inference": float_inference_form(compiled.model, x),
    }
    ar = ClearArith()
    with np.errstate(
        all="ignore"
    ):  # a polynomial far outside its interval overflows; counted below
        outputs["poly_clear"] = backend.program.clear(x_np, ar)
    result: dict = {
        "n": int(len(y)),
        "scheme": "ckks",
        "mode": "execute" if execute else "simulate",
        "layout": backend.layout,
        "layout_reason": backend.meta.get("layout_reason"),
    }
    if execute:
        backend.keygen()
        packed = backend.layout == "packed"
        size = (
            1 if packed else backend.params.batch_size or backend.plan.slots
        )  # packed: one query per run
        enc, runs = [], []
        for sl in batches(len(x_np), size):
            if progress:
                progress(
                    f"encrypted run on samples {sl.start}..{sl.stop - 1} "
                    f"(N={backend.plan.poly_modulus_degree}, chain depth {backend.plan.depth}) ..."
                )
            start = time.perf_counter()
            enc.append(backend.encrypt_run_decrypt(x_np[sl]))
            runs.append(time.perf_counter() - start)
        outputs["encrypted"] = np.concatenate(enc)
        err = (outputs["encrypted"] - outputs["poly_clear"]) ** 2
        result["mse_encrypted_vs_clear"] = {
            "max_per_sample": float(err.mean(1).max()),
            "mean": float(err.mean()),
        }
        result["max_abs_error_encrypted_vs_clear"] = float(np.sqrt(err.max()))
        result["latency_s"] = {
            "per_batch": runs,
            "samples_per_batch": size,
            "amortised_per_sample": float(sum(runs) / len(x_np)),
        }
    preds = {k: v.argmax(-1) for k, v in outputs.items()}
    result["accuracy"] = {k: float((p == y).mean()) for k, p in preds.items()}
    result["agreement"] = {
        f"{a}_vs_{b}": float((preds[a] == preds[b]).mean())
        for a, b in (
            ("encrypted", "poly_clear"),
            ("poly_clear", "float_inference"),
            ("poly_clear", "float"),
        )
        if a in preds and b in preds
    }
    per_sample = ((outputs["poly_clear"] - outputs["float_inference"]) ** 2).mean(1)
    result["mse_poly_vs_float_inference"] = {
        "mean": float(per_sample.mean()),
        "median": float(np.median(per_sample)),
        "max": float(per_sample.max()),
    }
    acc = result["accuracy"]
    result["accuracy_drop_poly_vs_float_points"] = 100 * (acc["float"] - acc["poly_clear"])
    result["values_outside_calibrated_intervals"] = dict(ar.outside)
    if any(ar.outside.values()) and progress:
        left = ", ".join(f"{k}: {v}" for k, v in ar.outside.items() if v)
        progress(
            f"warning: inputs left a calibrated interval ({left}); the polynomial diverges there: "
            "recalibrate with more samples (--calib) or a wider --margin"
        )
    rep = backend.report()
    keys = ("depth", "program_depth_without_refresh", "poly_modulus_degree", "coeff_mod_bit_sizes")
    result.update({k: rep[k] for k in (*keys, "op_counts", "engine", "bootstraps") if k in rep})
    return result
