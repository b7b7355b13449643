"""``fhe compile`` and ``fhe compare`` as calls: options for either scheme, one dispatch on it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fhe.api._common import Echo
from fhe.api._common import silent as _silent
from fhe.api.train import load_model_and_task
from fhe.errors import BadOptionError, FheError
from quant.config import DEFAULT_CALIB_SAMPLES

CKKS_CALIB_SAMPLES = (
    5000  # polynomials diverge outside their intervals: the intervals must cover the tails
)


class CircuitMismatchError(FheError):
    """Concrete's simulation of the compiled circuit differs from the integer program it
    compiles."""


class NoParametersError(FheError):
    """Concrete found no TFHE parameters for the program's widest lookup or product."""


# -----------------------------------------------------------------------------------------
# compiling
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


@dataclass(frozen=True)
class CompileOptions:
    """``fhe compile``/``fhe compare``'s options for either scheme. TFHE quantization options left
    None take what the model file records (``fhe train --qat-bits``), else the TFHE defaults."""

    scheme: str = "tfhe"
    data_dir: Path | None = None
    n_calib: int | None = None  # default: 2000 for TFHE, 5000 for CKKS
    # TFHE
    n_bits: int | None = None
    weight_bits: int | None = None
    input_bits: int | None = None
    attention_bits: int | None = None
    rounding_bits: int | None = None
    lut_bits: int | None = None
    attention_lut_bits: int | None = None
    range_mode: str | None = None
    rounding: str = "exact"  # or "approximate"
    ranges: str = "calibrated"  # or "proven"
    compress_keys: bool = True
    p_error: float | None = None
    global_p_error: float | None = 1e-5
    inputset: int = 500
    # CKKS
    poly_modulus_degree: int | None = None
    scale_bits: int = 40
    outer_bits: int = 60
    refresh: bool = False
    reciprocal_tol: float = 1e-2
    activation_tol: float = 2e-2
    max_degree: int = 31
    margin: float = 0.2
    layout: str = "auto"  # or "batch", "packed": see choose_layout

    def __post_init__(self) -> None:
        if self.scheme not in ("tfhe", "ckks"):
            raise BadOptionError(f"scheme must be tfhe or ckks, got {self.scheme!r}")
        if self.layout not in LAYOUTS:
            raise BadOptionError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")

    @classmethod
    def from_mapping(cls, opts: Mapping) -> CompileOptions:
        """The options among ``opts`` (e.g. a click command's keyword arguments), the rest
        ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in opts.items() if k in names}
        if given.get("poly_modulus_degree") is not None:
            given["poly_modulus_degree"] = int(given["poly_modulus_degree"])
        return cls(**given)

    @property
    def calib_samples(self) -> int:
        return self.n_calib or (
            DEFAULT_CALIB_SAMPLES if self.scheme == "tfhe" else CKKS_CALIB_SAMPLES
        )


LAYOUTS = ("auto", "batch", "packed")


@dataclass(frozen=True)
class LayoutChoice:
    """The CKKS layout a run uses, and why (printed in the report and kept in its JSON)."""

    layout: str
    reason: str


def choose_layout(options: CompileOptions, for_dataset: bool) -> LayoutChoice:
    """``--layout auto``: one query (``fhe compile``, then ``fhe run``/``serve`` on its artifacts)
    gets the packed layout, whose latency is that of one sample; a dataset (``fhe compare``) gets
    the batch layout, N/2 samples per run for the cost of one; a client-assisted refresh exists
    only in the batch layout. An explicit ``--layout`` is kept as asked."""
    if options.layout != "auto":
        return LayoutChoice(options.layout, f"--layout {options.layout} asked for")
    if for_dataset:
        return LayoutChoice(
            "batch", "auto: a dataset, so the batch layout (N/2 samples per run at the cost of one)"
        )
    if options.refresh:
        return LayoutChoice(
            "batch", "auto: --refresh asked for, and only the batch layout refreshes"
        )
    return LayoutChoice(
        "packed",
        "auto: one query, so the packed layout (the latency of one sample; --layout batch for "
        "throughput)",
    )


@dataclass
class Compilation:
    """A model file compiled for one scheme: its checkpoint, task data and
    :class:`~fhe.harness.CompiledModel`."""

    model_path: Path
    checkpoint: object
    data: object
    compiled: object
    options: CompileOptions

    @property
    def scheme(self) -> str:
        return self.options.scheme

    @property
    def calib_x(self):
        return self.data.x_train[: self.options.calib_samples]

    def report(self) -> dict:
        return self.compiled.report()


def compile_file(
    model_path: str | Path,
    options: CompileOptions = CompileOptions(),
    simulate_only: bool = False,
    on_message: Echo = _silent,
    for_dataset: bool = False,
) -> Compilation:
    """Compile the model file for ``options.scheme``. ``simulate_only``: no keys will be made (TFHE:
    Concrete compiles without key material; CKKS: a program too deep for any chain is planned with
    ``refresh``). ``for_dataset``: the compilation serves many samples at once (CKKS ``--layout
    auto`` then picks the batch layout)."""
    ckpt, data = load_model_and_task(model_path, options.data_dir)
    meta = {
        "model_path": str(model_path),
        "task": ckpt.task["name"],
        "patch": (ckpt.task.get("meta") or {}).get("patch"),
    }  # what `fhe run` needs to rebuild inputs
    if options.scheme == "ckks":
        choice = choose_layout(options, for_dataset)
        options = dataclasses.replace(options, layout=choice.layout)
        meta["layout_reason"] = choice.reason
    compile_fn = _compile_tfhe if options.scheme == "tfhe" else _compile_ckks
    compiled = compile_fn(
        ckpt, data.x_train[: options.calib_samples], options, meta, simulate_only, on_message
    )
    return Compilation(Path(model_path), ckpt, data, compiled, options)


def _compile_tfhe(
    ckpt, calib_x, options: CompileOptions, meta: dict, simulate_only: bool, on_message: Echo
):
    from fhe.harness import compile_model
    from fhe.schemes import TfheParams
    from fhe.tfhe_recipe import resolve_quant
    from quant import BitWidthError, ExportError

    try:
        quant = resolve_quant(
            ckpt.extra.get("quant"), **{k: getattr(options, k) for k in TFHE_QUANT_OPTIONS}
        )
        params = TfheParams(
            quant=quant,
            p_error=options.p_error,
            global_p_error=options.global_p_error,
            inputset_size=options.inputset,
            exact_rounding=options.rounding == "exact",
            ranges=options.ranges,
            compress_keys=options.compress_keys,
        )
    except ValueError as exc:
        raise BadOptionError(str(exc)) from exc
    on_message(
        f"quantization: {quant.n_bits}-bit activations, {quant.w_bits}-bit weights, "
        f"{quant.in_bits}-bit inputs, attention {quant.bits_for('block0.mix.qk')} bits, lookups <= "
        f"{quant.lut_bits or 'unrounded'} bits"
        + (f" (Q/K/V lookups <= {quant.attention_lut_bits})" if quant.attention_lut_bits else "")
        + f", {quant.range_mode.value} ranges"
        + (", the client pools the per-token head" if quant.client_pooling else "")
        + (", last residual folded into the head" if quant.fold_last_residual else "")
    )
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
            "Concrete found no TFHE parameters for the widest lookup or encrypted product of this "
            "program (see `fhe quantize MODEL --nodes` for the widths). Narrow them: --lut-bits 4, "
            "--attention-bits 3, --n-bits 5, or fewer tokens / a smaller --d-model when training."
        ) from exc


def _compile_ckks(
    ckpt, calib_x, options: CompileOptions, meta: dict, simulate_only: bool, on_message: Echo
):
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
            layout=options.layout,
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
            if not simulate_only or options.layout == "packed":
                raise
            on_message(
                f"note: {exc.summary}; simulating anyway (no encryption), parameters planned with "
                "--refresh"
            )
            return compile_model(ckpt.model, calib_x, params.replace(refresh=True), meta=meta)
    except (PolynomialError, ApproximationError, DepthError, ValueError) as exc:
        raise FheError(str(exc)) from exc


def check_circuit(c: Compilation, on_message: Echo = _silent) -> None:
    """TFHE: Concrete's simulation must equal the integer program on the calibration set (exact
    rounding); otherwise :class:`CircuitMismatchError` names the first diverging node. CKKS: nothing
    to check."""
    if c.scheme != "tfhe":
        return
    from fhe.harness import locate_divergence

    check = c.compiled.verify(c.calib_x, limit=len(c.calib_x))
    on_message(check.describe())
    if check.consistent or not c.compiled.backend.params.exact_rounding:
        return
    on_message("locating the first diverging node (compiling prefixes of the program) ...")
    where = locate_divergence(c.compiled, c.calib_x, check)
    raise CircuitMismatchError(
        "the compiled circuit does not compute the integer program (Concrete's simulation differs "
        f"on {check.n - check.n_equal - check.n_transient} calibration samples, each time it is "
        "run; "
        f"{where.describe() if where else 'no prefix of the program reproduces it'}); refusing to "
        "produce keys or artifacts. Please report it with the model file; another --lut-bits may "
        "avoid it."
    )


def keygen(c: Compilation, on_message: Echo = _silent) -> None:
    """Generate the keys. TFHE first says the expected key size and latency and refuses
    (:class:`~fhe.tfhe_recipe.KeysTooLargeError`, with the fixes) keys that would not fit in
    memory."""
    if c.scheme == "tfhe":
        from fhe.tfhe_recipe import preflight

        check = preflight(c.compiled.backend.circuit)
        on_message(check.describe())
        check.check()
        on_message("generating keys ...")
    c.compiled.keygen()


@dataclass(frozen=True)
class SampleCheck:
    """One encrypted test sample against the clear program (TFHE: equal; CKKS: max |error|)."""

    scheme: str
    max_error: float
    seconds: float

    def describe(self) -> str:
        if self.scheme == "tfhe":
            return f"encrypted output equals the clear integer program: {self.max_error == 0}"
        return f"encrypted vs clear polynomial program: max |error| {self.max_error:.2e}"


def one_encrypted_sample(c: Compilation, index: int = 0) -> SampleCheck:
    """Encrypt test sample ``index``, run, decrypt, and compare with the clear program (keys
    needed)."""
    x = c.data.x_test[index : index + 1]
    if (
        c.scheme == "tfhe"
    ):  # integers in and out: the backend, so an overflowing sample is run, not refused
        x_int = c.compiled.program.quantize_input(x)
        start = time.perf_counter()
        got = c.compiled.backend.encrypt_run_decrypt(x_int[0])
        seconds = time.perf_counter() - start
        want = c.compiled.program.run_int(x_int, "clip")[0][0]
    else:
        start = time.perf_counter()
        got = c.compiled.encrypt_run_decrypt(x)
        seconds = time.perf_counter() - start
        want = c.compiled.simulate(x)
    return SampleCheck(c.scheme, float(np.abs(np.asarray(got, np.float64) - want).max()), seconds)


def save_artifacts(c: Compilation, out_dir: str | Path, on_message: Echo = _silent) -> dict:
    """Write ``client/`` (with the secret key) and ``server/`` (never one); makes the keys if
    needed."""
    if not c.compiled.backend.has_keys:
        keygen(c, on_message)
    return c.compiled.save(out_dir, include_secret_key=True)


# ------------------------------------------------------------------------------------------
# comparing
def compare_file(
    model_path: str | Path,
    options: CompileOptions = CompileOptions(),
    n: int = 20,
    mode: str = "simulate",
    workers: int = 0,
    ray_address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_message: Echo = _silent,
) -> dict:
    """``fhe compare``: float vs clear program vs simulated (TFHE) or encrypted predictions on the
    first ``n`` test samples. TFHE ``execute`` runs in this process or on Ray
    (``workers``/``ray_address``)."""
    if mode not in ("simulate", "execute"):
        raise BadOptionError(f"mode must be simulate or execute, got {mode!r}")
    c = compile_file(
        model_path,
        options,
        simulate_only=mode == "simulate",
        on_message=on_message,
        for_dataset=True,
    )
    x, y = c.data.x_test[:n], c.data.y_test[:n].numpy()
    if c.scheme == "ckks":
        from fhe.ckks.compare import compare_ckks

        return compare_ckks(c.compiled, x, y, execute=mode == "execute", progress=on_message)
    from fhe.compare import compare_tfhe

    if mode == "execute":
        keygen(c, on_message)
    return compare_tfhe(
        c.compiled, x, y, mode, workers, ray_address, progress=progress, on_message=on_message
    )
