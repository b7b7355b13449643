"""Where the service keeps its clients' evaluation keys: verified, bounded, never half-written.

Layout under the store's root (``fhe serve --keys-dir``)::

    <tenant>/<key_id>.bin    one key set, named by the SHA-256 of its bytes
    .spool/                  request bodies while they arrive, and answers while they leave
    .quarantine/<key_id>     ids whose execution crashed a worker: refused for good
    .damaged/                key files that no longer hashed to their id, kept for inspection

- **Verified**: a key file is hashed against its id whenever a worker loads it
  (:mod:`fhe.deploy.worker`); a file that does not match is moved to ``.damaged/`` and the client is
  told to upload again. A re-upload always replaces the stored file, so it repairs it.
- **Never half-written**: bodies stream into ``.spool/`` and are renamed into place only once whole
  and checked; :meth:`KeyStore.sweep` empties ``.spool/`` at start, so an upload killed mid-way
  (``kill -9``) leaves nothing behind.
- **Bounded**, least recently used first: a tenant whose key sets would pass its quota loses its own
  least recently used ones; a store that would pass ``max_total_bytes`` loses the least recently
  used of anyone's. A key set larger than the quota by itself is refused (:class:`OverQuota`).
  "Used" is the file's modification time, touched on every request that names it.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

KEY_ID = re.compile(r"^[0-9a-f]{64}$")
TENANT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class OverQuota(Exception):
    """A key set larger than the tenant's whole quota."""


@dataclass(frozen=True)
class Stored:
    tenant: str
    key_id: str
    path: Path
    size: int
    used: float


class KeyStore:
    def __init__(self, root: str | Path, max_total_bytes: int | None = None) -> None:
        self.root = Path(root)
        self.max_total_bytes = max_total_bytes
        self.spool = self.root / ".spool"
        self.quarantined = self.root / ".quarantine"
        self.damaged = self.root / ".damaged"
        for folder in (self.root, self.spool, self.quarantined, self.damaged):
            folder.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------------------- start
    def sweep(self, legacy_tenant: str = "anonymous") -> dict[str, int]:
        """Removes what interrupted uploads and requests left; moves key files of the flat layout
        of earlier versions (``<key_id>.bin`` at the root) to ``legacy_tenant``. Returns counts."""
        removed = 0
        leftovers = [*self.spool.iterdir(), *self.root.glob("*/*.tmp"), *self.root.glob("*.tmp")]
        for leftover in leftovers:
            leftover.unlink(missing_ok=True)
            removed += 1
        moved = 0
        for flat in self.root.glob("*.bin"):
            if KEY_ID.match(flat.stem):
                target = self.root / legacy_tenant / flat.name
                target.parent.mkdir(exist_ok=True)
                flat.replace(target)
                moved += 1
        return {"swept": removed, "migrated": moved}

    # ----------------------------------------------------------------------------- lookups
    def path(self, tenant: str, key_id: str) -> Path:
        return self.root / tenant / f"{key_id}.bin"

    def has(self, tenant: str, key_id: str) -> bool:
        return bool(KEY_ID.match(key_id)) and self.path(tenant, key_id).is_file()

    def is_quarantined(self, key_id: str) -> bool:
        return bool(KEY_ID.match(key_id)) and (self.quarantined / key_id).exists()

    def touch(self, tenant: str, key_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path(tenant, key_id))

    def entries(self, tenant: str | None = None) -> list[Stored]:
        """Every stored key set (of ``tenant``, or of all), least recently used first."""
        folders = (
            [self.root / tenant]
            if tenant
            else [p for p in self.root.iterdir() if p.is_dir() and TENANT.match(p.name)]
        )
        out = []
        for folder in folders:
            for f in folder.glob("*.bin"):
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                out.append(Stored(folder.name, f.stem, f, st.st_size, st.st_mtime))
        return sorted(out, key=lambda s: s.used)

    def used_bytes(self, tenant: str | None = None) -> int:
        return sum(s.size for s in self.entries(tenant))

    # ------------------------------------------------------------------------------ writes
    def spool_file(self, suffix: str) -> Path:
        """A fresh path in the spool (never shared by two requests)."""
        return self.spool / f"{uuid.uuid4().hex}.{suffix}"

    def commit(self, tenant: str, key_id: str, spooled: Path, quota: int | None) -> list[Stored]:
        """Moves a whole, checked upload into place (replacing, so repairing, any stored file of
        that id) after evicting what the quotas require; returns the evicted key sets."""
        size = spooled.stat().st_size
        if quota is not None and size > quota:
            spooled.unlink(missing_ok=True)
            raise OverQuota(f"a key set of {size} bytes is over this token's quota of {quota} B")
        target = self.path(tenant, key_id)
        evicted = []
        if quota is not None:
            evicted += self._evict(self.entries(tenant), quota - size, keep=target)
        if self.max_total_bytes is not None:
            evicted += self._evict(self.entries(), self.max_total_bytes - size, keep=target)
        target.parent.mkdir(exist_ok=True)
        spooled.replace(target)
        return evicted

    @staticmethod
    def _evict(entries: list[Stored], room: int, keep: Path) -> list[Stored]:
        others = [e for e in entries if e.path != keep]
        total, evicted = sum(e.size for e in others), []
        for e in others:
            if total <= room:
                break
            e.path.unlink(missing_ok=True)
            total -= e.size
            evicted.append(e)
        return evicted

    def set_aside(self, tenant: str, key_id: str) -> Path | None:
        """Moves a damaged key file out of the store (kept for inspection); None if it is gone."""
        source = self.path(tenant, key_id)
        target = self.damaged / f"{tenant}-{key_id}-{int(time.time())}.bin"
        try:
            source.replace(target)
        except FileNotFoundError:
            return None
        return target

    def quarantine(self, tenant: str, key_id: str, reason: str) -> None:
        """Refuses ``key_id`` from now on, for every tenant and across restarts; deletes the
        bytes."""
        (self.quarantined / key_id).write_text(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {reason}\n")
        self.path(tenant, key_id).unlink(missing_ok=True)
