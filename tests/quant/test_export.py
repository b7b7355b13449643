"""PTQ export: the integer program against the fake-quantized torch forward, the float model, and
clear errors for what cannot export."""

import numpy as np
import pytest
import torch

from models import AttentionKind, Transformer, TransformerConfig
from models.tasks import load_task
from models.training import TrainConfig, config_for_task, train
from quant import OverflowPolicy, QuantConfig
from quant.export import ExportError, export
from quant.qat import prepare_qat, strip_qat
from quant.report import accuracy, program_summary

KINDS = [k for k in AttentionKind]


def tiny(kind, **kw):
    cfg = dict(
        seq_len=6,
        in_features=5,
        n_outputs=3,
        attention=kind,
        d_model=8,
        n_heads=2,
        norm="none",
        dct_n_bar=3,
    )
    cfg.update(kw)
    return Transformer(TransformerConfig(**cfg)).double().eval()


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(
    "qconfig",
    [
        QuantConfig(n_bits=6),
        QuantConfig(n_bits=5, symmetric=False, weight_granularity="per-channel", rounding_bits=1),
        QuantConfig(n_bits=4, range_mode="percentile", percentile=99.0, lut_bits=6),
    ],
    ids=["sym", "asym-pc-r1", "pct-lut6"],
)
def test_integer_program_equals_fake_quantized_forward(kind, qconfig):
    model = tiny(kind)
    x = torch.rand(260, 6, 5, dtype=torch.float64)
    program = export(model, x[:200], qconfig)
    held_out = x[200:]
    out_int, clipped = program.run_int(program.quantize_input(held_out), OverflowPolicy.CLIP)
    ok = np.ones(len(held_out), bool)
    if clipped:  # a sample that overflowed a calibrated width is not comparable; there must be few
        rec = {}
        program.graph.run(program.quantize_input(held_out), OverflowPolicy.CLIP, record=rec)
        assert sum(clipped.values()) < 10
    fake = program.fake_forward(held_out)
    got = program.dequantize_output(out_int)
    if clipped:
        ok = np.isclose(got, fake, rtol=1e-9, atol=1e-9).all(-1)
        assert ok.mean() > 0.9
    np.testing.assert_allclose(got[ok], fake[ok], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "kind",
    [
        AttentionKind.INHIBITOR,
        AttentionKind.SIGNED_INHIBITOR,
        AttentionKind.DOT_PRODUCT,
        AttentionKind.ACTIVATOR,
    ],
    ids=lambda k: k.value,
)
def test_sixteen_bit_program_tracks_the_float_model(kind):
    model = tiny(kind)
    x = torch.rand(300, 6, 5, dtype=torch.float64)
    program = export(model, x[:250], QuantConfig(n_bits=16, weight_bits=14))
    with torch.no_grad():
        ref = model(x[250:]).numpy()
    got = program.forward(x[250:], OverflowPolicy.CLIP)
    assert np.abs(got - ref).max() < 0.02 * np.abs(ref).max() + 1e-3


def test_quad_ffn_exports_its_table_and_tracks_the_float_model():
    """The FFN's quad activation (CKKS-exact) is one lookup under TFHE, like ReLU or GELU."""
    model = tiny(AttentionKind.INHIBITOR, ffn_activation="quad")
    x = torch.rand(300, 6, 5, dtype=torch.float64)
    program = export(model, x[:250], QuantConfig(n_bits=16, weight_bits=14))
    with torch.no_grad():
        ref = model(x[250:]).numpy()
    got = program.forward(x[250:], OverflowPolicy.CLIP)
    assert np.abs(got - ref).max() < 0.02 * np.abs(ref).max() + 1e-3
    low = export(model, x[:250], QuantConfig(n_bits=6))
    held_out = x[250:]
    out_int, _ = low.run_int(low.quantize_input(held_out), OverflowPolicy.CLIP)
    np.testing.assert_allclose(
        low.dequantize_output(out_int), low.fake_forward(held_out), atol=1e-9
    )


