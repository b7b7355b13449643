"""Integer lowerings of the token mixers, one module per attention kind, registered by kind.

Each module registers, for the :class:`~models.config.AttentionKind` values it handles, a function
``(low, mixer, h, name, cfg) -> (value, output projection)``: the mixer's integer program up to its
output projection, which the residual applies (:func:`quant.export.residual`). The export looks the
kind up here and nothing else in ``quant`` names a kind. Adding a kind: a module in this package
(imported automatically) next to the model's own file in ``models/attention/``.
"""

from __future__ import annotations

from collections.abc import Callable

from models.config import AttentionKind
from models.registry import KindRegistry, import_modules

MixerLowering = (
    Callable  # (Lowering, nn.Module, QValue, str, TransformerConfig) -> (QValue, nn.Linear)
)
LOWERINGS: KindRegistry[MixerLowering] = KindRegistry("integer lowering")
register_mixer = LOWERINGS.register


class NoLoweringError(ValueError):
    """No lowering is registered for this attention kind under this backend."""


def mixer_lowering(kind: AttentionKind) -> MixerLowering:
    return LOWERINGS.require(kind, NoLoweringError, "the integer program (TFHE)")


def registered_mixers() -> list[AttentionKind]:
    return LOWERINGS.kinds()


import_modules(__name__, __path__)
