"""One registry shape for everything keyed by attention kind: the attention modules
(models/attention), their integer lowerings (quant/mixers) and their polynomial lowerings
(fhe/ckks/mixers). The registry stores, refuses a second registration of a kind, answers a missing
kind with the one error shape of every gap ("no lowering registered for <kind> under <where>",
:meth:`KindRegistry.require`, each owner naming its own error class and fix), and imports a
package's modules so their decorators run."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Generic, TypeVar

from models.config import AttentionKind

T = TypeVar("T")


class KindRegistry(Generic[T]):
    """Entries keyed by :class:`AttentionKind` (its value, a string, is accepted too)."""

    def __init__(self, what: str) -> None:
        self.what = what  # e.g. "attention module", for the double-registration error
        self.entries: dict[AttentionKind, T] = {}

    def register(self, *kinds: AttentionKind) -> Callable[[T], T]:
        def decorator(entry: T) -> T:
            for kind in map(AttentionKind, kinds):
                if kind in self.entries:
                    raise ValueError(f"{self.what} for {kind.value!r} registered twice")
                self.entries[kind] = entry
            return entry

        return decorator

    def get(self, kind: AttentionKind | str) -> T | None:
        return self.entries.get(AttentionKind(kind))

    def require(
        self, kind: AttentionKind | str, error: type[Exception], where: str, fix: str = ""
    ) -> T:
        """The entry for ``kind``, else ``error("no lowering registered for <kind> under <where>[:
        fix]")``."""
        key = AttentionKind(kind)
        entry = self.entries.get(key)
        if entry is None:
            raise error(
                f"no lowering registered for {key.value} under {where}"
                + (f": {fix}" if fix else "")
            )
        return entry

    def kinds(self) -> list[AttentionKind]:
        return list(self.entries)


def import_modules(package: str, path) -> None:
    """Imports every module of ``package`` (its ``__path__``), so each registers what it defines."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")
