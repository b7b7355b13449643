"""Polynomial (CKKS) lowerings of the token mixers, one module per attention kind, registered by kind.

Each module registers, for the :class:`~models.config.AttentionKind` values it handles, a function
``(program, arith, tag, key, x) -> Affine``: the mixer on the residual stream's values, up to and
including its output projection (kept lazy). :class:`fhe.ckks.program.PolyProgram` looks the kind up
here; a kind without a lowering is refused before calibration with :class:`NoPolyLoweringError`.
"""

from __future__ import annotations

from collections.abc import Callable

from models.config import AttentionKind
from models.registry import KindRegistry, import_modules

PolyMixer = Callable  # (PolyProgram, Arith, str, str, Affine) -> Affine
LOWERINGS: KindRegistry[PolyMixer] = KindRegistry("polynomial lowering")
register_poly_mixer = LOWERINGS.register

# What to use instead when a kind has no polynomial lowering (shown in the error).
_ALTERNATIVE = "use --scheme tfhe, or train with --attention power-softmax"


class NoPolyLoweringError(ValueError):
    """No polynomial lowering is registered for this attention kind."""


def poly_mixer(kind: AttentionKind) -> PolyMixer:
    kind = AttentionKind(kind)
    fn = LOWERINGS.get(kind)
    if fn is None:
        raise NoPolyLoweringError(f"no lowering registered for {kind.value} under CKKS: {_ALTERNATIVE}")
    return fn


def registered_poly_mixers() -> list[AttentionKind]:
    return LOWERINGS.kinds()


import_modules(__name__, __path__)
