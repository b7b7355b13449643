"""Float calibration: the value range of every tensor crossing a layer boundary of a float model,
attention internals included (scores, PowerSoftmax inputs and denominators, Inhibitor distances,
norm statistics). Both backends use it: TFHE to size integers, CKKS to choose approximation intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from models.attention import functional as AF
from models.attention.dct_former import DCTAttention
from models.attention.inhibitor import InhibitorAttention
from models.attention.power_softmax import PowerSoftmaxAttention
from models.transformer import Transformer


@dataclass(frozen=True)
class TensorRange:
    lo: float
    hi: float

    def union(self, other: TensorRange) -> TensorRange:
        return TensorRange(min(self.lo, other.lo), max(self.hi, other.hi))

    @property
    def absmax(self) -> float:
        return max(abs(self.lo), abs(self.hi))


class Calibration(dict):
    """name -> TensorRange, filled by :func:`calibrate`."""

    def observe(self, name: str, t: Tensor) -> None:
        r = TensorRange(float(t.min()), float(t.max()))
        self[name] = self[name].union(r) if name in self else r


def _attention_internals(cal: Calibration, name: str, mod: nn.Module, x: Tensor) -> None:
    q, k, v = (mod.split(p(x)) for p in (mod.q_proj, mod.k_proj, mod.v_proj))
    if isinstance(mod, InhibitorAttention):
        z = torch.cdist(q.contiguous(), k.contiguous(), p=1) / mod.gamma
        cal.observe(f"{name}.inhibitor.distance", z)
        cal.observe(f"{name}.inhibitor.shifted", torch.relu(z - mod.alpha))
        return
    if isinstance(mod, DCTAttention):
        q, k, v = (AF.dct_ii(t, dim=-2, m=mod.n_bar) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    cal.observe(f"{name}.scores", scores)
    if isinstance(mod, PowerSoftmaxAttention):
        powers = scores.pow(mod.p)
        cal.observe(f"{name}.power", powers)
        cal.observe(f"{name}.power_mean", powers.mean(-1))  # Eq. (7) denominator before ε
    else:
        shifted = scores - scores.amax(-1, keepdim=True)
        cal.observe(f"{name}.exp_input", shifted)
        cal.observe(f"{name}.exp_sum", shifted.exp().sum(-1))


@torch.no_grad()
def calibrate(model: Transformer, x: Tensor, batch_size: int = 256) -> Calibration:
    """Runs ``model`` on calibration inputs and records ranges (hooks on every sub-module)."""
    cal = Calibration()
    hooks = []

    def hook(name):
        def fn(mod, inputs, output):
            if isinstance(output, Tensor):
                cal.observe(f"{name}.out", output)
            if isinstance(mod, nn.LayerNorm):
                xin = inputs[0]
                cal.observe(f"{name}.variance", xin.var(-1, unbiased=False))
                cal.observe(f"{name}.in", xin)
            if hasattr(mod, "q_proj"):
                _attention_internals(cal, name, mod, inputs[0])
        return fn

    for name, mod in model.named_modules():
        if name:
            hooks.append(mod.register_forward_hook(hook(name)))
    try:
        model.eval()
        for i in range(0, len(x), batch_size):
            xb = x[i : i + batch_size]
            cal.observe("input", xb.float())
            model(xb)
    finally:
        for h in hooks:
            h.remove()
    return cal
