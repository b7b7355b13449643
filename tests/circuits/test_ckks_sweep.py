"""circuits/ckks_sweep.py: the per-kind CKKS rows `fhe report --scheme ckks` prints."""

import json

import pytest

from circuits import ckks_sweep


def test_seal_operation_costs_order_as_expected():
    """Key switching (a rotation, a relinearised product) costs more than a plaintext product,
    measured."""
    costs = ckks_sweep.op_costs(8192, (60, 40, 40, 60))
    assert set(costs) == {"ct_ct_mul", "rotation", "ct_pt_mul", "rescale"}
    assert costs["rotation"] > costs["ct_pt_mul"] > 0 and costs["ct_ct_mul"] > costs["ct_pt_mul"]


@pytest.fixture(scope="module")
def geglu_rows():
    return ckks_sweep.sweep(["geglu-only"], [4], ("batch", "packed"), execute=True)


def test_geglu_rows_in_both_layouts_and_the_packed_run_matches_the_clear_program(geglu_rows):
    batch, packed = geglu_rows
    assert (
        (batch.layout, packed.layout) == ("batch", "packed")
        and not batch.error
        and not packed.error
    )
    assert batch.samples_per_run == batch.poly_modulus_degree // 2 and packed.samples_per_run == 1
    assert batch.rotations == 0 and batch.galois_keys == 0  # samples in slots: no rotation at all
    assert packed.rotations > 0 and packed.galois_keys > 0  # one query: matmuls by rotations
    assert packed.estimated_run_s > 0 and packed.measured_run_s > 0
    assert packed.max_abs_error < 1e-2  # encrypted == clear polynomial program, up to CKKS noise


def test_a_kind_without_a_packed_lowering_gets_a_labelled_row(monkeypatch):
    from fhe.ckks import mixers

    monkeypatch.setattr(mixers.PACKED_LOWERINGS, "entries", {})
    (row,) = ckks_sweep.sweep(["geglu-only"], [4], ("packed",))
    assert row.error and "no packed lowering" in row.error and row.depth is None


def test_written_report_holds_every_row(geglu_rows, tmp_path):
    paths = ckks_sweep.write(geglu_rows, tmp_path, "sweep", "fhe report --scheme ckks")
    table = [
        line for line in paths["md"].read_text().splitlines() if line.startswith("| geglu-only")
    ]
    assert len(table) == len(geglu_rows)
    saved = json.loads(paths["json"].read_text())["reports"]
    assert [r["layout"] for r in saved] == ["batch", "packed"] and saved[1][
        "rotations"
    ] == geglu_rows[1].rotations
    assert paths["png"].stat().st_size > 0
