"""The OpenFHE engine's CKKS backend: the packed program, bootstrapped on the server where its chain
runs out, so a deep model never needs the data owner mid-run.

Planning (before any key exists), from clear packed runs of the program:

1. OpenFHE's chain at N = 2^16: scale 2^52 and a 60-bit first prime (OpenFHE bootstraps only with
   first − scale ≤ 8 bits there; a smaller scale loses the precision a bootstrap keeps), level
   budget (3, 2) and 5 key-switching digits (what fits this machine's memory), and the most levels
   left after a bootstrap that 128-bit security allows (asked of OpenFHE itself). The chosen
   setting is measured in ``benchmarks/results/ckks_bootstrap.md``; the settings set aside were
   tried in one-off runs, not in a results file (docs/ckks.md says which);
2. bootstraps placed just in time by :class:`fhe.ckks.arith.Arith`: an operand whose next product
   would not fit is bootstrapped, once (in place), and an exhausted value is bootstrapped before it
   is rotated, not each rotated copy after; and, where a search over clear runs finds it saves
   bootstraps (:mod:`fhe.ckks.placement`), a stage's inputs are renewed as the stage begins
   (``entry_levels``, kept in the plan: the server places its bootstraps by the same rule), and
   whether Goldschmidt's 1/x renews its iterate alone and rebuilds its error term (``rebuild``,
   kept in the plan too: :func:`fhe.ckks.placement.search_placement`). One
   level is kept below each bootstrap: OpenFHE bootstraps only a ciphertext with a level left. A
   client's query is encoded high enough in the chain to run up to 24 levels before the first
   bootstrap, as high as that saves bootstraps (``fresh_levels``,
   :func:`fhe.ckks.placement.fewest_fresh_levels`). The residual stream is made one ciphertext at
   each block's first norm (``compact_residual``, :meth:`fhe.ckks.packed.PackedProgram.compact`),
   so the server does not hold every block's outputs and their rotations to the end. The count
   and the stage of each bootstrap are in the report;
3. the largest |value| the calibration samples bring to each bootstrap: OpenFHE's error is the
   same for values in [−16, 16] as in [−1, 1] (``ckks_bootstrap.md``) and grew beyond in a one-off
   run (~10x at 64); the report lists them and warns
   above 16;
4. the rotation steps (one key each), as the TenSEAL packed layout.

Keys: the client worker makes every key; the server folder gets the crypto context, the public key
and the evaluation keys (relinearisation, rotations, bootstrapping), never the secret key.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fhe import wire
from fhe.artifacts import verify
from fhe.backends import register_backend
from fhe.ckks.arith import ClearArith, Val
from fhe.ckks.openfhe.engine import OpenFheArith, WorkerProcess
from fhe.ckks.packed import PackedProgram, check_packed, min_slots
from fhe.ckks.placement import count_bootstraps, search_placement
from fhe.ckks.planner import DepthError
from fhe.ckks.program import PolyProgram, build_program
from fhe.ckks.serialize import load_program, save_program
from fhe.errors import FheError, KeysMissingError
from fhe.schemes import CkksEngine, CkksLayout, CkksParams, Scheme

if TYPE_CHECKING:  # the server and client load artifacts without torch
    import torch

SECURE_RING = 1 << 16
SCALE_BITS = 52
FIRST_MOD_BITS = 60  # OpenFHE bootstraps only with first − scale ≤ 8 bits at N = 2^16
LEVEL_BUDGET = (3, 2)  # levels of the bootstrap's two linear transforms (fewer: more keys, memory)
# baby steps of the bootstrap's two linear transforms (CoeffsToSlots, SlotsToCoeffs). OpenFHE's own
# choice (0, 0) makes 73 rotation keys at 2048 slots, (8, 8) 38: 8.8 instead of 14.3 GiB with the
# bootstrap's precomputation, at the same speed and precision (benchmarks/results/ckks_bootstrap.md)
BOOTSTRAP_BABY_STEPS = (8, 8)
LARGE_DIGITS = 5  # hybrid key switching digits: more fit more levels in 128 bits, bigger keys
FLAT_ERROR_BOUND = 16.0  # OpenFHE's bootstrap error is flat for |x| up to this (ckks_bootstrap.md)
PLAN_SAMPLES = 16  # calibration samples the bootstrap inputs' peaks are taken over
SEARCH_SAMPLES = 2  # those the placement search checks its bootstraps' inputs on
SERVER_FILES = (
    "openfhe.context",
    "openfhe.public",
    "openfhe.mult_keys",
    "openfhe.rotation_keys",
    "openfhe.params.json",
)
CLIENT_FILES = ("openfhe.context", "openfhe.public", "openfhe.secret", "openfhe.params.json")
# what a client uploads to `fhe serve`: one fhe.wire payload of these server files, saved whole in
# client/ as KEY_SET_FILE (its SHA-256, in client/'s manifest, is the service's key id)
KEY_SET = ("openfhe.public", "openfhe.mult_keys", "openfhe.rotation_keys")
KEY_SET_FILE = "openfhe.keys"


@cache
def chain_at_128_bits() -> tuple[int, int]:
    """(levels left after a bootstrap, levels one bootstrap uses) at N = 2^16 with this module's
    scale, budget and digits: the most OpenFHE builds a 128-bit context for, asked of it once per
    process. An insecure test ring takes the same numbers, so that a test places its bootstraps
    where the real parameters would."""
    worker = WorkerProcess()
    try:
        reply, _ = worker.call(
            "max_levels_after",
            ring_dim=SECURE_RING,
            scale_bits=SCALE_BITS,
            first_mod_bits=FIRST_MOD_BITS,
            level_budget=list(LEVEL_BUDGET),
            large_digits=LARGE_DIGITS,
        )
    finally:
        worker.close()
    return int(reply["levels"]), int(reply["bootstrap_depth"])


def levels_after_bootstrap() -> int:
    return chain_at_128_bits()[0]


@dataclass(frozen=True)
class OpenFhePlan:
    """Everything the keys and a run depend on, decided from clear runs (saved in meta.json)."""

    ring_dim: int
    secure: bool
    slots: int
    scale_bits: int
    first_mod_bits: int
    large_digits: int
    level_budget: tuple[int, int]
    bootstrap_depth: int  # levels one bootstrap consumes
    levels_after: int  # levels a bootstrapped ciphertext has for the program
    program_depth: int  # the program's depth with no bootstrap
    bootstrap_tags: tuple[str, ...]  # the stage of each bootstrap, in run order
    peaks: tuple[float, ...]  # the largest |value| entering each bootstrap (calibration samples)
    rotation_steps: tuple[int, ...]
    # stage -> level above which its inputs are bootstrapped as it begins (fhe.ckks.placement);
    # empty in artifacts planned before the search: just-in-time renewal only
    entry_levels: tuple[tuple[str, int], ...] = ()
    # the bootstrap's baby steps (BOOTSTRAP_BABY_STEPS); (0, 0), OpenFHE's own choice, in artifacts
    # planned before they were chosen: their keys were made with it
    baby_steps: tuple[int, int] = (0, 0)
    # Goldschmidt renews y alone and rebuilds e (fhe.ckks.placement.search_placement); False in
    # artifacts planned before: the plain iteration, as they were planned
    rebuild: bool = False
    # levels a client's fresh ciphertext holds beyond a bootstrapped one (fhe.ckks.placement's
    # fewest_fresh_levels): it is encoded at OpenFHE level bootstrap_depth − fresh_levels. 0 in
    # artifacts planned before: encoded at bootstrap_depth, levels_after levels like a bootstrap's
    fresh_levels: int = 0
    # the residual stream made one ciphertext at each block's first norm (PackedProgram.compact):
    # the server's memory no longer grows with the blocks. False in artifacts planned before
    compact_residual: bool = False

    @property
    def encoding_level(self) -> int:
        """OpenFHE's level of a client's fresh ciphertext (0: the whole chain)."""
        return self.bootstrap_depth - self.fresh_levels

    @property
    def poly_modulus_degree(self) -> int:
        return self.ring_dim

    @property
    def depth(self) -> int:
        """The chain's depth (a bootstrap and the levels left after it)."""
        return self.total_depth

    @property
    def total_depth(self) -> int:
        return self.levels_after + self.bootstrap_depth

    @property
    def arith_depth(self) -> int:
        """Levels between bootstraps: one is kept below each (OpenFHE bootstraps only a ciphertext
        with a level left)."""
        return self.levels_after - 1

    def worker_params(self) -> dict:
        return {
            "secure": self.secure,
            "ring_dim": self.ring_dim,
            "scale_bits": self.scale_bits,
            "first_mod_bits": self.first_mod_bits,
            "large_digits": self.large_digits,
            "total_depth": self.total_depth,
            "slots": self.slots,
            "level_budget": list(self.level_budget),
            "baby_steps": list(self.baby_steps),
            "bootstrap": bool(self.bootstrap_tags),
            "rotation_steps": list(self.rotation_steps),
            "bootstrap_depth": self.bootstrap_depth,  # the level of load_keys' probe
        }

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> OpenFhePlan:
        d = dict(d)
        for name in ("level_budget", "bootstrap_tags", "peaks", "rotation_steps"):
            d[name] = tuple(d[name])
        d["baby_steps"] = tuple(d.get("baby_steps", (0, 0)))
        d["entry_levels"] = tuple((str(t), int(k)) for t, k in d.get("entry_levels", ()))
        return cls(**d)

    def arith(self, worker: WorkerProcess) -> OpenFheArith:
        """The server's arithmetic for one query: this plan's depth and bootstrap placement."""
        return OpenFheArith(
            worker, self.arith_depth, dict(self.entry_levels), self.rebuild, -self.fresh_levels
        )


