"""``fhe serve``, ``fhe serve-token`` and ``fhe client``: the service's commands (they parse, call
:mod:`fhe.deploy` and print)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import click
import numpy as np

from fhe.deploy.server import ServeConfig
from fhe.scheme import Scheme
from fhe_cli._common import config_from, library_errors, options_from


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option(
    "--keys-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where uploaded keys are stored (default: uploaded_keys/ next to the server folder).",
)
@click.option(
    "--allow-anonymous",
    is_flag=True,
    help="Serve a host other than loopback without --tokens (anyone who reaches it may use it).",
)
@options_from(ServeConfig)
@library_errors
def serve(artifact_dir, host, port, keys_dir, allow_anonymous, **options) -> None:
    """Serve encrypted inference over HTTP from ARTIFACT_DIR's server artifact (never a secret
    key)."""
    from fhe.deploy.server import serve as run_server

    config = config_from(ServeConfig, options)
    if config.tokens is None and not _loopback(host) and not allow_anonymous:
        raise click.UsageError(
            f"--host {host} is reachable from other machines: give --tokens FILE (fhe serve-token) "
            "so that only token holders can use the service, or --allow-anonymous"
        )
    run_server(artifact_dir, host, port, keys_dir, config)


@click.command(name="serve-token")
@click.argument("name")
@click.option(
    "--tokens",
    "tokens_path",
    type=click.Path(path_type=Path),
    required=True,
    help="The tokens file to add to (created if missing).",
)
@click.option(
    "--max-store-mb",
    type=click.IntRange(min=1),
    default=None,
    help="This tenant's quota of stored key sets (least recently used evicted).",
)
@click.option(
    "--requests-per-minute",
    type=click.FloatRange(min=0.01),
    default=None,
    help="This tenant's rate limit (429 with Retry-After beyond it).",
)
@library_errors
def serve_token(name, tokens_path, max_store_mb, requests_per_minute) -> None:
    """Add tenant NAME with a fresh API token to a tokens file; prints the token (shown once: the
    file keeps only its SHA-256)."""
    from fhe.deploy.access import add_token

    click.echo(add_token(tokens_path, name, max_store_mb, requests_per_minute))


@click.command(name="client")
@click.argument("client_dir", type=click.Path(path_type=Path))
@click.option("--url", default="http://127.0.0.1:8000", show_default=True)
@click.option("--token", default=None, help="API token (default: $FHE_TOKEN).")
@click.option("--sample", type=int, default=None, help="Index into the task's test split.")
@click.option(
    "--input",
    "input_path",
    type=click.Path(path_type=Path),
    default=None,
    help="A .npy file with one input (the model's input shape, floats).",
)
@click.option("--text", default=None, help="Text models: one text (the client embeds it).")
@click.option(
    "--allow-overflow",
    is_flag=True,
    help="TFHE: encrypt an input outside the calibrated widths anyway (the answer can be wrong).",
)
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@library_errors
def client_cmd(client_dir, url, token, sample, input_path, text, allow_overflow, data_dir) -> None:
    """Encrypt an input with CLIENT_DIR's keys, have the service at --url run it, decrypt the
    answer."""
    import httpx

    from fhe import api
    from fhe.deploy.client import Client

    client = Client(
        client_dir, url, token=token or os.environ.get("FHE_TOKEN"), allow_overflow=allow_overflow
    )
    x, label = api.client_input(client, sample, text, input_path, data_dir)
    if client.scheme is Scheme.CKKS:
        x = x[None]
    try:
        result = client.predict(x)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc} (is `fhe serve` running?)") from exc
    logits = np.asarray(result.logits).reshape(-1)
    click.echo(
        f"prediction {api.named(int(logits.argmax()), client.labels)}"
        + ("" if label is None else f" (label {api.named(label, client.labels)})")
        + f"; round trip {result.round_trip_s:.2f} s, server {result.server_s:.2f} s; "
        f"logits {np.round(logits, 3).tolist()}"
    )
    note = client.text_note(text)
    for warning in result.warnings + ((note,) if note else ()):
        click.echo(warning, err=True)
