"""Model files: safetensors + JSON, no code runs when loading one, clear errors for bad files."""

import pytest
import torch

from models import Transformer, TransformerConfig
from models.training import load_checkpoint, save_checkpoint


class _Payload:
    """Unpickling this would create the marker file (a stand-in for an attacker's shell command)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _model():
    return Transformer(
        TransformerConfig(seq_len=4, in_features=5, n_outputs=3, norm="batchnorm", d_model=8)
    )


def test_a_saved_model_reloads_to_the_same_outputs_without_pickle(tmp_path):
    model = _model().eval()
    path = tmp_path / "m.pt"
    save_checkpoint(
        path, model, None, quant={"n_bits": 6}, history=[{"epoch": 1, "train_loss": 0.5}]
    )
    assert path.read_bytes()[:2] != b"PK"  # not a torch.save (zip/pickle) archive
    ckpt = load_checkpoint(path)
    x = torch.randn(3, 4, 5)
    torch.testing.assert_close(ckpt.model(x), model(x))
    assert ckpt.extra["quant"] == {"n_bits": 6} and ckpt.task is None
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary file was renamed into place


def test_a_pickle_payload_in_a_model_file_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"config": {}, "state_dict": {}, "x": _Payload(marker)}, path)
    with pytest.raises(ValueError, match="evil.pt"):
        load_checkpoint(path)
    assert not marker.exists()


def test_legacy_torch_save_files_load_with_tensors_only(tmp_path):
    model = _model().eval()
    path = tmp_path / "old.pt"
    torch.save(
        {
            "version": 1,
            "config": model.config.to_dict(),
            "state_dict": model.state_dict(),
            "task": None,
            "extra": {},
        },
        path,
    )
    x = torch.randn(2, 4, 5)
    torch.testing.assert_close(load_checkpoint(path).model(x), model(x))


@pytest.mark.parametrize(
    "content", [b"", b"not a model", b"\x10\x00\x00\x00\x00\x00\x00\x00{bad json}     "]
)
def test_corrupt_model_files_are_named_in_the_error(tmp_path, content):
    path = tmp_path / "broken.pt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="broken.pt is not a readable fhe-attention model file"):
        load_checkpoint(path)