@pytest.mark.parametrize("kind", [AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR])
def test_round_attention_keeps_the_attention_lookups_within_lut_bits(kind):
    """Without it the Inhibitor's T²-sized lookups (|q − k|, (v − z)⁺) read one bit more than
    Q/K/V; with it they are rounded like every lookup (to lut_bits, one more where the maximum
    rounds up), and the integer program still equals its fake-quantized twin."""
    torch.manual_seed(0)
    model = tiny(kind)
    x = torch.rand(200, 6, 5, dtype=torch.float64)
    widths = {}
    for rounded in (False, True):
        cfg = QuantConfig(n_bits=6, attention_bits=6, lut_bits=5, round_attention=rounded)
        program = export(model, x[:200], cfg)
        g = program.graph
        widths[rounded] = max(
            n.lut_input_bits(g)
            for n in g.nodes.values()
            if n.op == "lut" and n.name.endswith(("attn.abs", "attn.relu", "relu.pos", "relu.neg"))
        )
        calib = x[:200]  # its widths were calibrated here: nothing clips
        out_int, clipped = program.run_int(program.quantize_input(calib), OverflowPolicy.CLIP)
        assert not clipped
        np.testing.assert_allclose(
            program.dequantize_output(out_int), program.fake_forward(calib), atol=1e-9
        )
    assert widths[False] > widths[True] <= 5 + 1  # + 1: a maximum that rounds up


def test_layernorm_and_token_models_fail_with_what_to_do():
    with pytest.raises(ExportError, match="--norm none"):
        export(
            tiny(AttentionKind.INHIBITOR, norm="layernorm"),
            torch.rand(10, 6, 5, dtype=torch.float64),
        )
    tok = Transformer(
        TransformerConfig(seq_len=6, in_features=20, n_outputs=2, input_kind="tokens", norm="none")
    )
    with pytest.raises(ExportError, match="token"):
        export(tok, torch.randint(0, 20, (10, 6)))
    with pytest.raises(ExportError, match="Algorithm 2"):
        export(tiny(AttentionKind.DCT, dct_ideal=True), torch.rand(10, 6, 5, dtype=torch.float64))


def test_inhibitor_program_has_no_encrypted_products_and_dot_product_does():
    x = torch.rand(50, 6, 5, dtype=torch.float64)
    inh = export(tiny(AttentionKind.INHIBITOR), x).graph
    dot = export(tiny(AttentionKind.DOT_PRODUCT), x).graph
    assert not [n for n in inh.nodes.values() if n.op in ("mul", "matmul")]
    assert [n for n in dot.nodes.values() if n.op == "matmul"]
    assert inh.pbs_estimate() < dot.pbs_estimate()


@pytest.fixture(scope="module")
def digits_inhibitor():
    data = load_task("digits")
    cfg = config_for_task(data, attention="inhibitor", d_model=32, n_heads=2, norm="none")
    return data, cfg, train(cfg, data, TrainConfig(epochs=30, lr=3e-3), progress=False)


def test_digits_inhibitor_ptq_6_bits_within_one_point(digits_inhibitor):
    data, _, result = digits_inhibitor
    program = export(result.model, data.x_train[:500], QuantConfig(n_bits=6))
    acc = accuracy(program.forward(data.x_test, OverflowPolicy.CLIP), data.y_test.numpy())
    assert result.test_score > 0.9
    assert acc >= result.test_score - 0.01, (acc, result.test_score)
    assert program_summary(program.graph)["fits_tfhe"]


def test_digits_inhibitor_qat_4_bits_within_two_points(digits_inhibitor):
    data, cfg, result = digits_inhibitor
    qat = train(
        cfg,
        data,
        TrainConfig(epochs=15, lr=1e-3),
        progress=False,
        model=prepare_qat(result.model, 4),
    )
    program = export(strip_qat(qat.model), data.x_train[:500], QuantConfig(n_bits=4))
    acc = accuracy(program.forward(data.x_test, OverflowPolicy.CLIP), data.y_test.numpy())
    assert acc >= result.test_score - 0.02, (acc, result.test_score)


def _abs_lookups(program) -> int:
    from quant.ops import op_spec

    return sum(
        op_spec(n.op).pbs_count(n.attrs)
        for n in program.graph.nodes.values()
        if n.op == "lut" and n.name.endswith("attn.abs")
    )


