"""Encrypted execution in a child process, so a native crash fails one request, not the service.

Concrete and SEAL are native code: keys made for another circuit can pass every check a library
offers and still abort the process inside a bootstrap (SIGSEGV in Concrete's keyswitch). The server
therefore never calls a library on client bytes itself. It hands a :class:`WorkerPool` file paths
(keys already stored, a request body already spooled to disk) and gets back an answer file or a
typed failure:

- :class:`Refused`: the bytes are wrong (malformed, another circuit's): the client's fault, a 4xx;
- :class:`Damaged`: a stored key file no longer hashes to its id (disk corruption, tampering);
- :class:`Crashed`: the child died (a signal or ``os._exit``); the pool starts a fresh one for the
  next job, and the server quarantines the key id that was running.

Each child loads the server artifact once and keeps the last ``keys_in_memory`` key sets it
deserialised (TFHE keys are about a gigabyte each). The messages between the two processes are
small dicts on a :mod:`multiprocessing` pipe between our own processes; no client bytes travel on
it, and nothing a client sent is ever unpickled.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

HASH_CHUNK = 1 << 20


class JobFailed(Exception):
    """A job the worker could not answer; the subclass says whose fault it is."""


class Refused(JobFailed):
    """The client's bytes cannot be used (the server answers 400)."""


class Damaged(JobFailed):
    """A stored key file does not hash to its key id (the server moves it aside)."""


class Crashed(JobFailed):
    """The worker process died while it held the job."""


@dataclass(frozen=True)
class Timings:
    queue_s: float  # waiting for a free worker
    keys_s: float  # reading, hashing and deserialising keys not already in the worker's memory
    compute_s: float  # the encrypted execution itself


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# ------------------------------------------------------------------------------ the child side
def _child(conn, artifact: str, keys_in_memory: int, threads: int | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the child stops
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    from fhe import wire
    from fhe.deploy.runtime import KeysError, load_runtime

    runtime = load_runtime(artifact)
    # a runtime whose keys are gigabytes (OpenFHE) reads them from their file and holds fewer
    from_file = getattr(runtime, "keys_from_file", False)
    keys_in_memory = min(keys_in_memory, getattr(runtime, "max_keys_in_memory", keys_in_memory))
    holds = getattr(runtime, "holds", lambda keys: True)
    loaded: OrderedDict[str, object] = OrderedDict()
    conn.send({"ready": True})

    def remember(key_id: str, keys) -> None:
        loaded[key_id] = keys
        while len(loaded) > keys_in_memory:
            loaded.popitem(last=False)

    def keys_at(key_id: str, path: str) -> tuple[object, float]:
        if key_id in loaded and holds(loaded[key_id]):
            loaded.move_to_end(key_id)
            return loaded[key_id], 0.0
        start = time.perf_counter()
        if from_file:
            if file_sha256(Path(path)) != key_id:
                raise Damaged(f"stored keys {key_id} no longer hash to their id")
            remember(key_id, runtime.load_keys(Path(path)))
            return loaded[key_id], time.perf_counter() - start
        blob = Path(path).read_bytes()
        if hashlib.sha256(blob).hexdigest() != key_id:
            raise Damaged(f"stored keys {key_id} no longer hash to their id")
        remember(key_id, runtime.load_keys(blob))
        return loaded[key_id], time.perf_counter() - start

    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        try:
            if job["op"] == "check":
                path = Path(job["keys"])
                keys = runtime.check_keys(path if from_file else path.read_bytes())
                remember(job["key_id"], keys)
                conn.send({"ok": True})
            elif job["op"] == "run":
                keys, keys_s = keys_at(job["key_id"], job["keys"])
                payload = Path(job["payload"]).read_bytes()
                start = time.perf_counter()
                out = runtime.run(keys, payload)
                compute_s = time.perf_counter() - start
                Path(job["out"]).write_bytes(out)
                conn.send({"ok": True, "keys_s": keys_s, "compute_s": compute_s})
            else:  # pragma: no cover - only this module writes jobs
                conn.send({"error": "internal", "message": f"unknown op {job['op']!r}"})
        except Damaged as exc:
            conn.send({"error": "damaged", "message": str(exc)})
        except (KeysError, wire.PayloadError) as exc:
            conn.send({"error": "refused", "message": str(exc)})
        except (ValueError, RuntimeError, TypeError, IndexError) as exc:
            # a library refusing bytes it cannot use (TenSEAL raises plain RuntimeErrors)
            conn.send({"error": "refused", "message": f"{type(exc).__name__}: {exc}"[:500]})


# ----------------------------------------------------------------------------- the parent side
class _Child:
    def __init__(self, ctx, artifact: str, keys_in_memory: int, threads: int | None) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(
            target=_child,
            args=(child_conn, artifact, keys_in_memory, threads),
            daemon=True,
            name="fhe-worker",
        )
        self.process.start()
        child_conn.close()
        self._ready = False

    def call(self, job: dict) -> dict:
        try:
            if not self._ready:
                self.conn.recv()  # the artifact loaded
                self._ready = True
            self.conn.send(job)
            return self.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            self.process.join(timeout=5)
            code = self.process.exitcode
            reason = (
                f"signal {signal.Signals(-code).name}"
                if code is not None and code < 0
                else f"exit status {code}"
            )
            raise Crashed(f"the worker process died ({reason})") from None

    def stop(self) -> None:
        self.conn.close()
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)


class WorkerPool:
    """``size`` worker processes over one server artifact; :meth:`check` and :meth:`run` block the
    calling thread until a worker is free and has answered (the server calls them from a thread
    pool and bounds how many wait)."""

    def __init__(
        self,
        artifact: str | Path,
        size: int = 1,
        keys_in_memory: int = 2,
        threads: int | None = None,
    ) -> None:
        self.artifact = str(artifact)
        self.keys_in_memory = keys_in_memory
        self.threads = threads
        self._ctx = mp.get_context("spawn")  # no inherited threads or locks from the server
        self._idle: list[_Child] = [self._spawn() for _ in range(size)]
        self._cv = threading.Condition()
        self.size = size
        self.crashes = 0

    def _spawn(self) -> _Child:
        return _Child(self._ctx, self.artifact, self.keys_in_memory, self.threads)

    def _call(self, job: dict) -> dict:
        start = time.perf_counter()
        with self._cv:
            while not self._idle:
                self._cv.wait()
            child = self._idle.pop()
        waited = time.perf_counter() - start
        try:
            reply = child.call(job)
        except Crashed:
            self.crashes += 1
            child.stop()
            child = self._spawn()
            raise
        finally:
            with self._cv:
                self._idle.append(child)
                self._cv.notify()
        error = reply.get("error")
        if error == "damaged":
            raise Damaged(reply["message"])
        if error:
            raise Refused(reply["message"])
        return {**reply, "queue_s": waited}

    def check(self, key_id: str, keys_path: Path) -> None:
        """Refuses (:class:`Refused`) keys this circuit cannot use; keeps them loaded if usable."""
        self._call({"op": "check", "key_id": key_id, "keys": str(keys_path)})

    def run(self, key_id: str, keys_path: Path, payload: Path, out: Path) -> Timings:
        reply = self._call(
            {
                "op": "run",
                "key_id": key_id,
                "keys": str(keys_path),
                "payload": str(payload),
                "out": str(out),
            }
        )
        return Timings(reply["queue_s"], reply["keys_s"], reply["compute_s"])

    def close(self) -> None:
        with self._cv:
            children, self._idle = self._idle, []
        for child in children:
            child.stop()
