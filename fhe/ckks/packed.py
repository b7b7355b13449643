"""The polynomial program in the packed layout: one sample per ciphertext, answers one query.

The same trained program as :mod:`fhe.ckks.program` (same weights, same calibrated approximations),
evaluated on *one* sample whose activations fill the slots of a single ciphertext (layout in
:mod:`fhe.ckks.packing`). Where the batch layout spends one ciphertext per scalar and gets N/2 samples
per run, this one spends a handful of ciphertexts per sample: its latency is that of one query.

Every linear layer is a clear matrix applied by the diagonal method (BSGS rotations); consecutive linear
maps still compose lazily (:class:`~fhe.ckks.affine.Affine` over packed values), so a layer costs one
level only where a product follows. Attention (PowerSoftmax Eq. 7; softmax with exp by polynomial for
dot-product and DCT-Former), with S the stride and T' = pow2(T):

    p_r = q ⊙ rot(k, r·S)          query t beside key (t + r) mod T', r = 0 … T'−1 (rotations, no level)
    s   = Σ_r mask_r ⊙ HeadSum(p_r)   head sums by rotate-and-add; one masked sum puts offset r in block r
    e   = f(s)                       sᵖ or exp(s): one polynomial for all T' offsets at once
    a   = Σ_blocks e (+ ε)           the row sums, by rotate-and-add over blocks
    o   = Σ_blocks (e ⊙ v_all) ⊙ Goldschmidt(a),  v_all: block r = rot(v, r·S)

so the score function, the division and the value product each run once (when the T' blocks do not fit
the slots, offset by offset). The head's matrix runs per position, then a rotate-and-add over positions
is the mean pooling.

The clear run (numpy slot vectors, :class:`~fhe.ckks.arith.ClearArith`) is the planner: depth, every
operation and the set of rotation steps (the Galois keys the server needs) are known before keygen.
"""

from __future__ import annotations

import numpy as np

from fhe.ckks import approx as A
from fhe.ckks.affine import Affine, per_position
from fhe.ckks.arith import Arith, ClearArith, Val
from fhe.ckks.mixers.softmax import dct_matrix
from fhe.ckks.packing import Layout, LinearMap, PVec, Rotations, apply_maps, linear_map, pow2, rotate_and_sum
from fhe.ckks.program import PolynomialError, PolyProgram
from models.config import Activation, AttentionKind, NormKind

PACKED_KINDS = (AttentionKind.POWER_SOFTMAX, AttentionKind.DOT_PRODUCT, AttentionKind.DCT, AttentionKind.ACTIVATOR,
                AttentionKind.GEGLU_ONLY)


def check_packed(program: PolyProgram) -> None:
    """Refuse, with the way out, what the packed layout does not lower yet."""
    cfg = program.config
    if cfg.attention not in PACKED_KINDS:
        raise PolynomialError(f"the packed layout has no lowering for {cfg.attention.value} attention yet "
                              f"(packed: {', '.join(k.value for k in PACKED_KINDS)}); use --layout batch")


def stride_of(program: PolyProgram) -> int:
    """One stride for every activation: the widest channel count, to the next power of two."""
    cfg = program.config
    widths = [cfg.in_features, cfg.d_model, cfg.n_outputs]
    widths += [v.shape[0] for k, v in program.weights.items() if k.endswith(("fc1.weight", "up_value.weight"))]
    return pow2(max(widths))


def min_slots(program: PolyProgram) -> int:
    """Slots one activation block needs (T'·stride); packed attention needs T' blocks (see PackedProgram)."""
    return pow2(program.config.seq_len) * stride_of(program)


