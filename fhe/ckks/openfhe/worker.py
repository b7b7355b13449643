"""The OpenFHE engine's worker: one process that holds a CKKS crypto context and its ciphertexts.

OpenFHE's Python wheel is built for CPython 3.10 only, the rest of the toolkit runs on 3.11, so
OpenFHE runs here, in its own interpreter (``.venv-openfhe``), driven over stdin/stdout by
``fhe.ckks.openfhe.engine``. This file imports only the standard library, numpy and openfhe, and
never anything from the toolkit: it is run by path, not imported.

Wire format, both directions: a 4-byte big-endian length, a JSON header, then the binary blobs
whose lengths the header lists (``"blobs": [n, ...]``). Nothing is pickled. Slot vectors travel as
little-endian float64; ciphertexts and keys in OpenFHE's own binary serialisation.

A worker is a *client* (``keygen``/``open_client``: it holds the secret key) or a *server*
(``open_server``: crypto context, public key and evaluation keys from files; it never reads a
secret key, and ``has_secret_key`` says so). Ciphertexts live in a table and are named by integer
handles; the driver frees them.
"""

from __future__ import annotations

import json
import resource
import struct
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import openfhe as of

BINARY = of.BINARY
FEATURES = (
    of.PKESchemeFeature.PKE,
    of.PKESchemeFeature.KEYSWITCH,
    of.PKESchemeFeature.LEVELEDSHE,
    of.PKESchemeFeature.ADVANCEDSHE,
    of.PKESchemeFeature.FHE,
)
FILES = {
    "context": "openfhe.context",
    "public": "openfhe.public",
    "mult": "openfhe.mult_keys",
    "rotation": "openfhe.rotation_keys",
    "secret": "openfhe.secret",
}


