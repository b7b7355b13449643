"""What differs between TFHE and CKKS in a compile-and-run session, one class per scheme, registered
by :class:`~fhe.schemes.Scheme` next to its definition (``tfhe.py``, ``ckks.py``). :mod:`fhe.api`
looks the scheme up here once per call (:func:`steps_for`) and names no scheme itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fhe.api._common import Echo
from fhe.errors import BadOptionError
from fhe.schemes import Scheme
from models.registry import import_modules

if TYPE_CHECKING:
    from fhe.api.compile import Compilation, CompileOptions


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
    if not _STEPS:
        import_modules(__name__, __path__)
    return _STEPS[scheme]
