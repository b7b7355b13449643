"""Artifacts carry a manifest of SHA-256 digests; a missing, corrupt or foreign file is named on
load."""

import json

import pytest

from circuits.attention import CircuitSpec, build
from fhe.artifacts import MANIFEST, ArtifactError, atomic_save, verify
from fhe.schemes import TfheParams
from fhe.tfhe.backend import TfheBackend, TfheClient, TfheServer
from models.config import AttentionKind
from quant.config import QuantConfig


@pytest.fixture(scope="module")
def backend():
    built = build(CircuitSpec(AttentionKind.INHIBITOR, 2, d=2, n_bits=3))
    return TfheBackend.compile(
        built.graph, built.calib_ints, TfheParams(quant=QuantConfig(n_bits=3), inputset_size=16)
    )


@pytest.fixture
def artifact(backend, tmp_path):
    return atomic_save(tmp_path / "art", backend.save, "tfhe")


def test_a_fresh_artifact_verifies(artifact):
    doc = verify(artifact["server"], "server")
    assert doc["scheme"] == "tfhe" and "server.zip" in doc["files"]
    assert not [
        p for p in artifact["server"].parent.iterdir() if p.name.startswith(".")
    ]  # no temporary left


def test_a_flipped_byte_is_named(artifact):
    f = artifact["server"] / "server.zip"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match="server.zip is corrupt"):
        TfheServer(artifact["server"])


def test_a_missing_or_extra_file_is_named(artifact):
    (artifact["client"] / "client.zip").unlink()
    with pytest.raises(ArtifactError, match="client.zip is missing"):
        TfheClient(artifact["client"])
    (artifact["server"] / "notes.txt").write_text("hello")
    with pytest.raises(ArtifactError, match="notes.txt"):
        verify(artifact["server"], "server")


def test_wrong_role_version_or_no_manifest(artifact, tmp_path):
    with pytest.raises(ArtifactError, match="is a client artifact, not a server"):
        verify(artifact["client"], "server")
    m = artifact["server"] / MANIFEST
    doc = json.loads(m.read_text())
    m.write_text(json.dumps({**doc, "format_version": 99}))
    with pytest.raises(ArtifactError, match="format 99"):
        verify(artifact["server"], "server")
    m.unlink()
    with pytest.raises(ArtifactError, match="no manifest.json"):
        verify(artifact["server"], "server")
    with pytest.raises(ArtifactError, match="no server artifact"):
        verify(tmp_path / "nowhere", "server")


def test_an_interrupted_save_leaves_the_previous_artifact(backend, artifact):
    before = (artifact["server"] / MANIFEST).read_text()

    def crash(tmp):
        backend.save(tmp)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_save(artifact["server"].parent, crash, "tfhe")
    assert (artifact["server"] / MANIFEST).read_text() == before
    verify(artifact["server"], "server")
    assert not [p for p in artifact["server"].parent.iterdir() if p.name.startswith(".")]
