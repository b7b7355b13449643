"""What a server needs to answer one request: a server artifact, a client's evaluation keys, a
payload.

The service process reads an artifact with :func:`artifact_info` (files only, no FHE library). The
workers execute with one runtime class per scheme, both with the same three verbs:
``check_keys(blob)`` (refuse keys this circuit cannot use, before they are stored),
``load_keys(blob)`` and ``run(keys, payload) -> payload``.
Nothing here unpickles: keys and ciphertexts are the libraries' own serialisations inside the
length-prefixed payloads of :mod:`fhe.wire`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fhe import wire
from fhe.artifacts import verify
from fhe.errors import FheError
from fhe.scheme import Scheme
from fhe.tfhe import restore_sigpipe  # no FHE library: fhe.tfhe/__init__ is ctypes + signal

SECRET_FILES = ("keys.bin", "context.secret", "client.zip")

# A CKKS key set is the libraries' compressed serialisation of fresh random polynomials: another
# client's keys for the same parameters are the server artifact's own size give or take a few bytes
# of compression. The bound leaves room for that and nothing more, so a worker never reads a body
# much larger than a real key set (issue: bodies bounded from what the server expects).
CKKS_KEY_SLACK = 1.05
CKKS_KEY_SLACK_BYTES = 1 << 20


def ckks_key_bound(reference_bytes: int) -> int:
    """The largest CKKS key upload accepted for a program whose own public keys are
    ``reference_bytes``."""
    return int(reference_bytes * CKKS_KEY_SLACK) + CKKS_KEY_SLACK_BYTES


class KeysError(FheError):
    """Uploaded keys that this server artifact cannot use (the server answers 400)."""


def server_dir(path: str | Path) -> Path:
    """The server artifact at ``path`` (an artifact root holding ``server/``, or the server folder
    itself), refused if it holds secret-key material."""
    path = Path(path)
    folder = path / "server" if (path / "server").is_dir() else path
    verify(folder, "server")
    present = [f for f in SECRET_FILES if (folder / f).exists()]
    if present:
        raise FheError(
            f"{folder} holds client files {present}: a server artifact never holds a secret key; "
            "serve the server/ folder that `fhe compile --out` wrote"
        )
    return folder


TFHE_DESCRIBED = (
    "task",
    "seq_len",
    "input_shape",
    "input_scale",
    "input_zero_point",
    "input_qmin",
    "input_qmax",
    "output_scale",
    "quant",
    "ranges",
    "patch",
)
CKKS_DESCRIBED = ("task", "seq_len", "input_shape", "patch", "plan")


@dataclass(frozen=True)
class ArtifactInfo:
    """What the service process needs of a server artifact, read from its files without loading an
    FHE library (the workers load one): what ``GET /model`` answers and the key sizes it accepts.
    The service process then stays small (no Concrete, TenSEAL or torch in it)."""

    folder: Path
    scheme: Scheme
    description: dict
    expected_key_bytes: int | None  # TFHE: the one size of this circuit's keys
    max_key_bytes: int | None  # the largest key upload accepted

    def describe(self) -> dict:
        return dict(self.description)


def artifact_info(path: str | Path) -> ArtifactInfo:
    """The :class:`ArtifactInfo` of the server artifact at ``path`` (checked by :func:`server_dir`);
    a CKKS program that needs client-assisted refreshes is refused (one request, no round trip)."""
    folder = server_dir(path)
    meta = json.loads((folder / "meta.json").read_text())
    if not (folder / "program.json").exists():
        keys = folder / "evaluation_keys.bin"
        # Concrete aborts the process when it bootstraps with keys made for other parameters, so
        # keys are checked against the size of this circuit's own keys before they are accepted
        size = keys.stat().st_size if keys.exists() else meta.get("evaluation_keys_bytes")
        kept = {k: meta[k] for k in TFHE_DESCRIBED if k in meta}
        description = {"scheme": "tfhe", **kept, "evaluation_keys_bytes": size}
        return ArtifactInfo(folder, Scheme.TFHE, description, size, size)
    if meta.get("engine") == "openfhe":
        return _openfhe_info(folder, meta)
    if meta["plan"]["client_assisted_refresh"]:
        raise FheError(
            "this CKKS program needs client-assisted refreshes, which a one-request service "
            "cannot do; compile it without --refresh (a larger --poly-modulus-degree) to serve "
            "it"
        )
    reference = (folder / "context.public").stat().st_size
    packed = meta.get("layout") == "packed"
    if packed:  # the public context and the Galois keys, as the one wire payload a client sends
        reference += len(wire.pack([b"", b""])) + (folder / "galois.keys").stat().st_size
    bound = ckks_key_bound(reference)
    description = {
        "scheme": "ckks",
        **{k: meta[k] for k in CKKS_DESCRIBED if k in meta},
        "max_key_bytes": bound,
    }
    if packed:
        description.update(layout="packed", rotation_steps=meta["rotation_steps"])
    return ArtifactInfo(folder, Scheme.CKKS, description, None, bound)


def _openfhe_info(folder: Path, meta: dict) -> ArtifactInfo:
    """The OpenFHE engine's packed program: keys a bound over the artifact's own key set."""
    if "key_set_bytes" not in meta:
        raise FheError(
            "this OpenFHE artifact was compiled before `fhe serve` took OpenFHE keys: compile it "
            "again"
        )
    plan = meta["openfhe_plan"]
    bound = ckks_key_bound(meta["key_set_bytes"])
    description = {
        "scheme": "ckks",
        **{k: meta[k] for k in CKKS_DESCRIBED if k in meta},
        "layout": "packed",
        "engine": "openfhe",
        "rotation_steps": plan["rotation_steps"],
        "bootstraps": len(plan["bootstrap_tags"]),
        "max_key_bytes": bound,
    }
    return ArtifactInfo(folder, Scheme.CKKS, description, None, bound)


class Runtime(Protocol):
    """What a worker process calls (:mod:`fhe.deploy.worker`). Keys are the uploaded bytes, or the
    stored file's path for a runtime with ``keys_from_file`` (keys of gigabytes); the loaded keys
    are whatever the library gives back."""

    scheme: str

    def check_keys(self, keys: Any) -> Any: ...
    def load_keys(self, keys: Any) -> Any: ...
    def run(self, keys: Any, payload: bytes) -> bytes: ...


def load_runtime(path: str | Path) -> Runtime:
    """The runtime that executes requests on the artifact at ``path`` (loads its FHE library)."""
    info = artifact_info(path)
    if info.scheme is Scheme.TFHE:
        return TfheRuntime(info)
    if info.description.get("engine") == "openfhe":
        return OpenFheRuntime(info)
    return (PackedCkksRuntime if info.description.get("layout") == "packed" else CkksRuntime)(info)


class TfheRuntime:
    scheme = "tfhe"

    def __init__(self, info: ArtifactInfo) -> None:
        from concrete import fhe

        self.fhe = fhe
        self.info, self.folder = info, info.folder
        self.expected_key_bytes = info.expected_key_bytes
        self.server = fhe.Server.load(self.folder / "server.zip")
        self._lock = threading.Lock()  # one execution at a time (it already uses every core)

    def check_keys(self, blob: bytes):
        """The keys, loaded, if this circuit can use them (else :class:`KeysError`)."""
        if self.expected_key_bytes is not None and len(blob) != self.expected_key_bytes:
            raise KeysError(
                f"evaluation keys of {len(blob)} bytes; this circuit's are "
                f"{self.expected_key_bytes} bytes: keys made for another circuit or parameters"
            )
        keys = self.load_keys(blob)
        # Concrete reads a prefix it understands and ignores the rest: another circuit's keys padded
        # to this size deserialise, then abort the process in a keyswitch. Whole, canonical keys
        # serialise back to exactly the bytes received.
        if keys.serialize() != blob:
            raise KeysError(
                "these bytes are not one whole Concrete key set (they do not serialise back to "
                "themselves): keys made for another circuit, padded or altered"
            )
        return keys

    def load_keys(self, blob: bytes):
        try:
            return self.fhe.EvaluationKeys.deserialize(blob)
        except RuntimeError as exc:
            raise KeysError(
                f"not Concrete evaluation keys: {str(exc).splitlines()[0][:200]}"
            ) from exc

    def run(self, keys, payload: bytes) -> bytes:
        items = wire.unpack(payload)
        if len(items) != 1:
            raise wire.PayloadError(f"a TFHE request holds one ciphertext, got {len(items)}")
        try:
            ct = self.fhe.Value.deserialize(items[0])
        except RuntimeError as exc:
            raise wire.PayloadError("not a Concrete ciphertext (fhe.Value)") from exc
        with self._lock:
            try:
                out = self.server.run(ct, evaluation_keys=keys)
            except RuntimeError as exc:  # e.g. a ciphertext encrypted for another circuit
                raise wire.PayloadError(
                    f"ciphertext does not fit this circuit: {str(exc).splitlines()[0][:200]}"
                ) from exc
            finally:
                restore_sigpipe()
        return wire.pack([out.serialize()])


class CkksRuntime:
    scheme = "ckks"

    def __init__(self, info: ArtifactInfo) -> None:
        import tenseal as ts

        self.ts = ts
        self.info, self.folder = info, info.folder
        self.server = self._open(self.folder)
        self.params_id = list(self.server.context.seal_context().data.key_parms_id())
        self._lock = threading.Lock()

    def _open(self, folder: Path):
        from fhe.ckks.backend import CkksServer

        return CkksServer(folder, verified=True)  # artifact_info has just verified it

    def check_keys(self, blob: bytes):
        return self.load_keys(blob)

    def load_keys(self, blob: bytes):
        try:
            ctx = self.ts.context_from(blob)
        except ValueError as exc:
            raise KeysError("not a serialised TenSEAL context") from exc
        if ctx.has_secret_key():
            raise KeysError(
                "this context holds a secret key: upload the public context "
                "(context.serialize(save_secret_key=False)); the secret key never leaves the client"
            )
        if list(ctx.seal_context().data.key_parms_id()) != self.params_id:
            raise KeysError("a context for other CKKS parameters than this program's")
        return ctx

    def run(self, ctx, payload: bytes) -> bytes:
        items = wire.unpack(payload)
        try:
            cts = [self.ts.ckks_vector_from(ctx, item) for item in items]
        except (ValueError, RuntimeError) as exc:
            raise wire.PayloadError(f"not CKKS vectors for this context: {exc}") from exc
        expected = self.server.meta.get("n_inputs")
        if expected is not None and len(cts) != expected:
            raise wire.PayloadError(f"this program takes {expected} ciphertexts, got {len(cts)}")
        with self._lock:
            try:
                out = self.server.run(cts)
            except (ValueError, RuntimeError, IndexError) as exc:
                raise wire.PayloadError(f"ciphertexts do not fit this program: {exc}") from exc
        return wire.pack([ct.serialize() for ct in out])


class PackedCkksRuntime(CkksRuntime):
    """The packed layout (one sample per ciphertext): keys are a wire payload of (public context,
    Galois keys), ciphertexts SEAL's own serialisation, one per sample
    (fhe/ckks/backend_packed.py)."""

    def _open(self, folder: Path):
        from fhe.ckks.backend_packed import PackedServer

        return PackedServer(folder, verified=True)  # artifact_info has just verified it

    def load_keys(self, blob: bytes):
        import tenseal.sealapi as sa

        from fhe.ckks.seal import from_bytes

        try:
            items = wire.unpack(blob)
        except wire.PayloadError as exc:
            raise KeysError(
                f"packed-layout keys are one wire payload of (public context, Galois keys): {exc}"
            ) from exc
        if len(items) != 2:
            raise KeysError(
                f"packed-layout keys are (public context, Galois keys), got {len(items)} items"
            )
        ctx = super().load_keys(items[0])
        try:
            galois = from_bytes(sa.GaloisKeys, ctx, items[1])
        except (ValueError, RuntimeError) as exc:
            raise KeysError(f"not SEAL Galois keys for this program's parameters: {exc}") from exc
        missing = self.server.missing_rotations(galois)
        if missing:
            raise KeysError(
                f"the Galois keys lack {len(missing)} of this program's rotation steps (e.g. "
                f"{missing[:4]}); make one per step in GET /model's rotation_steps"
            )
        return ctx, galois

    def run(self, keys, payload: bytes) -> bytes:
        import tenseal.sealapi as sa

        from fhe.ckks.seal import from_bytes, to_bytes

        ctx, _ = keys
        first = list(ctx.seal_context().data.first_parms_id())
        try:
            cts = [from_bytes(sa.Ciphertext, ctx, item) for item in wire.unpack(payload)]
        except (ValueError, RuntimeError) as exc:
            raise wire.PayloadError(f"not SEAL ciphertexts for this context: {exc}") from exc
        if not cts or any(ct.size() != 2 or list(ct.parms_id()) != first for ct in cts):
            raise wire.PayloadError(
                "the packed program takes fresh ciphertexts (size 2, top level), one per sample"
            )
        with self._lock:
            try:
                out = self.server.run(cts, keys=keys)
            except (ValueError, RuntimeError) as exc:
                raise wire.PayloadError(f"ciphertexts do not fit this program: {exc}") from exc
        return wire.pack([to_bytes(ct) for ct in out])


@dataclass(frozen=True)
class OpenFheKeys:
    key_tag: str  # OpenFHE's name of the client's secret key, which its keys and ciphertexts carry


class OpenFheRuntime:
    """The OpenFHE engine's packed program (fhe/ckks/openfhe/), bootstrapped on the server.

    A key set is one wire payload of (public key, relinearisation keys, rotation and bootstrapping
    keys): gigabytes at N = 2^16, so the worker reads it from its stored file (``keys_from_file``),
    never whole into this process, and holds one client's at a time (``max_keys_in_memory``).
    Checked before it is stored: the three belong to one secret key, hold every automorphism this
    program's own keys hold, and compute on this context. A query is one fresh ciphertext per
    sample under the loaded keys."""

    scheme = "ckks"
    keys_from_file = True
    max_keys_in_memory = 1

    def __init__(self, info: ArtifactInfo) -> None:
        from fhe.ckks.openfhe.backend import open_server_worker, read_artifact

        self.info, self.folder = info, info.folder
        # load_runtime's artifact_info has just verified the folder: its GBs of keys hashed once
        _, self.plan, self.packed = read_artifact(self.folder)
        self.worker = open_server_worker(self.folder, evaluation_keys=False)
        self.loaded: OpenFheKeys | None = None
        self._lock = threading.Lock()

    def check_keys(self, path: Path) -> OpenFheKeys:
        return self.load_keys(path)

    def holds(self, keys: OpenFheKeys) -> bool:
        """Whether ``keys`` are the ones the worker has loaded (it holds one set at a time)."""
        return keys == self.loaded

    def load_keys(self, path: Path) -> OpenFheKeys:
        from fhe.ckks.openfhe.engine import EngineError

        try:
            parts = wire.spans(path)
        except wire.PayloadError as exc:
            raise KeysError(f"OpenFHE keys are one payload of three items: {exc}") from exc
        if len(parts) != 3:
            raise KeysError(
                "OpenFHE keys are one payload of (public key, relinearisation keys, rotation "
                f"keys), got {len(parts)} items"
            )
        self.loaded = None
        with self._lock:
            try:
                reply, _ = self.worker.call("load_keys", path=str(path), parts=parts)
            except EngineError as exc:
                self._raise_if_dead()
                raise KeysError(str(exc).removeprefix("OpenFHE load_keys: ")) from exc
        self.loaded = OpenFheKeys(reply["key_tag"])
        return self.loaded

    def _raise_if_dead(self) -> None:
        """A dead OpenFHE worker is not the client's fault: the exception ends this worker process,
        and the service quarantines the key id (fhe.deploy.worker)."""
        if not self.worker.alive:
            raise SystemExit("the OpenFHE worker died")

    def run(self, keys: OpenFheKeys, payload: bytes) -> bytes:
        from fhe.ckks.openfhe.backend import run_on
        from fhe.ckks.openfhe.engine import EngineError

        items = wire.unpack(payload)
        if not items:
            raise wire.PayloadError("the packed program takes one ciphertext per sample, got none")
        if not self.holds(keys):
            raise KeysError("these keys are no longer loaded")  # fhe.deploy.worker reloads first
        out = []
        with self._lock:
            for blob in items:
                try:
                    out.append(run_on(self.worker, self.packed, self.plan, blob, fresh=True)[0])
                except EngineError as exc:
                    self._raise_if_dead()
                    raise wire.PayloadError(f"ciphertexts do not fit this program: {exc}") from exc
        return wire.pack(out)
