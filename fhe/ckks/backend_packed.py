"""CKKS backend, packed layout: one sample per ciphertext, rotations by SEAL (fhe/ckks/packed.py).

The batch layout (fhe/ckks/backend.py) costs the same for 1 or N/2 samples; this one answers a
single query. The clear packed run plans everything before keygen: depth (hence N), operation counts
and the rotation steps, for which exactly one Galois key each is made. The server gets the public
context (public and relinearisation keys) and the Galois keys, never the secret key.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tenseal.sealapi as sa

from fhe.backends import register_backend
from fhe.ckks.arith import ClearArith, Val
from fhe.ckks.backend import CkksBackend, CkksClient, CkksServer, client_pooled, words_pooling
from fhe.ckks.packed import PackedProgram, check_packed, min_slots
from fhe.ckks.packing import Layout
from fhe.ckks.planner import MAX_COEFF_BITS_128, CkksPlan, DepthError, max_depth, plan_parameters
from fhe.ckks.program import PolyProgram, build_program
from fhe.ckks.seal import (
    SealArith,
    SealCodec,
    from_bytes,
    galois_elements,
    galois_keys_memory,
    make_galois_keys,
    to_bytes,
)
from fhe.errors import FheError
from fhe.schemes import CkksLayout, CkksParams

if TYPE_CHECKING:  # a server loads its artifact without torch
    import torch


def is_packed(folder: str | Path) -> bool:
    """Whether a CKKS artifact folder (server/ or client/) holds a packed-layout program."""
    return json.loads((Path(folder) / "meta.json").read_text()).get("layout") == "packed"


def engine_of(folder: str | Path) -> str:
    """The CKKS engine an artifact folder was compiled for (tenseal or openfhe)."""
    return json.loads((Path(folder) / "meta.json").read_text()).get("engine", "tenseal")


def open_server(folder: str | Path):
    """The server side of a CKKS artifact, in the layout and on the engine it was compiled for."""
    if engine_of(folder) == "openfhe":
        from fhe.ckks.openfhe.backend import OpenFheServer

        return OpenFheServer(folder)
    return (PackedServer if is_packed(folder) else CkksServer)(folder)


def open_client(folder: str | Path):
    """The client side of a CKKS artifact, in the layout and on the engine it was compiled for."""
    if engine_of(folder) == "openfhe":
        from fhe.ckks.openfhe.backend import OpenFheClient

        return OpenFheClient(folder)
    return (PackedClient if is_packed(folder) else CkksClient)(folder)


WHY = (
    "packed: one sample's activations in the slots of one ciphertext, linear maps by BSGS "
    "rotations; latency of one query (--layout batch: N/2 samples per run at the cost of one)"
)


def plan_packed(program: PolyProgram, x: np.ndarray, params: CkksParams) -> tuple[CkksPlan, dict]:
    """Depth, operation counts and rotation steps from a clear packed run, then the parameters."""
    if params.refresh:
        raise FheError(
            "the packed layout runs without client-assisted refresh; drop --refresh or use "
            "--layout batch"
        )
    sizes = (
        [params.poly_modulus_degree] if params.poly_modulus_degree else sorted(MAX_COEFF_BITS_128)
    )
    for (
        n
    ) in sizes:  # the layout depends on the slots (packed attention or not), the slots on the depth
        if n // 2 < min_slots(program) or (
            n != sizes[-1] and max_depth(n, params.scale_bits, params.outer_bits) < 1
        ):
            continue
        probe = PackedProgram(program, n // 2)
        ar = ClearArith()
        probe.forward(ar, ar.encode(probe.encode_input(x)))
        summary = ar.summary()
        if n == sizes[-1] or max_depth(n, params.scale_bits, params.outer_bits) >= summary["depth"]:
            return plan_parameters(
                summary["depth"],
                params.scale_bits,
                params.outer_bits,
                n,
                False,
                summary["level_after_tag"],
            ), summary
    raise DepthError(
        f"the packed program needs {min_slots(program)} slots, more than N = {sizes[-1]} has"
    )


@register_backend(CkksParams, CkksLayout.PACKED)
class PackedCkksBackend(CkksBackend):
    """The batch backend's keys, report and artifacts, with the packed program, Galois keys and SEAL
    runs."""

    layout = "packed"

    def __init__(
        self, program: PolyProgram, params: CkksParams, plan: CkksPlan, planned: dict, meta: dict
    ) -> None:
        super().__init__(program, params, plan, planned, meta)
        self.packed = PackedProgram(program, plan.slots)
        self.galois_keys: sa.GaloisKeys | None = None

    @classmethod
    def compile(
        cls, model, calib_x, params: CkksParams, meta: dict | None = None
    ) -> PackedCkksBackend:
        start = time.perf_counter()
        program = build_program(model, calib_x, params.approx)
        check_packed(program)
        plan, planned = plan_packed(program, np.asarray(calib_x[0], dtype=np.float64), params)
        backend = cls(program, params, plan, planned, dict(meta or {}))
        backend.timings_s["compile"] = time.perf_counter() - start
        return backend

    @property
    def rotation_steps(self) -> list[int]:
        return self.planned["rotation_steps"]

    # ------------------------------------------------------------------ keys
    def keygen(self, force: bool = False) -> None:
        """The batch backend's context, plus one Galois key per planned rotation step."""
        if self.client_ctx is not None and not force:
            return
        start = time.perf_counter()
        super().keygen(force=True)
        self.galois_keys = make_galois_keys(
            self.client_ctx, self.rotation_steps, self.plan.poly_modulus_degree
        )
        self.timings_s["keygen"] = time.perf_counter() - start
        self.key_sizes_bytes["galois_keys"] = galois_keys_memory(
            len(self.rotation_steps),
            self.plan.poly_modulus_degree,
            len(self.plan.coeff_mod_bit_sizes),
        )

    # ------------------------------------------------------------------ client side
    def encrypt(self, x: np.ndarray | torch.Tensor) -> list:
        """(B, T, F) or (T, F) floats → one ciphertext per sample."""
        self._require_keys()
        x = np.asarray(x, dtype=np.float64)
        x = x[None] if x.ndim == 2 else x
        start = time.perf_counter()
        codec = SealCodec(self.client_ctx, self.plan.scale_bits)
        cts = [codec.encrypt(self.packed.encode_input(sample)) for sample in x]
        self.timings_s["encrypt"] = time.perf_counter() - start
        self._batch = len(cts)
        return cts

    def decrypt(self, cts: list) -> np.ndarray:
        self._require_keys()
        start = time.perf_counter()
        codec = SealCodec(self.client_ctx, self.plan.scale_bits)
        out = np.stack([self.packed.decode_output(codec.decrypt(ct)) for ct in cts])
        self.timings_s["decrypt"] = time.perf_counter() - start
        return out

    # ------------------------------------------------------------------ server side
    def run(self, cts: list) -> list:
        """One program run per ciphertext (sample); ``timings_s['run']`` is the last one's
        latency."""
        self._require_keys()
        out = []
        for ct in cts:
            ar = SealArith(
                self.server_ctx,
                self.galois_keys,
                self.plan.scale_bits,
                self.plan.depth,
                self.packed.plain_cache,
            )
            start = time.perf_counter()
            out.append(self.packed.forward(ar, Val(ct, 0)).data)
            self.timings_s["run"] = time.perf_counter() - start
            self.last_run = {"stages_s": dict(ar.timings_s), **ar.summary()}
        return out

    def simulate_packed(self, x) -> np.ndarray:
        """The clear *packed* program: the same function through the layout, rotations and masks."""
        return self.packed.clear(np.asarray(x, dtype=np.float64))

    # ------------------------------------------------------------------ report and artifacts
    def report(self) -> dict:
        rep = super().report()
        rep.update(
            layout="packed",
            layout_reason=f"{self.meta.get('layout_reason', 'packed')}: {WHY}",
            rotation_steps=list(self.rotation_steps),
            galois_keys_count=len(self.rotation_steps),
        )
        return rep

    def _artifact_meta(self) -> dict:
        cfg = self.program.config
        return {
            "layout": "packed",
            "plan": self.plan.to_dict(),
            "words_pooling": words_pooling(cfg),
            "rotation_steps": self.rotation_steps,
            "io": {
                "seq_len": cfg.seq_len,
                "in_features": cfg.in_features,
                "n_outputs": cfg.n_outputs,
                "stride": self.packed.stride,
                "block": self.packed.block,
            },
        }

    def _save_server_extras(self, server: Path) -> None:
        assert self.galois_keys is not None  # saved after keygen (_require_keys)
        self.galois_keys.save(str(server / "galois.keys"))

    def _save_client_extras(self, client: Path) -> None:
        assert self.galois_keys is not None
        self.galois_keys.save(
            str(client / "galois.keys")
        )  # evaluation keys: what the client uploads to serve