def bootstraps_per_stage(tags) -> dict[str, int]:
    out: dict[str, int] = {}
    for tag in tags:
        out[tag] = out.get(tag, 0) + 1
    return out


def plan_openfhe(program: PolyProgram, calib_x: np.ndarray, params: CkksParams):
    """The plan and the clear run's summary (see the module docstring)."""
    ring = params.insecure_ring_dim or SECURE_RING
    slots = min_slots(program)
    if slots > ring // 2:
        raise DepthError(f"the packed program needs {slots} slots, more than N = {ring} has")
    packed = PackedProgram(program, slots, compact_residual=True)
    if not packed.pack_attention and packed.attention_period <= ring // 2:
        # all attention offsets in one ciphertext: one bootstrap where there would be one per
        # offset (issue 28's digits model: 8 bootstraps at 2048 slots, 24 at 256)
        slots = packed.attention_period
        packed = PackedProgram(program, slots, compact_residual=True)
    unbounded = ClearArith()
    packed.clear(calib_x[:1], unbounded)
    depths = unbounded.summary()  # the program's depth, and its depth after each stage
    after, depth = chain_at_128_bits()
    arith_depth = after - 1  # OpenFhePlan.arith_depth
    placement = search_placement(
        lambda ar: packed.clear(calib_x[:1], ar),  # the count: the program's, on any sample
        arith_depth,
        FLAT_ERROR_BOUND,
        check=lambda ar: packed.clear(calib_x[:SEARCH_SAMPLES], ar),
        fresh_levels=depth,  # the client may encode at the top: the bootstrap's levels too
    )
    entry = placement.entry_levels
    peaks: list[float] = []
    summary: dict = {}
    for sample in calib_x[:PLAN_SAMPLES]:
        ar = count_bootstraps(
            partial(packed.clear, sample[None]),  # packed.clear(x, ar)
            arith_depth,
            entry,
            placement.rebuild,
            placement.fresh_levels,
        )
        # depth per stage as the program's, not within the chain between two bootstraps
        summary = {**ar.summary(), "level_after_tag": depths["level_after_tag"]}
        new = ar.bootstrap_peaks  # the same bootstraps for every sample: one program
        peaks = [max(p, q) for p, q in zip(peaks, new, strict=True)] if peaks else list(new)
    plan = OpenFhePlan(
        ring_dim=ring,
        secure=params.insecure_ring_dim is None,
        slots=slots,
        scale_bits=SCALE_BITS,
        first_mod_bits=FIRST_MOD_BITS,
        large_digits=LARGE_DIGITS,
        level_budget=LEVEL_BUDGET,
        baby_steps=BOOTSTRAP_BABY_STEPS,
        bootstrap_depth=depth,
        levels_after=after,
        program_depth=depths["depth"],
        bootstrap_tags=tuple(summary["bootstraps"]),
        peaks=tuple(round(p, 4) for p in peaks),
        rotation_steps=tuple(summary["rotation_steps"]),
        entry_levels=tuple(entry.items()),
        rebuild=placement.rebuild,
        fresh_levels=placement.fresh_levels,
        compact_residual=packed.compact_residual,
    )
    return plan, summary