@pytest.mark.parametrize("kind", [AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR])
def test_tied_qk_inhibitor_lowers_the_pairs_only_and_equals_its_twin_and_the_float_model(kind):
    """K = Q: the program reads |q_i − q_j| for the T(T − 1)/2 pairs (not T²), mirrors them by a
    clear matrix, and still equals its fake-quantized twin at 6 bits and the float model (Eq. 5
    with K = Q computed by torch) at 16 bits."""
    torch.manual_seed(1)
    tied, untied = tiny(kind, tie_qk=True), tiny(kind)
    assert tied.blocks[0].mixer.k_proj is tied.blocks[0].mixer.q_proj
    x = torch.rand(300, 6, 5, dtype=torch.float64)
    nh, T, dh = 2, 6, 4
    low = {m: export(m, x[:250], QuantConfig(n_bits=6)) for m in (tied, untied)}
    assert _abs_lookups(low[tied]) == nh * T * (T - 1) // 2 * dh
    assert _abs_lookups(low[untied]) == nh * T * T * dh
    assert not any(n.startswith("block0.mix.k") for n in low[tied].graph.nodes)  # no K at all
    assert "block0.mix.k.out" in low[untied].graph.nodes
    held_out = x[250:]
    out_int, clipped = low[tied].run_int(low[tied].quantize_input(held_out), OverflowPolicy.CLIP)
    ok = np.isclose(low[tied].dequantize_output(out_int), low[tied].fake_forward(held_out)).all(-1)
    assert ok.mean() > 0.9 and (ok.all() or clipped)  # differences only where a width clipped
    program = export(tied, x[:250], QuantConfig(n_bits=16, weight_bits=14))
    with torch.no_grad():
        ref = tied(held_out).numpy()
    got = program.forward(held_out, OverflowPolicy.CLIP)
    assert np.abs(got - ref).max() < 0.02 * np.abs(ref).max() + 1e-3


def test_tied_qk_is_an_inhibitor_option_and_survives_qat_and_checkpoints(tmp_path):
    from models.training import load_checkpoint, save_checkpoint

    with pytest.raises(ValueError, match="Inhibitor option"):
        tiny(AttentionKind.DOT_PRODUCT, tie_qk=True)
    model = tiny(AttentionKind.INHIBITOR, tie_qk=True).float()
    for m in (prepare_qat(model, 6), strip_qat(prepare_qat(model, 6))):
        mixer = m.blocks[0].mixer
        assert mixer.k_proj is mixer.q_proj  # one module under both names, after replacement too
    save_checkpoint(tmp_path / "m.pt", model)
    loaded = load_checkpoint(tmp_path / "m.pt").model
    assert loaded.config.tie_qk and loaded.blocks[0].mixer.k_proj is loaded.blocks[0].mixer.q_proj
    x = torch.rand(4, 6, 5)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))


def test_client_pooling_outputs_per_token_logits_whose_sum_is_the_pooled_program():
    """Mean pooling and the head are linear: the program can output W h_t + b per token and the
    client sums the decrypted values. Same logits as the server-pooled program (up to the bias's
    rounding on a finer grid), the twin's exactly; the output is narrower."""
    torch.manual_seed(2)
    model = tiny(AttentionKind.INHIBITOR)
    x = torch.rand(260, 6, 5, dtype=torch.float64)
    server = export(model, x[:200], QuantConfig(n_bits=6))
    client = export(model, x[:200], QuantConfig(n_bits=6, client_pooling=True))
    calib = x[:200]  # calibrated here: nothing clips
    y_server, _ = server.run_int(server.quantize_input(calib), OverflowPolicy.CLIP)
    y_client, clipped = client.run_int(client.quantize_input(calib), OverflowPolicy.CLIP)
    assert not clipped and y_server.shape == (200, 3) and y_client.shape == (200, 6, 3)
    got = client.dequantize_output(y_client)
    np.testing.assert_allclose(got, client.fake_forward(calib), atol=1e-9)
    pooled = server.dequantize_output(y_server)
    np.testing.assert_allclose(got, pooled, atol=2 * client.output_scale)
    server_bits, client_bits = (p.graph.nodes[p.graph.output_name].bits for p in (server, client))
    assert client_bits < server_bits


@pytest.mark.parametrize("kind", [AttentionKind.INHIBITOR, AttentionKind.ACTIVATOR])
def test_folding_the_last_residual_into_the_head_equals_its_twin_and_the_float_model(kind):
    """W_h (h + W₂a + b₂) + b_h as two linear layers on one grid: no second-residual lookups in the
    last block (the first keeps its own), and the integer program equals its twin at 6 bits and
    tracks the float model at 16."""
    torch.manual_seed(3)
    model = tiny(kind, n_layers=2)
    x = torch.rand(300, 6, 5, dtype=torch.float64)
    folded = QuantConfig(n_bits=6, client_pooling=True, fold_last_residual=True)
    program = export(model, x[:250], folded)
    assert "block1.res2.out" not in program.graph.nodes and "block0.res2.out" in program.graph.nodes
    assert "block1.res2.out" in export(model, x[:250], QuantConfig(n_bits=6)).graph.nodes
    calib = x[:250]
    out_int, clipped = program.run_int(program.quantize_input(calib), OverflowPolicy.CLIP)
    assert not clipped
    np.testing.assert_allclose(
        program.dequantize_output(out_int), program.fake_forward(calib), atol=1e-9
    )
    wide = export(model, x[:250], folded.replace(n_bits=16, weight_bits=14))
    with torch.no_grad():
        ref = model(x[250:]).numpy()
    got = wide.forward(x[250:], OverflowPolicy.CLIP)
    assert np.abs(got - ref).max() < 0.02 * np.abs(ref).max() + 1e-3
    with pytest.raises(ValueError, match="needs client_pooling"):
        QuantConfig(fold_last_residual=True)