class Worker:
    def __init__(self) -> None:
        self.cc: Any = None  # openfhe.CryptoContext once made or loaded
        self.params: dict = {}
        self.public: Any = None
        self.secret: Any = None
        self.table: dict[int, object] = {}
        self.next_handle = 1
        self.bootstrap_ready = False

    # ------------------------------------------------------------------ contexts and keys
    def _context(self, p: dict):
        """A crypto context from the plan's numbers (the same call on client and server)."""
        q = of.CCParamsCKKSRNS()
        q.SetSecretKeyDist(of.SecretKeyDist.UNIFORM_TERNARY)
        if p["secure"]:
            q.SetSecurityLevel(of.SecurityLevel.HEStd_128_classic)
        else:
            q.SetSecurityLevel(of.SecurityLevel.HEStd_NotSet)
        q.SetRingDim(p["ring_dim"])
        q.SetScalingModSize(p["scale_bits"])
        q.SetFirstModSize(p["first_mod_bits"])
        q.SetScalingTechnique(of.ScalingTechnique.FLEXIBLEAUTO)
        q.SetKeySwitchTechnique(of.KeySwitchTechnique.HYBRID)
        q.SetNumLargeDigits(p["large_digits"])
        q.SetMultiplicativeDepth(p["total_depth"])
        q.SetBatchSize(p["slots"])
        cc = of.GenCryptoContext(q)
        for feature in FEATURES:
            cc.Enable(feature)
        return cc

    def _bootstrap_setup(self) -> None:
        p = self.params
        if p["bootstrap"]:
            self.cc.EvalBootstrapSetup(p["level_budget"], [0, 0], p["slots"])
            self.bootstrap_ready = True

    def op_bootstrap_depth(self, h, blobs):
        """OpenFHE's depth of one bootstrap for a level budget (its own formula)."""
        dist = of.SecretKeyDist.UNIFORM_TERNARY
        return {"depth": of.CryptoContext.GetBootstrapDepth(h["level_budget"], dist)}, []

    def op_max_levels_after(self, h, blobs):
        """The most levels left after a bootstrap for which OpenFHE builds a 128-bit context, and
        the levels one bootstrap uses."""
        budget_depth = self.op_bootstrap_depth(h, blobs)[0]["depth"]
        for after in range(40, 0, -1):
            p = {
                "secure": True,
                "ring_dim": h["ring_dim"],
                "scale_bits": h["scale_bits"],
                "first_mod_bits": h["first_mod_bits"],
                "large_digits": h["large_digits"],
                "total_depth": after + budget_depth,
                "slots": 8,
            }
            try:
                self._context(p)
            except RuntimeError:
                continue
            return {"levels": after, "bootstrap_depth": budget_depth}, []
        raise ValueError("no 128-bit chain holds one bootstrap at these settings")

    def op_keygen(self, h, blobs):
        """New keys; server files (context, public key, evaluation keys) into ``server_dir``, the
        secret key into ``client_dir`` only."""
        self.params = h["params"]
        start = time.perf_counter()
        self.cc = self._context(self.params)
        self._bootstrap_setup()
        keys = self.cc.KeyGen()
        self.public, self.secret = keys.publicKey, keys.secretKey
        self.cc.EvalMultKeyGen(self.secret)
        steps = [int(s) for s in self.params["rotation_steps"]]
        if steps:
            self.cc.EvalRotateKeyGen(self.secret, steps)
        if self.params["bootstrap"]:
            self.cc.EvalBootstrapKeyGen(self.secret, self.params["slots"])
        keygen_s = time.perf_counter() - start
        server, client = Path(h["server_dir"]), Path(h["client_dir"])
        sizes = self._save_public(server, evaluation_keys=True)
        self._save_public(client, evaluation_keys=False)
        (client / FILES["secret"]).write_bytes(of.Serialize(self.secret, BINARY))
        sizes["secret"] = (client / FILES["secret"]).stat().st_size
        of.ClearEvalMultKeys()  # the client encrypts and decrypts: its memory is freed of
        self.cc.ClearEvalAutomorphismKeys()  # the evaluation keys, which the server holds
        return {"keygen_s": keygen_s, "sizes": sizes, **self._info()}, []

    def _save_public(self, folder: Path, evaluation_keys: bool) -> dict:
        folder.mkdir(parents=True, exist_ok=True)
        of.SerializeToFile(str(folder / FILES["context"]), self.cc, BINARY)
        of.SerializeToFile(str(folder / FILES["public"]), self.public, BINARY)
        (folder / "openfhe.params.json").write_text(json.dumps(self.params))
        names = ["context", "public"]
        if evaluation_keys:
            self.cc.SerializeEvalMultKey(str(folder / FILES["mult"]), BINARY)
            self.cc.SerializeEvalAutomorphismKey(str(folder / FILES["rotation"]), BINARY)
            names += ["mult", "rotation"]
        return {k: (folder / FILES[k]).stat().st_size for k in names}

    def _load_context(self, folder: Path) -> None:
        self.params = json.loads((folder / "openfhe.params.json").read_text())
        of.ClearEvalMultKeys()
        of.ReleaseAllContexts()
        cc, ok = of.DeserializeCryptoContext(str(folder / FILES["context"]), BINARY)
        if not ok:
            raise ValueError(f"{folder}: not an OpenFHE crypto context")
        self.cc = cc
        for feature in FEATURES:
            cc.Enable(feature)
        public, ok = of.DeserializePublicKey(str(folder / FILES["public"]), BINARY)
        if not ok:
            raise ValueError(f"{folder}: not an OpenFHE public key")
        self.public = public

    def op_open_server(self, h, blobs):
        """Context, public and evaluation keys from a server folder; no secret key is read."""
        folder = Path(h["folder"])
        self._load_context(folder)
        if not self.cc.DeserializeEvalMultKey(str(folder / FILES["mult"]), BINARY):
            raise ValueError(f"{folder}: unreadable relinearisation keys")
        if not self.cc.DeserializeEvalAutomorphismKey(str(folder / FILES["rotation"]), BINARY):
            raise ValueError(f"{folder}: unreadable rotation/bootstrapping keys")
        self._bootstrap_setup()
        return self._info(), []

    def op_open_client(self, h, blobs):
        folder = Path(h["folder"])
        self._load_context(folder)
        secret, ok = of.DeserializePrivateKey(str(folder / FILES["secret"]), BINARY)
        if not ok:
            raise ValueError(f"{folder}: not an OpenFHE secret key")
        self.secret = secret
        return self._info(), []

    def _info(self) -> dict:
        return {
            "ring_dim": self.cc.GetRingDimension(),
            "has_secret_key": self.secret is not None,
            "bootstrap_ready": self.bootstrap_ready,
        }

    # ------------------------------------------------------------------ ciphertext table
    def _put(self, ct) -> int:
        handle, self.next_handle = self.next_handle, self.next_handle + 1
        self.table[handle] = ct
        return handle

    def _get(self, handle: int):
        return self.table[int(handle)]

    def _vector(self, blob: bytes) -> list:
        return np.frombuffer(blob, dtype="<f8").tolist()

    def _plain(self, values: list, level: int):
        return self.cc.MakeCKKSPackedPlaintext(values, 1, level, None, self.params["slots"])

    def op_free(self, h, blobs):
        for handle in h["handles"]:
            self.table.pop(int(handle), None)
        return {}, []

    def op_encrypt(self, h, blobs):
        ct = self.cc.Encrypt(self.public, self._plain(self._vector(blobs[0]), h["level"]))
        return {"handle": self._put(ct)}, []

    def op_decrypt(self, h, blobs):
        if self.secret is None:
            raise PermissionError("this worker holds no secret key")
        pt = self.cc.Decrypt(self._get(h["handle"]), self.secret)
        pt.SetLength(self.params["slots"])
        values = np.asarray(pt.GetRealPackedValue(), dtype="<f8")
        return {}, [values.tobytes()]

    def op_to_bytes(self, h, blobs):
        return {}, [of.Serialize(self._get(h["handle"]), BINARY)]

    def op_from_bytes(self, h, blobs):
        ct = of.DeserializeCiphertextString(blobs[0], BINARY)
        return {"handle": self._put(ct)}, []

    def op_level(self, h, blobs):
        ct = self._get(h["handle"])
        return {"level": ct.GetLevel(), "noise_degree": ct.GetNoiseScaleDeg()}, []

    # ------------------------------------------------------------------ arithmetic
    def op_mul(self, h, blobs):
        return {"handle": self._put(self.cc.EvalMult(self._get(h["a"]), self._get(h["b"])))}, []

    def op_square(self, h, blobs):
        return {"handle": self._put(self.cc.EvalSquare(self._get(h["a"])))}, []

    def op_add(self, h, blobs):
        return {"handle": self._put(self.cc.EvalAdd(self._get(h["a"]), self._get(h["b"])))}, []

    def op_add_scalar(self, h, blobs):
        return {"handle": self._put(self.cc.EvalAdd(self._get(h["a"]), float(h["c"])))}, []

    def op_neg(self, h, blobs):
        return {"handle": self._put(self.cc.EvalNegate(self._get(h["a"])))}, []

    def op_mul_scalar(self, h, blobs):
        return {"handle": self._put(self.cc.EvalMult(self._get(h["a"]), float(h["c"])))}, []

    def op_rotate(self, h, blobs):
        return {"handle": self._put(self.cc.EvalRotate(self._get(h["a"]), int(h["step"])))}, []

    def op_add_plain(self, h, blobs):
        a = self._get(h["a"])
        out = self.cc.EvalAdd(a, self._plain(self._vector(blobs[0]), a.GetLevel()))
        return {"handle": self._put(out)}, []

    def op_dot_plain(self, h, blobs):
        """Σ ctᵢ ⊙ ptᵢ, each plaintext encoded at its ciphertext's level."""
        acc = None
        for handle, blob in zip(h["handles"], blobs, strict=True):
            ct = self._get(handle)
            term = self.cc.EvalMult(ct, self._plain(self._vector(blob), ct.GetLevel()))
            acc = term if acc is None else self.cc.EvalAdd(acc, term)
        return {"handle": self._put(acc)}, []

    def op_bootstrap(self, h, blobs):
        """A fresh ciphertext of the same slots (error flat for |x| ≤ 16: ckks_bootstrap.md)."""
        if not self.bootstrap_ready:
            raise RuntimeError("this context was made without bootstrapping")
        start = time.perf_counter()
        out = self.cc.EvalBootstrap(self._get(h["a"]))
        seconds = time.perf_counter() - start
        return {"handle": self._put(out), "level": out.GetLevel(), "seconds": seconds}, []

    def op_peak_memory(self, h, blobs):
        """This process's peak resident memory so far, in bytes."""
        return {"bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, []


def read_frame(stream) -> tuple[dict, list[bytes]] | None:
    raw = stream.read(4)
    if len(raw) < 4:
        return None
    (n,) = struct.unpack(">I", raw)
    header = json.loads(stream.read(n))
    return header, [stream.read(size) for size in header.get("blobs", [])]


def write_frame(stream, header: dict, blobs: list[bytes]) -> None:
    header = {**header, "blobs": [len(b) for b in blobs]}
    raw = json.dumps(header).encode()
    stream.write(struct.pack(">I", len(raw)) + raw)
    for blob in blobs:
        stream.write(blob)
    stream.flush()


def main() -> None:
    worker, stdin, stdout = Worker(), sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # OpenFHE's and numpy's prints must not corrupt the frames
    while (frame := read_frame(stdin)) is not None:
        header, blobs = frame
        try:
            reply, out = getattr(worker, "op_" + header["op"])(header, blobs)
            write_frame(stdout, {"ok": True, **reply}, out)
        except Exception as exc:  # reported to the driver, which raises it there
            write_frame(stdout, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, [])


if __name__ == "__main__":
    main()
