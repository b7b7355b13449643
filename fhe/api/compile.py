"""``fhe compile`` and ``fhe compare`` as calls: options for either scheme, one dispatch on it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fhe.api._common import Echo, option_field
from fhe.api._common import silent as _silent
from fhe.api.schemes import SchemeSteps, steps_for
from fhe.api.schemes.ckks import LayoutChoice, choose_layout
from fhe.api.schemes.tfhe import CircuitMismatchError, NoParametersError
from fhe.api.train import load_for_encryption
from fhe.errors import BadOptionError
from fhe.schemes import RANGES, Scheme
from quant.config import RangeMode

__all__ = [
    "CircuitMismatchError",
    "Compilation",
    "CompileOptions",
    "LayoutChoice",
    "NoParametersError",
    "SampleCheck",
    "check_circuit",
    "choose_layout",
    "compare_file",
    "compile_file",
    "keygen",
    "one_encrypted_sample",
    "save_artifacts",
]

SCHEMES = tuple(s.value for s in Scheme)
LAYOUTS = ("auto", "batch", "packed")  # auto: fhe/api/schemes/ckks.py's choose_layout


@dataclass(frozen=True)
class CompileOptions:
    """``fhe compile``/``fhe compare``'s options for either scheme, declared once: the CLI's options
    are generated from these fields (their defaults and help). TFHE quantization options left None
    take what the model file records (``fhe train --qat-bits``), else the TFHE defaults."""

    scheme: str = option_field("tfhe", "", choices=SCHEMES)
    # TFHE
    n_bits: int | None = option_field(
        None,
        "TFHE activation bits (default: what the model was trained for with --qat-bits, else 6).",
    )
    weight_bits: int | None = option_field(None, "TFHE weight bits (default 4).")
    input_bits: int | None = option_field(None, "TFHE input bits (default 4).")
    attention_bits: int | None = option_field(
        None,
        "TFHE bits of Q, K and V, which set the width of every attention lookup (default 3).",
    )
    rounding_bits: int | None = option_field(None, "LSBs every table lookup rounds away first.")
    lut_bits: int | None = option_field(
        None, "Round each lookup's input down to at most this many bits (default 5; 0: off)."
    )
    attention_lut_bits: int | None = option_field(
        None,
        "TFHE, Inhibitor kinds: the lookups that produce Q, K and V read at most this many bits "
        "(default 4; 0: as --lut-bits).",
    )
    range_mode: str | None = option_field(
        None,
        "Calibration ranges (default percentile: clips outliers).",
        choices=tuple(m.value for m in RangeMode),
    )
    rounding: str = option_field(
        "exact",
        "TFHE: Concrete's exact rounding (encrypted == clear program), or its approximate rounding "
        "(cheaper; values near a rounding boundary may read the neighbouring entry).",
        choices=("exact", "approximate"),
    )
    ranges: str = option_field(
        "calibrated",
        "TFHE: bit widths from the calibration set (inputs that would overflow one are refused by "
        "the client), or proven by interval arithmetic for every accepted input (wider, slower).",
        choices=RANGES,
    )
    compress_keys: bool = option_field(
        True,
        "TFHE: seeded evaluation keys (~4-5x fewer bytes to store and upload; the server expands "
        "them on load, same memory and speed there).",
    )
    p_error: float | None = option_field(None, "Per-PBS error probability.")
    global_p_error: float | None = option_field(1e-5, "")
    n_calib: int | None = option_field(
        None,
        "Calibration samples from the training split (default: 2000 for TFHE; 5000 for CKKS, whose "
        "polynomials diverge outside their intervals, so intervals must cover the tails).",
        option="--calib",
    )
    inputset: int = option_field(500, "Calibration samples Concrete evaluates when compiling.")
    data_dir: Path | None = option_field(None, "")
    # CKKS
    poly_modulus_degree: int | None = option_field(
        None,
        "CKKS ring size (default: the smallest whose 128-bit chain holds the program's depth).",
        choices=("8192", "16384", "32768"),
    )
    scale_bits: int = option_field(40, "CKKS scale 2^bits.")
    outer_bits: int = option_field(
        60,
        "CKKS: bits of the chain's first and special primes (smaller ones leave room for more "
        "levels or a larger scale; the first must hold the output's integer part).",
    )
    refresh: bool = option_field(
        False,
        "CKKS: allow client-assisted refreshes (the data owner decrypts and re-encrypts "
        "ciphertexts that run out of levels). Off by default; counted in the report.",
    )
    reciprocal_tol: float = option_field(
        1e-2, "CKKS: relative error of the Goldschmidt 1/x (sets the iteration count)."
    )
    activation_tol: float = option_field(
        2e-2, "CKKS: max error of the GELU/ReLU polynomial on its interval (sets the degree)."
    )
    max_degree: int = option_field(31, "CKKS: activation degree cap.")
    margin: float = option_field(
        0.2, "CKKS: widen calibrated intervals by this fraction of their width on each side."
    )
    layout: str = option_field(
        "auto",
        "CKKS: batch (samples in the SIMD slots: N/2 samples per run at the cost of one) or packed "
        "(one sample per ciphertext, rotations: the latency of one query). auto: packed for `fhe "
        "compile` (one query), batch for `fhe compare` (a dataset) and with --refresh.",
        choices=LAYOUTS,
    )

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
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
        return self.n_calib or steps_for(self.scheme).calib_samples


@dataclass
class Compilation:
    """A model file compiled for one scheme: its checkpoint, task data and
    :class:`~fhe.harness.CompiledModel`."""

    model_path: Path
    checkpoint: object
    data: object
    compiled: object
    options: CompileOptions
    text: object | None = None  # models.text.TextEncoder: the client's front end of a text model

    @property
    def scheme(self) -> str:
        return self.options.scheme

    @property
    def steps(self) -> SchemeSteps:
        return steps_for(self.scheme)

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
    inputs = load_for_encryption(model_path, options.data_dir)
    ckpt, data = inputs.checkpoint, inputs.data
    meta = {
        "model_path": str(model_path),
        "task": ckpt.task["name"],
        "patch": (ckpt.task.get("meta") or {}).get("patch"),
        "words": inputs.text.words if inputs.text else None,
    }  # what `fhe run` needs to rebuild inputs
    steps = steps_for(options.scheme)
    options = steps.prepare(options, meta, for_dataset)
    compiled = steps.compile(
        ckpt, data.x_train[: options.calib_samples], options, meta, simulate_only, on_message
    )
    return Compilation(Path(model_path), ckpt, data, compiled, options, inputs.text)


def check_circuit(c: Compilation, on_message: Echo = _silent) -> None:
    """Refuse a compiled program that does not compute what it should. TFHE: Concrete's simulation
    must equal the integer program on the calibration set (exact rounding); otherwise
    :class:`CircuitMismatchError` names the first diverging node. CKKS: nothing to check."""
    c.steps.check(c, on_message)


def keygen(c: Compilation, on_message: Echo = _silent) -> None:
    """Generate the keys. TFHE first says the expected key size and latency and refuses
    (:class:`~fhe.tfhe.recipe.KeysTooLargeError`, with the fixes) keys that would not fit in
    memory."""
    c.steps.preflight(c, on_message)
    c.compiled.keygen()


@dataclass(frozen=True)
class SampleCheck:
    """One encrypted test sample against the clear program (TFHE: equal; CKKS: max |error|)."""

    scheme: str
    max_error: float
    seconds: float

    def describe(self) -> str:
        return steps_for(self.scheme).describe_sample(self.max_error)


def one_encrypted_sample(c: Compilation, index: int = 0) -> SampleCheck:
    """Encrypt test sample ``index``, run, decrypt, and compare with the clear program (keys
    needed)."""
    got, want, seconds = c.steps.one_sample(c, c.data.x_test[index : index + 1])
    return SampleCheck(c.scheme, float(np.abs(np.asarray(got, np.float64) - want).max()), seconds)


def save_artifacts(c: Compilation, out_dir: str | Path, on_message: Echo = _silent) -> dict:
    """Write ``client/`` (with the secret key) and ``server/`` (never one); makes the keys if
    needed."""
    if not c.compiled.backend.has_keys:
        keygen(c, on_message)
    return c.compiled.save(
        out_dir, include_secret_key=True, client_files=c.text.save if c.text else None
    )


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
    return c.steps.compare(c, x, y, mode, workers, ray_address, progress, on_message)
