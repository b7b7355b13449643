"""The one dispatch from typed parameters to a backend: backends register themselves by parameter
type (and, for CKKS, layout) next to their definition; importing one needs only its own FHE
library."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_BACKENDS: dict[tuple[type, object], type] = {}

# where each registration lives, imported on first use so that `import fhe` works with only one FHE
# library installed: (parameter type name, layout value or None) -> module
_MODULES: dict[tuple[str, object], str] = {
    ("TfheParams", None): "fhe.tfhe.backend",
    ("CkksParams", "batch"): "fhe.ckks.backend",
    ("CkksParams", "packed"): "fhe.ckks.backend_packed",
    ("CkksParams", ("packed", "openfhe")): "fhe.ckks.openfhe.backend",
}


def _key(params_type: type, layout, engine=None) -> tuple[type, object]:
    """A CKKS engine other than the default one (TenSEAL) is part of the key."""
    layout = getattr(layout, "value", layout)
    engine = getattr(engine, "value", engine)
    return params_type, layout if engine in (None, "tenseal") else (layout, engine)


def register_backend(params_type: type, layout=None, engine=None) -> Callable[[type], type]:
    """Class decorator: the backend for ``params_type`` (in ``layout`` and on ``engine``, where the
    scheme has several)."""

    def wrap(cls: type) -> type:
        _BACKENDS[_key(params_type, layout, engine)] = cls
        return cls

    return wrap


def backend_for(params) -> Any:
    """The backend class that compiles ``params`` (a ``TfheParams`` or ``CkksParams``; each class
    has its own ``compile`` signature, hence ``Any``)."""
    import importlib

    key = _key(type(params), getattr(params, "layout", None), getattr(params, "engine", None))
    if key not in _BACKENDS:
        module = _MODULES.get((type(params).__name__, key[1]))
        if module is not None:
            importlib.import_module(module)
    try:
        return _BACKENDS[key]
    except KeyError:
        raise ValueError(
            f"no backend registered for {type(params).__name__}"
            + (f" in the {key[1]} layout" if key[1] else "")
        ) from None
