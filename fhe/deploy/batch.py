"""Batches of encrypted requests, in this process or spread over Ray workers.

Each Ray worker is an actor that loads the server artifact and the evaluation keys once (the keys go
into Ray's object store once, and every worker reads them from there), then takes payloads
(:mod:`fhe.wire`) one at a time. ``workers=0`` and no ``address`` runs in-process, as before.
On one machine, each worker gets ``cores / workers`` threads for Concrete's loop parallelism (or
TenSEAL's), so two workers do not fight over the same cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fhe.deploy.runtime import load_runtime


@dataclass
class BatchResult:
    outputs: list[bytes]  # one encrypted answer per payload, in order
    workers: int  # 0: in-process
    setup_s: float  # start the workers and load artifact + keys in each (in-process: load once)
    run_s: float  # from the first payload sent to the last answer received
    per_worker_setup_s: list[float] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return len(self.outputs) / self.run_s if self.run_s else float("nan")


class Worker:
    """Holds one server artifact and one set of keys; answers payloads."""

    def __init__(self, server: str, keys: bytes) -> None:
        start = time.perf_counter()
        self.runtime = load_runtime(server)
        self.keys = self.runtime.load_keys(keys)
        self.setup_s = time.perf_counter() - start

    def ready(self) -> float:
        return self.setup_s

    def run(self, payload: bytes) -> bytes:
        return self.runtime.run(self.keys, payload)


def run_batch(
    server: str | Path,
    keys: bytes,
    payloads: list[bytes],
    workers: int = 0,
    address: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> BatchResult:
    """Answers every payload with the server artifact at ``server`` and the client's ``keys``.

    ``workers`` > 0 starts a local Ray with that many workers; ``address`` joins an existing cluster
    (``workers`` then defaults to its CPU count). Results are in payload order either way."""
    if workers <= 0 and address is None:
        start = time.perf_counter()
        worker = Worker(str(server), keys)
        setup = time.perf_counter() - start
        start = time.perf_counter()
        outputs = []
        for i, p in enumerate(payloads):
            outputs.append(worker.run(p))
            if progress:
                progress(i + 1)
        return BatchResult(outputs, 0, setup, time.perf_counter() - start, [setup])
    return _run_on_ray(str(Path(server).resolve()), keys, payloads, workers, address, progress)


def _run_on_ray(
    server: str, keys: bytes, payloads: list[bytes], workers: int, address: str | None, progress
) -> BatchResult:
    import ray
    from ray.util import ActorPool

    start = time.perf_counter()
    if address:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        workers = workers or int(ray.cluster_resources().get("CPU", 1))
        threads = None
    else:
        cores = os.cpu_count() or 1
        ray.init(
            num_cpus=max(workers, cores),
            include_dashboard=False,
            ignore_reinit_error=True,
            log_to_driver=False,
        )
        threads = max(1, cores // workers)
    env = {"env_vars": {"OMP_NUM_THREADS": str(threads)}} if threads else None
    actor: Any = (  # a Ray actor class (untyped)
        ray.remote(num_cpus=1, runtime_env=env)(Worker) if env else ray.remote(num_cpus=1)(Worker)
    )
    keys_ref = ray.put(keys)
    actors = [actor.remote(server, keys_ref) for _ in range(workers)]
    per_worker = ray.get([a.ready.remote() for a in actors])
    setup = time.perf_counter() - start
    start = time.perf_counter()
    outputs = []
    pool = ActorPool(actors)
    for i, out in enumerate(pool.map(lambda a, p: a.run.remote(p), payloads)):
        outputs.append(out)
        if progress:
            progress(i + 1)
    run_s = time.perf_counter() - start
    for a in actors:
        ray.kill(a)
    return BatchResult(outputs, workers, setup, run_s, list(per_worker))


def execute_compiled(
    compiled,
    x_int,
    workers: int = 0,
    address: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[list, BatchResult]:
    """Encrypts ``x_int`` with ``compiled``'s TFHE client, answers every sample from a temporary
    server artifact (on ``workers`` local Ray workers, or the cluster at ``address``), decrypts, and
    returns the decrypted outputs in order with the batch timings."""
    import tempfile

    import numpy as np
    from concrete import fhe as cfhe

    from fhe import wire

    circuit = compiled.backend.circuit
    with tempfile.TemporaryDirectory() as tmp:
        paths = compiled.save(tmp)
        payloads = [wire.pack([circuit.encrypt(xi).serialize()]) for xi in x_int]
        result = run_batch(
            paths["server"],
            circuit.client.evaluation_keys.serialize(),
            payloads,
            workers,
            address,
            progress,
        )
    outs = [
        np.asarray(circuit.decrypt(cfhe.Value.deserialize(wire.unpack(o)[0])))
        for o in result.outputs
    ]
    return outs, result
