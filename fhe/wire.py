"""The bytes that travel between client and server: no pickle, a length-prefixed list of blobs.

A payload is ``MAGIC`` then a 4-byte count then, per item, an 8-byte length and the item's bytes
(each item is a library's own serialisation: a Concrete ``fhe.Value`` or a TenSEAL CKKS vector).
Anything else (truncated, trailing bytes, absurd lengths) is a :class:`PayloadError` that says what
is wrong.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from fhe.errors import FheError

MAGIC = b"FHEA1"
MAX_ITEMS = 1 << 20


class PayloadError(FheError):
    """A request body that is not a well-formed payload (the server answers 400)."""


def pack(items: list[bytes]) -> bytes:
    parts = [MAGIC, struct.pack(">I", len(items))]
    for item in items:
        parts += [struct.pack(">Q", len(item)), item]
    return b"".join(parts)


def unpack(payload: bytes) -> list[bytes]:
    view = memoryview(payload)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise PayloadError(
            "not an fhe-attention payload (bad magic bytes): send what fhe.deploy.Client encrypts"
        )
    pos = len(MAGIC)
    if len(view) < pos + 4:
        raise PayloadError("truncated payload: no item count")
    (count,) = struct.unpack_from(">I", view, pos)
    pos += 4
    if count > MAX_ITEMS:
        raise PayloadError(f"payload announces {count} items (limit {MAX_ITEMS})")
    items = []
    for i in range(count):
        if len(view) < pos + 8:
            raise PayloadError(f"truncated payload: item {i} of {count} has no length")
        (size,) = struct.unpack_from(">Q", view, pos)
        pos += 8
        if len(view) < pos + size:
            raise PayloadError(
                f"truncated payload: item {i} of {count} announces {size} bytes, {len(view) - pos} "
                "remain"
            )
        items.append(bytes(view[pos : pos + size]))
        pos += size
    if pos != len(view):
        raise PayloadError(f"{len(view) - pos} unexpected bytes after the last item")
    return items


# -------------------------------------------------------------------- payloads too large for memory
CHUNK = 1 << 20


def packed_size(paths: list[Path]) -> int:
    """The length of :func:`pack_files`' payload."""
    return len(MAGIC) + 4 + sum(8 + Path(p).stat().st_size for p in paths)


def pack_files(paths: list[Path]) -> Iterator[bytes]:
    """The payload of :func:`pack` over the files' bytes, in chunks, never whole in memory (an
    OpenFHE key set is gigabytes)."""
    yield MAGIC + struct.pack(">I", len(paths))
    for path in paths:
        yield struct.pack(">Q", Path(path).stat().st_size)
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk


def spans(path: Path) -> list[tuple[int, int]]:
    """The ``(offset, size)`` of each item of the payload in the file at ``path``, read from its
    headers only; refused as :func:`unpack` refuses."""
    total = Path(path).stat().st_size
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise PayloadError("not an fhe-attention payload (bad magic bytes)")
        head = f.read(4)
        if len(head) < 4:
            raise PayloadError("truncated payload: no item count")
        (count,) = struct.unpack(">I", head)
        if count > MAX_ITEMS:
            raise PayloadError(f"payload announces {count} items (limit {MAX_ITEMS})")
        out, pos = [], len(MAGIC) + 4
        for i in range(count):
            f.seek(pos)
            raw = f.read(8)
            if len(raw) < 8:
                raise PayloadError(f"truncated payload: item {i} of {count} has no length")
            (size,) = struct.unpack(">Q", raw)
            pos += 8
            if pos + size > total:
                raise PayloadError(
                    f"truncated payload: item {i} of {count} announces {size} bytes, "
                    f"{total - pos} remain"
                )
            out.append((pos, size))
            pos += size
    if pos != total:
        raise PayloadError(f"{total - pos} unexpected bytes after the last item")
    return out
