"""The encrypted-inference service: FastAPI on uvicorn, over a server artifact (no secret key).

Endpoints (bodies are ``application/octet-stream``; nothing the client sends is unpickled):

=====================  =====================================================================
GET  /health           ``{"status": "ok"}``
GET  /model            scheme, input shape, quantisation or CKKS plan (what a client needs)
PUT  /keys             a client's evaluation keys (TFHE) or public context (CKKS); answers
                       ``{"key_id": ...}`` (the SHA-256 of the blob: uploading twice is free)
GET  /keys/{key_id}    204 if the server holds these keys, 404 otherwise
POST /infer/{key_id}   a payload of ciphertexts (fhe.wire) -> the encrypted result;
                       header ``X-Server-Seconds``: the time spent computing
=====================  =====================================================================

Errors are 4xx with ``{"detail": "<what is wrong and what to do>"}``: 400 malformed payload or keys
for other parameters, 404 unknown key id, 413 body over the limit, 415 wrong content type. Keys are
written to ``keys_dir`` (one file per key id; default ``uploaded_keys/`` next to the server folder)
and survive a restart. Executions run one at a time in a worker thread (each already uses every
core), so health and key requests are answered while a circuit runs.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from fhe import wire
from fhe.deploy.runtime import KeysError, load_runtime

OCTET = "application/octet-stream"
KEY_ID = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MAX_KEYS_BYTES = 8 << 30
DEFAULT_MAX_PAYLOAD_BYTES = 256 << 20
KEYS_IN_MEMORY = 2  # deserialised key sets kept (TFHE keys are ~1 GB); the rest reload from disk


def create_app(
    artifact: str | Path,
    keys_dir: str | Path | None = None,
    max_keys_bytes: int = DEFAULT_MAX_KEYS_BYTES,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> FastAPI:
    runtime = load_runtime(artifact)
    keys_dir = Path(keys_dir) if keys_dir else runtime.folder.parent / "uploaded_keys"
    keys_dir.mkdir(parents=True, exist_ok=True)
    loaded: OrderedDict[str, object] = OrderedDict()
    lock = threading.Lock()  # `loaded` is touched from the event loop and from worker threads
    app = FastAPI(
        title="fhe-attention", description="Encrypted inference: the server never sees the data."
    )

    async def body(request: Request, limit: int) -> bytes:
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        if kind != OCTET:
            raise HTTPException(
                415, f"send the bytes as {OCTET}, got {kind or 'no content type'!r}"
            )
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise HTTPException(
                413, f"body of {declared} bytes is over this server's limit of {limit} bytes"
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(413, f"body over this server's limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def keys_for(key_id: str):
        if not KEY_ID.match(key_id):
            raise HTTPException(404, f"unknown key id {key_id!r}: upload keys with PUT /keys first")
        with lock:
            if key_id in loaded:
                loaded.move_to_end(key_id)
                return loaded[key_id]
        path = keys_dir / f"{key_id}.bin"
        if not path.exists():
            raise HTTPException(404, f"unknown key id {key_id}: upload keys with PUT /keys first")
        try:
            keys = runtime.load_keys(path.read_bytes())
        except KeysError as exc:
            raise HTTPException(
                400, f"stored keys {key_id} are unreadable: {exc}; upload them again"
            ) from exc
        remember(key_id, keys)
        return keys

    def remember(key_id: str, keys) -> None:
        with lock:
            loaded[key_id] = keys
            loaded.move_to_end(key_id)
            while len(loaded) > KEYS_IN_MEMORY:
                loaded.popitem(last=False)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "scheme": runtime.scheme}

    @app.get("/model")
    def model() -> dict:
        return runtime.describe()

    @app.put("/keys", status_code=201)
    async def upload_keys(request: Request) -> dict:
        blob = await body(request, max_keys_bytes)
        try:
            keys = await run_in_threadpool(runtime.check_keys, blob)
        except KeysError as exc:
            raise HTTPException(400, str(exc)) from exc
        key_id = hashlib.sha256(blob).hexdigest()
        path = keys_dir / f"{key_id}.bin"
        if not path.exists():
            tmp = path.with_suffix(
                f".{uuid.uuid4().hex}.tmp"
            )  # concurrent uploads never share a file
            tmp.write_bytes(blob)
            tmp.replace(path)
        remember(key_id, keys)  # the first request does not deserialise them again
        return {"key_id": key_id}

    @app.get("/keys/{key_id}", status_code=204)
    def has_keys(key_id: str) -> Response:
        if not (KEY_ID.match(key_id) and (keys_dir / f"{key_id}.bin").exists()):
            raise HTTPException(404, f"unknown key id {key_id}")
        return Response(status_code=204)

    @app.post("/infer/{key_id}")
    async def infer(key_id: str, request: Request) -> Response:
        payload = await body(request, max_payload_bytes)
        keys = await run_in_threadpool(keys_for, key_id)
        start = time.perf_counter()
        try:
            out = await run_in_threadpool(runtime.run, keys, payload)
        except wire.PayloadError as exc:
            raise HTTPException(400, str(exc)) from exc
        return Response(
            out,
            media_type=OCTET,
            headers={"X-Server-Seconds": f"{time.perf_counter() - start:.6f}"},
        )

    return app


def serve(
    artifact: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    keys_dir: str | Path | None = None,
    **limits,
) -> None:
    """Run the service in this process (blocking) with uvicorn."""
    import uvicorn

    uvicorn.run(create_app(artifact, keys_dir, **limits), host=host, port=port, log_level="info")
