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
