"""What every API module shares: the message callback type and its silent default."""

from __future__ import annotations

from collections.abc import Callable

Echo = Callable[[str], None]


def silent(_: str) -> None:
    pass
