"""Polynomial (CKKS) lowerings of the token mixers, one module per attention kind, registered by kind.

Each module registers, for the :class:`~models.config.AttentionKind` values it handles, a function
``(program, arith, tag, key, x) -> Affine``: the mixer on the residual stream's values, up to and
including its output projection (kept lazy). :class:`fhe.ckks.program.PolyProgram` looks the kind up
here; a kind without a lowering is refused before calibration with :class:`NoPolyLoweringError`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from models.config import AttentionKind

PolyMixer = Callable  # (PolyProgram, Arith, str, str, Affine) -> Affine
_LOWERINGS: dict[AttentionKind, PolyMixer] = {}

# Why a kind has no polynomial lowering yet, and what to use instead (shown in the error).
_MISSING = {
    AttentionKind.DOT_PRODUCT: "softmax's exp and row max (use --attention power-softmax, or --scheme tfhe)",
    AttentionKind.INHIBITOR: "the Inhibitor's |x| and ReLU (table lookups: use --scheme tfhe)",
    AttentionKind.SIGNED_INHIBITOR: "the signed Inhibitor's |x| and ReLU (table lookups: use --scheme tfhe)",
    AttentionKind.DCT: "DCT-Former's softmax (use --scheme tfhe, or train with --attention power-softmax)",
}


class NoPolyLoweringError(ValueError):
    """No polynomial lowering is registered for this attention kind."""


def register_poly_mixer(*kinds: AttentionKind) -> Callable[[PolyMixer], PolyMixer]:
    def decorator(fn: PolyMixer) -> PolyMixer:
        for kind in kinds:
            if kind in _LOWERINGS:
                raise ValueError(f"a polynomial lowering for {kind.value} is already registered")
            _LOWERINGS[kind] = fn
        return fn

    return decorator


def poly_mixer(kind: AttentionKind) -> PolyMixer:
    kind = AttentionKind(kind)
    if kind not in _LOWERINGS:
        why = f": {_MISSING[kind]}" if kind in _MISSING else ""
        raise NoPolyLoweringError(f"no lowering registered for {kind.value} under CKKS{why}")
    return _LOWERINGS[kind]


def registered_poly_mixers() -> list[AttentionKind]:
    return list(_LOWERINGS)


for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
