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
secret key, and ``has_secret_key`` says so). A served model's server opens the context alone and
takes each client's keys with ``load_keys`` (one key set at a time, checked before use).
Ciphertexts live in a table and are named by integer handles; the driver frees them.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import struct
import subprocess
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
        self.key_tag: str | None = None  # the client whose evaluation keys are loaded (served)

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
            # baby steps [0, 0] (OpenFHE's choice) in params written before the plan chose them
            baby_steps = p.get("baby_steps", [0, 0])
            self.cc.EvalBootstrapSetup(p["level_budget"], baby_steps, p["slots"])
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
        # what a served model checks another key set of this program against (op_load_keys)
        tag = self.secret.GetKeyTag()
        self.params["automorphism_indices"] = self.cc.GetExistingEvalAutomorphismKeyIndices(tag)
        server, client = Path(h["server_dir"]), Path(h["client_dir"])
        sizes = self._save_public(server, evaluation_keys=True)
        self._save_public(client, evaluation_keys=False)
        (client / FILES["secret"]).write_bytes(of.Serialize(self.secret, BINARY))
        sizes["secret"] = (client / FILES["secret"]).stat().st_size
        of.ClearEvalMultKeys()  # the client encrypts and decrypts: its memory is freed of
        self.cc.ClearEvalAutomorphismKeys()  # the evaluation keys, which the server holds
        keys = len(self.params["automorphism_indices"])
        return {"keygen_s": keygen_s, "sizes": sizes, "rotation_keys": keys, **self._info()}, []

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
        """Context, public and (unless ``evaluation_keys`` is false: a served model takes each
        client's with ``load_keys``) evaluation keys from a server folder; no secret key is read."""
        folder = Path(h["folder"])
        self._load_context(folder)
        if h.get("evaluation_keys", True):
            self._deserialize_keys(folder / FILES["mult"], folder / FILES["rotation"])
        self._bootstrap_setup()
        return self._info(), []

    def _deserialize_keys(self, mult: Path | str, rotation: Path | str) -> None:
        for path, read, what in (
            (mult, self.cc.DeserializeEvalMultKey, "relinearisation"),
            (rotation, self.cc.DeserializeEvalAutomorphismKey, "rotation and bootstrapping"),
        ):
            try:
                ok = read(str(path), BINARY)
            except RuntimeError as exc:
                raise ValueError(f"unreadable {what} keys: {exc}") from exc
            if not ok:
                raise ValueError(f"unreadable {what} keys")

    def op_load_keys(self, h, blobs):
        """A client's key set, replacing the one loaded: the parts (public key, relinearisation
        keys, rotation and bootstrapping keys) of the file at ``path``, each an ``[offset, size]``
        slice. Refused (ValueError) unless the three belong to one secret key, hold every
        automorphism this program's keygen made, and compute on this context."""
        path = Path(h["path"])
        (public_at, mult_at, rotation_at) = h["parts"]
        of.ClearEvalMultKeys()
        self.cc.ClearEvalAutomorphismKeys()
        self.key_tag = None
        with open(path, "rb") as f:
            f.seek(public_at[0])
            public = of.DeserializePublicKeyString(f.read(public_at[1]), BINARY)
        with _streamed(path, mult_at) as mult, _streamed(path, rotation_at) as rotation:
            self._deserialize_keys(mult, rotation)
        tag = public.GetKeyTag()
        tags = list(self.cc.GetAllEvalMultKeys())
        if tags != [tag]:
            raise ValueError("the relinearisation keys are not those of this public key's secret")
        have = set(self.cc.GetExistingEvalAutomorphismKeyIndices(tag))
        missing = sorted(set(self.params.get("automorphism_indices", [])) - have)
        if missing:
            raise ValueError(
                f"the rotation keys lack {len(missing)} of the automorphisms this program uses "
                f"(e.g. {missing[:4]}): keys made for another program or slot count"
            )
        try:  # keys for another context are refused by OpenFHE on first use
            probe = self.cc.Encrypt(public, self._plain([0.0], self.params["bootstrap_depth"]))
            self.cc.EvalMult(probe, probe)
            for step in self.params["rotation_steps"][:1]:
                self.cc.EvalRotate(probe, int(step))
        except RuntimeError as exc:
            raise ValueError(f"these keys do not compute on this program's context: {exc}") from exc
        self.public, self.key_tag = public, tag
        return {"key_tag": tag}, []

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
        """A serialised ciphertext into the table; with ``fresh`` (a served query), refused unless
        it is a fresh two-part ciphertext at the client's encoding level, under the loaded keys."""
        ct = of.DeserializeCiphertextString(blobs[0], BINARY)
        if h.get("fresh"):
            if self.key_tag is None:
                raise ValueError("no client keys are loaded")
            if ct.GetKeyTag() != self.key_tag:
                raise ValueError("a ciphertext encrypted under other keys than those uploaded")
            if ct.NumberCiphertextElements() != 2 or ct.GetLevel() != h["level"]:
                raise ValueError(
                    "the program takes fresh ciphertexts (two parts, encoded at level "
                    f"{h['level']}), got {ct.NumberCiphertextElements()} parts at {ct.GetLevel()}"
                )
            if ct.GetSlots() != self.params["slots"]:
                slots = self.params["slots"]
                raise ValueError(f"{ct.GetSlots()} slots; this program packs {slots}")
        # a server computes on it; ``adopt`` False only to measure what adoption saves
        if h.get("adopt", True) and self.secret is None and self.public is not None:
            ct = self._adopt(ct)
        return {"handle": self._put(ct)}, []

    def _adopt(self, ct):
        """``ct`` re-randomised into this context: a fresh encryption of zero at its level, plus
        ``ct``. OpenFHE bootstraps a deserialised ciphertext, and every one computed from it, at
        about half the speed of one encrypted in the process (30 s against 15 s at N = 2^16, 2048
        slots); the sum takes its first operand's, the fresh one's, speed. Measured in
        benchmarks/results/ckks_bootstrap.md; the error added is a fresh encryption's."""
        zero = self.cc.Encrypt(
            self.public, self._plain([0.0] * self.params["slots"], ct.GetLevel())
        )
        return self.cc.EvalAdd(zero, ct)

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


# the writer of _streamed: a slice of a file into its stdout, a pipe (run by this interpreter)
_COPY = """
import os, sys
path, offset, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "rb") as f:
    while size > 0:
        done = os.sendfile(1, f.fileno(), offset, min(size, 1 << 24))
        if done == 0:
            sys.exit(1)
        offset, size = offset + done, size - done
"""


@contextlib.contextmanager
def _streamed(path: Path, part: list):
    """Bytes ``part = [offset, size]`` of ``path`` as a path OpenFHE can open (it reads its large
    keys from files only): a pipe that a child process fills, so that the slice is never copied to
    disk nor held whole in memory. The child, not a thread: OpenFHE's reader keeps the GIL."""
    read_end, write_end = os.pipe()
    writer = subprocess.Popen(
        [sys.executable, "-c", _COPY, str(path), str(int(part[0])), str(int(part[1]))],
        stdout=write_end,
    )
    os.close(write_end)
    try:
        yield f"/dev/fd/{read_end}"
    finally:
        os.close(read_end)  # a reader that stopped early leaves the writer a broken pipe
        if writer.wait(timeout=60) not in (0, 1, -13, 120):
            raise ValueError(f"reading {path} failed")


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
