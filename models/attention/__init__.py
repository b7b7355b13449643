"""The attention zoo. Importing this package registers every variant: each module here (imported
automatically) registers its ``nn.Module`` under its ``AttentionKind``."""

from models.attention.registry import build_attention, register_attention, registered_kinds
from models.registry import import_modules

import_modules(__name__, __path__)

__all__ = ["build_attention", "register_attention", "registered_kinds"]
