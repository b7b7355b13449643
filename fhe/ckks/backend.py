"""CKKS backend: runs the polynomial program (fhe.ckks.program) on TenSEAL ciphertexts.

Layout: SIMD over samples, one ciphertext per (position, feature) scalar whose slots hold up to N/2
samples: no rotations, so the server needs relinearisation keys only (no Galois keys). The client
holds the secret key; the server receives a public context (TenSEAL ``make_context_public``
semantics: public and relinearisation keys, no secret key) and computes on ciphertexts linked to it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tenseal as ts

from fhe.artifacts import verify
from fhe.backends import register_backend
from fhe.ckks.arith import Arith, ClearArith, Val
from fhe.ckks.planner import CkksPlan, plan_parameters
from fhe.ckks.program import (
    PolyProgram,
    build_program,
    pool_outputs,
    pool_positions,
)
from fhe.ckks.serialize import load_program, save_program
from fhe.errors import KeysMissingError, SecretKeyLeakError
from fhe.schemes import CkksLayout, CkksParams, Scheme

if TYPE_CHECKING:  # a server loads its artifact without torch
    import torch


class CkksArith(Arith):
    """TenSEAL ciphertexts (auto-rescale, auto-relinearise, auto mod-switch) as program values."""

    def __init__(self, max_depth: int, refresh_fn=None) -> None:
        super().__init__(max_depth, refresh=refresh_fn is not None)
        self._refresh_fn = refresh_fn

    def _mul(self, a, b):
        return a * b

    def _square(self, a):
        return a.square()

    def _add(self, a, b):
        return a + b

    def _add_scalar(self, a, c):
        return a + c

    def _neg(self, a):
        return a.neg()

    def _mul_scalar(self, a, c):
        return a * c

    def _refresh(self, a):
        return self._refresh_fn(a)


def make_context(
    poly_modulus_degree: int, coeff_mod_bit_sizes, scale_bits: int, galois: bool = False
) -> ts.Context:
    """A private CKKS context (secret, public and relinearisation keys; Galois keys on request)."""
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=poly_modulus_degree,
        coeff_mod_bit_sizes=list(coeff_mod_bit_sizes),
    )
    ctx.global_scale = 2.0**scale_bits
    if galois:
        ctx.generate_galois_keys()
    return ctx


def encrypt_batch(ctx: ts.Context, x: np.ndarray) -> list:
    """(B, T, F) floats → T·F ciphertexts (position-major), the batch in the slots."""
    return [
        ts.ckks_vector(ctx, x[:, t, f].tolist())
        for t in range(x.shape[1])
        for f in range(x.shape[2])
    ]


def words_pooling(config) -> dict | None:
    """What the client needs to pool a padded text model's outputs over its words (recorded in
    the artifact), or None."""
    if not config.key_mask_column:
        return None
    return {
        "seq_len": config.seq_len,
        "n_outputs": config.n_outputs,
        "pooling": config.pooling.value,
    }


def client_pooled(meta: dict, y: np.ndarray) -> np.ndarray:
    """The client's decrypted outputs, pooled over its words when the artifact says so."""
    pooling = meta.get("words_pooling")
    return pool_positions(y, **pooling) if pooling else y


def decrypt_all(ctx: ts.Context, cts: list) -> np.ndarray:
    sk = ctx.secret_key()
    return np.stack([np.asarray(ct.decrypt(sk)) for ct in cts], axis=-1)


def refresher(client_ctx: ts.Context, server_ctx: ts.Context):
    """Client-assisted refresh: the data owner decrypts and re-encrypts a ciphertext (opt-in,
    counted)."""

    def refresh(ct):
        fresh = ts.ckks_vector(client_ctx, ct.decrypt(client_ctx.secret_key()))
        fresh.link_context(server_ctx)
        return fresh

    return refresh


def run_program(
    program: PolyProgram, server_ctx: ts.Context, cts: list, max_depth: int, refresh_fn=None
):
    """The server's part: link the inputs to the public context and evaluate; returns (outputs,
    arith)."""
    for ct in cts:
        ct.link_context(server_ctx)  # from here on, no secret key is reachable
    ar = CkksArith(max_depth, refresh_fn)
    return [v.data for v in program.forward(ar, [Val(ct, 0) for ct in cts])], ar


def public_context(ctx: ts.Context) -> ts.Context:
    """The server's copy: public and relinearisation keys, never the secret key."""
    server = ts.context_from(
        ctx.serialize(
            save_public_key=True,
            save_secret_key=False,
            save_galois_keys=False,
            save_relin_keys=True,
        )
    )
    if (
        not server.is_public() or server.has_secret_key()
    ):  # a real check: asserts vanish under python -O
        raise SecretKeyLeakError(
            "the server's CKKS context still holds the secret key; refusing to use it"
        )
    return server


