"""`fhe train` end to end on the small digits task, and its reload."""

import json

import pytest
import torch
from click.testing import CliRunner

from fhe_cli import main
from models.config import TransformerConfig
from models.tasks import load_task
from models.training import evaluate, load_checkpoint
from models.transformer import Transformer


def test_train_saves_a_model_that_reloads_to_the_same_outputs(tmp_path):
    out = tmp_path / "m.pt"
    summary = tmp_path / "s.json"
    res = CliRunner().invoke(
        main,
        [
            "train",
            "--task",
            "digits",
            "--attention",
            "inhibitor",
            "--epochs",
            "8",
            "--quiet",
            "-o",
            str(out),
            "--json",
            str(summary),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "digits / inhibitor: test accuracy" in res.output
    info = json.loads(summary.read_text())
    ckpt = load_checkpoint(out)
    data = load_task("digits")
    assert evaluate(ckpt.model, data) == info["test"]
    # it learned: far above the same architecture untrained (chance is 0.1), and its training loss
    # fell
    untrained = evaluate(Transformer(ckpt.model.config), data)
    assert info["test"] > untrained + 0.4, (info["test"], untrained)
    losses = [h["train_loss"] for h in ckpt.extra["history"]]
    assert losses[-1] < 0.5 * losses[0], losses
    assert ckpt.task["name"] == "digits"
    x = data.x_test[:16]
    assert torch.equal(load_checkpoint(out).model(x), ckpt.model(x))


def test_train_sets_the_ffn_width(tmp_path):
    out = tmp_path / "m.pt"
    res = CliRunner().invoke(
        main,
        [
            "train",
            "--d-model",
            "8",
            "--heads",
            "1",
            "--d-ff",
            "24",
            "--epochs",
            "1",
            "--quiet",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    model = load_checkpoint(out).model
    assert model.config.d_ff == 24
    assert model.blocks[0].ffn.fc1.out_features == 24


def test_train_reports_bad_options_clearly(tmp_path):
    res = CliRunner().invoke(
        main,
        [
            "train",
            "--task",
            "mnist",
            "--data-dir",
            str(tmp_path / "no"),
            "-o",
            str(tmp_path / "m.pt"),
        ],
    )
    assert res.exit_code == 2 and "--data-dir" in res.output
    res = CliRunner().invoke(
        main, ["train", "--d-model", "10", "--heads", "3", "-o", str(tmp_path / "m.pt")]
    )
    assert res.exit_code == 2 and "divisible" in res.output
    res = CliRunner().invoke(main, ["train", "--attention", "fourier"])
    assert res.exit_code == 2
    res = CliRunner().invoke(main, ["train", "--attention", "dot-product", "--tie-qk"])
    assert res.exit_code == 2 and "Inhibitor option" in res.output


def test_init_keeps_the_base_architecture_and_refuses_another_attention(tmp_path):
    base = tmp_path / "dp.pt"
    res = CliRunner().invoke(
        main,
        [
            "train",
            "--attention",
            "dot-product",
            "--d-model",
            "4",
            "--heads",
            "1",
            "--epochs",
            "1",
            "--quiet",
            "-o",
            str(base),
        ],
    )
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(
        main,
        [
            "train",
            "--init",
            str(base),
            "--attention",
            "power-softmax",
            "--epochs",
            "1",
            "--quiet",
            "-o",
            str(tmp_path / "ps.pt"),
        ],
    )
    assert res.exit_code == 2 and "is a dot-product model" in res.output
    res = CliRunner().invoke(
        main,
        ["train", "--init", str(base), "--epochs", "1", "--quiet", "-o", str(tmp_path / "ft.pt")],
    )
    assert res.exit_code == 0 and "digits / dot-product" in res.output


def test_qat_quant_sets_the_recorded_quantization_and_refuses_bad_fields(tmp_path):
    out = tmp_path / "m.pt"
    small = ["train", "--d-model", "8", "--heads", "1", "--patch", "4", "--epochs", "1", "--quiet"]
    qat = ["--qat-bits", "6", "--qat-epochs", "1", "-o", str(out)]
    given = {"weight_bits": 5, "client_pooling": False, "fold_last_residual": False}
    res = CliRunner().invoke(main, [*small, *qat, "--qat-quant", json.dumps(given)])
    assert res.exit_code == 0, res.output
    recorded = load_checkpoint(out).extra["quant"]
    assert {k: recorded[k] for k in given} == given
    assert recorded["n_bits"] == 6  # --qat-bits
    for bad, message in [
        ('{"weight_bitz": 5}', "weight_bitz"),
        ("[5]", "JSON object"),
        ("{weight_bits: 5}", "not JSON"),
        ('{"fold_last_residual": true, "client_pooling": false}', "client_pooling"),
    ]:
        res = CliRunner().invoke(main, [*small, *qat, "--qat-quant", bad])
        assert res.exit_code == 2 and message in res.output, (bad, res.output)
    res = CliRunner().invoke(main, [*small, "--qat-quant", '{"weight_bits": 5}'])
    assert res.exit_code == 2 and "--qat-bits" in res.output


def test_a_recipe_fills_the_options_left_at_their_defaults():
    from fhe import api
    from fhe.api.recipes import RECIPES, Recipe

    recipe = RECIPES["digits", Recipe.TFHE]
    req = api.with_recipe(api.TrainRequest(task="digits", recipe="tfhe", epochs=3))
    assert req.epochs == 3  # given: kept
    assert (req.patch, req.d_model, req.heads, req.qat_bits) == (
        recipe["patch"],
        recipe["d_model"],
        recipe["heads"],
        recipe["qat_bits"],
    )
    ckks = api.with_recipe(api.TrainRequest(task="digits", recipe="ckks"))
    assert (ckks.attention, ckks.power_p, ckks.ffn_activation) == ("power-softmax", 2, "quad")
    deep = api.with_recipe(api.TrainRequest(task="digits", recipe="ckks-deep"))
    assert (deep.norm, deep.norm_range_loss, deep.norm_range_ratio) == ("layernorm", 0.1, 3.0)
    # --norm none typed: the recipe's norm range loss has no LayerNorm to act on and is dropped
    bare = api.with_recipe(
        api.TrainRequest(task="digits", recipe="ckks-deep", norm="none"), given=frozenset({"norm"})
    )
    assert (bare.norm, bare.norm_range_loss) == ("none", 0.0)


def test_a_norm_range_ratio_that_is_not_a_ratio_is_a_usage_error(tmp_path):
    res = CliRunner().invoke(
        main,
        [
            *("train", "--task", "digits", "--norm", "layernorm", "--norm-range-loss", "0.1"),
            *("--norm-range-ratio", "0.5", "--epochs", "1", "-o", str(tmp_path / "m.pt")),
        ],
    )
    assert res.exit_code == 2 and "norm_range_ratio" in res.output and "> 1" in res.output


@pytest.mark.parametrize("norm", ["none", "batchnorm"])
def test_a_norm_range_loss_without_layernorm_is_a_usage_error(tmp_path, norm):
    """Typed on a model without LayerNorm, the loss would do nothing: said, not ignored."""
    res = CliRunner().invoke(
        main,
        [
            *("train", "--task", "digits", "--norm", norm, "--norm-range-loss", "0.1"),
            *("--epochs", "1", "-o", str(tmp_path / "m.pt")),
        ],
    )
    assert res.exit_code == 2 and "--norm-range-loss" in res.output and norm in res.output
    assert not (tmp_path / "m.pt").exists()


def test_a_recipe_that_does_not_exist_is_a_usage_error(tmp_path):
    res = CliRunner().invoke(
        main, ["train", "--task", "adding", "--recipe", "tfhe", "-o", str(tmp_path / "m.pt")]
    )
    assert res.exit_code == 2 and "no tfhe recipe for task 'adding'" in res.output


def test_an_option_typed_with_its_default_value_wins_over_the_recipe(tmp_path):
    out = tmp_path / "m.pt"
    res = CliRunner().invoke(
        main,
        [
            *("train", "--task", "digits", "--recipe", "ckks", "--attention", "inhibitor"),
            *("--epochs", "1", "--limit", "64", "--quiet", "-o", str(out)),
        ],
    )
    assert res.exit_code == 0, res.output
    config = load_checkpoint(out).model.config
    assert config.attention.value == "inhibitor"  # typed, though it is the default
    assert (config.d_model, config.ffn_activation.value) == (16, "quad")  # from the recipe


def test_a_text_recipe_widens_its_quantization_beyond_the_shape_it_was_tuned_on():
    """benchmarks/results/text_widths.md: the 1-block widths lose 3-6 points on 2 blocks or 32
    segments; the recipe switches to its wider widths there, and an explicit --qat-quant wins."""
    from fhe import api
    from fhe.api.recipes import BEYOND_SHAPE, RECIPES, Recipe

    tuned = RECIPES["imdb", Recipe.TFHE]["qat_quant"]
    beyond = BEYOND_SHAPE["imdb", Recipe.TFHE]
    blocks, segments = beyond.blocks["qat_quant"], beyond.segments["qat_quant"]
    causal = beyond.causal["qat_quant"]
    assert len({str(tuned), str(blocks), str(segments)}) == 3
    assert causal != blocks and causal != segments  # the recipe's own widths, at d = 8 (below)

    def quant(**fields):
        return api.with_recipe(api.TrainRequest(task="imdb", recipe="tfhe", **fields)).qat_quant

    assert quant() == tuned
    assert quant(layers=1, seq_len=16) == tuned
    assert quant(layers=2) == blocks
    assert quant(seq_len=32) == segments
    assert quant(layers=2, seq_len=32) == segments  # the longer shape's options win
    assert quant(causal=True) == causal
    assert quant(causal=True, layers=2) == blocks  # the deeper shape's widths win
    assert quant(causal=True, seq_len=32) == segments

    def width(**fields) -> tuple[int | None, int | None]:
        options = api.with_recipe(api.TrainRequest(task="imdb", recipe="tfhe", **fields))
        return options.d_model, options.qat_epochs

    # the recipe's d = 6 and 6 QAT epochs at its own shape; beyond it, d = 8 and 3 as measured
    assert width() == (6, 6) and width(attention="signed-inhibitor") == (6, 6)
    for beyond_fields in ({"layers": 2}, {"seq_len": 32}, {"causal": True}):
        assert width(**beyond_fields) == (8, 3), beyond_fields

    def means(**fields) -> bool:
        return api.with_recipe(
            api.TrainRequest(task="imdb", recipe="tfhe", **fields)
        ).inhibitor_mean

    # the recipe's means on every shape (with segment_norm the means did best on each, below)
    assert means() and means(causal=True) and means(seq_len=32) and means(layers=2)
    assert not means(causal=True, attention="dot-product")  # an Inhibitor option
    assert not means(attention="dot-product")
    for kind in ("power-softmax", "dot-product", "dct", "activator"):  # K = Q too: an Inhibitor's
        options = api.with_recipe(api.TrainRequest(task="imdb", recipe="tfhe", attention=kind))
        assert not options.tie_qk and not options.inhibitor_mean, kind
        TransformerConfig(  # the model the recipe asks for is valid (it raised on tie_qk before)
            seq_len=16,
            in_features=10,
            n_outputs=2,
            input_kind="tokens",
            attention=kind,
            tie_qk=options.tie_qk,
            inhibitor_mean=options.inhibitor_mean,
            words=options.words,
            segment_norm=options.segment_norm,
        )
    padded = api.with_recipe(  # word positions, padded: each word's vector at unit RMS
        api.TrainRequest(task="imdb", recipe="tfhe", words=None, seq_len=32),
        given=frozenset({"words", "seq_len"}),
    )
    assert padded.words is None and padded.segment_norm and padded.inhibitor_mean
    assert padded.qat_quant == beyond.padded["qat_quant"]  # it wins over the longer shape's
    ckks_padded = api.with_recipe(
        api.TrainRequest(task="imdb", recipe="ckks", words=None, seq_len=32),
        given=frozenset({"words", "seq_len"}),
    )
    assert not ckks_padded.segment_norm  # the CKKS recipe scales nothing
    assert quant(layers=2, qat_quant={"weight_bits": 6}) == {"weight_bits": 6}
    given = frozenset({"layers", "qat_quant"})  # the CLI's path: typed options named
    typed = api.TrainRequest(task="imdb", recipe="tfhe", layers=2, qat_quant={"lut_bits": 6})
    assert api.with_recipe(typed, given=given).qat_quant == {"lut_bits": 6}
    ckks = api.with_recipe(api.TrainRequest(task="imdb", recipe="ckks", layers=2))
    assert ckks.qat_quant == api.TrainRequest().qat_quant  # CKKS has no widths to widen


def test_the_text_recipes_wider_widths_are_the_ones_the_width_sweep_found_best():
    """The widths the recipe takes for a shape, its own or BEYOND_SHAPE's (and whether the
    Inhibitor sums or means, and whether the client scales segment means to unit RMS), are the
    candidate that benchmarks/text_widths.py measured within a point of float on the most seeds
    (then the most accurate program, mean over the seeds), among those whose keys fit the text
    issue's 2 GB and that were measured to accept short reviews (at most 1% of the test reviews
    cut to 16 words refused): the recipe and its evidence are two places, and this keeps them from
    drifting apart (rerun the sweep before changing one). The recipe's own shape, the best model the
    text issue times, also has to fit the latency budget on the compiler's estimate; its width
    (d = 6, 5 or 4 where the shape says so, else 8) and QAT epochs (6 or the recipe's 3) come with
    the cell."""
    import re
    from pathlib import Path

    from fhe import api
    from fhe.api.recipes import TEXT_TFHE_BUDGET_S

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "text_widths.json"
    saved = json.loads(results.read_text())
    widths = {(r["shape"], r["candidate"]): r["qat_quant"] for r in saved["rows"]}
    one_block = tuple(  # the recipe's shape, with sums or means, norm or not, narrower or not
        s
        for s in dict.fromkeys(s["shape"] for s in saved["summary"])
        if re.fullmatch(r"imdb-L1-T16(-mean)?(-norm)?(-d\d+)?(-qat\d+)?", s)
    )
    assert {"imdb-L1-T16", "imdb-L1-T16-mean-norm-d6-qat6"} <= set(one_block)
    chosen = {  # each shape: sums or means, segment means as they are or at unit RMS
        one_block: {},
        ("imdb-L2-T16", "imdb-L2-T16-mean", "imdb-L2-T16-norm", "imdb-L2-T16-mean-norm"): {
            "layers": 2
        },
        ("imdb-L1-T32", "imdb-L1-T32-mean", "imdb-L1-T32-mean-norm"): {"seq_len": 32},
        (
            "imdb-L1-T16-causal",
            "imdb-L1-T16-causal-mean",
            "imdb-L1-T16-causal-mean-norm",
        ): {"causal": True},
        (
            "imdb-L1-T32-padded",
            "imdb-L1-T32-padded-mean",
            "imdb-L1-T32-padded-mean-norm",
        ): {"seq_len": 32, "words": None},
    }

    def accepts_short_reviews(s: dict) -> bool:  # padded words: each word its own position
        return "-padded" in s["shape"] or s.get("refused_first_16_words", 1.0) <= 0.01

    eligible = [  # seed 0's circuit
        s for s in saved["summary"] if s["eval_keys_bytes"] <= 2e9 and accepts_short_reviews(s)
    ]

    def fits(s: dict) -> bool:
        return s["shape"] not in one_block or s["est_latency_s"] <= TEXT_TFHE_BUDGET_S

    def best_of(cells) -> dict:  # the most seeds within a point, then the most accurate program
        return max(cells, key=lambda s: (s["within_1_point"], s["program_mean"]))

    for shapes, fields in chosen.items():
        best = best_of(s for s in eligible if s["shape"] in shapes and fits(s))
        first = next(  # the 1-block widths, V⁺ alone, summing: the recipe before
            s
            for s in saved["summary"]
            if (s["shape"], s["candidate"]) == (shapes[0], "1-block recipe")
        )
        assert best["gap_mean"] < first["gap_mean"], shapes
        options = api.with_recipe(
            api.TrainRequest(task="imdb", recipe="tfhe", **fields), given=frozenset(fields)
        )
        assert widths[best["shape"], best["candidate"]] == options.qat_quant, shapes
        assert options.inhibitor_mean == ("-mean" in best["shape"]), shapes
        assert options.segment_norm == ("-norm" in best["shape"]), shapes
        width = re.search(r"-d(\d+)", best["shape"])
        assert options.d_model == (int(width[1]) if width else 8), shapes
        epochs = re.search(r"-qat(\d+)", best["shape"])
        assert options.qat_epochs == (int(epochs[1]) if epochs else 3), shapes
    unbounded = best_of(s for s in eligible if s["shape"] in one_block)
    assert unbounded["est_latency_s"] > TEXT_TFHE_BUDGET_S  # the budget costs accuracy: d = 8's


def test_the_next_word_recipe_is_the_width_sweeps_best_next_word_shape():
    """benchmarks/results/text_widths.md: the next-word TFHE recipe's width and bit widths are the
    next-word cell within a point of its float model on the most seeds (then the most accurate
    program) among the circuits whose keys fit 2 GB, and that is every seed; at d = 8 no candidate
    got there (the recipe before); the same program with z's one 6-bit lookup is over 2 GB."""
    from pathlib import Path

    from fhe import api

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "text_widths.json"
    saved = json.loads(results.read_text())
    widths = {(r["shape"], r["candidate"]): r["qat_quant"] for r in saved["rows"]}
    lm = [s for s in saved["summary"] if s["shape"].startswith("imdb-lm")]
    best = max(
        (s for s in lm if s["eval_keys_bytes"] <= 2e9),
        key=lambda s: (s["within_1_point"], s["program_mean"]),
    )
    assert best["within_1_point"] == len(best["gaps_points"]) == 3
    assert all(s["within_1_point"] < 3 for s in lm if "-d16" not in s["shape"])
    same_program = [
        s
        for s in lm
        if (s["shape"], s["gaps_points"]) == (best["shape"], best["gaps_points"]) and s is not best
    ]
    assert same_program and all(s["eval_keys_bytes"] > 2e9 for s in same_program)
    options = api.with_recipe(api.TrainRequest(task="imdb-lm", recipe="tfhe"))
    assert best["shape"] == f"imdb-lm-L1-T{options.seq_len}-d{options.d_model}"
    assert options.qat_quant == widths[best["shape"], best["candidate"]]


def test_the_text_tfhe_recipe_narrows_the_dot_products_softmax():
    """fhe.api.recipes.KIND_WIDTHS: under the IMDB TFHE recipe the dot-product takes the width
    sweep's best dot-product widths (within a point on the most seeds, then the most accurate
    program, among the circuits whose keys fit 2 GB) over the d = 8 recipe's, at any shape
    (fhe.api.recipes.OTHER_KINDS: a kind other than the Inhibitor keeps d = 8, where it was
    measured); the Inhibitor, PowerSoftmax (not measured: the d = 8 recipe's widths), a typed
    --qat-quant and another task's recipe are left alone."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "text_widths.json"
    saved = json.loads(results.read_text())
    widths = {(r["shape"], r["candidate"]): r["qat_quant"] for r in saved["rows"]}
    cells = [s for s in saved["summary"] if s["shape"] == "imdb-L1-T16-dot-product"]
    best = max(
        (s for s in cells if s["eval_keys_bytes"] <= 2e9),
        key=lambda s: (s["within_1_point"], s["program_mean"]),
    )
    assert best["within_1_point"] == len(best["gaps_points"]) == 3
    assert any(s["eval_keys_bytes"] > 2e9 for s in cells)  # the widths before: over 2 GB
    from fhe import api
    from fhe.api.recipes import TEXT_D8_WIDTHS

    def quant(**kw):
        given = frozenset(kw) - {"task", "recipe"}
        return api.with_recipe(api.TrainRequest(**kw), given=given).qat_quant

    inhibitor = quant(task="imdb", recipe="tfhe")
    assert "softmax_bits" not in inhibitor
    dot = quant(task="imdb", recipe="tfhe", attention="dot-product")
    assert dot == widths[best["shape"], best["candidate"]] != inhibitor
    narrowed = {k: v for k, v in dot.items() if TEXT_D8_WIDTHS.get(k) != v}
    deeper = quant(task="imdb", recipe="tfhe", attention="dot-product", layers=2)
    assert deeper.items() >= narrowed.items() and deeper["weight_bits"] == 5  # and 2-block widths
    assert quant(task="imdb", recipe="tfhe", attention="power-softmax") == TEXT_D8_WIDTHS
    for kind in ("dot-product", "power-softmax"):
        options = api.with_recipe(api.TrainRequest(task="imdb", recipe="tfhe", attention=kind))
        assert (options.d_model, options.qat_epochs) == (8, 3), kind
    typed = {"weight_bits": 6}
    assert quant(task="imdb", recipe="tfhe", attention="dot-product", qat_quant=typed) == typed
    assert "softmax_bits" not in quant(task="digits", recipe="tfhe", attention="dot-product")
