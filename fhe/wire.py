"""The bytes that travel between client and server: no pickle, a length-prefixed list of blobs.

A payload is ``MAGIC`` then a 4-byte count then, per item, an 8-byte length and the item's bytes
(each item is a library's own serialisation: a Concrete ``fhe.Value`` or a TenSEAL CKKS vector).
Anything else (truncated, trailing bytes, absurd lengths) is a :class:`PayloadError` that says what
is wrong.
"""

from __future__ import annotations

import struct

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
