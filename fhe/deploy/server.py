"""The encrypted-inference service: FastAPI on uvicorn, over a server artifact (no secret key).

Endpoints (bodies are ``application/octet-stream``; nothing the client sends is unpickled):

=====================  =====================================================================
GET  /health           ``{"status": "ok", "scheme": ...}`` (no token needed)
GET  /model            scheme, input shape, quantisation or CKKS plan (what a client needs)
PUT  /keys             a client's evaluation keys (TFHE) or public context (CKKS); answers 201
                       ``{"key_id": ...}`` (the SHA-256 of the blob: uploading twice is free)
GET  /keys/{key_id}    204 if this token's tenant holds these keys, 404 otherwise
POST /infer/{key_id}   a payload of ciphertexts (fhe.wire) -> the encrypted result; headers
                       ``X-Queue-Seconds`` (waiting for a worker), ``X-Keys-Seconds`` (loading
                       keys not yet in memory), ``X-Server-Seconds`` (the encrypted execution)
=====================  =====================================================================

Every answer other than 2xx is ``{"detail": "<what is wrong and what to do>"}``: 400 malformed
payload or keys for another circuit, 401 no or unknown token, 404 unknown key id (for this token),
409 stored keys found damaged (set aside: upload them again), 410 a key id quarantined after its
execution crashed a worker, 413 body or key set over a limit, 415 wrong content type, 429 over the
token's rate (``Retry-After``), 500 the execution crashed its worker (the service stays up), 503
every worker busy and the queue full (``Retry-After``).

How it holds up (issue: a server strangers can reach):

- **Crash isolation**: the libraries run only in worker processes (:mod:`fhe.deploy.worker`); this
  process never deserialises a client's bytes. A worker that dies fails its request with a 500, is
  replaced, and the key id it was running is quarantined (refused afterwards, across restarts).
- **Keys are checked before they are stored**, in a worker: size, deserialisation, and (TFHE)
  re-serialisation to the same bytes, which refuses another circuit's keys padded to this size.
- **A verified store** (:mod:`fhe.deploy.keystore`): hashed against the id on every load, damaged
  files set aside, interrupted uploads swept at start, bounded per tenant and in total (LRU).
- **Streaming**: bodies go to the spool on disk as they arrive; a declared length over a limit, an
  unknown key id or a missing token is refused before the body is read, so this process's memory
  does not grow with what clients send.
- **Access** (:mod:`fhe.deploy.access`): tokens, one tenant per token, quotas, rate limits; the
  interactive docs (``/docs``, ``/openapi.json``) only with ``docs=True``.
- **Backpressure**: at most ``workers`` executions run and ``queue`` wait; more get a 503.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import FileResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from fhe.deploy.access import Access, RateLimited, Tenant, Unauthorized, read_tokens
from fhe.deploy.keystore import KeyStore, OverQuota
from fhe.deploy.runtime import artifact_info
from fhe.deploy.worker import Crashed, Damaged, Refused, WorkerPool, file_sha256
from fhe.errors import FheError

OCTET = "application/octet-stream"
LOG = logging.getLogger("fhe.serve")
KEEP_ALIVE_S = 15  # idle connections kept this long; clients reuse theirs for less (client.py)


class Detail(BaseModel):
    """Every answer other than 2xx: what is wrong and what to do."""

    detail: str


# What each endpoint may answer besides its success, declared in the OpenAPI schema (which the
# property tests hold the service to, tests/test_serve_attacks.py)
_ERRORS = {
    400: "malformed body, or keys/ciphertexts for another circuit or parameters",
    401: "no token, or an unknown one",
    404: "unknown key id (for this token)",
    409: "stored keys found damaged and set aside: upload them again",
    410: "a key id quarantined after its execution crashed a worker",
    413: "body or key set over a limit",
    415: "not application/octet-stream",
    429: "over the token's rate (Retry-After)",
    500: "the execution crashed its worker (the service stays up)",
    503: "every worker busy and the queue full (Retry-After)",
}


def _answers(*codes: int) -> dict:
    return {c: {"model": Detail, "description": _ERRORS[c]} for c in codes}


def _octet_body(what: str) -> dict:
    """The OpenAPI request body of an endpoint that reads raw bytes."""
    return {
        "requestBody": {
            "required": True,
            "description": what,
            "content": {OCTET: {"schema": {"type": "string", "format": "binary"}}},
        }
    }


@dataclass(frozen=True)
class ServeConfig:
    """What an operator sets when exposing the service (``fhe serve`` options, same names)."""

    max_payload_mb: int = field(
        default=1024,
        metadata={"min": 1, "help": "Largest /infer body (a CKKS batch query is ~340 MB)."},
    )
    max_keys_mb: int | None = field(
        default=None,
        metadata={
            "min": 1,
            "help": "Largest uploaded key set (default: what this artifact's own keys need).",
        },
    )
    max_store_mb: int | None = field(
        default=None,
        metadata={
            "min": 1,
            "help": "Bound on all stored key sets together (least recently used evicted).",
        },
    )
    anonymous_quota_mb: int | None = field(
        default=None,
        metadata={"min": 1, "help": "Without --tokens: the anonymous tenant's key quota."},
    )
    workers: int = field(
        default=1,
        metadata={"min": 1, "help": "Worker processes (each execution already uses every core)."},
    )
    queue: int = field(
        default=8, metadata={"help": "Requests that may wait for a worker; more get a 503."}
    )
    keys_in_memory: int = field(
        default=2,
        metadata={"min": 1, "help": "Deserialised key sets each worker keeps (TFHE: ~1 GB each)."},
    )
    tokens: Path | None = field(
        default=None, metadata={"help": "Tokens file (fhe serve-token); without it, anonymous."}
    )
    docs: bool = field(default=False, metadata={"help": "Serve /docs and /openapi.json."})


class _Gate:
    """Admits at most ``running + waiting`` jobs; the rest are answered 503 at once."""

    def __init__(self, running: int, waiting: int) -> None:
        self.limit = running + waiting
        self.inside = 0
        self._lock = threading.Lock()

    def __enter__(self) -> _Gate:
        with self._lock:
            if self.inside >= self.limit:
                raise HTTPException(
                    503,
                    f"every worker is busy and {self.limit} requests are already admitted; retry",
                    headers={"Retry-After": "5"},
                )
            self.inside += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self.inside -= 1


def _wrong_key_size(got: int, expected: int) -> HTTPException:
    return HTTPException(
        400,
        f"evaluation keys of {got} bytes; this circuit's are {expected} bytes: keys made for "
        "another circuit or parameters",
    )


def create_app(
    artifact: str | Path, keys_dir: str | Path | None = None, config: ServeConfig | None = None
) -> FastAPI:
    config = config or ServeConfig()
    # what GET /model says and the key sizes, from the files: no FHE library in this process
    runtime = artifact_info(artifact)
    store = KeyStore(
        Path(keys_dir) if keys_dir else runtime.folder.parent / "uploaded_keys",
        None if config.max_store_mb is None else config.max_store_mb << 20,
    )
    swept = store.sweep()
    if any(swept.values()):
        LOG.info("key store: %(swept)d leftover file(s) swept, %(migrated)d migrated", swept)
    access = Access(
        read_tokens(config.tokens) if config.tokens else None, config.anonymous_quota_mb
    )
    # TFHE keys have one exact size; CKKS ones a bound from the artifact's own keys
    expected_keys, key_bound = runtime.expected_key_bytes, runtime.max_key_bytes
    max_payload = config.max_payload_mb << 20
    max_keys = key_bound if config.max_keys_mb is None else config.max_keys_mb << 20
    if max_keys is None:
        raise FheError("this artifact does not say how large its keys are: give --max-keys-mb")
    if expected_keys is not None and expected_keys > max_keys:
        raise FheError(
            f"this artifact's keys are {expected_keys >> 20} MB, over --max-keys-mb "
            f"{config.max_keys_mb}: no client could upload them"
        )
    key_bound = key_bound or max_keys
    pool = WorkerPool(runtime.folder, config.workers, config.keys_in_memory)
    gate = _Gate(config.workers, config.queue)
    app = FastAPI(
        title="fhe-attention",
        description="Encrypted inference: the server never sees the data.",
        docs_url="/docs" if config.docs else None,
        redoc_url="/redoc" if config.docs else None,
        openapi_url="/openapi.json" if config.docs else None,
    )
    app.state.pool, app.state.store = pool, store

    @app.on_event("shutdown")
    def _close() -> None:
        pool.close()

    def tenant_of(request: Request) -> Tenant:
        try:
            tenant = access.authenticate(request.headers.get("authorization"))
            access.meter(tenant)
        except Unauthorized as exc:
            raise HTTPException(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from exc
        except RateLimited as exc:
            raise HTTPException(
                429, str(exc), headers={"Retry-After": str(max(1, round(exc.retry_after_s)))}
            ) from exc
        return tenant

    def octet(request: Request, limit: int, exact: int | None = None) -> None:
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        if kind != OCTET:
            raise HTTPException(
                415, f"send the bytes as {OCTET}, got {kind or 'no content type'!r}"
            )
        declared = request.headers.get("content-length", "")
        if exact is not None and declared.isdigit() and int(declared) != exact:
            raise _wrong_key_size(int(declared), exact)
        if declared.isdigit() and int(declared) > limit:
            raise HTTPException(
                413, f"body of {declared} bytes is over this server's limit of {limit} bytes"
            )

    async def spool(request: Request, limit: int, suffix: str) -> Path:
        """The body, streamed to a spool file as it arrives (413 as soon as it passes ``limit``)."""
        path = store.spool_file(suffix)
        size = 0
        try:
            with open(path, "wb") as f:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise HTTPException(413, f"body over this server's limit of {limit} bytes")
                    f.write(chunk)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path

    def known(tenant: Tenant, key_id: str) -> None:
        if store.is_quarantined(key_id):
            raise HTTPException(
                410,
                f"key id {key_id} is quarantined: an execution with these keys crashed a worker; "
                "make new keys (fhe compile or keygen) and upload those",
            )
        if not store.has(tenant.name, key_id):
            raise HTTPException(
                404, f"unknown key id {key_id[:80]!r}: upload keys with PUT /keys first"
            )

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "scheme": runtime.scheme.value}

    @app.get("/model", responses=_answers(401, 429))
    def model(request: Request) -> dict:
        tenant_of(request)
        return runtime.describe()

    @app.put(
        "/keys",
        status_code=201,
        responses=_answers(400, 401, 410, 413, 415, 429, 500, 503),
        openapi_extra=_octet_body("evaluation keys (TFHE) or public context (CKKS)"),
    )
    async def upload_keys(request: Request) -> dict:
        tenant = tenant_of(request)
        limit = min(max_keys, tenant.quota_bytes or max_keys, key_bound)
        octet(request, limit, exact=expected_keys)
        path = await spool(request, limit, "keys")
        try:
            if expected_keys is not None and path.stat().st_size != expected_keys:
                raise _wrong_key_size(path.stat().st_size, expected_keys)
            key_id = await run_in_threadpool(file_sha256, path)
            if store.is_quarantined(key_id):
                raise HTTPException(410, f"key id {key_id} is quarantined; make new keys")
            with gate:
                await run_in_threadpool(pool.check, key_id, path)
            evicted = store.commit(tenant.name, key_id, path, tenant.quota_bytes)
        except Refused as exc:
            raise HTTPException(400, str(exc)) from exc
        except OverQuota as exc:
            raise HTTPException(413, str(exc)) from exc
        except Crashed as exc:
            raise HTTPException(
                500, f"checking these keys crashed a worker ({exc}); the service is still up"
            ) from exc
        finally:
            path.unlink(missing_ok=True)
        for e in evicted:
            LOG.info("evicted keys %s of %s (%d bytes, LRU)", e.key_id, e.tenant, e.size)
        return {"key_id": key_id}

    @app.get("/keys/{key_id}", status_code=204, responses=_answers(401, 404, 410, 429))
    def has_keys(key_id: str, request: Request) -> Response:
        known(tenant_of(request), key_id)
        return Response(status_code=204)

    @app.post(
        "/infer/{key_id}",
        responses={
            200: {"content": {OCTET: {}}, "description": "the encrypted result (fhe.wire)"},
            **_answers(400, 401, 404, 409, 410, 413, 415, 429, 500, 503),
        },
        response_class=Response,
        openapi_extra=_octet_body("a payload of ciphertexts (fhe.wire)"),
    )
    async def infer(key_id: str, request: Request) -> Response:
        arrived = time.perf_counter()
        tenant = tenant_of(request)
        known(tenant, key_id)  # before a byte of the body is read
        octet(request, max_payload)
        with gate:
            payload = await spool(request, max_payload, "payload")
            out = store.spool_file("answer")
            store.touch(tenant.name, key_id)
            try:
                timings = await run_in_threadpool(
                    pool.run, key_id, store.path(tenant.name, key_id), payload, out
                )
            except Refused as exc:
                out.unlink(missing_ok=True)
                raise HTTPException(400, str(exc)) from exc
            except Damaged as exc:
                out.unlink(missing_ok=True)
                aside = store.set_aside(tenant.name, key_id)
                LOG.warning("damaged keys %s of %s set aside at %s", key_id, tenant.name, aside)
                raise HTTPException(
                    409, f"{exc}; they were set aside: upload your keys again (PUT /keys)"
                ) from exc
            except Crashed as exc:
                out.unlink(missing_ok=True)
                store.quarantine(tenant.name, key_id, str(exc))
                LOG.error("execution with keys %s crashed a worker: %s; quarantined", key_id, exc)
                raise HTTPException(
                    500,
                    f"the encrypted execution crashed its worker ({exc}); the service is still up, "
                    f"and key id {key_id} is quarantined (refused from now on)",
                ) from exc
            finally:
                payload.unlink(missing_ok=True)
        return FileResponse(
            out,
            media_type=OCTET,
            headers={
                "X-Server-Seconds": f"{timings.compute_s:.6f}",
                "X-Keys-Seconds": f"{timings.keys_s:.6f}",
                "X-Queue-Seconds": f"{timings.queue_s:.6f}",
                "X-Total-Seconds": f"{time.perf_counter() - arrived:.6f}",
            },
            background=BackgroundTask(out.unlink, missing_ok=True),
        )

    return app


def serve(
    artifact: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    keys_dir: str | Path | None = None,
    config: ServeConfig | None = None,
) -> None:
    """Run the service in this process (blocking) with uvicorn."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = create_app(artifact, keys_dir, config)
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_keep_alive=KEEP_ALIVE_S)
