"""CKKS backend, packed layout: one sample per ciphertext, rotations by SEAL (fhe/ckks/packed.py).

The batch layout (fhe/backends/ckks.py) costs the same for 1 or N/2 samples; this one answers a single
query. The clear packed run plans everything before keygen: depth (hence N), operation counts and the
rotation steps, for which exactly one Galois key each is made. The server gets the public context
(public and relinearisation keys) and the Galois keys, never the secret key.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import tenseal as ts
import tenseal.sealapi as sa
import torch

from fhe.artifacts import verify
from fhe.backends.ckks import make_context, public_context
from fhe.ckks.arith import ClearArith, Val
from fhe.ckks.packed import PackedProgram, check_packed, min_slots
from fhe.ckks.packing import Layout
from fhe.ckks.planner import MAX_COEFF_BITS_128, CkksPlan, DepthError, max_depth, plan_parameters
from fhe.ckks.program import PolyProgram, build_program
from fhe.ckks.seal import SealArith, SealCodec, ciphertext_bytes, galois_keys_memory, make_galois_keys
from fhe.ckks.serialize import load_program, save_program
from fhe.errors import FheError, KeysMissingError
from fhe.schemes import CkksParams, Scheme

WHY = ("packed: one sample's activations in the slots of one ciphertext, linear maps by BSGS rotations; "
       "latency of one query (--layout batch: N/2 samples per run at the cost of one)")


def plan_packed(program: PolyProgram, x: np.ndarray, params: CkksParams) -> tuple[CkksPlan, dict]:
    """Depth, operation counts and rotation steps from a clear packed run, then the parameters."""
    if params.refresh:
        raise FheError("the packed layout runs without client-assisted refresh; drop --refresh or use --layout batch")
    sizes = [params.poly_modulus_degree] if params.poly_modulus_degree else sorted(MAX_COEFF_BITS_128)
    for n in sizes:  # the layout depends on the slots (packed attention or not), the slots on the depth
        if n // 2 < min_slots(program) or (n != sizes[-1] and max_depth(n, params.scale_bits, params.outer_bits) < 1):
            continue
        probe = PackedProgram(program, n // 2)
        ar = ClearArith()
        probe.forward(ar, ar.encode(probe.encode_input(x)))
        summary = ar.summary()
        if n == sizes[-1] or max_depth(n, params.scale_bits, params.outer_bits) >= summary["depth"]:
            return plan_parameters(summary["depth"], params.scale_bits, params.outer_bits, n, False,
                                   summary["level_after_tag"]), summary
    raise DepthError(f"the packed program needs {min_slots(program)} slots, more than N = {sizes[-1]} has")


class PackedCkksBackend:
    scheme = Scheme.CKKS
    layout = "packed"

    def __init__(self, program: PolyProgram, params: CkksParams, plan: CkksPlan, planned: dict, meta: dict) -> None:
        self.program, self.params, self.plan, self.planned, self.meta = program, params, plan, planned, meta
        self.packed = PackedProgram(program, plan.slots)
        self.client_ctx: ts.Context | None = None
        self.server_ctx: ts.Context | None = None
        self.galois_keys = None
        self.timings_s: dict[str, float] = {}
        self.key_sizes_bytes: dict[str, int] = {}
        self.last_run: dict = {}

    @classmethod
    def compile(cls, model, calib_x, params: CkksParams, meta: dict | None = None) -> PackedCkksBackend:
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
        if self.client_ctx is not None and not force:
            return
        start = time.perf_counter()
        ctx = make_context(self.plan.poly_modulus_degree, self.plan.coeff_mod_bit_sizes, self.plan.scale_bits)
        self.galois_keys = make_galois_keys(ctx, self.rotation_steps, self.plan.poly_modulus_degree)
        self.client_ctx, self.server_ctx = ctx, public_context(ctx)
        self.timings_s["keygen"] = time.perf_counter() - start
        public = len(ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False,
                                   save_relin_keys=False))
        with_relin = len(ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False,
                                       save_relin_keys=True))
        with_secret = len(ctx.serialize(save_public_key=True, save_secret_key=True, save_galois_keys=False,
                                        save_relin_keys=False))
        self.key_sizes_bytes = {"public_context": public, "relin_keys": with_relin - public,
                                "secret_key": with_secret - public,
                                "galois_keys": galois_keys_memory(len(self.rotation_steps),
                                                                  self.plan.poly_modulus_degree,
                                                                  len(self.plan.coeff_mod_bit_sizes))}

    def _require_keys(self) -> None:
        if self.client_ctx is None:
            raise KeysMissingError("no CKKS keys yet: call keygen() first")

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
        """One program run per ciphertext (sample); ``timings_s['run']`` is the last one's latency."""
        self._require_keys()
        out = []
        for ct in cts:
            ar = SealArith(self.server_ctx, self.galois_keys, self.plan.scale_bits, self.plan.depth,
                           self.packed.plain_cache)
            start = time.perf_counter()
            out.append(self.packed.forward(ar, Val(ct, 0)).data)
            self.timings_s["run"] = time.perf_counter() - start
            self.last_run = {"stages_s": dict(ar.timings_s), **ar.summary()}
        return out

    def encrypt_run_decrypt(self, x) -> np.ndarray:
        return self.decrypt(self.run(self.encrypt(x)))

    def simulate(self, x) -> np.ndarray:
        """The clear polynomial program (exact arithmetic; CKKS noise is not modelled)."""
        return self.program.clear(np.asarray(x, dtype=np.float64))

    def simulate_packed(self, x) -> np.ndarray:
        """The clear *packed* program: the same function through the layout, rotations and masks."""
        return self.packed.clear(np.asarray(x, dtype=np.float64))

    # ------------------------------------------------------------------ report and artifacts
    def report(self) -> dict:
        planned = self.planned
        rep = {
            "scheme": "ckks", "seq_len": self.program.config.seq_len, "layout": "packed", "layout_reason": WHY,
            "depth": planned["depth"], "depth_per_tag": planned["level_after_tag"],
            "poly_modulus_degree": self.plan.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(self.plan.coeff_mod_bit_sizes), "scale_bits": self.plan.scale_bits,
            "security_bits": self.plan.security_bits, "slots": self.plan.slots, "client_assisted_refresh": False,
            "program_depth_without_refresh": planned["depth"],
            "op_counts": planned["op_counts"], "op_counts_per_tag": planned["op_counts_per_tag"],
            "rotation_steps": list(self.rotation_steps), "galois_keys_count": len(self.rotation_steps),
            "approximations": {k: {a: b for a, b in v.items() if a != "coeffs"} for k, v in self.program.ops.items()},
            "key_sizes_bytes": dict(self.key_sizes_bytes),
            "timings_s": {**self.timings_s, **{f"stage.{k}": v for k, v in self.last_run.get("stages_s", {}).items()}},
            **{k: v for k, v in self.meta.items() if k in ("task", "model_path")},
        }
        if self.last_run:
            rep["batch"] = getattr(self, "_batch", None)
        return rep

    def save(self, directory, include_secret_key: bool = False) -> dict:
        """server/: public context, Galois keys, program; client/: the context with the secret key."""
        self._require_keys()
        directory = Path(directory)
        server, client = directory / "server", directory / "client"
        server.mkdir(parents=True, exist_ok=True)
        (server / "context.public").write_bytes(self.server_ctx.serialize(save_secret_key=False))
        self.galois_keys.save(str(server / "galois.keys"))
        save_program(self.program, server)
        cfg = self.program.config
        meta = {**self.meta, "layout": "packed", "plan": self.plan.to_dict(), "rotation_steps": self.rotation_steps,
                "io": {"seq_len": cfg.seq_len, "in_features": cfg.in_features, "n_outputs": cfg.n_outputs,
                       "stride": self.packed.stride, "block": self.packed.block}}
        (server / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
        paths = {"server": server}
        if include_secret_key:
            client.mkdir(parents=True, exist_ok=True)
            (client / "context.secret").write_bytes(self.client_ctx.serialize(save_secret_key=True))
            (client / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
            paths["client"] = client
        return paths


class PackedServer:
    """The server side from ``save()``'s server/ folder (no secret key)."""

    def __init__(self, directory) -> None:
        directory = Path(directory)
        verify(directory, "server")
        self.context = ts.context_from((directory / "context.public").read_bytes())
        if self.context.has_secret_key():
            raise RuntimeError(f"{directory} holds a secret key: refusing to serve from it")
        self.meta = json.loads((directory / "meta.json").read_text())
        plan = self.meta["plan"]
        self.scale_bits, self.depth = plan["scale_bits"], plan["max_depth"]
        self.packed = PackedProgram(load_program(directory), plan["slots"])
        self.galois_keys = sa.GaloisKeys()
        self.galois_keys.load(self.context.seal_context().data, str(directory / "galois.keys"))

    def run(self, cts: list) -> list:
        out = []
        for ct in cts:
            ar = SealArith(self.context, self.galois_keys, self.scale_bits, self.depth, self.packed.plain_cache)
            out.append(self.packed.forward(ar, Val(ct, 0)).data)
        return out


class PackedClient:
    """The data owner from ``save()``'s client/ folder: the secret context and the input/output layouts
    (not the model's weights)."""

    def __init__(self, directory) -> None:
        directory = Path(directory)
        verify(directory, "client")
        self.context = ts.context_from((directory / "context.secret").read_bytes())
        self.meta = json.loads((directory / "meta.json").read_text())
        plan, io = self.meta["plan"], self.meta["io"]
        self.slots = plan["slots"]
        self.input_layout = Layout(io["seq_len"], io["in_features"], io["stride"], io["block"])
        self.output_layout = Layout(1, io["n_outputs"], io["stride"], io["block"])
        self.codec = SealCodec(self.context, plan["scale_bits"])

    def encrypt(self, x: np.ndarray) -> list:
        x = np.asarray(x, dtype=np.float64)
        x = x.reshape(-1, self.input_layout.positions, self.input_layout.channels)
        return [self.codec.encrypt(self.input_layout.place(s.reshape(-1), self.slots)) for s in x]

    def decrypt(self, cts: list) -> np.ndarray:
        return np.stack([self.output_layout.read(self.codec.decrypt(ct)) for ct in cts])


def ciphertexts_bytes(cts: list) -> int:
    return sum(len(ciphertext_bytes(ct)) for ct in cts)
