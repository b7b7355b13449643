"""Artifact integrity: a manifest per artifact folder, checked before anything is deserialised, and
writes that never leave a half-written artifact.

``manifest.json`` holds the format version, the toolkit version, the scheme and a SHA-256 of every
file. :func:`verify` names the missing, extra or corrupt file; :func:`atomic_save` writes a whole
artifact into a temporary sibling folder and renames it into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from fhe.errors import FheError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class ArtifactError(FheError):
    """An artifact folder is missing, incomplete, corrupt or of another format version."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def toolkit_version() -> str:
    try:
        return metadata.version("fhe-attention")
    except metadata.PackageNotFoundError:
        return "unknown"


def write_manifest(directory: Path, scheme: str, role: str) -> Path:
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != MANIFEST)
    doc = {
        "format_version": FORMAT_VERSION,
        "toolkit_version": toolkit_version(),
        "scheme": scheme,
        "role": role,
        "files": {p.name: {"sha256": _sha256(p), "bytes": p.stat().st_size} for p in files},
    }
    path = directory / MANIFEST
    path.write_text(json.dumps(doc, indent=2))
    return path


def verify(directory: Path, role: str) -> dict:
    """Checks ``directory`` against its manifest; returns the manifest. Raises
    :class:`ArtifactError`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ArtifactError(
            f"no {role} artifact at {directory}: write one with `fhe compile MODEL --out DIR`"
        )
    path = directory / MANIFEST
    if not path.exists():
        raise ArtifactError(
            f"{directory} has no {MANIFEST}: not an artifact written by this toolkit (or written "
            "by an older version); compile it again with `fhe compile MODEL --out DIR`"
        )
    try:
        doc = json.loads(path.read_text())
        files = doc["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"{path} is corrupt ({exc})") from exc
    if doc.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{directory} has artifact format {doc.get('format_version')}, this toolkit reads "
            f"{FORMAT_VERSION}: compile it again"
        )
    if doc.get("role") != role:
        raise ArtifactError(f"{directory} is a {doc.get('role')} artifact, not a {role} artifact")
    for name, entry in files.items():
        f = directory / name
        if not f.is_file():
            raise ArtifactError(f"{role} artifact {directory} is incomplete: {name} is missing")
        if f.stat().st_size != entry["bytes"] or _sha256(f) != entry["sha256"]:
            raise ArtifactError(
                f"{role} artifact file {f} is corrupt (its SHA-256 differs from {MANIFEST})"
            )
    extra = {p.name for p in directory.iterdir() if p.is_file()} - set(files) - {MANIFEST}
    if extra:
        raise ArtifactError(f"{directory} holds files its manifest does not list: {sorted(extra)}")
    return doc


def atomic_save(directory: Path, write: Callable[[Path], dict], scheme: str) -> dict[str, Path]:
    """Runs ``write(tmp)`` (which fills ``tmp/server`` and maybe ``tmp/client``), writes their
    manifests, then moves them into ``directory`` (replacing older ones only once the new ones are
    complete)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".writing-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        written = write(tmp)
        out = {}
        for role, path in written.items():
            write_manifest(Path(path), scheme, role)
            final = directory / role
            old = directory / f".old-{role}-{os.getpid()}"
            if final.exists():
                final.rename(old)
            Path(path).rename(final)
            shutil.rmtree(old, ignore_errors=True)
            out[role] = final
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
