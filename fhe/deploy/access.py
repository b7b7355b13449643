"""Who may use the service, how much of it: API tokens, per-token key ownership, quotas, rates.

A tokens file (JSON, written by ``fhe serve-token``; the server never stores a token itself, only
its SHA-256)::

    {"tokens": [{"name": "alice", "token_sha256": "<hex>", "max_store_mb": 4096,
                 "requests_per_minute": 60}]}

Clients send ``Authorization: Bearer <token>``. Each token is a tenant: it sees and uses only the
keys it uploaded (``GET /keys/{id}`` of another tenant's keys is a 404, exactly like keys that do
not exist, so ids cannot be probed), its stored key sets are bounded by ``max_store_mb`` (least
recently used evicted first, :mod:`fhe.deploy.keystore`), and its requests by a token bucket of
``requests_per_minute`` (429 with ``Retry-After``). Without a tokens file the service has one
anonymous tenant and is meant for loopback only: ``fhe serve`` refuses another host without
``--tokens`` unless ``--allow-anonymous`` is given.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fhe.deploy.keystore import TENANT
from fhe.errors import BadOptionError

ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Tenant:
    name: str
    token_sha256: str
    max_store_mb: int | None = None  # None: no quota of its own (the store's bound still holds)
    requests_per_minute: float | None = None  # None: no rate limit

    @property
    def quota_bytes(self) -> int | None:
        return None if self.max_store_mb is None else self.max_store_mb << 20


class Unauthorized(Exception):
    pass


class RateLimited(Exception):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"rate limit reached; retry in {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def read_tokens(path: str | Path) -> list[Tenant]:
    """The tenants of a tokens file; :class:`BadOptionError` naming what is wrong in it."""
    path = Path(path)
    try:
        entries = json.loads(path.read_text())["tokens"]
        tenants = [Tenant(**e) for e in entries]
    except FileNotFoundError as exc:
        raise BadOptionError(f"no tokens file at {path}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise BadOptionError(
            f"{path} is not a tokens file ({{'tokens': [{{'name', 'token_sha256', ...}}]}}): {exc}"
        ) from exc
    _check_tenants(path, tenants)
    return tenants


def _check_tenants(path: Path, tenants: list[Tenant]) -> None:
    names = [t.name for t in tenants]
    for t in tenants:
        if not TENANT.match(t.name) or t.name == ANONYMOUS:
            raise BadOptionError(f"{path}: tenant name {t.name!r} must match {TENANT.pattern}")
        if len(t.token_sha256) != 64:
            raise BadOptionError(f"{path}: {t.name}'s token_sha256 is not a SHA-256 hex digest")
    if len(set(names)) != len(names):
        raise BadOptionError(f"{path}: tenant names repeat")


def add_token(
    path: str | Path,
    name: str,
    max_store_mb: int | None = None,
    requests_per_minute: float | None = None,
) -> str:
    """Appends a tenant with a fresh random token to the tokens file (created if missing) and
    returns the token: the only time it is shown."""
    path = Path(path)
    tenants = read_tokens(path) if path.exists() else []
    if any(t.name == name for t in tenants):
        raise BadOptionError(f"{path} already has a tenant {name!r}")
    token = secrets.token_urlsafe(32)
    tenants.append(Tenant(name, token_hash(token), max_store_mb, requests_per_minute))
    _check_tenants(path, tenants)
    path.write_text(json.dumps({"tokens": [asdict(t) for t in tenants]}, indent=2) + "\n")
    path.chmod(0o600)
    return token


class _Bucket:
    def __init__(self, per_minute: float) -> None:
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, per_minute / 6.0)  # a burst of ten seconds' worth
        self.level = self.capacity
        self.at = time.monotonic()

    def take(self) -> float:
        """0 if a request may go now, else the seconds until one may."""
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level >= 1.0:
            self.level -= 1.0
            return 0.0
        return (1.0 - self.level) / self.rate


class Access:
    """Authenticates requests and meters them; ``tenants`` empty means one anonymous tenant."""

    def __init__(self, tenants: list[Tenant] | None = None, anonymous_quota_mb: int | None = None):
        self.by_hash = {t.token_sha256: t for t in tenants or []}
        self.anonymous = None if self.by_hash else Tenant(ANONYMOUS, "", anonymous_quota_mb)
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    @property
    def open(self) -> bool:
        return self.anonymous is not None

    def authenticate(self, authorization: str | None) -> Tenant:
        if self.anonymous is not None:
            return self.anonymous
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("send 'Authorization: Bearer <token>' (fhe client --token)")
        digest = token_hash(token.strip())
        for known, tenant in self.by_hash.items():
            if hmac.compare_digest(known, digest):
                return tenant
        raise Unauthorized("unknown token")

    def meter(self, tenant: Tenant) -> None:
        """Raises :class:`RateLimited` when ``tenant`` is over its rate."""
        if tenant.requests_per_minute is None:
            return
        with self._lock:
            bucket = self._buckets.setdefault(tenant.name, _Bucket(tenant.requests_per_minute))
            wait = bucket.take()
        if wait:
            raise RateLimited(wait)
