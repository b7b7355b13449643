"""TFHE's steps: quantize with the recipe the model file records, compile with concrete-python,
check the circuit against the integer program, pre-flight the keys, compare on integers."""

from __future__ import annotations

import time

from fhe.api._common import Echo
from fhe.api.compilation import SchemeSteps, register_steps
from fhe.errors import BadOptionError, FheError
from fhe.schemes import CompareMode, Scheme
from quant.config import DEFAULT_CALIB_SAMPLES
from quant.ir import OverflowPolicy

# the options that override the quantization a model file records (``fhe train --qat-bits``)
TFHE_QUANT_OPTIONS = (
    "n_bits",
    "weight_bits",
    "input_bits",
    "attention_bits",
    "rounding_bits",
    "lut_bits",
    "attention_lut_bits",
    "range_mode",
)


class CircuitMismatchError(FheError):
    """Concrete's simulation of the compiled circuit differs from the integer program it
    compiles."""


class NoParametersError(FheError):
    """Concrete found no TFHE parameters for the program's widest lookup or product."""


@register_steps
class TfheSteps(SchemeSteps):
    scheme = Scheme.TFHE
    calib_samples = DEFAULT_CALIB_SAMPLES
    server_label = "no secret key"
    shows_progress = True

    def target(self, options) -> str:
        return "TFHE"

    def compile(self, ckpt, calib_x, options, meta: dict, simulate_only: bool, on_message: Echo):
        from fhe.harness import compile_model
        from fhe.schemes import Rounding, TfheParams
        from fhe.tfhe.recipe import resolve_quant
        from quant import BitWidthError
        from quant.export import ExportError

        try:
            quant = resolve_quant(
                ckpt.extra.get("quant"), **{k: getattr(options, k) for k in TFHE_QUANT_OPTIONS}
            )
            params = TfheParams(
                quant=quant,
                p_error=options.p_error,
                global_p_error=options.global_p_error,
                inputset_size=options.inputset,
                exact_rounding=options.rounding is Rounding.EXACT,
                ranges=options.ranges,
                compress_keys=options.compress_keys,
            )
        except ValueError as exc:
            raise BadOptionError(str(exc)) from exc
        on_message(_describe_quant(quant))
        try:
            return compile_model(
                ckpt.model,
                calib_x,
                params,
                quant,
                simulate_only=simulate_only,
                meta={**meta, "quant": quant.to_dict()},
            )
        except (ExportError, BitWidthError, ValueError) as exc:
            raise FheError(str(exc)) from exc
        except RuntimeError as exc:
            if "NoParametersFound" not in str(exc):
                raise
            raise NoParametersError(
                "Concrete found no TFHE parameters for the widest lookup or encrypted product of "
                "this program (see `fhe quantize MODEL --nodes` for the widths). Narrow them: "
                "--lut-bits 4, --attention-bits 3, --n-bits 5, or fewer tokens / a smaller "
                "--d-model when training."
            ) from exc

    def check(self, c, on_message: Echo) -> None:
        """Concrete's simulation must equal the integer program on the calibration set (exact
        rounding); otherwise :class:`CircuitMismatchError` names the first diverging node."""
        from fhe.harness import locate_divergence

        check = c.compiled.verify(c.calib_x, limit=len(c.calib_x))
        on_message(check.describe())
        if check.consistent or not c.compiled.backend.params.exact_rounding:
            return
        on_message("locating the first diverging node (compiling prefixes of the program) ...")
        where = locate_divergence(c.compiled, c.calib_x, check)
        raise CircuitMismatchError(
            "the compiled circuit does not compute the integer program (Concrete's simulation "
            f"differs on {check.n - check.n_equal - check.n_transient} calibration samples, each "
            "time it is run; "
            f"{where.describe() if where else 'no prefix of the program reproduces it'}); refusing "
            "to produce keys or artifacts. Please report it with the model file; another "
            "--lut-bits may avoid it."
        )

    def preflight(self, c, on_message: Echo) -> None:
        """The expected key size and latency; :class:`~fhe.tfhe.recipe.KeysTooLargeError` (with
        the fixes) for keys that would not fit in memory."""
        from fhe.tfhe.recipe import preflight

        check = preflight(c.compiled.backend.circuit)
        on_message(check.describe())
        check.check()
        on_message("generating keys ...")

    def one_sample(self, c, x):
        # integers in and out: the backend, so an overflowing sample is run, not refused
        x_int = c.compiled.program.quantize_input(x)
        start = time.perf_counter()
        got = c.compiled.backend.encrypt_run_decrypt(x_int[0])
        seconds = time.perf_counter() - start
        return got, c.compiled.program.run_int(x_int, OverflowPolicy.CLIP)[0][0], seconds

    def describe_sample(self, max_error: float) -> str:
        return f"encrypted output equals the clear integer program: {max_error == 0}"

    def compare(self, c, x, y, mode, workers, ray_address, progress, on_message) -> dict:
        from fhe.tfhe.compare import compare_tfhe

        if mode is CompareMode.EXECUTE:  # fhe.api.keygen: the pre-flight, then the keys
            self.preflight(c, on_message)
            c.compiled.keygen()
        return compare_tfhe(
            c.compiled, x, y, mode, workers, ray_address, progress=progress, on_message=on_message
        )


def _describe_quant(quant) -> str:
    return (
        f"quantization: {quant.n_bits}-bit activations, {quant.w_bits}-bit weights, "
        f"{quant.in_bits}-bit inputs, attention {quant.bits_for('block0.mix.qk')} bits, lookups <= "
        f"{quant.lut_bits or 'unrounded'} bits"
        + (f" (Q/K/V lookups <= {quant.attention_lut_bits})" if quant.attention_lut_bits else "")
        + "".join(f", lookups matching {p!r} <= {b}" for p, b in quant.lut_bits_overrides)
        + (
            f", step lookups as {quant.step_lut_bits}-bit comparisons"
            if quant.step_lut_bits
            else ""
        )
        + f", {quant.range_mode.value} ranges"
        + (", the client pools the per-token head" if quant.client_pooling else "")
        + (", last residual folded into the head" if quant.fold_last_residual else "")
    )
