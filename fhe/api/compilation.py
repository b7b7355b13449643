"""A compilation's vocabulary, below every scheme: the options of ``fhe compile``/``fhe compare``
for either scheme (declared once: the CLI's options are generated from them), the result of a
compilation, and the registry of what differs between TFHE and CKKS (:class:`SchemeSteps`, one
class per scheme, registered by :class:`~fhe.schemes.Scheme` next to its definition in
``fhe/api/schemes/``). :mod:`fhe.api` looks the scheme up here once per call (:func:`steps_for`)
and names no scheme itself."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fhe.api._common import Echo, coerce_enums, option_field
from fhe.ckks.approx import ApproxConfig
from fhe.errors import BadOptionError
from fhe.schemes import (
    CkksEngine,
    CkksParams,
    LayoutOption,
    Ranges,
    Rounding,
    Scheme,
    TfheParams,
)
from quant.config import RangeMode

if TYPE_CHECKING:
    from fhe.harness import CompiledModel
    from models.tasks.base import TaskData
    from models.text import TextEncoder
    from models.training import Checkpoint

SCHEMES = tuple(s.value for s in Scheme)
# the defaults below are the parameter classes' own, declared there once
_TFHE, _CKKS, _APPROX = TfheParams(), CkksParams(), ApproxConfig()


@dataclass(frozen=True)
class CompileOptions:
    """``fhe compile``/``fhe compare``'s options for either scheme, declared once: the CLI's options
    are generated from these fields (their defaults and help). TFHE quantization options left None
    take what the model file records (``fhe train --qat-bits``), else the TFHE defaults."""

    scheme: Scheme = option_field(Scheme.TFHE, "")
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
    range_mode: RangeMode | None = option_field(
        None, "Calibration ranges (default percentile: clips outliers)."
    )
    rounding: Rounding = option_field(
        Rounding.EXACT if _TFHE.exact_rounding else Rounding.APPROXIMATE,
        "TFHE: Concrete's exact rounding (encrypted == clear program), or its approximate rounding "
        "(cheaper; values near a rounding boundary may read the neighbouring entry).",
    )
    ranges: Ranges = option_field(
        _TFHE.ranges,
        "TFHE: bit widths from the calibration set (inputs that would overflow one are refused by "
        "the client), or proven by interval arithmetic for every accepted input (wider, slower).",
    )
    compress_keys: bool = option_field(
        _TFHE.compress_keys,
        "TFHE: seeded evaluation keys (~4-5x fewer bytes to store and upload; the server expands "
        "them on load, same memory and speed there).",
    )
    p_error: float | None = option_field(None, "Per-PBS error probability.")
    global_p_error: float | None = option_field(_TFHE.global_p_error, "")
    n_calib: int | None = option_field(
        None,
        "Calibration samples from the training split (default: 2000 for TFHE; 5000 for CKKS, whose "
        "polynomials diverge outside their intervals, so intervals must cover the tails).",
        option="--calib",
    )
    inputset: int = option_field(
        _TFHE.inputset_size, "Calibration samples Concrete evaluates when compiling."
    )
    data_dir: Path | None = option_field(None, "")
    # CKKS
    poly_modulus_degree: int | None = option_field(
        None,
        "CKKS ring size (default: the smallest whose 128-bit chain holds the program's depth).",
        choices=("8192", "16384", "32768"),
    )
    scale_bits: int = option_field(_CKKS.scale_bits, "CKKS scale 2^bits.")
    outer_bits: int = option_field(
        _CKKS.outer_bits,
        "CKKS: bits of the chain's first and special primes (smaller ones leave room for more "
        "levels or a larger scale; the first must hold the output's integer part).",
    )
    refresh: bool = option_field(
        _CKKS.refresh,
        "CKKS: allow client-assisted refreshes (the data owner decrypts and re-encrypts "
        "ciphertexts that run out of levels). Off by default; counted in the report.",
    )
    reciprocal_tol: float = option_field(
        _APPROX.reciprocal_tol,
        "CKKS: relative error of the Goldschmidt 1/x (sets the iteration count).",
    )
    activation_tol: float = option_field(
        _APPROX.activation_tol,
        "CKKS: max error of the GELU/ReLU polynomial on its interval (sets the degree).",
    )
    max_degree: int = option_field(_APPROX.max_degree, "CKKS: activation degree cap.")
    margin: float = option_field(
        _APPROX.margin,
        "CKKS: widen calibrated intervals by this fraction of their width on each side.",
    )
    layout: LayoutOption = option_field(
        LayoutOption.AUTO,
        "CKKS: batch (samples in the SIMD slots: N/2 samples per run at the cost of one) or packed "
        "(one sample per ciphertext, rotations: the latency of one query). auto: packed for `fhe "
        "compile` (one query), batch for `fhe compare` (a dataset) and with --refresh.",
    )
    engine: CkksEngine = option_field(
        _CKKS.engine,
        "CKKS library: tenseal (SEAL; one modulus chain, no bootstrapping) or openfhe (bootstraps "
        "on the server where the chain runs out, so a deep model needs no refresh; packed layout; "
        "runs in a Python 3.10 worker, `make install` builds it). auto: tenseal when the program "
        "fits its one chain, else openfhe.",
    )

    def __post_init__(self) -> None:
        coerce_enums(
            self,
            scheme=Scheme,
            rounding=Rounding,
            ranges=Ranges,
            layout=LayoutOption,
            engine=CkksEngine,
            range_mode=RangeMode,
        )

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
    checkpoint: Checkpoint
    data: TaskData
    compiled: CompiledModel
    options: CompileOptions
    text: TextEncoder | None = None  # the client's front end of a text model

    @property
    def scheme(self) -> Scheme:
        return self.options.scheme

    @property
    def steps(self) -> SchemeSteps:
        return steps_for(self.scheme)

    @property
    def calib_x(self):
        return self.data.x_train[: self.options.calib_samples]

    def report(self) -> dict:
        return self.compiled.report()


class SchemeSteps:
    """The steps of ``fhe compile``/``fhe compare`` that depend on the scheme. Defaults: nothing to
    check or pre-flight, options used as given."""

    scheme: Scheme
    calib_samples: int  # calibration samples when --calib is not given
    server_label: str  # what the server artifact holds, for the CLI's last line
    shows_progress: bool  # whether `fhe compare` reports progress per sample

    def target(self, options: CompileOptions) -> str:
        """What ``fhe compile`` says it compiles for."""
        raise NotImplementedError

    def prepare(self, options: CompileOptions, meta: dict, for_dataset: bool) -> CompileOptions:
        """The options this compilation runs with (``meta`` gains what the artifact records)."""
        return options

    def compile(
        self,
        ckpt,
        calib_x,
        options: CompileOptions,
        meta: dict,
        simulate_only: bool,
        on_message: Echo,
    ):
        """The :class:`~fhe.harness.CompiledModel` of ``ckpt``'s model."""
        raise NotImplementedError

    def check(self, c: Compilation, on_message: Echo) -> None:
        """Refuse a compiled program that does not compute what it should (before any key)."""

    def preflight(self, c: Compilation, on_message: Echo) -> None:
        """Refuse keys that would not fit in memory (before keygen)."""

    def one_sample(self, c: Compilation, x) -> tuple[Any, Any, float]:
        """(encrypted output, clear output, seconds) of one test sample (keys needed)."""
        raise NotImplementedError

    def describe_sample(self, max_error: float) -> str:
        raise NotImplementedError

    def compare(
        self,
        c: Compilation,
        x,
        y,
        mode: str,
        workers: int,
        ray_address: str | None,
        progress: Callable[[int, int], None] | None,
        on_message: Echo,
    ) -> dict:
        """``fhe compare``'s figures on the samples ``x`` with labels ``y``."""
        raise NotImplementedError


_STEPS: dict[Scheme, SchemeSteps] = {}


def register_steps(cls: type[SchemeSteps]) -> type[SchemeSteps]:
    """Class decorator: ``cls`` is the steps of ``cls.scheme``."""
    _STEPS[cls.scheme] = cls()
    return cls


def steps_for(scheme: str | Scheme) -> SchemeSteps:
    """The registered steps of ``scheme`` (:class:`BadOptionError` for an unknown one)."""
    try:
        scheme = Scheme(scheme)
    except ValueError:
        raise BadOptionError(
            f"scheme must be one of {', '.join(s.value for s in Scheme)}, got {scheme!r}"
        ) from None
    if not _STEPS:  # the steps register themselves when their package is imported
        importlib.import_module("fhe.api.schemes")
    return _STEPS[scheme]
