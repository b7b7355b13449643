"""Polynomial (CKKS) lowerings of the token mixers, one module per attention kind, registered by
kind.

Two registries, one per layout. Each module registers, for the :class:`~models.config.AttentionKind`
values it handles,

- batch layout (samples in slots): ``(program, arith, tag, key, x) -> Affine``, the mixer on the
  residual stream's values up to and including its output projection (kept lazy), looked up by
  :class:`fhe.ckks.program.PolyProgram`;
- packed layout (one sample in the slots): ``(packed, arith, rotations, tag, key, x) -> Affine``,
  the same mixer on packed values, looked up by :class:`fhe.ckks.packed.PackedProgram`.

A kind without a lowering is refused before calibration (batch) or planning (packed) with
:class:`NoPolyLoweringError`, the one error for every gap.
"""

from __future__ import annotations

from collections.abc import Callable

from models.config import AttentionKind
from models.registry import KindRegistry, import_modules

PolyMixer = Callable  # (PolyProgram, Arith, str, str, Affine) -> Affine
LOWERINGS: KindRegistry[PolyMixer] = KindRegistry("polynomial lowering")
register_poly_mixer = LOWERINGS.register

PackedMixer = Callable  # (PackedProgram, Arith, Rotations, str, str, Affine) -> Affine
PACKED_LOWERINGS: KindRegistry[PackedMixer] = KindRegistry("packed polynomial lowering")
register_packed_mixer = PACKED_LOWERINGS.register

# What to use instead when a kind has no polynomial lowering (shown in the error).
_ALTERNATIVE = "use --scheme tfhe, or train with --attention power-softmax"


class NoPolyLoweringError(ValueError):
    """No polynomial lowering is registered for this attention kind."""


def poly_mixer(kind: AttentionKind) -> PolyMixer:
    return LOWERINGS.require(kind, NoPolyLoweringError, "CKKS", _ALTERNATIVE)


def registered_poly_mixers() -> list[AttentionKind]:
    return LOWERINGS.kinds()


def packed_mixer(kind: AttentionKind) -> PackedMixer:
    packed = ", ".join(k.value for k in PACKED_LOWERINGS.kinds())
    return PACKED_LOWERINGS.require(
        kind,
        NoPolyLoweringError,
        f"CKKS in the packed layout (packed: {packed})",
        "use --layout batch",
    )


def registered_packed_mixers() -> list[AttentionKind]:
    return PACKED_LOWERINGS.kinds()


import_modules(__name__, __path__)
