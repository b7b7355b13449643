"""The attention zoo. Importing this package registers every variant."""

from models.attention import activator, dct_former, dot_product, inhibitor, power_softmax  # noqa: F401
from models.attention.registry import build_attention, register_attention, registered_kinds

__all__ = ["build_attention", "register_attention", "registered_kinds"]
