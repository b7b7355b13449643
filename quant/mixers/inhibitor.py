"""The Inhibitor (Inhibitor paper Eqs. 5-7) and its signed form, with integer subtraction, |·| and
ReLU lookups only: no ciphertext × ciphertext product."""

from __future__ import annotations

import torch

from models.config import AttentionKind
from quant.lowering import Lowering, QValue
from quant.mixers import register_mixer
from quant.mixers._heads import merge_heads, project_qkv
from quant.quantizer import Quantizer


@register_mixer(AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR)
def lower(low: Lowering, mixer, h: QValue, name: str, cfg) -> tuple[QValue, torch.nn.Linear]:
    heads = project_qkv(
        low, mixer, h, name, cfg, shared_qk=True
    )  # Q and K share one grid: Eq. (5) subtracts them
    out = lower_inhibitor(low, mixer, heads.q, heads.k, heads.v, heads.v_quantizer, f"{name}.attn")
    return merge_heads(low, out, name), mixer.out_proj


def lower_inhibitor(
    low: Lowering, mixer, q: QValue, k: QValue, v: QValue, v_quantizer: Quantizer, name: str
) -> QValue:
    """Inhibitor, Eqs. (5)-(7).

    Z'_ij = (Σ_k |Q_ik − K_jk| / γ − α)⁺ is requantized directly onto V's scale and saturated at
    max|V|: any larger score already inhibits every value completely, so saturation is exact.
    """
    tag_s, tag_h = f"{name}.scores", f"{name}.inhibit"
    diff = low.sub(
        low.expand_dims(q, -2, f"{name}.q.e"),
        low.expand_dims(k, -3, f"{name}.k.e"),
        f"{name}.diff",
        tag_s,
    )  # (nh, T, T, dh)
    rounding = low.config.round_attention  # round |q − k| and (v − z)⁺ to lut_bits too
    dist = low.sum(
        low.lut_exact(diff, torch.abs, f"{name}.abs", tag_s, rounding), -1, f"{name}.l1", tag_s
    )  # Eq. (5)
    z_q = Quantizer(v_quantizer.scale, 0, v_quantizer.n_bits - 1, False)  # [0, max|V|] on V's grid
    gamma, alpha = mixer.gamma, mixer.alpha
    z = low.lut(
        dist, lambda t: torch.relu(t / gamma - alpha), f"{name}.z", tag_s, quantizer=z_q
    )  # Z'
    z = low.expand_dims(z, -1, f"{name}.z.e")  # (nh, T, T, 1)
    if not mixer.signed:
        t = low.sub(low.expand_dims(v, -3, f"{name}.v.e"), z, f"{name}.vz", tag_h)  # V_jk − Z'_ij
        t = low.lut_exact(t, torch.relu, f"{name}.relu", tag_h, rounding)  # Eq. (6)
        return low.sum(t, -2, f"{name}.h", tag_h)
    v_pos = low.lut_exact(v, torch.relu, f"{name}.v.pos", tag_h)  # V⁺
    v_neg = low.sub(v, v_pos, f"{name}.v.neg", tag_h)  # V⁻ = V − V⁺, free
    pos = low.sub(low.expand_dims(v_pos, -3, f"{name}.vp.e"), z, f"{name}.vpz", tag_h)
    pos = low.lut_exact(pos, torch.relu, f"{name}.relu.pos", tag_h, rounding)  # (V⁺ − Z')⁺
    neg = low.add(low.expand_dims(v_neg, -3, f"{name}.vn.e"), z, f"{name}.vnz", tag_h)
    neg = low.lut_exact(
        neg, lambda t: torch.clamp(t, max=0), f"{name}.relu.neg", tag_h, rounding
    )  # (V⁻ + Z')⁻
    both = low.add(pos, neg, f"{name}.pn", tag_h)
    return low.sum(both, -2, f"{name}.h", tag_h)  # Eq. (7)
