"""Driving the OpenFHE worker (``worker.py``) from the toolkit's interpreter, and the program
arithmetic on its ciphertexts.

OpenFHE's wheel runs on CPython 3.10 only; the toolkit's other libraries (concrete-python, torch)
run on 3.11. Rather than moving the project, the engine runs out of process: one worker per role
(client: holds the secret key; server: evaluation keys only), spoken to over a pipe in a framed
JSON + bytes format (no pickle). Each program operation is one round trip of a few hundred bytes;
at N = 2^16 an operation costs milliseconds to seconds, so the pipe is noise (measured in
``benchmarks/ckks_bootstrap.py``).

The interpreter is ``$FHE_OPENFHE_PYTHON``, else ``.venv-openfhe/bin/python`` beside the active
environment (``make install`` builds it).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import weakref
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fhe.ckks.arith import Arith
from fhe.errors import FheError

WORKER = Path(__file__).with_name("worker.py")


class EngineUnavailableError(FheError):
    """The OpenFHE interpreter or wheel is missing."""


class EngineError(FheError):
    """The worker refused or failed an operation (its message is kept)."""


def engine_python() -> Path:
    """The interpreter that has ``openfhe`` (see the module docstring)."""
    env = os.environ.get("FHE_OPENFHE_PYTHON")
    if env:
        return Path(env)
    for base in (Path(sys.prefix).parent, Path.cwd()):
        candidate = base / ".venv-openfhe" / "bin" / "python"
        if candidate.exists():
            return candidate
    raise EngineUnavailableError(
        "the OpenFHE engine needs its own Python 3.10 environment: run `make install` (it builds "
        ".venv-openfhe) or set FHE_OPENFHE_PYTHON to a python that has `openfhe==1.6.1.0.22.4`"
    )


class Ciphertext:
    """A handle on a ciphertext held by a worker; freed there when this object is collected."""

    __slots__ = ("__weakref__", "handle", "worker")

    def __init__(self, worker: WorkerProcess, handle: int) -> None:
        self.worker, self.handle = worker, handle
        weakref.finalize(self, worker.release, handle)


class WorkerProcess:
    """One OpenFHE worker (client or server role, decided by how it is opened)."""

    def __init__(self, threads: int | None = None) -> None:
        """``threads``: OpenMP threads for OpenFHE (default: all cores)."""
        env = dict(os.environ)
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        self.proc = subprocess.Popen(
            [str(engine_python()), str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._garbage: list[int] = []
        self.round_trips = 0

    # ------------------------------------------------------------------ the pipe
    def call(self, op: str, blobs: tuple[bytes, ...] = (), **fields) -> tuple[dict, list[bytes]]:
        if self._garbage and op != "free":
            garbage, self._garbage = self._garbage, []
            self.call("free", handles=garbage)
        header = json.dumps({"op": op, **fields, "blobs": [len(b) for b in blobs]}).encode()
        stdin, stdout = self.proc.stdin, self.proc.stdout
        if stdin is None or stdout is None or self.proc.poll() is not None:
            raise EngineError("the OpenFHE worker has exited")
        stdin.write(struct.pack(">I", len(header)) + header + b"".join(blobs))
        stdin.flush()
        raw = stdout.read(4)
        if len(raw) < 4:
            raise EngineError(f"the OpenFHE worker died during {op!r}")
        (n,) = struct.unpack(">I", raw)
        reply = json.loads(stdout.read(n))
        out = [stdout.read(size) for size in reply.get("blobs", [])]
        self.round_trips += 1
        if not reply["ok"]:
            raise EngineError(f"OpenFHE {op}: {reply['error']}")
        return reply, out

    def release(self, handle: int) -> None:
        self._garbage.append(handle)  # freed with the next call (finalizers must not do I/O)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=30)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the pipe may be gone
            self.close()

    # ------------------------------------------------------------------ ciphertexts
    def ciphertext(self, reply: dict) -> Ciphertext:
        """The ciphertext a reply names (freed in this worker when collected)."""
        return Ciphertext(self, int(reply["handle"]))

    def encrypt(self, slots: np.ndarray, level: int) -> Ciphertext:
        blob = np.asarray(slots, dtype="<f8").tobytes()
        return self.ciphertext(self.call("encrypt", (blob,), level=int(level))[0])

    def decrypt(self, ct: Ciphertext) -> np.ndarray:
        _, blobs = self.call("decrypt", handle=ct.handle)
        return np.frombuffer(blobs[0], dtype="<f8").copy()

    def to_bytes(self, ct: Ciphertext) -> bytes:
        return self.call("to_bytes", handle=ct.handle)[1][0]

    def from_bytes(
        self, blob: bytes, fresh_level: int | None = None, adopt: bool = True
    ) -> Ciphertext:
        """``fresh_level``: refuse (EngineError) anything but a fresh ciphertext encoded at that
        level under the keys loaded with ``load_keys`` (a served query). A server worker adopts
        what it receives into its own context (``Worker._adopt``); ``adopt=False`` leaves it as
        deserialised, for benchmarks/ckks_bootstrap.py to measure the difference."""
        if fresh_level is None:
            return self.ciphertext(self.call("from_bytes", (blob,), adopt=adopt)[0])
        reply = self.call("from_bytes", (blob,), fresh=True, level=int(fresh_level), adopt=adopt)[0]
        return self.ciphertext(reply)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def level(self, ct: Ciphertext) -> int:
        return int(self.call("level", handle=ct.handle)[0]["level"])


# below 2^-40 a plaintext is float round-off: far under CKKS's precision here (about 2^-20 after a
# bootstrap), and OpenFHE cannot encode a vector whose largest value times the scale (2^52) is < 1
NEGLIGIBLE = 2.0**-40


def negligible(plain) -> bool:
    """Whether every value of a clear slot vector is below :data:`NEGLIGIBLE` (zeros included)."""
    return not np.any(np.abs(np.asarray(plain)) >= NEGLIGIBLE)


class OpenFheArith(Arith):
    """Program values on an OpenFHE server worker; a value that would run out of levels is
    bootstrapped there (counted as ``bootstrap``), never sent back to the client."""

    def __init__(
        self,
        worker: WorkerProcess,
        max_depth: int,
        entry_levels: Mapping[str, int] | None = None,
        rebuild: bool = False,
        input_level: int = 0,
    ) -> None:
        super().__init__(
            max_depth,
            bootstrap=True,
            entry_levels=entry_levels,
            rebuild=rebuild,
            input_level=input_level,
        )
        self.worker = worker

    def _op(self, op: str, blobs: tuple[bytes, ...] = (), **fields) -> Ciphertext:
        return self.worker.ciphertext(self.worker.call(op, blobs, **fields)[0])

    @staticmethod
    def _blob(values) -> bytes:
        return np.asarray(values, dtype="<f8").tobytes()

    def _mul(self, a, b):
        return self._op("mul", a=a.handle, b=b.handle)

    def _square(self, a):
        return self._op("square", a=a.handle)

    def _add(self, a, b):
        return self._op("add", a=a.handle, b=b.handle)

    def _add_scalar(self, a, c):
        return self._op("add_scalar", a=a.handle, c=float(c))

    def _neg(self, a):
        return self._op("neg", a=a.handle)

    def _mul_scalar(self, a, c):
        return self._op("mul_scalar", a=a.handle, c=float(c))

    def _rotate(self, a, step):
        return self._op("rotate", a=a.handle, step=int(step))

    def _dot_plain(self, datas, plains):
        # a plaintext of zeros, or of float round-off (|p| ~ 1e-18, e.g. a DCT-Former map's
        # products), adds nothing and OpenFHE refuses to encode it ("Scaling factor too small"):
        # left out, as SealArith leaves out zeros; every term left out is 0·x
        pairs = [(d, p) for d, p in zip(datas, plains, strict=True) if not negligible(p)]
        if not pairs:
            return self._mul_scalar(datas[0], 0.0)
        blobs = tuple(self._blob(p) for _, p in pairs)
        return self._op("dot_plain", blobs, handles=[d.handle for d, _ in pairs])

    def _add_plain(self, a, plain):
        if negligible(plain):  # as in _dot_plain: nothing to add, nothing OpenFHE can encode
            return a
        return self._op("add_plain", (self._blob(plain),), a=a.handle)

    def _bootstrap(self, a):
        return self._op("bootstrap", a=a.handle)
