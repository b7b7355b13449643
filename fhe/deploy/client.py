"""The data owner's side of the service: keys uploaded once, then encrypt, post, decrypt.

    client = Client("artifacts/client", "http://127.0.0.1:8000")
    result = client.predict(x)          # x: one sample (TFHE) or a batch (CKKS), floats
    result.logits, result.round_trip_s, result.server_s

The client artifact (``fhe compile --out``) already holds the keys made at compile time; the key id
is the SHA-256 of the evaluation keys (or public context), so the client asks the server whether it
holds them and uploads them only once per server.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fhe import wire
from fhe.errors import FheError, InputOverflowError
from fhe.scheme import Scheme
from quant.quantizer import Quantizer, decode_output

if TYPE_CHECKING:
    import httpx

CLIENT_KEEP_ALIVE_S = 2.0  # below the server's keep-alive (fhe.deploy.server.KEEP_ALIVE_S)


class ServiceError(FheError):
    """The service answered with an error (its status and message are in the text;
    ``retry_after_s`` is set when the service said when to retry: 429 and 503)."""

    def __init__(self, message: str, status: int = 0, retry_after_s: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Prediction:
    logits: np.ndarray
    round_trip_s: float  # encrypt + upload + server + download + decrypt
    server_s: float  # what the server spent computing (its X-Server-Seconds header)
    queue_s: float = 0.0  # what the request waited for a free worker (X-Queue-Seconds)
    warnings: tuple[str, ...] = ()


def quantize_input(meta: dict, x: np.ndarray) -> np.ndarray:
    """The TFHE client's quantisation, from the artifact's metadata: the program's input quantizer
    rebuilt (inputs outside its range are clipped)."""
    qmin, qmax = meta["input_qmin"], meta["input_qmax"]
    n_bits = (qmax - qmin + 1).bit_length() - 1
    return Quantizer(meta["input_scale"], meta["input_zero_point"], n_bits, qmin < 0).quantize_np(x)


def dequantize_output(meta: dict, y: np.ndarray) -> np.ndarray:
    """The TFHE client's decoding of a decrypted output, from the artifact's metadata."""
    return decode_output(
        y,
        meta["output_scale"],
        meta.get("client_pools", False),
        meta.get("masked", False),
        meta.get("model_config", {}).get("pooling", "mean"),
    )


class Client:
    """The data owner's side of ``fhe serve`` on the client artifact ``client_dir`` (the module's
    docstring shows its use); without ``url``, it encrypts and decrypts locally only."""

    def __init__(
        self,
        client_dir: str | Path,
        url: str | None = None,
        timeout_s: float = 3600.0,
        token: str | None = None,
        allow_overflow: bool = False,
    ) -> None:
        """``url``: the service; without one the client only encrypts and decrypts (e.g. for `fhe
        batch`). ``token``: the service's API token (``fhe serve-token``). ``allow_overflow``
        (TFHE): encrypt inputs outside the calibrated bit widths anyway, with a warning, instead of
        refusing them (:class:`~fhe.errors.InputOverflowError`)."""
        import httpx

        client_dir = Path(client_dir)
        if any((client_dir / f).exists() for f in ("context.secret", "openfhe.secret")):
            from fhe.ckks.backend_packed import open_client

            self.scheme, self.local = Scheme.CKKS, open_client(client_dir)  # batch or packed layout
        else:
            from fhe.tfhe.backend import TfheClient

            self.scheme, self.local = Scheme.TFHE, TfheClient(client_dir)
        self.meta = self.local.meta
        self.folder = client_dir
        headers = {"authorization": f"Bearer {token}"} if token else {}
        # a pooled connection idle for longer than the server keeps it (uvicorn: KEEP_ALIVE_S) can
        # be closed by the server just as a request goes out on it ("server disconnected without
        # sending a response", seen under load while encrypting took seconds): reuse only younger
        self.http = (
            httpx.Client(
                base_url=url.rstrip("/"),
                timeout=timeout_s,
                headers=headers,
                limits=httpx.Limits(keepalive_expiry=CLIENT_KEEP_ALIVE_S),
            )
            if url
            else None
        )
        self.key_id: str | None = None
        self.allow_overflow = allow_overflow
        self.warnings: list[str] = []
        self.last_queue_s = 0.0
        self.last_keys_s = 0.0  # the last answer's X-Keys-Seconds (keys loaded for it)

    def _server(self) -> httpx.Client:
        if self.http is None:
            raise FheError("this client was opened without a server URL: Client(folder, url)")
        return self.http

    # ---------------------------------------------------------------------------------- text
    @functools.cached_property
    def text(self):
        """The front end of a text model (:class:`models.text.TextEncoder`: tokenizer, vocabulary,
        embedding table, positions), None for a model of feature vectors."""
        from models.text import TEXT_JSON, TextEncoder

        if not (self.folder / TEXT_JSON).exists():
            return None
        from safetensors import SafetensorError

        try:
            return TextEncoder.load(self.folder)
        except (ValueError, KeyError, OSError, SafetensorError) as exc:  # a mismatched front end
            raise FheError(f"{self.folder}: the text front end cannot be read: {exc}") from exc

    @property
    def labels(self) -> tuple[str, ...] | None:
        """The outputs' names (a next-word model's words), None when the model has none."""
        return self.text.labels if self.text is not None else None

    def text_note(self, text: str | None) -> str | None:
        """What the front end leaves out of ``text`` (more words than the model reads), or None."""
        return self.text.truncation_note(text) if text is not None and self.text else None

    def encode_text(self, text: str) -> np.ndarray:
        """One text as the (T, d_model) vectors this model's program reads (in the clear, here)."""
        if self.text is None:
            raise FheError("this model takes feature vectors, not text: give an input array")
        try:
            return self.text.encode([text])[0]
        except ValueError as exc:
            raise FheError(str(exc)) from exc

    # ----------------------------------------------------------------------------------- keys
    def public_keys(self) -> bytes:
        if self.scheme is Scheme.TFHE:
            return self.local.client.evaluation_keys.serialize()
        return self.local.public_keys()

    def upload_keys(self) -> str:
        """The key id on the server, uploading the keys only if the server does not hold them
        yet."""
        if self.key_id:
            return self.key_id
        key_file = getattr(self.local, "key_file", None)  # OpenFHE: gigabytes, sent from disk
        blob: bytes | None = None
        if key_file:
            key_id = self.local.key_id
        else:
            blob = self.public_keys()
            key_id = hashlib.sha256(blob).hexdigest()
        held = self._server().get(f"/keys/{key_id}")
        if held.status_code not in (204, 404):
            _raise_for(held)
        if held.status_code == 404:
            headers = {"content-type": wire_type()}
            if key_file:
                with open(key_file, "rb") as f:  # streamed, with its Content-Length
                    resp = self._server().put("/keys", content=f, headers=headers)
            else:
                resp = self._server().put("/keys", content=blob, headers=headers)
            _raise_for(resp)
            key_id = resp.json()["key_id"]
        self.key_id = key_id
        return key_id

    # ---------------------------------------------------------------------------- inference
    def encrypt(self, x: np.ndarray) -> bytes:
        shape = self.meta.get("input_shape")
        if shape is not None and tuple(np.shape(x)[-len(shape) :]) != tuple(shape):
            raise FheError(
                f"input of shape {np.shape(x)}; this model takes {tuple(shape)}"
                + (" (one sample)" if self.scheme is Scheme.TFHE else " per sample")
            )
        if self.scheme is Scheme.TFHE:
            x_int = quantize_input(self.meta, x)
            self.check_input(x_int)
            return wire.pack([self.local.encrypt(x_int)])
        return wire.pack(self.local.to_wire(self.local.encrypt(np.asarray(x, dtype=np.float64))))

    def check_input(self, x_int: np.ndarray) -> None:
        """Refuses (:class:`~fhe.errors.InputOverflowError`) an encoded TFHE input that would take
        a value outside a calibrated bit width, where the circuit wraps around and the answer would
        be wrong; with ``allow_overflow`` it is encrypted anyway and a warning is recorded."""
        clipped = self.local.overflowing(x_int)
        if clipped is None:
            self.warnings.append(
                "warning: this client artifact carries no program (made by an earlier version), "
                "so inputs outside the calibrated widths cannot be refused; compile it again"
            )
            return
        if not clipped:
            return
        first = next(iter(clipped))
        message = (
            f"this input takes {sum(clipped.values())} value(s) in {len(clipped)} node(s) outside "
            f"their calibrated bit widths, first {first!r}; encrypted, they would wrap around and "
            "the result would be wrong. Compile with --ranges proven or calibrate on data like "
            "this input (--calib)"
        )
        if not self.allow_overflow:
            raise InputOverflowError(message + ", or pass allow_overflow=True (--allow-overflow).")
        self.warnings.append("warning: " + message + "; encrypted anyway (--allow-overflow).")

    def decrypt(self, payload: bytes) -> np.ndarray:
        items = wire.unpack(payload)
        if self.scheme is Scheme.TFHE:
            return dequantize_output(self.meta, self.local.decrypt(items[0]))
        return self.local.decrypt(self.local.from_wire(items))

    def infer(self, payload: bytes) -> tuple[bytes, float]:
        """The encrypted answer and the server's compute seconds. Keys the server no longer holds
        (evicted, or found damaged and set aside: 404, 409) are uploaded again, once."""
        resp = self._post(payload)
        if resp.status_code in (404, 409):
            self.key_id = None
            resp = self._post(payload)
        _raise_for(resp)
        self.last_queue_s = float(resp.headers.get("x-queue-seconds", "0"))
        self.last_keys_s = float(resp.headers.get("x-keys-seconds", "0"))
        return resp.content, float(resp.headers.get("x-server-seconds", "nan"))

    def _post(self, payload: bytes):
        return self._server().post(
            f"/infer/{self.upload_keys()}", content=payload, headers={"content-type": wire_type()}
        )

    def predict(self, x: np.ndarray) -> Prediction:
        self.upload_keys()
        self.warnings = []
        start = time.perf_counter()
        out, server_s = self.infer(self.encrypt(x))
        logits = self.decrypt(out)
        return Prediction(
            logits, time.perf_counter() - start, server_s, self.last_queue_s, tuple(self.warnings)
        )

    def describe(self) -> dict:
        resp = self._server().get("/model")
        _raise_for(resp)
        return resp.json()


def wire_type() -> str:
    return "application/octet-stream"


def _raise_for(resp) -> None:
    if resp.status_code < 400:
        return
    try:
        detail = json.loads(resp.text).get("detail", resp.text)
    except ValueError:
        detail = resp.text
    retry = resp.headers.get("retry-after")
    raise ServiceError(
        f"server answered {resp.status_code}: {detail}",
        resp.status_code,
        float(retry) if retry and retry.replace(".", "", 1).isdigit() else None,
    )
