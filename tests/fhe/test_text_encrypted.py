"""Text end to end on a small IMDB-format corpus: `fhe train --words`, `fhe compile` under both
schemes, `fhe run --text` (the client embeds, the server sees ciphertexts only)."""

import csv
import gzip
import json
import random
import re

import numpy as np
import pytest
from click.testing import CliRunner

from fhe_cli import main
from models.config import TransformerConfig

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


SMALL_TFHE = ("--n-bits", "3", "--lut-bits", "4")  # narrow lookups: a quick keygen


def _compile(model, corpus, out, *options: str):
    """`fhe compile` (keys, one encrypted sample checked against the clear program, artifacts)."""
    res = CliRunner().invoke(
        main,
        ["compile", str(model), *options, "--data-dir", str(corpus), "--calib", "400", "--out",
         str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return res


def test_a_text_model_runs_encrypted_under_tfhe_from_a_text(corpus, tmp_path):
    from fhe.api import run_artifact
    from fhe.deploy.client import Client, dequantize_output, quantize_input
    from quant.ir import OverflowPolicy

    model = _train(corpus, tmp_path / "text.pt", "--attention", "inhibitor", "--tie-qk")
    out = tmp_path / "art"
    res = _compile(model, corpus, out, *SMALL_TFHE)
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
    # `fhe run --text` on the command line: test_a_next_word_model_runs_encrypted_under_tfhe
    res = CliRunner().invoke(main, ["run", str(out), "--sample", "1", "--data-dir", str(corpus)])
    assert res.exit_code == 0 and "sample 1: label 1, encrypted prediction" in res.output


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_an_inhibitor_mean_text_model_runs_encrypted_under_tfhe(corpus, tmp_path, causal):
    """The imdb TFHE recipe's Inhibitor means (`--inhibitor-mean`). Causal: clear integers m_i in
    the matrix that sums each query's pairs, n in the scale; full: 1 / T folded into the output
    projection. Encrypted == clear integer program (the program against the float means:
    tests/quant/test_causal.py, tests/quant/test_export.py)."""
    from fhe.deploy.client import Client

    mask = ["--causal"] if causal else []
    model = _train(
        corpus, tmp_path / "m.pt", "--attention", "inhibitor", "--tie-qk", *mask,
        "--inhibitor-mean",
    )  # fmt: skip
    res = _compile(model, corpus, tmp_path / "art", *SMALL_TFHE)
    assert "encrypted output equals the clear integer program: True" in res.output
    meta = Client(tmp_path / "art" / "client").meta
    assert meta["model_config"]["inhibitor_mean"] and meta["model_config"]["causal"] == causal


@pytest.mark.isolated
@pytest.mark.slow  # the packed path of the causal padded tests below; `fhe run --text` under CKKS
def test_a_text_model_runs_encrypted_under_ckks_packed(corpus, tmp_path):
    model = _train(
        corpus, tmp_path / "text_ckks.pt", "--attention", "power-softmax", "--power-form",
        "length-agnostic", "--power-p", "2", "--power-eps", "1", "--ffn-activation", "quad",
    )  # fmt: skip
    out = tmp_path / "art"
    res = _compile(model, corpus, out, "--scheme", "ckks")
    assert "packed" in res.output and (out / "client" / "text.json").exists()
    res = CliRunner().invoke(main, ["run", str(out), "--text", "Boring and awful, the worst."])
    assert res.exit_code == 0 and "text encrypted prediction" in res.output, res.output


def test_text_options_fail_clearly(corpus, tmp_path):
    res = CliRunner().invoke(main, ["train", "--task", "digits", "--words", "8", "-o", "x.pt"])
    assert res.exit_code == 2 and "--words applies to token tasks" in res.output
    padded = _train(corpus, tmp_path / "padded.pt", "--attention", "inhibitor", "--words", "4")
    assert padded.exists()  # words == seq_len: one word per segment, still no padding positions


def test_a_padded_text_model_runs_encrypted_with_its_mask_encrypted(corpus, tmp_path):
    """A model over padded word positions (no --words): the client sends its key mask as one more
    encrypted column; padding keys are masked inside the program and the client takes the mean
    over its words. Encrypted == clear; CKKS refuses it with the way out."""
    from fhe.api import run_artifact
    from fhe.deploy.client import Client, dequantize_output, quantize_input
    from quant.ir import OverflowPolicy

    model = tmp_path / "m.pt"
    res = CliRunner().invoke(
        main,
        ["train", "--task", "imdb", "--data-dir", str(corpus), "--seq-len", "4", "--d-model", "4",
         "--heads", "1", "--norm", "none", "--attention", "inhibitor", "--tie-qk", "--epochs", "6",
         "--lr", "1e-2", "--quiet", "-o", str(model)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = tmp_path / "art"
    res = _compile(model, corpus, out, *SMALL_TFHE)
    assert "encrypted output equals the clear integer program: True" in res.output
    client = Client(out / "client")
    assert client.text.padded
    text = "Awful, boring."  # 2 words in a bucket of 4: 2 padding positions
    x = client.encode_text(text)
    assert x.shape == (4, 5) and x[:, -1].tolist() == [1, 1, 0, 0]
    run = run_artifact(out, text=text)
    clear, _ = client.local.program.run(quantize_input(client.meta, x)[None], OverflowPolicy.CLIP)
    np.testing.assert_array_equal(run.logits, dequantize_output(client.meta, clear[0]).reshape(-1))


@pytest.mark.isolated  # an N = 32768 context: its SEAL pool ends with the test
def test_a_next_word_model_runs_encrypted_under_ckks_packed(corpus, tmp_path):
    """A small causal language model (`--task imdb-lm`: the word after a padded window) under
    PowerSoftmax: Eq. 11's mask folded into the head-sum masks, K of a padding key times its
    encrypted mask (one product), ε once per kept key; the program returns every position's logits
    beside the mask and the client keeps its last word's row."""
    model = tmp_path / "m.pt"
    res = CliRunner().invoke(
        main,
        ["train", "--task", "imdb-lm", "--data-dir", str(corpus), "--seq-len", "4", "--d-model",
         "4", "--heads", "1", "--norm", "none", "--attention", "power-softmax",
         "--power-form", "length-agnostic", "--power-p", "2", "--power-eps", "1",
         "--ffn-activation", "quad", "--epochs", "3", "--lr", "1e-2", "--quiet", "-o", str(model)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    # no artifacts: saving N = 32768 Galois keys (2 GB) and `fhe run` on them took ~2 min
    compile_ = ["compile", str(model), "--scheme", "ckks", "--data-dir", str(corpus)]
    res = CliRunner().invoke(main, [*compile_, "--calib", "400"])
    assert res.exit_code == 0 and "packed" in res.output, res.output
    error = re.search(r"encrypted vs clear polynomial program: max \|error\| (\S+)", res.output)
    assert error and float(error.group(1)) < 1e-3, res.output


@pytest.mark.isolated  # an N = 32768 context: its SEAL pool ends with the test
def test_a_causal_padded_inhibitor_runs_encrypted_under_ckks_packed(corpus, tmp_path):
    """The Inhibitor over padded word positions, causal: each (query, key) term of Eq. 6 times a
    multiplier per offset block, the client's encrypted key mask shifted beside each query with the
    public causal mask folded into its block masks (one product). Encrypted == clear polynomial
    program."""
    model = tmp_path / "m.pt"
    res = CliRunner().invoke(
        main,
        ["train", "--task", "imdb", "--data-dir", str(corpus), "--seq-len", "4", "--d-model", "4",
         "--heads", "1", "--norm", "none", "--causal", "--attention", "inhibitor",
         "--ffn-activation", "quad", "--epochs", "6", "--lr", "1e-2", "--quiet", "-o", str(model)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    # looser fits: depth within TenSEAL's chains; no artifacts (saving 2 GB of Galois keys: ~2 min)
    packed = ("--scheme", "ckks", "--layout", "packed", "--activation-tol", "0.1")
    res = CliRunner().invoke(
        main, ["compile", str(model), *packed, "--data-dir", str(corpus), "--calib", "400"]
    )
    assert res.exit_code == 0, res.output
    error = re.search(r"encrypted vs clear polynomial program: max \|error\| (\S+)", res.output)
    assert error and float(error.group(1)) < 1e-3, res.output


def test_masks_are_refused_under_ckks_where_they_have_no_lowering():
    from fhe.ckks.program import PolynomialError, check_model

    cfg = TransformerConfig(
        seq_len=4, in_features=5, n_outputs=2, input_kind="embedded", attention="dct",
        d_model=4, n_heads=1,
    )  # fmt: skip
    with pytest.raises(PolynomialError, match="--scheme tfhe.*--words"):
        check_model(cfg)
    for kind in ("dot-product", "inhibitor", "signed-inhibitor", "power-softmax"):
        check_model(cfg.replace(attention=kind, causal=True))  # every kind with a causal option


def test_a_next_word_model_runs_encrypted_under_tfhe(corpus, tmp_path):
    """A small causal language model (`--task imdb-lm`, PowerSoftmax paper Eq. 11's mask): the
    client sends its padded words and their key mask, encrypted; the program returns every
    position's logits beside the mask, equal to the clear integer program, and the client keeps
    the last word's row and names the predicted word."""
    from fhe.api import run_artifact
    from fhe.deploy.client import Client, quantize_input
    from quant.ir import OverflowPolicy

    model = tmp_path / "lm.pt"
    res = CliRunner().invoke(
        main,
        ["train", "--task", "imdb-lm", "--data-dir", str(corpus), "--seq-len", "4", "--d-model",
         "4", "--heads", "1", "--norm", "none", "--attention", "inhibitor", "--tie-qk",
         "--epochs", "3", "--lr", "1e-2", "--quiet", "-o", str(model)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = tmp_path / "art"
    res = _compile(model, corpus, out, *SMALL_TFHE)
    assert "encrypted output equals the clear integer program: True" in res.output
    client = Client(out / "client")
    labels = client.text.labels
    assert client.text.padded and labels and client.meta["model_config"]["causal"]
    text = "Boring and"  # 2 words in a bucket of 4
    res = CliRunner().invoke(main, ["run", str(out), "--text", text])
    word = re.search(r'text encrypted prediction (\d+) \("([^"]+)"\)', res.output)
    assert res.exit_code == 0 and word, res.output
    assert labels[int(word.group(1))] == word.group(2)
    run = run_artifact(out, text=text)
    x = quantize_input(client.meta, client.encode_text(text))
    clear, _ = client.local.program.run(x[None], OverflowPolicy.CLIP)  # (1, T, n_out + 1)
    assert clear[0, :, -1].tolist() == [1, 1, 0, 0]
    scale = np.asarray(client.meta["output_scale"], dtype=np.float64)
    np.testing.assert_array_equal(run.logits, clear[0, 1, :-1] * scale)  # the second word's row


def test_a_text_models_cost_per_length(corpus, tmp_path):
    """`fhe report MODEL --seq-lens`: the same weights compiled at each T; a T whose integer program
    exceeds the compile limit is extrapolated from the largest compiled one by PBS count."""
    from fhe.api import lengths
    from fhe.schemes import Scheme

    model = _train(corpus, tmp_path / "text.pt", "--attention", "inhibitor", "--tie-qk")
    (small,) = lengths.cost_per_length(model, [2], (Scheme.TFHE,), corpus, execute=True)
    assert small.status is lengths.Status.MEASURED and small.max_error == 0  # encrypted == clear
    assert small.pbs and small.keys_mib and small.latency_s
    rows = lengths.cost_per_length(
        model, [2, 4], (Scheme.TFHE,), corpus, execute=False, max_compile_pbs=small.pbs
    )
    assert [r.status for r in rows] == [lengths.Status.ESTIMATED, lengths.Status.EXTRAPOLATED]
    assert rows[1].pbs > rows[0].pbs and rows[1].estimated_latency_s == pytest.approx(
        rows[0].estimated_latency_s * rows[1].pbs / rows[0].pbs
    )
    poly = _train(
        corpus, tmp_path / "poly.pt", "--attention", "power-softmax", "--power-form",
        "length-agnostic", "--power-p", "2", "--power-eps", "1", "--ffn-activation", "quad",
    )  # fmt: skip
    res = CliRunner().invoke(
        main,
        ["report", str(poly), "--seq-lens", "2,4", "--scheme", "ckks", "--mode", "simulate",
         "--data-dir", str(corpus), "--out", str(tmp_path / "rep")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "rep" / "poly_per_length.json").read_text())
    depths = [r["depth"] for r in saved["rows"]]
    assert [r["seq_len"] for r in saved["rows"]] == [2, 4] and all(depths)
    assert (tmp_path / "rep" / "poly_per_length.png").stat().st_size > 0
    res = CliRunner().invoke(main, ["report", str(model), "--seq-lens", "99", "--data-dir",
                                    str(corpus)])  # fmt: skip
    assert res.exit_code == 2 and "more segments than the model's 24 words" in res.output
