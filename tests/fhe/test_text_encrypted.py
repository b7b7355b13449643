"""Text end to end on a small IMDB-format corpus: `fhe train --words`, `fhe compile` under both
schemes, `fhe run --text` (the client embeds, the server sees ciphertexts only)."""

import csv
import gzip
import json
import random

import numpy as np
import pytest
from click.testing import CliRunner

from fhe_cli import main

POSITIVE = ["great", "wonderful", "loved", "beautiful", "best", "fun"]
NEGATIVE = ["awful", "boring", "worst", "hated", "dull", "mess"]
NEUTRAL = ["the", "film", "plot", "actor", "scene", "it", "was", "a", "and", "story"]


def _review(rng: random.Random, label: int) -> str:
    mood = POSITIVE if label else NEGATIVE
    words = [rng.choice(NEUTRAL if rng.random() < 0.6 else mood) for _ in range(rng.randint(3, 30))]
    return " ".join(words).capitalize() + ". <br />"


def _write(path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with gzip.open(path, "wt", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["text", "label"])
        writer.writeheader()
        for i in range(n):
            writer.writerow({"text": _review(rng, i % 2), "label": i % 2})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A corpus in the IMDB files' format (`../shared/data/imdb`): 400 train and 40 test reviews."""
    folder = tmp_path_factory.mktemp("imdb")
    _write(folder / "imdb_train_6000.csv.gz", 400, 1)
    _write(folder / "imdb_test_4000.csv.gz", 40, 2)
    return folder


def _train(corpus, path, *options: str):
    res = CliRunner().invoke(
        main,
        [
            "train", "--task", "imdb", "--data-dir", str(corpus), "--words", "24", "--seq-len",
            "4", "--d-model", "4", "--heads", "1", "--norm", "none", "--epochs", "8", "--lr",
            "1e-2", "--quiet", "-o", str(path), *options,
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return path


def test_a_text_model_runs_encrypted_under_tfhe_from_a_text(corpus, tmp_path):
    from fhe.api import run_artifact
    from fhe.deploy.client import Client, dequantize_output, quantize_input
    from quant.ir import OverflowPolicy

    model = _train(corpus, tmp_path / "text.pt", "--attention", "inhibitor", "--tie-qk")
    out = tmp_path / "art"
    res = CliRunner().invoke(
        main,
        ["compile", str(model), "--n-bits", "3", "--lut-bits", "4", "--data-dir", str(corpus),
         "--calib", "400", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "encrypted output equals the clear integer program: True" in res.output
    # the front end travels with the client only, as JSON and safetensors
    assert (out / "client" / "text.json").exists() and (
        out / "client" / "text.safetensors"
    ).exists()
    assert not any(p.name.startswith("text") for p in (out / "server").iterdir())
    assert len(json.loads((out / "client" / "text.json").read_text())["vocab"]) > 10
    text = "A wonderful film, I loved the story and the actor. Best of the year."
    run = run_artifact(out, text=text)
    client = Client(out / "client")
    x_int = quantize_input(client.meta, client.encode_text(text))
    clear, _ = client.local.program.run(x_int[None], OverflowPolicy.CLIP)
    np.testing.assert_array_equal(run.logits, dequantize_output(client.meta, clear[0]).reshape(-1))
    res = CliRunner().invoke(main, ["run", str(out), "--text", text])
    assert res.exit_code == 0 and res.output.startswith("text encrypted prediction"), res.output
    res = CliRunner().invoke(main, ["run", str(out), "--sample", "1", "--data-dir", str(corpus)])
    assert res.exit_code == 0 and "sample 1: label 1, encrypted prediction" in res.output


def test_a_text_model_runs_encrypted_under_ckks_packed(corpus, tmp_path):
    model = _train(
        corpus, tmp_path / "text_ckks.pt", "--attention", "power-softmax", "--power-form",
        "length-agnostic", "--power-p", "2", "--power-eps", "1", "--ffn-activation", "quad",
    )  # fmt: skip
    out = tmp_path / "art"
    res = CliRunner().invoke(
        main,
        ["compile", str(model), "--scheme", "ckks", "--data-dir", str(corpus), "--calib", "400",
         "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "packed" in res.output and (out / "client" / "text.json").exists()
    res = CliRunner().invoke(main, ["run", str(out), "--text", "Boring and awful, the worst."])
    assert res.exit_code == 0 and "text encrypted prediction" in res.output, res.output


def test_text_options_fail_clearly(corpus, tmp_path):
    res = CliRunner().invoke(main, ["train", "--task", "digits", "--words", "8", "-o", "x.pt"])
    assert res.exit_code == 2 and "--words applies to token tasks" in res.output
    padded = _train(corpus, tmp_path / "padded.pt", "--attention", "inhibitor", "--words", "4")
    assert padded.exists()  # words == seq_len: one word per segment, still no padding positions
    res = CliRunner().invoke(
        main, ["train", "--task", "imdb", "--data-dir", str(corpus), "--seq-len", "8", "-o",
               str(tmp_path / "m.pt"), "--epochs", "1", "--quiet"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["compile", str(tmp_path / "m.pt"), "--data-dir", str(corpus)])
    assert res.exit_code == 2 and "--words" in res.output and "padding" in res.output
