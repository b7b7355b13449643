"""DCT-Former (Algorithm 1): softmax attention over a DCT-compressed sequence of n̄ positions."""

from __future__ import annotations

import torch

from models.attention import functional as AF
from models.config import AttentionKind
from quant.lowering import Lowering, QValue
from quant.mixers import NoLoweringError, register_mixer
from quant.mixers._heads import merge_heads, project_qkv
from quant.mixers.softmax import exp_scores, lower_normalized


@register_mixer(AttentionKind.DCT)
def lower(low: Lowering, mixer, h: QValue, name: str, cfg) -> tuple[QValue, torch.nn.Linear]:
    if cfg.dct_ideal:
        raise NoLoweringError(
            "DCT-Former Algorithm 2 ('ideal') is an evaluation device with a full T×T matrix; "
            "export the efficient Algorithm 1 (dct_ideal=False)"
        )
    heads = project_qkv(low, mixer, h, name, cfg)
    out = lower_dct(low, mixer, heads.q, heads.k, heads.v, f"{name}.attn")
    return merge_heads(low, out, name), mixer.out_proj


def lower_dct(low: Lowering, mixer, q: QValue, k: QValue, v: QValue, name: str) -> QValue:
    """DCT-Former Algorithm 1: compress Q, K, V with the clear D̄ (n̄ × T), attend over n̄
    positions, expand with D̄ᵀ. The DCT matrices are clear constants, so both transforms are
    leveled."""
    T = q.shape[-2]
    D = AF.dct_matrix(T, min(mixer.n_bar, T), dtype=torch.float64).numpy()
    qb, kb, vb = (
        low.requant(
            low.matmul_left(D, t, f"{name}.dct.{lbl}", f"{name}.dct"),
            f"{name}.dct.{lbl}.out",
            f"{name}.dct",
            signed=True,
        )
        for t, lbl in ((q, "q"), (k, "k"), (v, "v"))
    )
    a = lower_normalized(low, qb, kb, vb, name, exp_scores())  # (nh, n̄, dh)
    a = low.requant(a, f"{name}.compressed", f"{name}.dct", signed=True)
    return low.matmul_left(D.T.copy(), a, f"{name}.idct", f"{name}.dct")
