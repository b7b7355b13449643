"""Serving encrypted inference (FastAPI + uvicorn) and spreading batches over Ray workers.

The names below are imported on first use, so that the service process (``fhe.deploy.server``)
does not load the client's libraries (torch, the quantizers) with the package."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Client": "fhe.deploy.client",
    "Prediction": "fhe.deploy.client",
    "ServiceError": "fhe.deploy.client",
    "create_app": "fhe.deploy.server",
    "serve": "fhe.deploy.server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fhe.deploy' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
