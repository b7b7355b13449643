"""QAT through the integer program: the twin is differentiable, equals the program's fake forward,
and the exported program reproduces the QAT model's accuracy exactly."""

import numpy as np
import torch

from models import Transformer, TransformerConfig
from models.tasks import load_task
from models.training import TrainConfig, config_for_task, train
from quant import QuantConfig
from quant.config import ATTENTION_POINT, DEFAULT_CALIB_SAMPLES
from quant.export import export
from quant.program_qat import fit_quantizers, program_score, train_program, twin_forward

QUANT = QuantConfig(
    n_bits=4, weight_bits=4, input_bits=4, attention_bits=3, lut_bits=5, range_mode="percentile"
)


def _tiny(norm="none"):
    return (
        Transformer(
            TransformerConfig(
                seq_len=4,
                in_features=5,
                n_outputs=3,
                attention="inhibitor",
                d_model=8,
                n_heads=2,
                norm=norm,
            )
        )
        .double()
        .eval()
    )


def test_twin_forward_equals_the_programs_fake_forward_and_has_gradients():
    model = _tiny()
    x = torch.rand(120, 4, 5, dtype=torch.float64)
    program = export(model, x[:100], QUANT)
    fitted = fit_quantizers(program.model, x[:100], QUANT)
    out = twin_forward(program.model, x[100:], QUANT, fitted)
    np.testing.assert_allclose(
        out.detach().numpy(), program.fake_forward(x[100:]), rtol=1e-9, atol=1e-9
    )
    out.square().sum().backward()
    grads = [p.grad for p in program.model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


def test_quant_config_round_trips_and_names_attention_points():
    assert QuantConfig.from_dict(QUANT.to_dict()) == QUANT
    assert QUANT.bits_for("block0.mix.qk") == 3 and QUANT.bits_for("block3.mix.v.out") == 3
    assert QUANT.bits_for("block0.res1.out") == 4 and QUANT.bits_for("block0.mix.attn.probs") == 4
    assert not ATTENTION_POINT.match("block0.mix.attn.z")


def test_program_qat_recovers_accuracy_and_the_program_reproduces_it():
    data = load_task("digits", patch=4)
    model = train(
        config_for_task(data, attention="inhibitor", d_model=8, n_heads=2, norm="batchnorm"),
        data,
        TrainConfig(epochs=15, lr=3e-3),
        progress=False,
    ).model
    ptq = program_score(export(model, data.x_train[:DEFAULT_CALIB_SAMPLES], QUANT), data)
    qat = train_program(model, data, QUANT, TrainConfig(epochs=10, lr=2e-3), progress=False)
    assert qat.model.config.norm.value == "none"  # BatchNorm folded before training
    # the program exported from the QAT model is the one training saw: same score, recomputed from
    # scratch
    assert (
        program_score(export(qat.model, data.x_train[:DEFAULT_CALIB_SAMPLES], QUANT), data)
        == qat.program_score
    )
    # the twin that training saw computes the program's logits (compared as values: a tie between
    # two equal logits can break either way in float64)
    np.testing.assert_allclose(
        qat.program.fake_forward(data.x_test),
        qat.program.forward(data.x_test, policy="clip"),
        rtol=1e-9,
        atol=1e-9,
    )
    assert qat.program_score > ptq + 0.05, (ptq, qat.program_score)
