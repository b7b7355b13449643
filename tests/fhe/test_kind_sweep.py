"""Every attention kind x 1-2 layers x two quantizations: Concrete's simulation equals the clear
integer program on every calibration input (the guard `fhe compile` applies, swept; issue 13)."""

import pytest

from fhe.harness import compile_model
from fhe.schemes import TfheParams
from fhe.tfhe.recipe import DEFAULT_QUANT
from models import AttentionKind
from models.tasks import load_task
from models.training import config_for_task
from models.transformer import Transformer
from quant.ops import op_spec

QUANTS = {
    "default": DEFAULT_QUANT,
    "wide": DEFAULT_QUANT.replace(
        n_bits=5, attention_bits=5, weight_bits=4, lut_bits=6, range_mode="minmax"
    ),
}


@pytest.fixture(scope="module")
def digits():
    return load_task("digits", patch=4)


# One layer is enough for the second quantization. By default every kind runs one layer at the
# default
# quantization, and the Inhibitor (the whole-model kind) also two layers and the wide quantization;
# the
# other kinds' extra cases (5-70 s compiles each on 2 cores) run with `-m slow`.
CASES = [
    pytest.param(
        kind,
        layers,
        quant,
        id=f"{kind.value}-{layers}-{quant}",
        marks=[pytest.mark.slow]
        if (layers, quant) != (1, "default") and kind is not AttentionKind.INHIBITOR
        else [],
    )
    for kind in AttentionKind
    for layers in (1, 2)
    for quant in QUANTS
    if not (quant == "wide" and layers == 2)
]


@pytest.mark.parametrize(("kind", "layers", "quant"), CASES)
def test_simulation_equals_clear_program(digits, kind, layers, quant):
    model = Transformer(
        config_for_task(
            digits, attention=kind, d_model=4, n_heads=2, n_layers=layers, norm="batchnorm"
        )
    ).eval()
    q = QUANTS[quant]
    compiled = compile_model(
        model, digits.x_train[:200], TfheParams(quant=q), q, simulate_only=True
    )
    check = compiled.verify(digits.x_train[:200], limit=200)
    assert check.consistent, check.describe()


def test_tied_inhibitor_circuit_simulates_to_the_clear_program(digits):
    """K = Q: the pair-only scores (clear selection and mirror matrices) compile and simulate to
    the clear program, with T(T-1)/2 |q_i - q_j| lookups per head and dimension."""
    model = Transformer(
        config_for_task(
            digits, attention="inhibitor", d_model=4, n_heads=2, norm="batchnorm", tie_qk=True
        )
    ).eval()
    compiled = compile_model(
        model,
        digits.x_train[:200],
        TfheParams(quant=DEFAULT_QUANT),
        DEFAULT_QUANT,
        simulate_only=True,
    )
    check = compiled.verify(digits.x_train[:200], limit=200)
    assert check.consistent, check.describe()
    abs_node = compiled.program.graph.nodes["block0.mix.attn.abs"]
    assert compiled.program.graph.nodes[abs_node.inputs[0]].op == "matmul_left"
    assert op_spec("lut").pbs_count(abs_node.attrs) == 2 * 6 * 2  # heads x pairs x d_head