class PackedServer(CkksServer):
    """The server side from ``save()``'s server/ folder (no secret key), with its Galois keys."""

    def __init__(self, directory, verified: bool = False) -> None:
        super().__init__(directory, verified)
        self.packed = PackedProgram(self.program, self.plan["slots"])
        self.directory = Path(directory)
        self._galois_keys: sa.GaloisKeys | None = None

    @property
    def galois_keys(self) -> sa.GaloisKeys:
        """The artifact's own Galois keys, loaded on first use: a service runs with the keys its
        clients upload, and need not hold these (GBs at N = 32768) beside them."""
        if self._galois_keys is None:
            self._galois_keys = sa.GaloisKeys()
            self._galois_keys.load(
                self.context.seal_context().data, str(self.directory / "galois.keys")
            )
        return self._galois_keys

    def run(self, cts: list, refresh_fn=None, keys: tuple | None = None) -> list:
        """One query per ciphertext; the packed layout never refreshes (``refresh_fn`` is ignored).
        ``keys``: (public context, Galois keys) a client uploaded; by default the artifact's own."""
        ctx, galois = keys or (self.context, self.galois_keys)
        out = []
        for ct in cts:
            ar = SealArith(
                ctx,
                galois,
                self.plan["scale_bits"],
                self.plan["max_depth"],
                self.packed.plain_cache,
            )
            out.append(self.packed.forward(ar, Val(ct, 0)).data)
        return out

    def missing_rotations(self, galois: sa.GaloisKeys) -> list[int]:
        """The program's rotation steps that ``galois`` has no key for."""
        steps = self.meta["rotation_steps"]
        elements = galois_elements(steps, self.plan["poly_modulus_degree"])
        return [s for s, e in zip(steps, elements, strict=True) if not galois.has_key(e)]