class PackedProgram:
    """``program`` on one sample packed into ``n_slots`` slots (N/2)."""

    def __init__(self, program: PolyProgram, n_slots: int) -> None:
        check_packed(program)
        if n_slots < min_slots(program):
            raise ValueError(f"the packed program needs {min_slots(program)} slots, got {n_slots}")
        self.program, self.n_slots = program, n_slots
        cfg = program.config
        self.T, self.stride = cfg.seq_len, stride_of(program)
        self.block = pow2(self.T) * self.stride  # one activation: T' positions of `stride` slots
        # all T' relative offsets of the attention side by side, one block each, when they fit
        self.attention_period = pow2(self.T) * self.block
        self.pack_attention = self.attention_period <= n_slots
        self.input_layout = self.layout(cfg.in_features)
        self.output_layout = Layout(1, cfg.n_outputs, self.stride, self.block)
        self._maps: dict[tuple, LinearMap] = {}
        self._biases: dict[tuple, np.ndarray] = {}  # placed once: encoded plaintexts are cached by identity
        self.plain_cache: dict = {}  # SealArith's encoded plaintexts of this program (see fhe/ckks/seal.py)

    def layout(self, channels: int) -> Layout:
        return Layout(self.T, channels, self.stride, self.block)

    # ------------------------------------------------------------------ client side
    def encode_input(self, x: np.ndarray) -> np.ndarray:
        """One sample (T, F) → its replicated slot vector."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.T, self.program.config.in_features):
            raise ValueError(f"the packed program takes one sample of shape ({self.T}, "
                             f"{self.program.config.in_features}), got {x.shape}")
        return self.input_layout.place(x.reshape(-1), self.n_slots)

    def decode_output(self, slots: np.ndarray) -> np.ndarray:
        return self.output_layout.read(slots)

    # ------------------------------------------------------------------ evaluation
    def forward(self, ar: Arith, x: Val) -> Val:
        """The encoded sample → the logits' slot vector (read with :meth:`decode_output`)."""
        cfg, w, T = self.program.config, self.program.weights, self.T
        rot = Rotations(ar)
        xin = PVec(x, self.input_layout)
        with ar.stage("embed"):
            h = Affine([(xin, per_position(w["embed.weight"], T))],
                       np.tile(w["embed.bias"], T) + w["pos"][:T].reshape(-1))
        for i in range(cfg.n_layers):
            pre, key = f"block{i}", f"blocks.{i}"
            x1 = self._norm(ar, rot, f"{pre}.norm1", f"{key}.norm1", h)
            h = h + self._mixer(ar, rot, pre, f"{key}.mixer", x1)
            if cfg.has_ffn:
                x2 = self._norm(ar, rot, f"{pre}.norm2", f"{key}.norm2", h)
                h = h + self._ffn(ar, rot, f"{pre}.ffn", f"{key}.ffn", x2)
        h = self._norm(ar, rot, "final_norm", "norm", h)
        with ar.stage("head"):
            return self._head(ar, rot, h)

    def clear(self, x: np.ndarray, ar: ClearArith | None = None) -> np.ndarray:
        """The clear packed program, sample by sample: (B, T, F) → (B, n_outputs)."""
        x = np.asarray(x, dtype=np.float64)
        outs = []
        for sample in x.reshape(-1, *x.shape[-2:]):
            a = ar or ClearArith()
            outs.append(self.decode_output(self.forward(a, a.encode(self.encode_input(sample))).data))
        return np.stack(outs)

    # ------------------------------------------------------------------ building blocks
    def _map(self, key: tuple, m: np.ndarray, src: Layout, dst: Layout) -> LinearMap:
        if key not in self._maps:
            self._maps[key] = linear_map(m, src, dst, self.n_slots)
        return self._maps[key]

    def _bias(self, key: tuple, bias: np.ndarray, dst: Layout) -> np.ndarray:
        if key not in self._biases:
            self._biases[key] = dst.place(bias, self.n_slots)
        return self._biases[key]

    def _materialize(self, ar: Arith, rot: Rotations, name: str, aff: Affine, dst: Layout) -> PVec:
        terms = [(x.val, self._map((name, j), m, x.layout, dst)) for j, (x, m) in enumerate(aff.terms)]
        return PVec(apply_maps(ar, terms, self._bias((name,), aff.bias, dst), rot, self.n_slots), dst)

    def _mixer(self, ar: Arith, rot: Rotations, tag: str, key: str, h: Affine) -> Affine:
        if self.program.config.attention in (AttentionKind.ACTIVATOR, AttentionKind.GEGLU_ONLY):
            return self._geglu(ar, rot, f"{tag}.geglu", key, h)
        return self._attention(ar, rot, f"{tag}.attention", key, h)

    def _attention(self, ar: Arith, rot: Rotations, tag: str, key: str, x: Affine) -> Affine:
        """PowerSoftmax (Eq. 7), or softmax with exp by polynomial (dot-product; DCT-Former on its n̄
        compressed positions, D̄ and D̄ᵀ folded into the projections), with Goldschmidt 1/x, as in the batch
        lowerings (fhe/ckks/mixers/).

        Packed attention (when T' blocks fit the slots): the head sums of all T' offsets land in one
        ciphertext, block r holding offset r, so the score function, the denominator (a sum over blocks
        by rotations) and the attention-weighted values each cost one product, not T'."""
        prog, T, S = self.program, self.T, self.stride
        cfg, w = prog.config, prog.weights
        C, H, dh, p = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.power_p
        power = cfg.attention is AttentionKind.POWER_SOFTMAX
        seq = dct_matrix(T, min(cfg.dct_n_bar or max(1, T // 2), T)) if cfg.attention is AttentionKind.DCT \
            else np.eye(T)
        n = seq.shape[0]
        rec = prog.ops[f"{tag}.reciprocal"]
        D = rec["scale"]
        if power:
            cq, shift = 1 / (np.sqrt(dh) * (T * D) ** (1 / p)), 0.0  # 1/√d, Eq. 7's 1/L, Goldschmidt's 1/D
        else:
            exp = prog.ops[f"{tag}.scores.exp"]
            cq, shift = 1 / (np.sqrt(dh) * exp["half"]), -exp["mid"] / exp["half"]  # t = (s − mid)/half
        lay, seq_map = Layout(n, C, S, self.block), np.kron(seq, np.eye(C))

        def proj(name: str, scale: float) -> PVec:
            m = seq_map @ per_position(w[f"{key}.{name}.weight"], T) * scale
            return self._materialize(ar, rot, f"{key}.{name}", x.apply(m, seq_map @ np.tile(w[f"{key}.{name}.bias"],
                                                                                         T) * scale), lay)

        with ar.stage(f"{tag}.qkv"):
            q, k, v = proj("q_proj", cq), proj("k_proj", 1.0), proj("v_proj", 1.0)
        sums = np.kron(np.eye(n * H), np.ones((dh, dh)))  # Σ over a head's channels, broadcast back
        n_blocks = self.block // S  # T' relative positions, padding included
        shifts, packed = range(n_blocks), self.pack_attention
        with ar.stage(f"{tag}.scores"):
            prods = [ar.mul(q.val, kr) for kr in self._shifted(ar, k.val)]  # q_t · k_{(t+r) mod T'}
            if packed and dh == pow2(dh):
                # Σ over each head's channels lands on its first channel (log₂ dh rotations); one masked sum
                # keeps those slots, offset r in block r; broadcasting back to the head is rotations again
                heads = [rotate_and_sum(ar, pr, 1, dh) for pr in prods]
                s = [rotate_and_sum(ar, ar.dot_plain(heads, self._head_masks(n)), -1, dh, self.n_slots)]
            elif packed:  # heads of other widths: the head sums as maps into block r
                dst = [Layout(n, C, S, self.attention_period, offset=r * self.block) for r in shifts]
                s = [apply_maps(ar, [(pr, self._map(("head_sum", r), sums, lay, dst[r]))
                                     for r, pr in zip(shifts, prods, strict=True)], None, rot, self.n_slots)]
            else:
                s = [apply_maps(ar, [(pr, self._map(("head_sum",), sums, lay, lay))], None, rot, self.n_slots)
                     for pr in prods]
            del prods
        with ar.stage(f"{tag}.power" if power else f"{tag}.exp"):
            if power:
                e = [A.power_even(ar, sr, p) for sr in s]  # (s/L')ᵖ / D; a padding key scores 0, adds 0
                pad = 0.0
            else:  # exp(s)/D; a padding key scores s = 0, adding the constant p(t(0))/D to each row sum
                coeffs = tuple(c / D for c in exp["coeffs"])
                e = [A.poly_eval(ar, ar.add_scalar(sr, shift), coeffs) for sr in s]
                pad = (n_blocks - n) * float(np.polynomial.polynomial.polyval(shift, coeffs))
        del s
        with ar.stage(f"{tag}.reciprocal"):
            total = rotate_and_sum(ar, e[0], self.block, n_blocks) if packed else ar.sum(e)
            a = ar.add_scalar(total, (prog._inference_eps() if power else 0.0) / D - pad)
            y = A.goldschmidt_reciprocal(ar, a, rec["iterations"])
        with ar.stage(f"{tag}.values"):
            if packed:  # v_all: block r holds v rotated by r positions (masks: one level, off the critical path)
                v_all = ar.dot_plain(self._shifted(ar, v.val), self._masks(n_blocks))
                num = rotate_and_sum(ar, ar.mul(e[0], v_all), self.block, n_blocks)
            else:
                num = ar.sum([ar.mul(er, vr) for vr, er in zip(self._shifted(ar, v.val), e, strict=True)])
            o = ar.mul(num, y)
        out = per_position(w[f"{key}.out_proj.weight"], T) @ seq_map.T  # D̄ᵀ (DCT-Former), then the projection
        return Affine([(PVec(o, lay), out)], np.tile(w[f"{key}.out_proj.bias"], T))

    def _shifted(self, ar: Arith, x: Val) -> list[Val]:
        """x rotated by r positions, r = 0 … T'−1, as a chain of one-position rotations (one Galois key)."""
        out = [x]
        for _ in range(pow2(self.T) - 1):
            out.append(ar.rotate(out[-1], self.stride))
        return out

    def _head_masks(self, n: int) -> list[np.ndarray]:
        """Mask r: the first channel of every head and real position (n of them), in block r of the
        attention period."""
        if ("head_masks", n) not in self._biases:
            cfg = self.program.config
            first = np.zeros((n, cfg.d_model))
            first[:, ::cfg.d_head] = 1.0
            self._biases[("head_masks", n)] = [
                Layout(n, cfg.d_model, self.stride, self.attention_period, offset=r * self.block)
                .place(first.reshape(-1), self.n_slots) for r in range(self.block // self.stride)]
        return self._biases[("head_masks", n)]

    def _masks(self, n_blocks: int) -> list[np.ndarray]:
        """Block r of the packed-attention period, as 0/1 slot vectors (kept: plaintexts are cached)."""
        if ("masks",) not in self._biases:
            period = self.attention_period
            self._biases[("masks",)] = [np.tile((np.arange(period) // self.block == r).astype(float),
                                                self.n_slots // period) for r in range(n_blocks)]
        return self._biases[("masks",)]

    def _norm(self, ar: Arith, rot: Rotations, tag: str, key: str, h: Affine) -> Affine:
        if self.program.config.norm is NormKind.NONE:
            return h
        w, T = self.program.weights, self.T
        out = self._layernorm(ar, rot, tag, h, self.program.config.d_model)
        return out.apply(np.diag(np.tile(w[f"{key}.weight"], T)), np.tile(w[f"{key}.bias"], T))

    def _layernorm(self, ar: Arith, rot: Rotations, tag: str, h: Affine, width: int, eps: float = 1e-5) -> Affine:
        """(x − μ)/√(σ² + eps) per position, as the batch program: the centring and the variance are
        position-wise maps (2·stride − 1 diagonals), 1/√ by Newton from the calibrated guess."""
        op, T = self.program.ops[f"{tag}.invsqrt"], self.T
        V, lay = op["scale"], self.layout(width)  # z = (σ² + eps)/V lies in (0, 1]
        mean = np.kron(np.eye(T), np.ones((width, width)) / width)
        with ar.stage(tag):
            d = self._materialize(ar, rot, f"{tag}.centre", h.apply(np.eye(T * width) - mean), lay).val
            var = self._map((tag, "variance"), mean / V, lay, lay)
            z = apply_maps(ar, [(ar.square(d), var)], self._bias((tag, "eps"), np.full(T * width, eps / V), lay),
                           rot, self.n_slots)
            normed = ar.mul(d, A.newton_invsqrt(ar, z, tuple(op["guess"]), op["iterations"]))  # (x − μ)·√V/σ
        return Affine([(PVec(normed, lay), np.eye(T * width) / np.sqrt(V))], np.zeros(T * width))

    def _geglu(self, ar: Arith, rot: Rotations, tag: str, key: str, x: Affine) -> Affine:
        """Activator / GEGLU-only unit (Activator paper Eqs. 8-10): down(LN(up₁x) ⊙ LN(GELU(up₂x)))."""
        w, T = self.program.weights, self.T
        hidden = w[f"{key}.up_value.weight"].shape[0]
        lay = self.layout(hidden)
        u = x.apply(per_position(w[f"{key}.up_value.weight"], T), np.tile(w[f"{key}.up_value.bias"], T))
        g = x.apply(per_position(w[f"{key}.up_gate.weight"], T), np.tile(w[f"{key}.up_gate.bias"], T))
        gate = self._activation(ar, rot, f"{tag}.gelu", g, lay, Activation.GELU)
        if self.program.config.norm is NormKind.LAYERNORM:
            u = self._layernorm(ar, rot, f"{tag}.norm_value", u, hidden)
            normed = self._layernorm(ar, rot, f"{tag}.norm_gate", Affine([(gate, np.eye(lay.size))],
                                                                          np.zeros(lay.size)), hidden)
            with ar.stage(f"{tag}.gate"):
                gate = self._materialize(ar, rot, f"{tag}.norm_gate.out", normed, lay)
        with ar.stage(f"{tag}.gate"):
            prod = ar.mul(self._materialize(ar, rot, f"{key}.up_value", u, lay).val, gate.val)
        return Affine([(PVec(prod, lay), per_position(w[f"{key}.down.weight"], T))],
                      np.tile(w[f"{key}.down.bias"], T))

    def _ffn(self, ar: Arith, rot: Rotations, tag: str, key: str, x: Affine) -> Affine:
        w, T, cfg = self.program.weights, self.T, self.program.config
        lay = self.layout(w[f"{key}.fc1.weight"].shape[0])
        u = x.apply(per_position(w[f"{key}.fc1.weight"], T), np.tile(w[f"{key}.fc1.bias"], T))
        act = self._activation(ar, rot, f"{tag}.{cfg.ffn_activation.value}", u, lay, cfg.ffn_activation)
        return Affine([(act, per_position(w[f"{key}.fc2.weight"], T))], np.tile(w[f"{key}.fc2.bias"], T))

    def _activation(self, ar: Arith, rot: Rotations, name: str, u: Affine, lay: Layout, kind: Activation) -> PVec:
        """GELU (x·q(t), Eq. 10) or ReLU (p(t)), t = (u − mid)/half folded into u's matrices."""
        op = self.program.ops[name]
        fit = A.PolyFit(tuple(op["coeffs"]), op["mid"], op["half"], op["max_error"])
        with ar.stage(name):
            t = self._materialize(ar, rot, name, u.apply(np.eye(u.size) / op["half"], -op["mid"] / op["half"]), lay)
            out = A.gelu_eval(ar, t.val, fit) if kind is Activation.GELU else A.poly_eval(ar, t.val, fit.coeffs)
        return PVec(out, lay, clean=lay.size == lay.period)

    def _head(self, ar: Arith, rot: Rotations, h: Affine) -> Val:
        """head(mean over positions of h) = Σ_t (head·W/T) h_t: each position-wise term through the head's
        matrix per position first (it reads the terms' cached baby-step rotations), then one sum over
        the position blocks by rotations."""
        w, T, S = self.program.weights, self.T, self.stride
        cfg = self.program.config
        C, n_out = cfg.d_model, cfg.n_outputs
        head, per_pos = w["head.weight"], Layout(T, n_out, S, self.block)
        local, pooled = [], []
        for j, (x, m) in enumerate(h.terms):
            cin = x.layout.channels
            blk = m[:C, :cin]
            if m.shape == (T * C, T * cin) and np.allclose(m, per_position(blk, T)):
                local.append((x.val, self._map(("head", j), per_position(head @ blk / T, T), x.layout, per_pos)))
            else:  # any other linear map: the head and the mean as one dense map
                pool = np.tile(np.eye(C), T) / T
                pooled.append((x.val, self._map(("head", j), head @ pool @ m, x.layout, self.output_layout)))
        bias = self._bias(("head",), head @ (np.tile(np.eye(C), T) / T) @ h.bias + w["head.bias"], self.output_layout)
        out = rotate_and_sum(ar, apply_maps(ar, local, None, rot, self.n_slots), S, pow2(T)) if local else None
        if pooled:
            rest = apply_maps(ar, pooled, None, rot, self.n_slots)
            out = rest if out is None else ar.add(out, rest)
        return ar.add_plain(out, bias)
