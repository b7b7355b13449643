"""What a server needs to answer one request: a server artifact, a client's evaluation keys, a payload.

One class per scheme, both with the same three verbs: ``check_keys(blob)`` (refuse keys this circuit
cannot use, before they are stored), ``load_keys(blob)`` and ``run(keys, payload) -> payload``.
Nothing here unpickles: keys and ciphertexts are the libraries' own serialisations inside the
length-prefixed payloads of :mod:`fhe.deploy.wire`.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from fhe.artifacts import verify
from fhe.deploy import wire
from fhe.errors import FheError

SECRET_FILES = ("keys.bin", "context.secret", "client.zip")


class KeysError(FheError):
    """Uploaded keys that this server artifact cannot use (the server answers 400)."""


def server_dir(path: str | Path) -> Path:
    """The server artifact at ``path`` (an artifact root holding ``server/``, or the server folder itself),
    refused if it holds secret-key material."""
    path = Path(path)
    folder = path / "server" if (path / "server").is_dir() else path
    verify(folder, "server")
    present = [f for f in SECRET_FILES if (folder / f).exists()]
    if present:
        raise FheError(f"{folder} holds client files {present}: a server artifact never holds a secret key; "
                       "serve the server/ folder that `fhe compile --out` wrote")
    return folder


def load_runtime(path: str | Path) -> TfheRuntime | CkksRuntime:
    folder = server_dir(path)
    return CkksRuntime(folder) if (folder / "program.json").exists() else TfheRuntime(folder)


class TfheRuntime:
    scheme = "tfhe"

    def __init__(self, folder: Path) -> None:
        from concrete import fhe

        self.fhe = fhe
        self.folder = folder
        self.meta = json.loads((folder / "meta.json").read_text())
        self.server = fhe.Server.load(folder / "server.zip")
        # Concrete aborts the process when it bootstraps with keys made for other parameters, so keys are
        # checked against the size of the keys this circuit was compiled with before they are accepted
        keys = folder / "evaluation_keys.bin"
        self.expected_key_bytes = keys.stat().st_size if keys.exists() else self.meta.get("evaluation_keys_bytes")
        self._lock = threading.Lock()  # one circuit execution at a time (it already uses every core)

    def describe(self) -> dict:
        keep = ("task", "seq_len", "input_shape", "input_scale", "input_zero_point", "input_qmin", "input_qmax",
                "output_scale", "quant", "ranges", "patch")
        return {"scheme": self.scheme, **{k: self.meta[k] for k in keep if k in self.meta},
                "evaluation_keys_bytes": self.expected_key_bytes}

    def check_keys(self, blob: bytes):
        """The keys, loaded, if this circuit can use them (else :class:`KeysError`)."""
        if self.expected_key_bytes is not None and len(blob) != self.expected_key_bytes:
            raise KeysError(f"evaluation keys of {len(blob)} bytes; this circuit's are {self.expected_key_bytes} "
                            "bytes: keys made for another circuit or parameters")
        return self.load_keys(blob)

    def load_keys(self, blob: bytes):
        try:
            return self.fhe.EvaluationKeys.deserialize(blob)
        except RuntimeError as exc:
            raise KeysError(f"not Concrete evaluation keys: {str(exc).splitlines()[0][:200]}") from exc

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
                raise wire.PayloadError(f"ciphertext does not fit this circuit: {str(exc).splitlines()[0][:200]}") \
                    from exc
        return wire.pack([out.serialize()])


class CkksRuntime:
    scheme = "ckks"

    def __init__(self, folder: Path) -> None:
        import tenseal as ts

        from fhe.backends.ckks import CkksServer

        self.ts = ts
        self.folder = folder
        if json.loads((folder / "meta.json").read_text()).get("layout") == "packed":
            raise FheError("fhe serve does not serve packed-layout CKKS artifacts yet (its Galois keys and SEAL "
                           "ciphertexts have no wire format here); run them with `fhe run`, or compile with "
                           "--layout batch to serve")
        self.server = CkksServer(folder)
        if self.server.plan["client_assisted_refresh"]:
            raise FheError("this CKKS program needs client-assisted refreshes, which a one-request service cannot "
                           "do; compile it without --refresh (a larger --poly-modulus-degree) to serve it")
        self.params_id = list(self.server.context.seal_context().data.key_parms_id())
        self._lock = threading.Lock()

    def describe(self) -> dict:
        meta = self.server.meta
        keep = ("task", "seq_len", "input_shape", "patch", "plan")
        return {"scheme": self.scheme, **{k: meta[k] for k in keep if k in meta}}

    def check_keys(self, blob: bytes):
        return self.load_keys(blob)

    def load_keys(self, blob: bytes):
        try:
            ctx = self.ts.context_from(blob)
        except ValueError as exc:
            raise KeysError("not a serialised TenSEAL context") from exc
        if ctx.has_secret_key():
            raise KeysError("this context holds a secret key: upload the public context "
                            "(context.serialize(save_secret_key=False)); the secret key never leaves the client")
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