@register_backend(CkksParams, CkksLayout.PACKED, CkksEngine.OPENFHE)
class OpenFheBackend:
    """Compile, keys, encrypt/run/decrypt in this process (two workers: client and server), report
    and artifacts."""

    scheme = Scheme.CKKS
    layout = "packed"

    def __init__(
        self, program: PolyProgram, params: CkksParams, plan: OpenFhePlan, planned: dict, meta: dict
    ) -> None:
        self.program, self.params, self.plan, self.planned = program, params, plan, planned
        self.meta = meta
        self.packed = PackedProgram(program, plan.slots, plan.compact_residual)
        self.client: WorkerProcess | None = None
        self.server: WorkerProcess | None = None
        self.keys_dir: Path | None = None
        self.timings_s: dict[str, float] = {}
        self.key_sizes_bytes: dict[str, int] = {}
        self.rotation_keys: int | None = None  # made by keygen: the bootstrap's and the program's
        self.last_run: dict = {}

    @classmethod
    def compile(cls, model, calib_x, params: CkksParams, meta: dict | None = None):
        start = time.perf_counter()
        program = build_program(model, calib_x, params.approx)
        check_packed(program)
        x = np.asarray(calib_x, dtype=np.float64)
        plan, planned = plan_openfhe(program, x, params)
        backend = cls(program, params, plan, planned, dict(meta or {}))
        backend.timings_s["compile"] = time.perf_counter() - start
        return backend

    # ------------------------------------------------------------------ keys
    @property
    def has_keys(self) -> bool:
        return self.server is not None

    def keygen(self, force: bool = False) -> None:
        """All keys in a worker of their own, which writes the server and client files and exits;
        the client worker then opens the client files, the server worker the server files only."""
        if self.server is not None and not force:
            return
        self.close()  # a forced keygen replaces the workers and their keys
        self.keys_dir = Path(tempfile.mkdtemp(prefix="fhe-openfhe-"))
        # GBs at N = 2^16: removed with the backend even when close() is never called
        weakref.finalize(self, shutil.rmtree, self.keys_dir, True)
        start = time.perf_counter()
        maker = WorkerProcess()  # exits after keygen: its peak memory is the keys' (GBs)
        try:
            reply, _ = maker.call(
                "keygen",
                params=self.plan.worker_params(),
                server_dir=str(self.keys_dir / "server"),
                client_dir=str(self.keys_dir / "client"),
            )
            self.timings_s["keygen"] = time.perf_counter() - start
        finally:
            maker.close()
        self.client = WorkerProcess()
        self.client.call("open_client", folder=str(self.keys_dir / "client"))
        self.server = open_server_worker(self.keys_dir / "server")
        sizes = reply["sizes"]
        self.rotation_keys = int(reply["rotation_keys"])
        self.key_sizes_bytes = {
            "public_context": sizes["context"] + sizes["public"],
            "relin_keys": sizes["mult"],
            "rotation_and_bootstrap_keys": sizes["rotation"],
            "secret_key": sizes["secret"],
        }

    def _require_keys(self) -> tuple[WorkerProcess, WorkerProcess]:
        if self.client is None or self.server is None:
            raise KeysMissingError("no OpenFHE keys yet: call keygen() first")
        return self.client, self.server

    # ------------------------------------------------------------------ client and server
    def encrypt(self, x: np.ndarray | torch.Tensor) -> list[bytes]:
        """(B, T, F) or (T, F) floats → one serialised ciphertext per sample (what is sent)."""
        client, _ = self._require_keys()
        start = time.perf_counter()
        out = encrypt_samples(client, self.packed, self.plan, x)
        self.timings_s["encrypt"] = time.perf_counter() - start
        return out

    def decrypt(self, cts: list[bytes]) -> np.ndarray:
        client, _ = self._require_keys()
        start = time.perf_counter()
        out = decrypt_samples(client, self.packed, self.plan, cts)
        self.timings_s["decrypt"] = time.perf_counter() - start
        return out

    def run(self, cts: list[bytes]) -> list[bytes]:
        """One query per ciphertext; ``timings_s['run']`` is the last one's latency."""
        _, server = self._require_keys()
        out = []
        for blob in cts:
            start = time.perf_counter()
            result, ar = run_on(server, self.packed, self.plan, blob)
            out.append(result)
            self.timings_s["run"] = time.perf_counter() - start
            self.last_run = {"stages_s": dict(ar.timings_s), **ar.summary()}
        return out

    def encrypt_run_decrypt(self, x) -> np.ndarray:
        return self.decrypt(self.run(self.encrypt(x)))

    def simulate(self, x) -> np.ndarray:
        """The clear polynomial program (exact arithmetic; CKKS and bootstrapping noise are not
        modelled)."""
        return self.program.clear(np.asarray(x, dtype=np.float64))

    # ------------------------------------------------------------------ report and artifacts
    def report(self) -> dict:
        plan, planned = self.plan, self.planned
        return {
            "scheme": "ckks",
            "engine": "openfhe",
            "seq_len": self.program.config.seq_len,
            "layout": "packed",
            "layout_reason": self.meta.get(
                "layout_reason", "packed: the OpenFHE engine bootstraps one ciphertext per query"
            ),
            "depth": plan.program_depth,
            "depth_per_tag": planned["level_after_tag"],
            "poly_modulus_degree": plan.ring_dim,
            "security_bits": 128 if plan.secure else 0,
            "insecure_test_parameters": not plan.secure,
            "scale_bits": plan.scale_bits,
            "first_mod_bits": plan.first_mod_bits,
            "slots": plan.slots,
            "chain_depth": plan.total_depth,
            "levels_after_bootstrap": plan.levels_after,
            "levels_of_a_fresh_query": plan.levels_after + plan.fresh_levels,
            "bootstrap_depth": plan.bootstrap_depth,
            "level_budget": list(plan.level_budget),
            "bootstrap_baby_steps": list(plan.baby_steps),
            "bootstraps": len(plan.bootstrap_tags),
            "bootstraps_per_stage": bootstraps_per_stage(plan.bootstrap_tags),
            "bootstrap_entry_levels": dict(plan.entry_levels),
            "goldschmidt_rebuild": plan.rebuild,
            "bootstrap_input_peaks": list(plan.peaks),
            "bootstraps_beyond_flat_error": sum(p > FLAT_ERROR_BOUND for p in plan.peaks),
            "client_assisted_refresh": False,
            "op_counts": planned["op_counts"],
            "op_counts_per_tag": planned["op_counts_per_tag"],
            "rotation_steps": list(plan.rotation_steps),
            "galois_keys_count": len(plan.rotation_steps),
            "rotation_keys_made": self.rotation_keys,
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

    def _artifact_meta(self) -> dict:
        cfg = self.program.config
        return {
            "layout": "packed",
            "engine": "openfhe",
            "openfhe_plan": self.plan.to_dict(),
            "io": {
                "seq_len": cfg.seq_len,
                "in_features": cfg.in_features,
                "n_outputs": cfg.n_outputs,
            },
        }

    def save(self, directory, include_secret_key: bool = False) -> dict:
        """server/: program, crypto context, public and evaluation keys; client/ (on request): the
        context, public and secret keys, and the key set it uploads to a service (a copy of the
        server's evaluation keys: gigabytes at N = 2^16)."""
        self._require_keys()
        assert self.keys_dir is not None
        directory = Path(directory)
        server, client = directory / "server", directory / "client"
        server.mkdir(parents=True, exist_ok=True)
        for name in SERVER_FILES:
            shutil.copyfile(self.keys_dir / "server" / name, server / name)
        save_program(self.program, server)
        key_set = [server / name for name in KEY_SET]
        meta = {**self.meta, **self._artifact_meta(), "key_set_bytes": wire.packed_size(key_set)}
        (server / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
        paths = {"server": server}
        if include_secret_key:
            client.mkdir(parents=True, exist_ok=True)
            for name in CLIENT_FILES:
                shutil.copyfile(self.keys_dir / "client" / name, client / name)
            with open(client / KEY_SET_FILE, "wb") as f:
                for chunk in wire.pack_files(key_set):
                    f.write(chunk)
            save_program(self.program, client)  # the client decodes the packed output layout
            (client / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
            paths["client"] = client
        return paths

    def close(self) -> None:
        """Stops the workers and removes the keys' temporary folder (the saved artifacts stay)."""
        for worker in (self.client, self.server):
            if worker is not None:
                worker.close()
        self.client = self.server = None
        if self.keys_dir is not None:
            shutil.rmtree(self.keys_dir, ignore_errors=True)


def open_server_worker(folder: Path, evaluation_keys: bool = True) -> WorkerProcess:
    """A server worker on ``folder``'s context and (unless a service loads each client's, with
    ``evaluation_keys=False``) evaluation keys; it reads no secret key, and says so (checked all
    the same)."""
    worker = WorkerProcess()
    info, _ = worker.call("open_server", folder=str(folder), evaluation_keys=evaluation_keys)
    if info["has_secret_key"]:
        worker.close()
        raise RuntimeError(f"{folder}: the OpenFHE server worker holds a secret key")
    return worker


def encrypt_samples(worker: WorkerProcess, packed: PackedProgram, plan: OpenFhePlan, x):
    """(B, T, F) or (T, F) floats → one serialised ciphertext per sample, encoded at the plan's
    ``encoding_level`` (``levels_after`` + ``fresh_levels`` levels left)."""
    x = np.asarray(x, dtype=np.float64)
    return [
        worker.to_bytes(worker.encrypt(packed.encode_input(s), plan.encoding_level))
        for s in x.reshape(-1, *x.shape[-2:])
    ]


def decrypt_samples(
    worker: WorkerProcess, packed: PackedProgram, plan: OpenFhePlan, cts: list[bytes]
) -> np.ndarray:
    """The logits of each serialised result (a worker with the secret key)."""
    slots = [worker.decrypt(worker.from_bytes(ct))[: plan.slots] for ct in cts]
    return np.stack([packed.decode_output(v) for v in slots])


def open_artifact(directory: Path, role: str) -> tuple[dict, OpenFhePlan, PackedProgram]:
    """An artifact folder's meta (with its manifest as ``meta["manifest"]``), plan and packed
    program, after the manifest is verified."""
    return read_artifact(directory, verify(directory, role))


def read_artifact(
    directory: Path, manifest: dict | None = None
) -> tuple[dict, OpenFhePlan, PackedProgram]:
    """:func:`open_artifact` for a folder its caller has just verified (GBs of keys hashed once)."""
    meta = {**json.loads((directory / "meta.json").read_text()), "manifest": manifest}
    plan = OpenFhePlan.from_dict(meta["openfhe_plan"])
    return meta, plan, PackedProgram(load_program(directory), plan.slots, plan.compact_residual)


def run_on(
    worker: WorkerProcess,
    packed: PackedProgram,
    plan: OpenFhePlan,
    blob: bytes,
    fresh: bool = False,
):
    """One query on a server worker: the serialised ciphertext in, the serialised result out.
    ``fresh`` (a served query): the worker refuses a ciphertext that is not fresh at the client's
    encoding level under the keys it has loaded."""
    ar = plan.arith(worker)
    ct = worker.from_bytes(blob, fresh_level=plan.encoding_level if fresh else None)
    out = packed.forward(ar, Val(ct, ar.input_level))
    return worker.to_bytes(out.data), ar


class OpenFheServer:
    """The server side from an artifact's server/ folder (no secret key in it, none read)."""

    def __init__(self, directory) -> None:
        directory = Path(directory)
        self.meta, self.plan, self.packed = open_artifact(directory, "server")
        self.program: PolyProgram = self.packed.program
        self.worker = open_server_worker(directory)
        self.context = None  # no client-assisted refresh to offer

    def run(self, cts: list[bytes], refresh_fn=None) -> list[bytes]:
        return [run_on(self.worker, self.packed, self.plan, blob)[0] for blob in cts]


class OpenFheClient:
    """The data owner from an artifact's client/ folder: the secret key and the packed layouts."""

    def __init__(self, directory) -> None:
        directory = Path(directory)
        self.meta, self.plan, self.packed = open_artifact(directory, "client")
        self.worker = WorkerProcess()
        self.worker.call("open_client", folder=str(directory))
        files = self.meta["manifest"]["files"]
        self.key_file = directory / KEY_SET_FILE if KEY_SET_FILE in files else None
        # the service's key id, from the manifest that verify() just checked against the file
        self.key_id = files[KEY_SET_FILE]["sha256"] if self.key_file else None

    def public_keys(self) -> bytes:
        if self.key_file is None:
            raise FheError(
                f"this client folder has no {KEY_SET_FILE}: it was compiled before `fhe serve` "
                "took OpenFHE keys; compile it again"
            )
        raise FheError(
            "an OpenFHE key set is gigabytes: it is uploaded from its file (key_file), never "
            "held in memory; `fhe batch` does not take OpenFHE artifacts yet"
        )

    def encrypt(self, x: np.ndarray) -> list[bytes]:
        return encrypt_samples(self.worker, self.packed, self.plan, x)

    def decrypt(self, cts: list[bytes]) -> np.ndarray:
        return decrypt_samples(self.worker, self.packed, self.plan, cts)

    def refresh(self, server_ctx):
        return None  # bootstrapping: the server never asks

    def to_wire(self, cts: list[bytes]) -> list[bytes]:
        return list(cts)

    def from_wire(self, items: list[bytes]) -> list[bytes]:
        return list(items)


__all__ = ["OpenFheBackend", "OpenFheClient", "OpenFhePlan", "OpenFheServer", "plan_openfhe"]