def test_attention_lut_bits_round_the_qkv_lookups_further_and_the_program_equals_its_twin():
    """The Q/K/V requantisations read attention_lut_bits (4), every other lookup lut_bits (5)."""
    torch.manual_seed(4)
    model = tiny(AttentionKind.INHIBITOR)
    x = torch.rand(250, 6, 5, dtype=torch.float64)
    cfg = QuantConfig(n_bits=6, weight_bits=4, attention_bits=3, lut_bits=5, attention_lut_bits=4)
    program = export(model, x, cfg)
    g = program.graph
    reads = {n.name: n.lut_input_bits(g) for n in g.nodes.values() if n.op == "lut"}
    qkv = {k: v for k, v in reads.items() if k.endswith(("mix.q.out", "mix.k.out", "mix.v.out"))}
    assert len(qkv) == 3 and max(qkv.values()) <= 4
    assert max(v for k, v in reads.items() if k not in qkv) == 5
    out_int, clipped = program.run_int(program.quantize_input(x), OverflowPolicy.CLIP)
    assert not clipped
    np.testing.assert_allclose(
        program.dequantize_output(out_int), program.fake_forward(x), atol=1e-9
    )


@pytest.mark.parametrize("tie_qk", [True, False])
def test_the_inhibitor_reading_v_plus_is_the_same_program_one_bit_narrower(tie_qk):
    """(V − Z')⁺ = (V⁺ − Z')⁺ as Z' >= 0 (Eq. 6): with ``inhibitor_positive_v`` the program's
    integer outputs are those of the plain lowering on every input, V⁺ comes from V's own lookup
    (no lookup added) and the T²·d ReLU lookups read one bit less."""
    torch.manual_seed(3)
    model = tiny(AttentionKind.INHIBITOR, tie_qk=tie_qk)
    x = torch.randn(300, 6, 5, dtype=torch.float64)
    plain, narrow = (
        export(model, x[:250], QuantConfig(n_bits=6, attention_bits=3, inhibitor_positive_v=on))
        for on in (False, True)
    )
    held_out = plain.quantize_input(x[250:])
    assert np.array_equal(narrow.quantize_input(x[250:]), held_out)
    a, _ = plain.run_int(held_out, OverflowPolicy.CLIP)
    b, _ = narrow.run_int(held_out, OverflowPolicy.CLIP)
    assert np.array_equal(a, b)

    def relu_input(program):
        (node,) = [n for n in program.graph.nodes.values() if n.name.endswith("attn.relu")]
        return program.graph.nodes[node.inputs[0]]

    # V⁺ and Z' both lie in [0, 3] on 3-bit V's grid: V⁺ − Z' needs 3 bits whatever the inputs;
    # V − Z' reaches −7 (4 bits) when a negative V meets a large Z'
    assert relu_input(narrow).lo >= -3 and relu_input(narrow).bits == 3
    assert relu_input(plain).lo >= -7
    assert relu_input(plain).bits == (3 if tie_qk else 4)  # this seed's calibration reaches −4 tied
    n_luts = [sum(n.op == "lut" for n in p.graph.nodes.values()) for p in (plain, narrow)]
    assert n_luts[1] == n_luts[0] + 1  # V⁺: one more node, fused into V's table by Concrete


@pytest.mark.parametrize("kind", [AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR])
def test_the_inhibitor_means_program_follows_the_float_means_model_folded_or_not(kind):
    """``inhibitor_mean`` without a mask: export folds 1 / T into the output projection
    (models.fold.fold_means); lowering the unfolded model reads the sum on a scale 1 / T finer
    (Lowering.rescaled). Both follow the float means model, not the sums of the same weights."""
    from quant.export import lower_transformer
    from quant.lowering import Lowering

    torch.manual_seed(4)
    model = tiny(kind, inhibitor_mean=True)
    sums = tiny(kind)
    sums.load_state_dict(model.state_dict())
    x = torch.rand(300, 6, 5, dtype=torch.float64)
    config = QuantConfig(n_bits=16, weight_bits=14)
    with torch.no_grad():
        ref, other = model(x[250:]).numpy(), sums(x[250:]).numpy()
        unfolded = lower_transformer(Lowering(config), model, x[250:]).fake.numpy()
    folded = export(model, x[:250], config).forward(x[250:], OverflowPolicy.CLIP)
    for got in (folded, unfolded):
        err = np.abs(got - ref).max()
        assert err < 0.02 * np.abs(ref).max() + 1e-3
        assert err < 0.1 * np.abs(other - ref).max()