class PackedClient(CkksClient):
    """The data owner from ``save()``'s client/ folder: the secret context, its Galois keys (to
    upload) and the input/output layouts (not the model's weights)."""

    def __init__(self, directory) -> None:
        super().__init__(directory)
        self.directory = Path(directory)
        plan, io = self.meta["plan"], self.meta["io"]
        self.slots = plan["slots"]
        self.input_layout = Layout(io["seq_len"], io["in_features"], io["stride"], io["block"])
        pooled = self.meta.get("words_pooling")  # per position and the key mask, or pooled logits
        self.output_layout = (
            Layout(io["seq_len"], io["n_outputs"] + 1, io["stride"], io["block"])
            if pooled
            else Layout(1, io["n_outputs"], io["stride"], io["block"])
        )
        self.codec = SealCodec(self.context, plan["scale_bits"])

    def encrypt(self, x: np.ndarray) -> list:
        x = np.asarray(x, dtype=np.float64)
        x = x.reshape(-1, self.input_layout.positions, self.input_layout.channels)
        return [self.codec.encrypt(self.input_layout.place(s.reshape(-1), self.slots)) for s in x]

    def decrypt(self, cts: list) -> np.ndarray:
        out = np.stack([self.output_layout.read(self.codec.decrypt(ct)) for ct in cts])
        return client_pooled(self.meta, out)

    def public_keys(self) -> bytes:
        """The public context and the Galois keys, as one wire payload (fhe/wire.py)."""
        from fhe import wire

        return wire.pack([super().public_keys(), self.galois_keys_bytes()])

    def to_wire(self, cts: list) -> list[bytes]:
        return [to_bytes(ct) for ct in cts]

    def from_wire(self, items: list[bytes]) -> list:
        return [from_bytes(sa.Ciphertext, self.context, item) for item in items]

    def galois_keys_bytes(self) -> bytes:
        """The Galois keys made at compile time (SEAL's serialisation), or new ones for the planned
        steps."""
        path = self.directory / "galois.keys"
        if path.exists():
            return path.read_bytes()
        keys = make_galois_keys(
            self.context, self.meta["rotation_steps"], self.meta["plan"]["poly_modulus_degree"]
        )
        return to_bytes(keys)
