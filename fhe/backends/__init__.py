"""Backends register themselves by parameter type; importing one needs only its own FHE library."""

from __future__ import annotations

from collections.abc import Callable

_BACKENDS: dict[type, type] = {}


def register_backend(params_type: type) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        _BACKENDS[params_type] = cls
        return cls

    return wrap


def backend_for(params) -> type:
    if type(params) not in _BACKENDS:
        # import lazily so that `import fhe` works with only one FHE library installed
        from fhe.schemes import CkksParams, TfheParams

        if isinstance(params, TfheParams):
            import fhe.backends.tfhe  # noqa: F401
        elif isinstance(params, CkksParams):
            import fhe.backends.ckks  # noqa: F401
    try:
        return _BACKENDS[type(params)]
    except KeyError:
        raise ValueError(f"no backend registered for {type(params).__name__}") from None
