"""The shared encrypt/run/decrypt harness: float in, float out, whatever the scheme.

``compile_model`` hands a trained model to the backend registered for the parameter type and returns
one :class:`CompiledModel` with the same vocabulary on every backend: ``keygen``, ``encrypt``,
``run``, ``decrypt``, ``encrypt_run_decrypt``, ``simulate``, ``clear``, ``report`` and ``save`` (the
secret key only on explicit request). What differs between schemes sits in its :class:`Codec`, the
client's side of the boundary: TFHE quantizes the input and dequantizes the output with the integer
program's own quantizers (:class:`QuantCodec`, as Concrete ML's client does); CKKS programs take
floats directly (:class:`IdentityCodec`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from fhe.artifacts import atomic_save
from fhe.backends import backend_for
from fhe.errors import InputOverflowError
from fhe.schemes import CkksParams, Scheme, TfheParams
from models.transformer import Transformer
from quant import OverflowPolicy, QuantConfig
from quant.export import QuantizedProgram, export


class Backend(Protocol):
    """What every backend implements (TFHE: integers in and out; CKKS: floats in and out)."""

    scheme: Scheme
    params: Any  # the TfheParams or CkksParams it was compiled with
    timings_s: dict[str, float]

    @property
    def has_keys(self) -> bool: ...

    def keygen(self, force: bool = False) -> None: ...
    def encrypt(self, x_int: np.ndarray): ...
    def run(self, ct): ...
    def decrypt(self, ct) -> np.ndarray: ...
    def encrypt_run_decrypt(self, x_int: np.ndarray) -> np.ndarray: ...
    def simulate(self, x_int: np.ndarray) -> np.ndarray: ...
    def report(self) -> dict: ...
    def save(self, directory, include_secret_key: bool = False, client_files=None) -> dict: ...


class Codec(Protocol):
    """Floats to what the backend encrypts, and back; the clear program that every encrypted run
    equals."""

    @property
    def model(self) -> Transformer: ...
    def encode(self, x) -> np.ndarray: ...
    def decode(self, y: np.ndarray) -> np.ndarray: ...
    def reference(
        self, encoded: np.ndarray
    ) -> np.ndarray: ...  # the clear program, encoded in and out
    def overflowing(
        self, encoded: np.ndarray
    ) -> dict[str, int]: ...  # nodes an input would overflow


@dataclass
class QuantCodec:
    """TFHE: the integer program's input quantizer and output scale; its clear integer run as
    reference."""

    program: QuantizedProgram

    @property
    def model(self) -> Transformer:
        return self.program.model

    def encode(self, x) -> np.ndarray:
        return self.program.quantize_input(x)

    def decode(self, y: np.ndarray) -> np.ndarray:
        return self.program.dequantize_output(y)

    def reference(self, x_int: np.ndarray) -> np.ndarray:
        return self.program.run_int(x_int, OverflowPolicy.CLIP)[0]

    def overflowing(self, x_int: np.ndarray) -> dict[str, int]:
        return self.program.run_int(x_int, OverflowPolicy.CLIP)[1]


@dataclass
class IdentityCodec:
    """CKKS: the polynomial program takes and returns floats; ``reference`` is its clear
    evaluation."""

    model: Transformer
    reference: Callable[[np.ndarray], np.ndarray] = field(repr=False)

    def encode(self, x):
        return x

    def decode(self, y: np.ndarray) -> np.ndarray:
        return y

    def overflowing(self, x) -> dict[str, int]:
        # a polynomial has no width to overflow; values outside its intervals are counted elsewhere
        return {}


@dataclass
class CompiledModel:
    """A compiled model and its client codec. Overflow policy (TFHE with ``ranges="calibrated"``):
    an input that would take any value outside its calibrated bit width (where the encrypted circuit
    wraps around and the clear program saturates) is refused by :meth:`encrypt` with
    :class:`InputOverflowError` naming the node, so every encrypted result equals the clear program;
    ``allow_overflow=True`` encrypts anyway. With ``ranges="proven"`` no accepted input can overflow
    and nothing is refused."""

    backend: Backend
    codec: Codec
    allow_overflow: bool = False

    @property
    def model(self) -> Transformer:
        return self.codec.model

    @property
    def program(self) -> QuantizedProgram:
        """The integer program (TFHE only)."""
        if not isinstance(self.codec, QuantCodec):
            raise AttributeError(
                f"a {self.backend.scheme.value} compiled model has no integer program"
            )
        return self.codec.program

    # the client boundary
    def encrypt(self, x):
        encoded = self.codec.encode(x)
        if not self.allow_overflow:
            self.check_input(encoded)
        return self.backend.encrypt(encoded)

    def overflowing_nodes(self, x_int: np.ndarray) -> dict[str, int]:
        """Nodes (and entry counts) that the encoded input ``x_int`` pushes past their bit width."""
        return self.codec.overflowing(x_int)

    def check_input(self, x_int: np.ndarray) -> None:
        clipped = self.overflowing_nodes(x_int)
        if clipped:
            first = next(iter(clipped))
            node = self.program.graph.nodes[first]
            raise InputOverflowError(
                f"this input takes {sum(clipped.values())} value(s) in {len(clipped)} node(s) "
                f"outside their calibrated bit widths, first {first!r} (tag {node.tag!r}, "
                f"{node.bits} bits); encrypted, they would wrap around and the result would be "
                "wrong. Compile with --ranges proven (widths that hold every input), calibrate on "
                "data like this input (--calib), or pass allow_overflow=True."
            )

    def run(self, ct):
        return self.backend.run(ct)

    def decrypt(self, ct) -> np.ndarray:
        return self.codec.decode(self.backend.decrypt(ct))

    def keygen(self, force: bool = False) -> None:
        self.backend.keygen(force=force)

    def encrypt_run_decrypt(self, x) -> np.ndarray:
        return self.decrypt(self.run(self.encrypt(x)))

    def simulate(self, x) -> np.ndarray:
        return self.codec.decode(self.backend.simulate(self.codec.encode(x)))

    def clear(self, x) -> np.ndarray:
        """The clear program (TFHE: the integer program; CKKS: the polynomial program), the exact
        reference of every encrypted run."""
        return self.codec.decode(self.codec.reference(self.codec.encode(x)))

    def report(self) -> dict:
        return self.backend.report()

    def save(self, directory, include_secret_key: bool = False, client_files=None) -> dict:
        """``client_files(folder)``: writes what else the client needs (a text model's front end,
        :class:`models.text.TextEncoder`) into the client folder, under its manifest."""
        return save_artifacts(self.backend, directory, include_secret_key, client_files)

    def verify(self, x, limit: int = 500, repeats: int = 3) -> SimulationCheck:
        """Concrete's simulation of the compiled circuit against the clear integer program on up to
        ``limit`` inputs (cheap: milliseconds per sample). With exact rounding the two must be equal
        everywhere, except that Concrete's simulation also samples PBS errors at the circuit's
        error probability (global p_error 1e-5: about one sample in 10^5, so a check over 1437
        samples meets one about once in 70 compiles). A differing sample is therefore simulated
        ``repeats`` times more: one that then equals the clear program every time was such a
        sampled error (``n_transient``); one that differs again means the circuit does not compute
        the program."""
        x_int = self.program.quantize_input(np.asarray(x)[:limit])
        clear, _ = self.program.run_int(x_int, OverflowPolicy.CLIP)
        sim = np.stack([self.backend.simulate(xi) for xi in x_int])
        equal = (sim == clear).all(axis=tuple(range(1, sim.ndim)))
        bad = np.flatnonzero(~equal)
        transient = [
            i
            for i in bad
            if all(
                np.array_equal(self.backend.simulate(x_int[i]), clear[i]) for _ in range(repeats)
            )
        ]
        return SimulationCheck(
            len(x_int),
            int(equal.sum()),
            int(bad[0]) if len(bad) else None,
            float(np.abs(sim - clear).max()),
            float(
                (
                    self.program.dequantize_output(sim).argmax(-1)
                    == self.program.dequantize_output(clear).argmax(-1)
                ).mean()
            ),
            len(transient),
        )


def locate_divergence(compiled: CompiledModel, calib_x, check: SimulationCheck):
    """The first node whose simulated value differs from the clear program on the first sample
    ``check`` found unequal (:mod:`fhe.tfhe.divergence`); None when the check was exact or no prefix
    reproduces it."""
    from fhe.tfhe.divergence import first_divergence

    if check.first_mismatch is None:
        return None
    calib_ints = compiled.program.quantize_input(np.asarray(calib_x))
    return first_divergence(
        compiled.program.graph,
        calib_ints[check.first_mismatch],
        calib_ints,
        compiled.backend.params,
    )


@dataclass(frozen=True)
class SimulationCheck:
    n: int
    n_equal: int
    first_mismatch: int | None
    max_abs_diff: float
    argmax_agreement: float
    n_transient: int = 0  # mismatches that did not reproduce: PBS errors the simulation sampled

    @property
    def exact(self) -> bool:
        return self.n_equal == self.n

    @property
    def consistent(self) -> bool:
        """No mismatch that reproduces: the circuit computes the program."""
        return self.n_equal + self.n_transient == self.n

    def describe(self) -> str:
        head = f"simulation == clear integer program on {self.n_equal}/{self.n} calibration samples"
        if self.exact:
            return head
        if self.consistent:
            return (
                f"{head}; the other {self.n_transient} equalled it when simulated again (a PBS "
                "error that Concrete's simulation samples at the circuit's error probability, not "
                "a difference in what the circuit computes)"
            )
        return (
            f"{head} (first mismatch: sample {self.first_mismatch}, max |difference| "
            f"{self.max_abs_diff:g}, argmax agreement {100 * self.argmax_agreement:.1f}%)"
        )


def save_artifacts(
    backend: Backend,
    directory,
    include_secret_key: bool = False,
    client_files: Callable[[Path], None] | None = None,
) -> dict:
    """Writes ``server/`` and (with ``include_secret_key``) ``client/``, each with a manifest of
    SHA-256 digests, through a temporary folder renamed into place; ``client_files`` adds files to
    the client folder."""

    def write(tmp: Path) -> dict:
        written = backend.save(tmp, include_secret_key=include_secret_key)
        if client_files is not None and "client" in written:
            client_files(Path(written["client"]))
        return written

    return atomic_save(directory, write, backend.scheme.value)


def compile_ckks(model: Transformer, calib_x: torch.Tensor, params: CkksParams, meta: dict):
    """The CKKS backend of ``params``; ``engine=auto`` takes TenSEAL when the program fits its one
    chain (no refresh asked for) and the OpenFHE engine, packed, when TenSEAL's planner stops at the
    depth (the report's ``engine_reason`` says which and why)."""
    from fhe.ckks.planner import DepthError
    from fhe.schemes import CkksEngine, CkksLayout

    if params.engine is not CkksEngine.AUTO:
        return backend_for(params).compile(model, calib_x, params, meta=meta)
    tenseal = params.replace(engine=CkksEngine.TENSEAL)
    try:
        backend = backend_for(tenseal).compile(model, calib_x, tenseal, meta=meta)
        if not backend.plan.refresh:
            backend.meta["engine_reason"] = "auto: the program fits one TenSEAL chain"
            return backend
        depth = backend.planned.get("program_depth_without_refresh")
    except DepthError as exc:
        depth = exc.summary or str(exc)
    openfhe = params.replace(engine=CkksEngine.OPENFHE, layout=CkksLayout.PACKED, refresh=False)
    backend = backend_for(openfhe).compile(model, calib_x, openfhe, meta=meta)
    backend.meta["engine_reason"] = (
        f"auto: deeper than one TenSEAL chain ({depth}), so OpenFHE with server-side bootstraps"
    )
    return backend


def compile_model(
    model: Transformer,
    calib_x: torch.Tensor,
    params: TfheParams | CkksParams,
    quant_config: QuantConfig | None = None,
    simulate_only: bool = False,
    meta: dict | None = None,
) -> CompiledModel:
    """Quantize ``model`` on ``calib_x`` and compile it for the scheme of ``params`` (TFHE), or
    build and calibrate its polynomial program (CKKS)."""
    if isinstance(params, CkksParams):
        backend = compile_ckks(
            model, calib_x, params, {"seq_len": model.config.seq_len, **(meta or {})}
        )
        return CompiledModel(backend, IdentityCodec(model, backend.simulate))
    if quant_config is not None:  # an explicit configuration replaces the parameters' own
        params = params.replace(quant=quant_config)
    qconfig = params.quant
    program = export(model, calib_x, qconfig)
    backend_cls = backend_for(params)
    calib_ints = program.quantize_input(calib_x)
    meta = {
        "seq_len": model.config.seq_len,
        "model_config": model.config.to_dict(),
        "input_scale": program.input_quantizer.scale,
        "input_zero_point": program.input_quantizer.zero_point,
        "input_qmin": program.input_quantizer.qmin,
        "input_qmax": program.input_quantizer.qmax,
        "output_scale": np.asarray(program.output_scale).tolist(),
        "client_pools": program.client_pools,  # the client sums per-token outputs
        "masked": program.masked,  # ... over its words, the last column its key mask
        **(meta or {}),
    }
    q = program.input_quantizer
    backend = backend_cls.compile(
        program.graph,
        calib_ints,
        params,
        meta=meta,
        simulate_only=simulate_only,
        input_range=(q.qmin, q.qmax),
    )
    return CompiledModel(backend, QuantCodec(program))
