"""CKKS's steps: pick the layout, build and plan the polynomial program (TenSEAL), compare with the
clear polynomial program."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from fhe.api._common import Echo
from fhe.api.compilation import SchemeSteps, register_steps
from fhe.errors import BadOptionError, FheError
from fhe.schemes import CkksEngine, CkksLayout, CompareMode, LayoutOption, Scheme

# polynomials diverge outside their intervals: the intervals must cover the tails
CKKS_CALIB_SAMPLES = 5000


@dataclass(frozen=True)
class LayoutChoice:
    """The CKKS layout a run uses, and why (printed in the report and kept in its JSON)."""

    layout: CkksLayout
    reason: str


def choose_layout(options, for_dataset: bool) -> LayoutChoice:
    """``--layout auto``: one query (``fhe compile``, then ``fhe run``/``serve`` on its artifacts)
    gets the packed layout, whose latency is that of one sample; a dataset (``fhe compare``) gets
    the batch layout, N/2 samples per run for the cost of one; a client-assisted refresh exists
    only in the batch layout. An explicit ``--layout`` is kept as asked."""
    if options.layout is not LayoutOption.AUTO:
        asked = CkksLayout(options.layout.value)
        return LayoutChoice(asked, f"--layout {asked.value} asked for")
    if options.engine is CkksEngine.OPENFHE:
        return LayoutChoice(
            CkksLayout.PACKED, "auto: the OpenFHE engine bootstraps the packed layout only"
        )
    if for_dataset:
        return LayoutChoice(
            CkksLayout.BATCH,
            "auto: a dataset, so the batch layout (N/2 samples per run at the cost of one)",
        )
    if options.refresh:
        return LayoutChoice(
            CkksLayout.BATCH, "auto: --refresh asked for, and only the batch layout refreshes"
        )
    return LayoutChoice(
        CkksLayout.PACKED,
        "auto: one query, so the packed layout (the latency of one sample; --layout batch for "
        "throughput)",
    )


@register_steps
class CkksSteps(SchemeSteps):
    scheme = Scheme.CKKS
    calib_samples = CKKS_CALIB_SAMPLES
    server_label = "public context, no secret key"
    shows_progress = False

    def target(self, options) -> str:
        layout = choose_layout(options, for_dataset=False)
        return f"CKKS (polynomial program, {layout.layout.value} layout; {layout.reason})"

    def prepare(self, options, meta: dict, for_dataset: bool):
        choice = choose_layout(options, for_dataset)
        meta["layout_reason"] = choice.reason
        return dataclasses.replace(options, layout=LayoutOption(choice.layout.value))

    def compile(self, ckpt, calib_x, options, meta: dict, simulate_only: bool, on_message: Echo):
        from fhe.ckks import ApproxConfig, PolynomialError
        from fhe.ckks.approx import ApproximationError
        from fhe.ckks.planner import DepthError
        from fhe.harness import compile_model
        from fhe.schemes import CkksParams

        try:
            params = CkksParams(
                poly_modulus_degree=options.poly_modulus_degree,
                scale_bits=options.scale_bits,
                outer_bits=options.outer_bits,
                refresh=options.refresh,
                layout=CkksLayout(options.layout.value),
                engine=options.engine,
                approx=ApproxConfig(
                    reciprocal_tol=options.reciprocal_tol,
                    activation_tol=options.activation_tol,
                    max_degree=options.max_degree,
                    margin=options.margin,
                ),
            )
        except ValueError as exc:  # options that cannot work (e.g. --outer-bits above 60): usage
            raise BadOptionError(str(exc)) from exc
        try:
            try:
                return compile_model(ckpt.model, calib_x, params, meta=meta)
            except DepthError as exc:
                if not simulate_only or options.layout is LayoutOption.PACKED:
                    raise
                on_message(
                    f"note: {exc.summary}; simulating anyway (no encryption), parameters planned "
                    "with --refresh"
                )
                return compile_model(ckpt.model, calib_x, params.replace(refresh=True), meta=meta)
        except (PolynomialError, ApproximationError, DepthError, ValueError) as exc:
            raise FheError(str(exc)) from exc

    def one_sample(self, c, x):
        start = time.perf_counter()
        got = c.compiled.encrypt_run_decrypt(x)
        seconds = time.perf_counter() - start
        return got, c.compiled.simulate(x), seconds

    def describe_sample(self, max_error: float) -> str:
        return f"encrypted vs clear polynomial program: max |error| {max_error:.2e}"

    def compare(self, c, x, y, mode, workers, ray_address, progress, on_message) -> dict:
        from fhe.ckks.compare import compare_ckks

        return compare_ckks(
            c.compiled, x, y, execute=mode is CompareMode.EXECUTE, progress=on_message
        )