@register_backend(CkksParams, CkksLayout.BATCH)
class CkksBackend:
    scheme = Scheme.CKKS
    layout = "batch"

    def __init__(
        self, program: PolyProgram, params: CkksParams, plan: CkksPlan, planned: dict, meta: dict
    ) -> None:
        self.program, self.params, self.plan, self.planned, self.meta = (
            program,
            params,
            plan,
            planned,
            meta,
        )
        self.client_ctx: ts.Context | None = None
        self.server_ctx: ts.Context | None = None
        self.timings_s: dict[str, float] = {}
        self.key_sizes_bytes: dict[str, int] = {}
        self.last_run: dict = {}

    # ------------------------------------------------------------------ compile
    @classmethod
    def compile(cls, model, calib_x, params: CkksParams, meta: dict | None = None):
        """The batch layout's backend (the packed one registers itself, backend_packed.py)."""
        start = time.perf_counter()
        program = build_program(model, calib_x, params.approx)
        plan, planned = plan_program(program, np.asarray(calib_x[:2], dtype=np.float64), params)
        backend = cls(program, params, plan, planned, dict(meta or {}))
        backend.timings_s["compile"] = time.perf_counter() - start
        return backend

    # ------------------------------------------------------------------ keys
    @property
    def has_keys(self) -> bool:
        return self.client_ctx is not None

    def keygen(self, force: bool = False) -> None:
        if self.client_ctx is not None and not force:
            return
        start = time.perf_counter()
        ctx = make_context(
            self.plan.poly_modulus_degree, self.plan.coeff_mod_bit_sizes, self.plan.scale_bits
        )
        self.client_ctx, self.server_ctx = ctx, public_context(ctx)
        self.timings_s["keygen"] = time.perf_counter() - start
        public = len(
            ctx.serialize(
                save_public_key=True,
                save_secret_key=False,
                save_galois_keys=False,
                save_relin_keys=False,
            )
        )
        with_relin = len(
            ctx.serialize(
                save_public_key=True,
                save_secret_key=False,
                save_galois_keys=False,
                save_relin_keys=True,
            )
        )
        with_secret = len(
            ctx.serialize(
                save_public_key=True,
                save_secret_key=True,
                save_galois_keys=False,
                save_relin_keys=False,
            )
        )
        self.key_sizes_bytes = {
            "public_context": public,
            "relin_keys": with_relin - public,
            "secret_key": with_secret - public,
            "galois_keys": 0,
        }

    def _require_keys(self) -> None:
        if self.client_ctx is None:
            raise KeysMissingError("no CKKS keys yet: call keygen() first")

    # ------------------------------------------------------------------ client side
    def encrypt(self, x: np.ndarray | torch.Tensor) -> list:
        """(B, T, F) floats → T·F ciphertexts, the batch in the slots (B ≤ N/2)."""
        self._require_keys()
        x = np.asarray(x, dtype=np.float64)
        if x.ndim == 2:
            x = x[None]
        if x.shape[0] > self.plan.slots:
            raise ValueError(
                f"{x.shape[0]} samples exceed the {self.plan.slots} slots of one ciphertext"
            )
        start = time.perf_counter()
        cts = encrypt_batch(self.client_ctx, x)
        self.timings_s["encrypt"] = time.perf_counter() - start
        self._batch = x.shape[0]
        return cts

    def decrypt(self, cts: list) -> np.ndarray:
        self._require_keys()
        start = time.perf_counter()
        out = pool_outputs(self.program.config, decrypt_all(self.client_ctx, cts))
        self.timings_s["decrypt"] = time.perf_counter() - start
        return out

    # ------------------------------------------------------------------ server side
    def run(self, cts: list) -> list:
        self._require_keys()
        refresh = refresher(self.client_ctx, self.server_ctx) if self.plan.refresh else None
        start = time.perf_counter()
        out, ar = run_program(self.program, self.server_ctx, cts, self.plan.depth, refresh)
        self.timings_s["run"] = time.perf_counter() - start
        self.last_run = {"stages_s": dict(ar.timings_s), **ar.summary()}
        for ct in out:
            ct.link_context(self.client_ctx)
        return out

    def encrypt_run_decrypt(self, x) -> np.ndarray:
        return self.decrypt(self.run(self.encrypt(x)))

    def simulate(self, x) -> np.ndarray:
        """The clear polynomial program (exact arithmetic; CKKS noise is not modelled)."""
        return self.program.clear(np.asarray(x, dtype=np.float64))

    # ------------------------------------------------------------------ report and artifacts
    def report(self) -> dict:
        planned = self.planned
        rep = {
            "scheme": "ckks",
            "seq_len": self.program.config.seq_len,
            "layout": "batch",
            "layout_reason": f"{self.meta.get('layout_reason', 'batch')}: SIMD over samples, up "
            "to N/2 samples per run at the cost of one, no rotations (--layout packed: the latency "
            "of one query)",
            "depth": planned["depth"],
            "depth_per_tag": planned["level_after_tag"],
            "poly_modulus_degree": self.plan.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(self.plan.coeff_mod_bit_sizes),
            "scale_bits": self.plan.scale_bits,
            "security_bits": self.plan.security_bits,
            "slots": self.plan.slots,
            "client_assisted_refresh": self.plan.refresh,
            "program_depth_without_refresh": planned.get(
                "program_depth_without_refresh", planned["depth"]
            ),
            "op_counts": planned["op_counts"],
            "op_counts_per_tag": planned["op_counts_per_tag"],
            "approximations": {
                k: {a: b for a, b in v.items() if a != "coeffs"}
                for k, v in self.program.ops.items()
            },
            "key_sizes_bytes": dict(self.key_sizes_bytes),
            "timings_s": {
                **self.timings_s,
                **{f"stage.{k}": v for k, v in self.last_run.get("stages_s", {}).items()},
            },
            **{k: v for k, v in self.meta.items() if k in ("task", "model_path", "engine_reason")},
        }
        if self.last_run:
            rep["batch"] = getattr(self, "_batch", None)
        return rep

    def _artifact_meta(self) -> dict:
        return {"plan": self.plan.to_dict(), "words_pooling": words_pooling(self.program.config)}

    def _save_server_extras(self, server: Path) -> None:
        """Layout-specific server files (the packed layout's Galois keys)."""

    def _save_client_extras(self, client: Path) -> None:
        """Layout-specific client files (the packed layout's Galois keys, to upload to a
        service)."""

    def save(self, directory, include_secret_key: bool = False) -> dict:
        """server/: public context + program; client/: context with the secret key (on request)."""
        self._require_keys()
        assert self.server_ctx is not None and self.client_ctx is not None  # made together
        directory = Path(directory)
        server, client = directory / "server", directory / "client"
        server.mkdir(parents=True, exist_ok=True)
        (server / "context.public").write_bytes(self.server_ctx.serialize(save_secret_key=False))
        save_program(self.program, server)
        self._save_server_extras(server)
        meta = {**self.meta, **self._artifact_meta()}
        (server / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
        paths = {"server": server}
        if include_secret_key:
            client.mkdir(parents=True, exist_ok=True)
            (client / "context.secret").write_bytes(self.client_ctx.serialize(save_secret_key=True))
            (client / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
            self._save_client_extras(client)
            paths["client"] = client
        return paths


def plan_program(program: PolyProgram, x: np.ndarray, params: CkksParams) -> tuple[CkksPlan, dict]:
    """Depth and operation counts from a clear run (the program's structure does not depend on
    data), then the parameters; with refresh, a second clear run under the chain's depth counts the
    refreshes."""
    ar = ClearArith()
    program.clear(x, ar)
    summary = ar.summary()
    plan = plan_parameters(
        summary["depth"],
        params.scale_bits,
        params.outer_bits,
        params.poly_modulus_degree,
        params.refresh,
        summary["level_after_tag"],
    )
    if plan.depth < summary["depth"]:
        full_depth = summary["depth"]
        ar = ClearArith(max_depth=plan.depth, refresh=True)
        program.clear(x, ar)
        summary = ar.summary()
        summary["program_depth_without_refresh"] = full_depth
    return plan, summary


class CkksServer:
    """The server side from ``save()``'s server/ folder: program + public context (no secret
    key). ``verified``: the caller has just checked the folder against its manifest (the service's
    ``artifact_info``), so its files (GBs of Galois keys, packed) are not hashed again."""

    def __init__(self, directory, verified: bool = False) -> None:
        directory = Path(directory)
        if not verified:
            verify(directory, "server")
        self.context = ts.context_from((directory / "context.public").read_bytes())
        if self.context.has_secret_key():
            raise RuntimeError(f"{directory} holds a secret key: refusing to serve from it")
        self.program: PolyProgram = load_program(directory)
        self.meta = json.loads((directory / "meta.json").read_text())
        self.plan = self.meta["plan"]

    def run(self, cts: list, refresh_fn=None) -> list:
        """``refresh_fn`` (the client's decrypt-and-re-encrypt) only when the plan was compiled with
        it."""
        refresh = refresh_fn if self.plan["client_assisted_refresh"] else None
        return run_program(self.program, self.context, cts, self.plan["max_depth"], refresh)[0]


class CkksClient:
    """The data owner from ``save()``'s client/ folder: the context with the secret key."""

    def __init__(self, directory) -> None:
        directory = Path(directory)
        verify(directory, "client")
        self.context = ts.context_from((directory / "context.secret").read_bytes())
        self.meta = json.loads((directory / "meta.json").read_text())

    def encrypt(self, x: np.ndarray) -> list:
        return encrypt_batch(
            self.context, np.asarray(x, dtype=np.float64).reshape(-1, *np.shape(x)[-2:])
        )

    def decrypt(self, cts: list) -> np.ndarray:
        return client_pooled(self.meta, decrypt_all(self.context, cts))

    def refresh(self, server_ctx):
        return refresher(self.context, server_ctx)

    # what a service receives (fhe/deploy): the libraries' own serialisations, never pickles
    def public_keys(self) -> bytes:
        """The public context (public and relinearisation keys): the evaluation keys a server
        needs."""
        return self.context.serialize(save_secret_key=False)

    def to_wire(self, cts: list) -> list[bytes]:
        return [ct.serialize() for ct in cts]

    def from_wire(self, items: list[bytes]) -> list:
        return [ts.ckks_vector_from(self.context, item) for item in items]
