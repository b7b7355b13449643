"""``fhe compile`` and ``fhe compare`` as calls: options for either scheme, one dispatch on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fhe.api._common import Echo
from fhe.api._common import silent as _silent
from fhe.api.compilation import Compilation, CompileOptions, steps_for
from fhe.api.schemes.ckks import LayoutChoice, choose_layout
from fhe.api.schemes.tfhe import CircuitMismatchError, NoParametersError
from fhe.api.train import load_for_encryption
from fhe.errors import BadOptionError
from fhe.schemes import CompareMode, Scheme
from models.config import as_enum

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
    task = ckpt.task
    assert task, "load_for_encryption refuses a model file without a task"
    meta = {
        "model_path": str(model_path),
        "task": task["name"],
        "patch": (task.get("meta") or {}).get("patch"),
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

    scheme: Scheme
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
    mode: CompareMode | str = CompareMode.SIMULATE,
    workers: int = 0,
    ray_address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_message: Echo = _silent,
) -> dict:
    """``fhe compare``: float vs clear program vs simulated (TFHE) or encrypted predictions on the
    first ``n`` test samples. TFHE ``execute`` runs in this process or on Ray
    (``workers``/``ray_address``)."""
    try:
        mode = as_enum(CompareMode, mode, "mode")
    except ValueError as exc:
        raise BadOptionError(str(exc)) from None
    c = compile_file(
        model_path,
        options,
        simulate_only=mode is CompareMode.SIMULATE,
        on_message=on_message,
        for_dataset=True,
    )
    x, y = c.data.x_test[:n], c.data.y_test[:n].numpy()
    return c.steps.compare(c, x, y, mode, workers, ray_address, progress, on_message)
