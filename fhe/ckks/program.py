"""The polynomial program of a trained model: every operation a CKKS ciphertext supports.

Layout: SIMD over samples. Each scalar of a sample, (position t, channel c), is one value whose
batch axis is the ciphertext's slot axis, so every linear layer is a sum of clear-weighted values
(no rotations, hence no Galois keys) and the same program serves 1 or N/2 samples at once.

Linear maps are kept lazy (:class:`Affine`): consecutive affine maps (embedding, projections, the
residual stream, mean pooling and the head) are composed in the clear and cost one level only when a
non-linear operation needs their value. Clear constants are folded likewise: 1/√d, the
length-agnostic 1/L (PowerSoftmax paper Eq. 7) and the Goldschmidt input scale enter the query
weights, the LayerNorm scale and GELU's interval map enter the producing linear layer.

Approximation intervals come from a calibration pass of this same program with exact non-linear
functions; :meth:`PolyProgram.finalize` turns them into iteration counts and polynomial fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fhe.ckks import approx as A
from fhe.ckks.affine import Affine, per_position
from fhe.ckks.arith import Arith, ClearArith, Val
from fhe.ckks.mixers import NoPolyLoweringError, poly_mixer
from fhe.errors import FheError
from models.config import (
    Activation,
    AttentionKind,
    InputKind,
    NormKind,
    Pooling,
    PowerForm,
    TransformerConfig,
)
from models.pooling import pool_words

if TYPE_CHECKING:  # a server loads a program without torch (building one needs it)
    import torch

    from models.transformer import Transformer


class PolynomialError(FheError):
    """The model has an operation with no polynomial form here; the message names it and the fix."""


@dataclass
class PolyProgram:
    """A trained model as a polynomial program; ``ops`` holds each approximation's settings."""

    config: TransformerConfig
    weights: dict[str, np.ndarray]
    approx: A.ApproxConfig = field(default_factory=A.ApproxConfig)
    ops: dict[str, dict] = field(default_factory=dict)
    calib_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    # the running forward's key mask, one value per position (a padded text model's input column,
    # encrypted): read by the mixers that mask padding keys; None without one
    key_mask: list[Val] | None = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ entry points
    def forward(self, ar: Arith, xs: list[Val]) -> list[Val]:
        """xs: the T·F input values (position-major); returns the n_outputs logits, or for a
        padded text model (``config.key_mask_column``) each position's logits and its key mask,
        T·(n_outputs + 1) values that the client pools (:func:`pool_outputs`)."""
        cfg, w, T = self.config, self.weights, self.config.seq_len
        if len(xs) != T * cfg.in_features:
            raise ValueError(
                f"the program takes {T} positions × {cfg.in_features} features = "
                f"{T * cfg.in_features} input values (ciphertexts), got {len(xs)}"
            )
        F, masked = cfg.in_features, cfg.key_mask_column
        self.key_mask = [xs[t * F + F - 1] for t in range(T)] if masked else None
        with ar.stage("embed"):
            h = Affine(
                [(xs, per_position(w["embed.weight"], T))],
                np.tile(w["embed.bias"], T) + w["pos"][:T].reshape(-1),
            )
        for i in range(cfg.n_layers):
            pre = f"block{i}"
            x1 = self._norm(ar, f"{pre}.norm1", f"blocks.{i}.norm1", h)
            h = h + self._mixer(ar, pre, f"blocks.{i}.mixer", x1)
            if cfg.has_ffn:
                x2 = self._norm(ar, f"{pre}.norm2", f"blocks.{i}.norm2", h)
                h = h + self._ffn(ar, f"{pre}.ffn", f"blocks.{i}.ffn", x2)
        h = self._norm(ar, "final_norm", "norm", h)
        with ar.stage("head"):
            C, n = cfg.d_model, cfg.n_outputs
            if self.key_mask is not None:  # per position, beside the mask: the client pools
                y = h.apply(
                    per_position(w["head.weight"], T), np.tile(w["head.bias"], T)
                ).materialize(ar)
                mask = self.key_mask
                return [v for t in range(T) for v in (*y[t * n : (t + 1) * n], mask[t])]
            pool = np.tile(np.eye(C), T) / T  # mean over positions, (C, T·C)
            return h.apply(w["head.weight"] @ pool, w["head.bias"]).materialize(ar)

    def clear(self, x: np.ndarray, ar: ClearArith | None = None) -> np.ndarray:
        """The clear polynomial program on a float batch (B, T, F) → (B, n_outputs)."""
        ar = ar or ClearArith()
        out = self.forward(ar, encode_clear(ar, x))
        return pool_outputs(self.config, np.stack([v.data for v in out], axis=-1))

    # ------------------------------------------------------------------ calibration
    def _calibrating(self, name: str, ar: Arith) -> bool:
        if name in self.ops:
            return False
        if not isinstance(ar, ClearArith):
            raise PolynomialError(
                f"{name}: no approximation interval was calibrated; build the program with "
                "build_program(model, calibration_inputs) first"
            )
        return True

    def _observe(self, ar: Arith, name: str, vals: list[Val], offset: float = 0.0) -> None:
        """Clear runs record the input range (calibration) and count values outside the interval
        (of the values + ``offset``)."""
        if not isinstance(ar, ClearArith):
            return
        data = np.concatenate([np.ravel(v.data) for v in vals]) + offset
        lo, hi = float(data.min()), float(data.max())
        old = ar.ranges.get(name)
        ar.ranges[name] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
        if name in self.ops:
            ilo, ihi = self.ops[name]["interval"]
            n_out = int(((data < ilo) | (data > ihi)).sum())
            ar.outside[name] = ar.outside.get(name, 0) + n_out
            if n_out and ar.strict:
                raise PolynomialError(
                    f"{name}: {n_out} input values fall outside the interval calibration covered "
                    f"({self.ops[name]['calibrated'][0]:.4g} to "
                    f"{self.ops[name]['calibrated'][1]:.4g} before the {self.approx.margin:.0%} "
                    f"margin), where the {self.ops[name]['kind']} approximation diverges; "
                    "recalibrate on more or more representative samples (--calib) or widen "
                    "--margin"
                )

    def finalize(self, ranges: dict[str, tuple[float, float]]) -> None:
        """Approximation settings from calibrated ranges (each widened by ``approx.margin``)."""
        self.calib_ranges = dict(ranges)
        for name, (lo, hi) in ranges.items():
            try:
                self.ops[name] = self._approximation(name.rsplit(".", 1)[-1], lo, hi)
            except A.ApproximationError as exc:
                raise A.ApproximationError(f"{name}: {exc}") from None

    def _approximation(self, kind: str, lo: float, hi: float) -> dict:
        ap = self.approx
        if kind == "reciprocal":
            return {
                "kind": kind,
                **A.plan_reciprocal(
                    lo, hi, ap.reciprocal_tol, ap.margin, ap.reciprocal_headroom, ap.max_iterations
                ),
            }
        if kind == "invsqrt":
            lo_w, hi_w = A.widen(lo, hi, ap.margin, positive=True)
            common = {
                "kind": kind,
                "calibrated": [lo, hi],
                "scale": hi_w,
                "interval": [lo_w / hi_w, 1.0],
            }
            poly = A.invsqrt_poly(lo_w / hi_w, 1.0, ap.invsqrt_tol)
            if poly is not None:  # a narrow interval: a cubic at most, a level fewer
                coeffs, error = poly
                return {**common, "poly": coeffs, "degree": len(coeffs) - 1, "max_error": error}
            guess, steps = A.invsqrt_plan(lo_w / hi_w, 1.0, ap.invsqrt_tol, ap.max_iterations)
            return {**common, "iterations": len(steps), "guess": guess, "steps": steps}
        lo_w, hi_w = A.widen(lo, hi, ap.margin)
        fitter = {
            "gelu": A.gelu_fit,
            "relu": A.relu_fit,
            "quad": A.quad_fit,
            "abs": A.abs_fit,
            "inhibit": A.inhibit_fit,
            "exp": A.exp_fit,
        }[kind]
        fit = fitter(lo_w, hi_w, ap.activation_tol, ap.max_degree)
        return {
            "kind": kind,
            "calibrated": [lo, hi],
            "interval": [-1.0, 1.0],
            "coeffs": list(fit.coeffs),
            "mid": fit.mid,
            "half": fit.half,
            "degree": fit.degree,
            "max_error": fit.max_error,
        }

    # ------------------------------------------------------------------ layers
    def _norm(self, ar: Arith, tag: str, key: str, h: Affine) -> Affine:
        if self.config.norm is NormKind.NONE:
            return h
        w = self.weights
        T = self.config.seq_len
        out = self._layernorm(ar, tag, h, self.config.d_model)
        gamma, beta = np.tile(w[f"{key}.weight"], T), np.tile(w[f"{key}.bias"], T)
        return out.apply(np.diag(gamma), beta)

    def _layernorm(self, ar: Arith, tag: str, h: Affine, width: int, eps: float = 1e-5) -> Affine:
        """(x − μ)/√(σ² + eps) per position; 1/√ by a polynomial of degree ≤ 3 where one meets the
        tolerance on the calibrated variance interval, else by Newton-type steps. The centring is a
        clear linear map folded into ``h``, scaled by s = 1/√(width·V) so that z = Σ d² + eps/V
        needs no product of its own: d at one level, z at two."""
        name = f"{tag}.invsqrt"
        calibrating = self._calibrating(name, ar)
        op = self.ops.get(name, {})
        V = op.get("scale", 1.0)  # variance scale: z = (σ² + eps)/V lies in (0, 1]
        T = h.size // width
        s = 1 / math.sqrt(width * V)
        centre = np.kron(np.eye(T), s * (np.eye(width) - np.full((width, width), 1 / width)))
        with ar.stage(tag):
            d = h.apply(centre).materialize(ar)  # s·(x − μ)
            normed: list[Val] = []
            for t in range(T):
                dt = d[t * width : (t + 1) * width]
                z = ar.add_scalar(ar.sum([ar.square(dc) for dc in dt]), eps / V)
                self._observe(ar, name, [z])
                if calibrating:
                    y = Val(1 / np.sqrt(z.data), z.level)
                elif "poly" in op:
                    y = A.poly_eval(ar, z, tuple(op["poly"]))
                else:
                    y = A.newton_invsqrt(ar, z, tuple(op["guess"]), A.op_steps(op))
                normed += [ar.mul(dc, y) for dc in dt]  # s·(x − μ)·√V/σ
        return Affine([(normed, np.eye(len(normed)) / (s * math.sqrt(V)))], np.zeros(len(normed)))

    def _mixer(self, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
        """The token mixer, by the polynomial lowering registered for the model's kind
        (fhe/ckks/mixers/)."""
        return poly_mixer(self.config.attention)(self, ar, tag, key, x)

    def _inference_eps(self) -> float:
        """ε of the inference form (see PowerSoftmaxAttention.inference_eps)."""
        return self.config.power_eps if self.config.power_form is PowerForm.LENGTH_AGNOSTIC else 0.0

    def _ffn(self, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
        w, T = self.weights, self.config.seq_len
        u = x.apply(per_position(w[f"{key}.fc1.weight"], T), np.tile(w[f"{key}.fc1.bias"], T))
        act, scale, offset = self._activation(
            ar, f"{tag}.{self.config.ffn_activation.value}", u, self.config.ffn_activation
        )
        w2, b2 = per_position(w[f"{key}.fc2.weight"], T), np.tile(w[f"{key}.fc2.bias"], T)
        return Affine.scaled(act, scale, offset, w2.shape[1]).apply(w2, b2)

    def approximate(
        self, ar: Arith, name: str, t: list[Val], exact, scale: float = 1.0
    ) -> list[Val]:
        """``scale`` × the approximation ``name`` of values t already mapped to [−1, 1] by its
        mid/half (the caller folds the map into a linear layer): the exact function while
        calibrating."""
        calibrating = self._calibrating(name, ar)
        self._observe(
            ar, name, t
        )  # calibration: the raw range (identity map); later: t against [−1, 1]
        if calibrating:
            return [Val(scale * exact(ti.data), ti.level) for ti in t]
        coeffs = tuple(scale * c for c in self.ops[name]["coeffs"])
        return [A.poly_eval(ar, ti, coeffs) for ti in t]

    def fit_map(self, name: str) -> tuple[float, float]:
        """(mid, half) of an approximation's interval: t = (x − mid)/half (identity while
        calibrating)."""
        op = self.ops.get(name)
        return (op["mid"], op["half"]) if op else (0.0, 1.0)

    def _activation(
        self, ar: Arith, name: str, u: Affine, kind: Activation
    ) -> tuple[list[Val], float, float]:
        """GELU (x·q(t), Eq. 10), ReLU or quad as p(t), t = (u − mid)/half folded into u's weights:
        values v with activation = scale·v + offset, the scale and offset left to the next linear
        layer (a degree-2 p in its square form, :class:`~fhe.ckks.approx.SquareForm`)."""
        calibrating = self._calibrating(name, ar)
        op = self.ops.get(name, {"mid": 0.0, "half": 1.0})
        t_map = u.apply(np.eye(u.size) / op["half"], -op["mid"] / op["half"])
        with ar.stage(name):
            if calibrating:
                t = t_map.materialize(ar)
                self._observe(ar, name, t)
                return [Val(A.activation_exact(kind)(ti.data), ti.level) for ti in t], 1.0, 0.0
            fit = A.PolyFit(tuple(op["coeffs"]), op["mid"], op["half"], op["max_error"])
            coeffs = A.activation_coeffs(kind, fit)
            square = A.SquareForm.of(coeffs)
            if square is None:
                t = t_map.materialize(ar)
                self._observe(ar, name, t)
                return [A.poly_eval(ar, ti, coeffs) for ti in t], 1.0, 0.0
            s = t_map.apply(np.eye(u.size), square.shift).materialize(ar)
            self._observe(ar, name, s, offset=-square.shift)
            return [ar.square(si) for si in s], square.scale, square.offset


def pool_outputs(config: TransformerConfig, y: np.ndarray) -> np.ndarray:
    """The client's last step on decrypted outputs: for a padded text model, (…, T·(n + 1)) per
    position logits and mask → (…, n), pooled over the words as the float model pools them (the
    masked mean, or a next-word model's last word; the server never learns how many words there
    are); else ``y`` unchanged."""
    if not config.key_mask_column:
        return y
    return pool_positions(y, config.seq_len, config.n_outputs, config.pooling)


def pool_positions(
    y: np.ndarray, seq_len: int, n_outputs: int, pooling: Pooling | str = Pooling.MEAN
) -> np.ndarray:
    """(…, T·(n + 1)) per-position logits and key mask → (…, n), pooled over the words."""
    y = np.asarray(y, dtype=np.float64)
    per = y.reshape(*y.shape[:-1], seq_len, n_outputs + 1)
    return pool_words(per[..., :-1], np.round(per[..., -1:]), pooling)  # m: 0 or 1, up to noise


def encode_clear(ar: ClearArith, x: np.ndarray | torch.Tensor) -> list[Val]:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"expected inputs of shape (batch, seq_len, features), got {x.shape}")
    B, T, F = x.shape
    return [ar.encode(x[:, t, f]) for t in range(T) for f in range(F)]


# the kinds whose lowerings take causal and key-padding masks (Eq. 11); the token-local kinds have
# no scores to mask
MASKED_KINDS = frozenset(
    {
        AttentionKind.POWER_SOFTMAX,
        AttentionKind.DOT_PRODUCT,
        AttentionKind.INHIBITOR,
        AttentionKind.SIGNED_INHIBITOR,
    }
)
TOKEN_LOCAL_KINDS = frozenset({AttentionKind.ACTIVATOR, AttentionKind.GEGLU_ONLY})


def _names(kinds: frozenset[AttentionKind]) -> str:
    return ", ".join(sorted(k.value for k in kinds))


def check_model(config: TransformerConfig) -> None:
    if config.input_kind is InputKind.TOKENS:
        raise PolynomialError(
            "token-id inputs: the embedding lookup has no polynomial form, so the client embeds "
            "its words; split the model first (models.text.split_text_model; `fhe compile` does "
            "it for models trained with --words)"
        )
    if config.key_mask_column and config.attention not in MASKED_KINDS | TOKEN_LOCAL_KINDS:
        raise PolynomialError(
            f"this text model attends over padded word positions: its encrypted key-padding mask "
            f"has a polynomial lowering for {_names(MASKED_KINDS)} (and the token-local kinds), "
            f"not for {config.attention.value}; use --scheme tfhe, or train with --words N (N "
            "words pooled into --seq-len segments on the client: no padding, no mask)"
        )
    if config.causal and config.attention not in MASKED_KINDS:
        raise PolynomialError(
            f"causal {config.attention.value} attention has no polynomial lowering (under CKKS "
            f"the causal mask, PowerSoftmax paper Eq. 11, is lowered for {_names(MASKED_KINDS)}); "
            "use --scheme tfhe, or train with one of those"
        )
    try:
        poly_mixer(config.attention)
    except NoPolyLoweringError as exc:
        raise PolynomialError(str(exc)) from exc


def build_program(
    model: Transformer, calib_x: torch.Tensor | np.ndarray, approx: A.ApproxConfig | None = None
) -> PolyProgram:
    """Calibrate ``model``'s polynomial program on ``calib_x`` and fix every approximation (a
    BatchNorm model is compiled with its norms folded into the linear layers: free)."""
    from models.fold import fold_norms

    model = fold_norms(model)
    check_model(model.config)
    weights = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    program = PolyProgram(model.config, weights, approx or A.ApproxConfig())
    ar = ClearArith()
    program.clear(np.asarray(calib_x, dtype=np.float64), ar)
    program.finalize(ar.ranges)
    return program


def float_inference_form(model: Transformer, x: torch.Tensor) -> np.ndarray:
    """The float model in its inference form (length-agnostic PowerSoftmax, Eq. 7): the exact
    function the polynomial program approximates."""
    import torch

    from models.attention.power_softmax import PowerSoftmaxAttention

    mods = [m for m in model.modules() if isinstance(m, PowerSoftmaxAttention)]
    old = [m.inference_form for m in mods]
    try:
        for m in mods:
            m.inference_form = True
        model.eval()
        dtype = next(model.parameters()).dtype
        with torch.no_grad():
            return model(torch.as_tensor(x, dtype=dtype)).double().numpy()
    finally:
        for m, o in zip(mods, old, strict=True):
            m.inference_form = o