@pytest.mark.parametrize("kind", [AttentionKind.DOT_PRODUCT, AttentionKind.POWER_SOFTMAX])
def test_softmax_bits_narrow_the_operands_of_the_encrypted_products(kind):
    """``softmax_bits`` quantizes the numerators, the reciprocal and the probabilities (the
    operands of σ(s)·(1/Σ) and a·V) to its width and no other point; the program still equals its
    fake-quantized twin, and its widest encrypted value narrows."""
    torch.manual_seed(5)
    model = tiny(kind, n_layers=2)
    x = torch.rand(250, 6, 5, dtype=torch.float64)
    wide = export(model, x, QuantConfig(n_bits=6))
    narrow = export(model, x, QuantConfig(n_bits=6, softmax_bits=3))

    def out_bits(program):  # each lookup's calibrated output width
        return {n.name: n.bits for n in program.graph.nodes.values() if n.op == "lut"}

    softmax = {
        f"block{b}.mix.attn.{p}"
        for b in (0, 1)
        for p in ("exp" if kind is AttentionKind.DOT_PRODUCT else "pow", "recip", "probs")
    }
    got, before = out_bits(narrow), out_bits(wide)
    assert softmax <= set(got) and all(got[p] <= 3 < before[p] for p in softmax)
    assert {p: b for p, b in got.items() if p not in softmax} == {
        p: b for p, b in before.items() if p not in softmax
    }
    out_int, clipped = narrow.run_int(narrow.quantize_input(x), OverflowPolicy.CLIP)
    assert not clipped
    np.testing.assert_allclose(narrow.dequantize_output(out_int), narrow.fake_forward(x), atol=1e-9)
    for product in (f"block{b}.mix.attn.{p}" for b in (0, 1) for p in ("norm", "av")):
        assert narrow.graph.nodes[product].bits < wide.graph.nodes[product].bits, product


def test_lut_bits_overrides_narrow_only_the_lookups_they_match():
    """``lut_bits_overrides`` rounds the lookups whose point names match a pattern to their own
    width (here the Inhibitor's z of every block to 3 bits) and every other rounded lookup to
    ``lut_bits`` as before (the exact ones, |q − k| and (v − z)⁺, read what their inputs hold); the
    program still equals its fake-quantized twin."""
    torch.manual_seed(6)
    model = tiny(AttentionKind.INHIBITOR, n_layers=2)
    x = torch.rand(250, 6, 5, dtype=torch.float64)
    base = QuantConfig(n_bits=6, lut_bits=5)
    wide = export(model, x, base)
    narrow = export(model, x, base.replace(lut_bits_overrides={r"block\d+\.mix\.attn\.z$": 3}))

    def reads(program):  # each rounded lookup's input width
        g = program.graph
        return {
            n.name: n.lut_input_bits(g)
            for n in g.nodes.values()
            if n.op == "lut" and n.attrs.get("rounding_bits")
        }

    got, before = reads(narrow), reads(wide)
    z = {"block0.mix.attn.z", "block1.mix.attn.z"}
    assert z <= set(got) and all(got[p] == 3 < before[p] for p in z)
    assert {p: b for p, b in got.items() if p not in z} == {
        p: b for p, b in before.items() if p not in z
    }
    out_int, clipped = narrow.run_int(narrow.quantize_input(x), OverflowPolicy.CLIP)
    assert not clipped
    np.testing.assert_allclose(narrow.dequantize_output(out_int), narrow.fake_forward(x), atol=1e-9)


def test_lut_bits_overrides_are_checked_and_round_trip_through_json():
    cfg = QuantConfig(lut_bits=6, lut_bits_overrides={r"block\d+\.mix\.attn\.z$": 4})
    assert cfg.lut_bits_for("block3.mix.attn.z") == 4
    assert cfg.lut_bits_for("block3.mix.attn.z.mirror") == 6  # the pattern's $ holds
    assert cfg.lut_bits_for("block0.ffn.act", default=5) == 5
    assert QuantConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="needs lut_bits"):
        QuantConfig(lut_bits_overrides={"block0": 4})
    with pytest.raises(ValueError, match=r"lut_bits_overrides\['block0'\] must be in \[2, 16\]"):
        QuantConfig(lut_bits=6, lut_bits_overrides={"block0": 1})
    with pytest.raises(ValueError, match="not a regular expression"):
        QuantConfig(lut_bits=6, lut_bits_overrides={"block(": 4})
