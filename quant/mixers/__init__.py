"""Integer lowerings of the token mixers, one module per attention kind, registered by kind.

Each module registers, for the :class:`~models.config.AttentionKind` values it handles, a function
``(low, mixer, h, name, cfg) -> (value, output projection)``: the mixer's integer program up to its
output projection, which the residual applies (:func:`quant.export.residual`). The export looks the
kind up here and nothing else in ``quant`` names a kind. Adding a kind: a module in this package
(imported automatically) next to the model's own file in ``models/attention/``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from models.config import AttentionKind

MixerLowering = Callable  # (Lowering, nn.Module, QValue, str, TransformerConfig) -> (QValue, nn.Linear)
_LOWERINGS: dict[AttentionKind, MixerLowering] = {}


class NoLoweringError(ValueError):
    """No lowering is registered for this attention kind under this backend."""


def register_mixer(*kinds: AttentionKind) -> Callable[[MixerLowering], MixerLowering]:
    def decorator(fn: MixerLowering) -> MixerLowering:
        for kind in kinds:
            if kind in _LOWERINGS:
                raise ValueError(f"an integer lowering for {kind.value} is already registered")
            _LOWERINGS[kind] = fn
        return fn

    return decorator


def mixer_lowering(kind: AttentionKind) -> MixerLowering:
    try:
        return _LOWERINGS[AttentionKind(kind)]
    except KeyError:
        raise NoLoweringError(f"no lowering registered for {AttentionKind(kind).value} under the integer program "
                              "(TFHE)") from None


def registered_mixers() -> list[AttentionKind]:
    return list(_LOWERINGS)


for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
