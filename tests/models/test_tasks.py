"""Task loaders: synthetic targets, real data files, and clear errors for missing files."""

import gzip
import struct

import numpy as np
import pytest
import torch

from models.tasks import DataFileError, default_data_dir, load_task
from models.tasks.adding import make_adding
from models.tasks.imdb import build_vocab, encode, tokenize
from models.tasks.mnist import read_idx


def test_adding_targets_are_the_sum_of_marked_values():
    x, y = make_adding(50, 20, torch.Generator().manual_seed(1))
    assert x.shape == (50, 20, 2)
    assert torch.all(x[..., 1].sum(1) == 2)
    for n in range(50):
        marked = [x[n, t, 0] for t in range(20) if x[n, t, 1] == 1]
        assert y[n].item() == pytest.approx(float(sum(marked)))


def test_digits_is_eight_tokens_of_eight_pixels():
    data = load_task("digits")
    assert data.x_train.shape[1:] == (8, 8) and data.in_features == 8
    assert len(data.x_train) + len(data.x_test) == 1797
    assert data.x_train.min() >= 0.0 and data.x_train.max() <= 1.0


def test_idx_reader_on_a_written_file(tmp_path):
    images = np.random.randint(0, 256, (3, 4, 5), dtype=np.uint8)
    path = tmp_path / "imgs-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(struct.pack(">IIII", 2051, 3, 4, 5) + images.tobytes()))
    assert np.array_equal(read_idx(path), images)
    labels = np.array([3, 1, 4], dtype=np.uint8)
    raw = gzip.compress(struct.pack(">II", 2049, 3) + labels.tobytes())
    (tmp_path / "lbl-idx1-ubyte.gz.part00").write_bytes(raw[:10])
    (tmp_path / "lbl-idx1-ubyte.gz.part01").write_bytes(raw[10:])
    assert np.array_equal(read_idx(tmp_path / "lbl-idx1-ubyte.gz"), labels)


def test_missing_data_names_the_option(tmp_path):
    with pytest.raises(DataFileError, match="--data-dir"):
        load_task("mnist", data_dir=tmp_path / "nowhere")
    with pytest.raises(DataFileError, match="--data-dir"):
        load_task("imdb", data_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown task"):
        load_task("cifar")


def test_imdb_tokenizer_and_vocabulary():
    assert tokenize("Great<br /><br />film, isn't it?") == ["great", "film", "isn't", "it"]
    vocab = build_vocab(["a b b c", "b c"], size=4)
    assert vocab == ["<pad>", "<unk>", "b", "c"]
    ids = encode(["b a zzz", ""], vocab, seq_len=4)
    assert ids.tolist() == [[2, 1, 1, 0], [0, 0, 0, 0]]


needs_shared = pytest.mark.skipif(
    not default_data_dir("mnist").exists(), reason="../shared/data not present"
)


@needs_shared
def test_real_mnist_and_imdb_files_load():
    mnist = load_task("mnist")
    assert mnist.x_train.shape == (60000, 28, 28) and mnist.x_test.shape == (10000, 28, 28)
    assert mnist.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert abs(mnist.x_train.mean().item() - 0.1307) < 1e-3
    imdb = load_task("imdb", seq_len=64)
    assert imdb.x_train.shape == (6000, 64) and set(imdb.y_test.unique().tolist()) == {0, 1}


def test_patches_tile_the_image_in_row_major_order():
    from models.tasks.base import to_patches

    img = np.arange(64, dtype=np.float32).reshape(1, 8, 8)
    p = to_patches(img, 4)
    assert p.shape == (1, 4, 16)
    np.testing.assert_array_equal(p[0, 1], img[0, :4, 4:].reshape(-1))  # top-right patch second
    np.testing.assert_array_equal(p[0, 2], img[0, 4:, :4].reshape(-1))
    assert to_patches(img, None) is img
    with pytest.raises(ValueError, match="divide"):
        to_patches(img, 3)


def test_digits_with_patches_records_them_for_reloading():
    from models.tasks import load_task_of

    data = load_task("digits", patch=4)
    assert data.x_train.shape[1:] == (4, 16) and data.in_features == 16 and data.meta["patch"] == 4
    again = load_task_of({"name": "digits", "meta": data.meta})
    assert torch.equal(again.x_test, data.x_test)
