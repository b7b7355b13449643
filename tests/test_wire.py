"""The service's wire format (fhe/wire.py): what is packed unpacks unchanged, and every malformed
body (any truncation, trailing bytes, a foreign body) is a PayloadError, never an exception of
another kind."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fhe.wire import PayloadError, pack, unpack

ITEMS = st.lists(st.binary(max_size=64), max_size=6)


@given(ITEMS)
def test_pack_then_unpack_is_the_identity(items):
    assert unpack(pack(items)) == items


@given(ITEMS.filter(bool))
def test_every_truncation_and_any_trailing_byte_is_refused(items):
    body = pack(items)
    for cut in range(len(body)):
        with pytest.raises(PayloadError):
            unpack(body[:cut])
    with pytest.raises(PayloadError, match="unexpected bytes"):
        unpack(body + b"\0")


def test_a_foreign_body_is_refused_by_its_magic():
    with pytest.raises(PayloadError, match="magic"):
        unpack(b'{"x": [1, 2, 3]}')


@given(ITEMS)
def test_files_pack_to_the_same_bytes_and_their_spans_locate_each_item(items):
    """pack_files (a key set too large for memory, streamed) writes what pack writes; spans reads
    each item's place back from the headers alone."""
    import tempfile
    from pathlib import Path

    from fhe.wire import pack_files, packed_size, spans

    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, item in enumerate(items):
            paths.append(Path(tmp) / f"item{i}")
            paths[-1].write_bytes(item)
        body = b"".join(pack_files(paths))
        assert body == pack(items) and packed_size(paths) == len(body)
        whole = Path(tmp) / "body"
        whole.write_bytes(body)
        assert [body[o : o + n] for o, n in spans(whole)] == items
        for cut in range(len(body) - 1, max(-1, len(body) - 40), -1):
            whole.write_bytes(body[:cut])
            with pytest.raises(PayloadError):
                spans(whole)
        whole.write_bytes(body + b"\0")
        with pytest.raises(PayloadError, match="unexpected bytes"):
            spans(whole)
