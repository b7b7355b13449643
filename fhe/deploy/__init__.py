"""Serving encrypted inference (FastAPI + uvicorn) and spreading batches over Ray workers."""

from fhe.deploy.client import Client, Prediction, ServiceError
from fhe.deploy.server import create_app, serve

__all__ = ["Client", "Prediction", "ServiceError", "create_app", "serve"]
