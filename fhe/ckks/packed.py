"""The polynomial program in the packed layout: one sample per ciphertext, answers one query.

The same trained program as :mod:`fhe.ckks.program` (same weights, same calibrated approximations),
evaluated on *one* sample whose activations fill the slots of a single ciphertext (layout in
:mod:`fhe.ckks.packing`). Where the batch layout spends one ciphertext per scalar and gets N/2
samples per run, this one spends a handful of ciphertexts per sample: its latency is that of one
query.

Every linear layer is a clear matrix applied by the diagonal method (BSGS rotations); consecutive
linear maps still compose lazily (:class:`~fhe.ckks.affine.Affine` over packed values), so a layer
costs one level only where a product follows. The token mixers are registered per attention kind in
:mod:`fhe.ckks.mixers` (packed attention of the softmax family in ``packed_softmax``, the Inhibitor
in ``inhibitor``, the GEGLU unit in ``geglu``); this class holds what they share: the layouts, the
linear maps and their cache, the shifted copies and masks of the attention offsets, LayerNorm and
the activations. The head's matrix runs per position, then a rotate-and-add over positions is the
mean pooling.

The clear run (numpy slot vectors, :class:`~fhe.ckks.arith.ClearArith`) is the planner: depth, every
operation and the set of rotation steps (the Galois keys the server needs) are known before keygen.
"""

from __future__ import annotations

import typing
from collections.abc import Callable

import numpy as np

from fhe.ckks import approx as A
from fhe.ckks.affine import Affine, per_position
from fhe.ckks.arith import Arith, ClearArith, Val
from fhe.ckks.mixers import NoPolyLoweringError, packed_mixer
from fhe.ckks.packing import (
    Layout,
    LinearMap,
    PVec,
    Rotations,
    apply_maps,
    linear_map,
    pow2,
    rotate_and_sum,
)
from fhe.ckks.program import PolynomialError, PolyProgram, pool_outputs
from models.config import Activation, NormKind

V = typing.TypeVar("V")


def check_packed(program: PolyProgram) -> None:
    """Refuse, with the way out, a kind without a packed lowering (registered in
    fhe/ckks/mixers/)."""
    try:
        packed_mixer(program.config.attention)
    except NoPolyLoweringError as exc:
        raise PolynomialError(str(exc)) from exc


def stride_of(program: PolyProgram) -> int:
    """One stride for every activation: the widest channel count, to the next power of two."""
    cfg = program.config
    widths = [cfg.in_features, cfg.d_model, cfg.n_outputs + cfg.key_mask_column]
    widths += [
        v.shape[0]
        for k, v in program.weights.items()
        if k.endswith(("fc1.weight", "up_value.weight"))
    ]
    return pow2(max(widths))


def min_slots(program: PolyProgram) -> int:
    """Slots one activation block needs (T'·stride); packed attention needs T' blocks (see
    PackedProgram)."""
    return pow2(program.config.seq_len) * stride_of(program)


class PackedProgram:
    """``program`` on one sample packed into ``n_slots`` slots (N/2); ``compact_residual``: the
    residual stream made one ciphertext at each block's first norm (:meth:`compact`)."""

    def __init__(self, program: PolyProgram, n_slots: int, compact_residual: bool = False) -> None:
        check_packed(program)
        if n_slots < min_slots(program):
            raise ValueError(f"the packed program needs {min_slots(program)} slots, got {n_slots}")
        self.program, self.n_slots = program, n_slots
        self.compact_residual = compact_residual
        cfg = program.config
        self.T, self.stride = cfg.seq_len, stride_of(program)
        self.block = pow2(self.T) * self.stride  # one activation: T' positions of `stride` slots
        # all T' relative offsets of the attention side by side, one block each, when they fit
        self.attention_period = pow2(self.T) * self.block
        self.pack_attention = self.attention_period <= n_slots
        self.input_layout = self.layout(cfg.in_features)
        self.masked = cfg.key_mask_column  # a padded text model: its key mask is the last column
        self.output_layout = (
            Layout(self.T, cfg.n_outputs + 1, self.stride, self.block)  # per position, and m_t
            if self.masked
            else Layout(1, cfg.n_outputs, self.stride, self.block)
        )
        self.key_mask: PVec | None = None  # the running forward's input, when masked
        self._maps: dict[tuple, LinearMap] = {}
        self._vectors: dict[
            tuple, object
        ] = {}  # clear slot vectors, made once: SealArith caches by identity
        # SealArith's encoded plaintexts of this program (see fhe/ckks/seal.py)
        self.plain_cache: dict = {}

    def layout(self, channels: int) -> Layout:
        return Layout(self.T, channels, self.stride, self.block)

    # ------------------------------------------------------------------ client side
    def encode_input(self, x: np.ndarray) -> np.ndarray:
        """One sample (T, F) → its replicated slot vector."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.T, self.program.config.in_features):
            raise ValueError(
                f"the packed program takes one sample of shape ({self.T}, "
                f"{self.program.config.in_features}), got {x.shape}"
            )
        return self.input_layout.place(x.reshape(-1), self.n_slots)

    def decode_output(self, slots: np.ndarray) -> np.ndarray:
        """The logits (a padded text model's per-position logits, pooled over its words)."""
        return pool_outputs(self.program.config, self.output_layout.read(slots))

    # ------------------------------------------------------------------ evaluation
    def forward(self, ar: Arith, x: Val) -> Val:
        """The encoded sample → the logits' slot vector (read with :meth:`decode_output`)."""
        cfg, w, T = self.program.config, self.program.weights, self.T
        rot = Rotations(ar)
        xin = PVec(x, self.input_layout)
        self.key_mask = xin if self.masked else None
        with ar.stage("embed"):
            h = Affine(
                [(xin, per_position(w["embed.weight"], T))],
                np.tile(w["embed.bias"], T) + w["pos"][:T].reshape(-1),
            )
        for i in range(cfg.n_layers):
            pre, key = f"block{i}", f"blocks.{i}"
            h = self.compact(ar, rot, f"{pre}.norm1", h)
            x1 = self._norm(ar, rot, f"{pre}.norm1", f"{key}.norm1", h)
            h = h + packed_mixer(cfg.attention)(self, ar, rot, pre, f"{key}.mixer", x1)
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
            outs.append(
                self.decode_output(self.forward(a, a.encode(self.encode_input(sample))).data)
            )
        return np.stack(outs)

    # ------------------------------------------------------------------ building blocks
    def map_of(self, key: tuple, m: np.ndarray, src: Layout, dst: Layout) -> LinearMap:
        if key not in self._maps:
            self._maps[key] = linear_map(m, src, dst, self.n_slots)
        return self._maps[key]

    def placed(self, key: tuple, values: np.ndarray, dst: Layout) -> np.ndarray:
        """``values`` placed in layout ``dst``, once per key (encoded plaintexts are cached by
        identity)."""
        return self.cached(key, lambda: dst.place(values, self.n_slots))

    def cached(self, key: tuple, make: Callable[[], V]) -> V:
        """A clear slot vector (or a list of them) of this program, made once per key."""
        if key not in self._vectors:
            self._vectors[key] = make()
        return typing.cast(V, self._vectors[key])

    def materialize(self, ar: Arith, rot: Rotations, name: str, aff: Affine, dst: Layout) -> PVec:
        terms = [
            (x.val, self.map_of((name, j), m, x.layout, dst)) for j, (x, m) in enumerate(aff.terms)
        ]
        return PVec(
            apply_maps(ar, terms, self.placed((name,), aff.bias, dst), rot, self.n_slots), dst
        )

    def compact(self, ar: Arith, rot: Rotations, tag: str, h: Affine) -> Affine:
        """The residual stream ``h`` as one ciphertext, made as the norm's stage ``tag`` begins
        (the norm then reads it): with ``compact_residual``, a norm, and more than one term in
        ``h``; else ``h``.

        Left lazy, ``h`` keeps every term since the input (each block's mixer and FFN outputs,
        the fresh query at the chain's top) with its baby-step rotations for the whole run, and
        every norm multiplies each of them again: the server's memory and its products grow with
        the blocks. Made here, the stream costs one level, and a bootstrapping engine's norm
        renews it where the norm's input would be renewed anyway: one bootstrap then serves the
        norm and every later read of the stream. On issue 28's models the planner placed as many
        bootstraps as with the lazy stream; made after the norm had read the lazy terms instead
        (no level on one chain), the 4-block model needed 2 more. On one chain it is a level per
        block, so only the bootstrapping engine's plan asks for it. A model without a norm reads
        ``h`` directly: left lazy."""
        lazy = not self.compact_residual or self.program.config.norm is NormKind.NONE
        if lazy or len(h.terms) < 2:
            return h
        with ar.stage(tag):
            made = self.materialize(ar, rot, f"{tag}.residual", h, self.layout(h.size // self.T))
        rot.forget(x.val for x, _ in h.terms)
        return Affine([(made, np.eye(h.size))], np.zeros(h.size))

    def shifted(self, ar: Arith, x: Val, levels: int = 1) -> list[Val]:
        """x rotated by r positions, r = 0 … T'−1, as a chain of one-position rotations (one Galois
        key); ``levels``: the products each copy takes next (:meth:`Arith.before_fanout`)."""
        out = [ar.before_fanout(x, levels)]
        for _ in range(pow2(self.T) - 1):
            out.append(ar.rotate(out[-1], self.stride))
        return out

    def head_masks(self, n: int, causal: bool = False) -> list[np.ndarray]:
        """Mask r: the first channel of every head and real position (n of them), in block r of the
        attention period; ``causal``: only the queries t whose key (t + r) mod T' is <= t (Eq. 11's
        mask folded into this one, no extra level)."""
        cfg = self.program.config

        def make() -> list[np.ndarray]:
            masks = []
            for r in range(self.block // self.stride):
                first = np.zeros((n, cfg.d_model))
                first[:, :: cfg.d_head] = self.causal_keep(n, r)[:, None] if causal else 1.0
                masks.append(
                    Layout(
                        n, cfg.d_model, self.stride, self.attention_period, offset=r * self.block
                    ).place(first.reshape(-1), self.n_slots)
                )
            return masks

        return self.cached(("head_masks", n, causal), make)

    def causal_keep(self, n: int, r: int) -> np.ndarray:
        """(n,) 0/1: whether query t keeps its key at offset r, (t + r) mod T' <= t (Eq. 11)."""
        t = np.arange(n)
        return ((t + r) % pow2(self.T) <= t).astype(np.float64)

    def pair_keep(self, ar: Arith, rot: Rotations, tag: str) -> list | None:
        """What removes the masked (query, key) pairs of an attention that cannot fold its masks
        into a score (the Inhibitor's ReLU, softmax's exp): per offset group (one when every offset
        is packed in one ciphertext, else one per offset r), a multiplier of the per-pair values:
        at the C channels of query t in block r, [key (t + r) mod T' kept], times the client's
        encrypted key mask m there for a padded model (one ciphertext, one level), else the public
        causal mask (a plaintext, Eq. 11). Padding offsets (keys beyond T) get 0. None: nothing to
        remove."""
        cfg = self.program.config
        T, C, S, n_blocks = self.T, cfg.d_model, self.stride, self.block // self.stride
        if not cfg.causal and self.key_mask is None:
            return None
        lay = self.layout(C)

        def kept(r: int) -> np.ndarray:  # (T·C,): query t keeps its key at offset r
            causal = self.causal_keep(T, r) if cfg.causal else np.ones(T)
            real_key = ((np.arange(T) + r) % pow2(T) < T).astype(np.float64)
            return np.repeat(causal * real_key, C)

        if self.pack_attention:
            blocks = [
                Layout(T, C, S, self.attention_period, offset=r * self.block)
                for r in range(n_blocks)
            ]
            plains = [self.placed(("keep", tag, r), kept(r), b) for r, b in enumerate(blocks)]
        else:
            plains = [self.placed(("keep", tag, r), kept(r), lay) for r in range(n_blocks)]
        if self.key_mask is None:
            return [sum(plains)] if self.pack_attention else plains
        m = self.materialize(ar, rot, "key_mask", self.mask_of(np.eye(T), C), lay)
        shifted = self.shifted(ar, m.val)  # m_{(t + r) mod T'} beside query t
        if self.pack_attention:
            return [ar.dot_plain(shifted, plains)]
        return [ar.dot_plain([s], [pl]) for s, pl in zip(shifted, plains, strict=True)]

    @staticmethod
    def apply_keep(ar: Arith, values: list[Val], keep: list | None) -> list[Val]:
        """``values`` (one per offset group) times :meth:`pair_keep`'s multipliers."""
        if keep is None:
            return values
        return [
            ar.dot_plain([v], [k]) if isinstance(k, np.ndarray) else ar.mul(v, k)
            for v, k in zip(values, keep, strict=True)
        ]

    def block_masks(self, n_blocks: int) -> list[np.ndarray]:
        """Block r of the packed-attention period, as 0/1 slot vectors."""
        period = self.attention_period
        return self.cached(
            ("masks", n_blocks),
            lambda: [
                np.tile(
                    (np.arange(period) // self.block == r).astype(float), self.n_slots // period
                )
                for r in range(n_blocks)
            ],
        )

    def _norm(self, ar: Arith, rot: Rotations, tag: str, key: str, h: Affine) -> Affine:
        if self.program.config.norm is NormKind.NONE:
            return h
        w, T = self.program.weights, self.T
        out = self.layernorm(ar, rot, tag, h, self.program.config.d_model)
        return out.apply(np.diag(np.tile(w[f"{key}.weight"], T)), np.tile(w[f"{key}.bias"], T))

    def layernorm(
        self, ar: Arith, rot: Rotations, tag: str, h: Affine, width: int, eps: float = 1e-5
    ) -> Affine:
        """(x − μ)/√(σ² + eps) per position, as the batch program: the centring and the variance are
        position-wise maps (2·stride − 1 diagonals), 1/√ by the plan's cubic (at most) or by
        Newton-type steps from the calibrated guess. The variance z is never made on its own:
        every c·z + b the approximation takes (the cubic's coefficients, Newton's guess and each
        step's −b·z) is a variance map of d² with c in its weights, at z's level: one level fewer
        per norm with Newton (:func:`fhe.ckks.approx.newton_invsqrt_affine`), two with the cubic
        (:meth:`scaled_invsqrt`)."""
        op, T = self.program.ops[f"{tag}.invsqrt"], self.T
        V, lay = op["scale"], self.layout(width)  # z = (σ² + eps)/V lies in (0, 1]
        mean = np.kron(np.eye(T), np.ones((width, width)) / width)
        with ar.stage(tag):
            d = self.materialize(
                ar, rot, f"{tag}.centre", h.apply(np.eye(T * width) - mean), lay
            ).val
            squares = ar.square(d)
            made: dict[tuple[float, float], Val] = {}

            def z(c: float, b: float) -> Val:  # c·z + b = (c/V)·mean(d²) + c·eps/V + b, made once
                if (c, b) not in made:
                    made[c, b] = apply_maps(
                        ar,
                        [(squares, self.map_of((tag, "variance", c), c * mean / V, lay, lay))],
                        self.placed((tag, "eps", c, b), np.full(T * width, c * eps / V + b), lay),
                        rot,
                        self.n_slots,
                    )
                return made[c, b]

            if "poly" in op:
                normed = self.scaled_invsqrt(ar, d, z, tuple(op["poly"]))
            else:
                y = A.newton_invsqrt_affine(ar, z, tuple(op["guess"]), A.op_steps(op))
                normed = ar.mul(d, y)  # (x − μ)·√V/σ
        return Affine([(PVec(normed, lay), np.eye(T * width) / np.sqrt(V))], np.zeros(T * width))

    @staticmethod
    def scaled_invsqrt(ar: Arith, d: Val, z: A.ZAffine, coeffs: tuple[float, ...]) -> Val:
        """d·p(z) for p = c₀ + c₁z + c₂z² + c₃z³ (degree ≤ 3) as c₀·d + (d·z)·(c₁ + c₂z + c₃z²),
        each cₖ folded into z's map: two levels above z (d·p(z) after p would take three)."""
        c = (*coeffs, 0.0, 0.0, 0.0)[:4]
        if len(coeffs) <= 2:  # d·(c₀ + c₁z): one product
            return ar.mul(d, z(c[1], c[0]))
        q = z(c[2], c[1])  # c₁ + c₂z
        if c[3] != 0:
            q = ar.add(q, ar.mul(z(c[3], 0.0), z(1.0, 0.0)))  # + c₃z²
        return ar.add(ar.lincomb([d], [c[0]]), ar.mul(ar.mul(d, z(1.0, 0.0)), q))

    def _ffn(self, ar: Arith, rot: Rotations, tag: str, key: str, x: Affine) -> Affine:
        w, T, cfg = self.program.weights, self.T, self.program.config
        lay = self.layout(w[f"{key}.fc1.weight"].shape[0])
        u = x.apply(per_position(w[f"{key}.fc1.weight"], T), np.tile(w[f"{key}.fc1.bias"], T))
        act, scale, offset = self.activation(
            ar, rot, f"{tag}.{cfg.ffn_activation.value}", u, lay, cfg.ffn_activation
        )
        w2, b2 = per_position(w[f"{key}.fc2.weight"], T), np.tile(w[f"{key}.fc2.bias"], T)
        return Affine.scaled(act, scale, offset, w2.shape[1]).apply(w2, b2)

    def activation(
        self, ar: Arith, rot: Rotations, name: str, u: Affine, lay: Layout, kind: Activation
    ) -> tuple[PVec, float, float]:
        """The batch program's activation on packed values (:meth:`PolyProgram._activation`): v
        with activation = scale·v + offset, a degree-2 polynomial in its square form."""
        op = self.program.ops[name]
        fit = A.PolyFit(tuple(op["coeffs"]), op["mid"], op["half"], op["max_error"])
        coeffs = A.activation_coeffs(kind, fit)
        square = A.SquareForm.of(coeffs)
        t_map = u.apply(np.eye(u.size) / op["half"], -op["mid"] / op["half"])
        with ar.stage(name):
            if square is None:
                t = self.materialize(ar, rot, name, t_map, lay)
                out = A.poly_eval(ar, t.val, coeffs)
                return PVec(out, lay, clean=lay.size == lay.period), 1.0, 0.0
            s = self.materialize(ar, rot, name, t_map.apply(np.eye(u.size), square.shift), lay)
            return PVec(ar.square(s.val), lay, clean=s.clean), square.scale, square.offset

    def mask_of(self, reach: np.ndarray, channels: int) -> Affine:
        """Σ_j reach[t, j]·m_j at every channel of position t, from the client's key mask
        column."""
        assert self.key_mask is not None
        T = reach.shape[0]
        return Affine([(self.key_mask, self.mask_map(reach, channels))], np.zeros(T * channels))

    def mask_map(self, per_position_of_mask: np.ndarray, channels: int) -> np.ndarray:
        """(T·channels, T·F): a clear map from the input (F columns, the key mask last) that puts
        Σ_j M[t, j] m_j at every channel of position t (``M``: (T, T))."""
        F = self.program.config.in_features
        pick = np.zeros((channels, F))
        pick[:, F - 1] = 1.0
        return np.kron(per_position_of_mask, pick)

    def _head(self, ar: Arith, rot: Rotations, h: Affine) -> Val:
        """head(mean over positions of h) = Σ_t (head·W/T) h_t: each position-wise term through the
        head's matrix per position first (it reads the terms' cached baby-step rotations), then one
        sum over the position blocks by rotations. A padded text model: the head per position and
        the key mask beside it (the client pools over its words)."""
        w, T, S = self.program.weights, self.T, self.stride
        cfg = self.program.config
        C, n_out = cfg.d_model, cfg.n_outputs
        if self.key_mask is not None:
            widen = np.kron(np.eye(T), np.eye(n_out + 1, n_out))  # n_out logits, then a 0 column
            logits = h.apply(
                widen @ per_position(w["head.weight"], T), widen @ np.tile(w["head.bias"], T)
            )
            mask = self.mask_map(np.eye(T), n_out + 1) * np.tile(np.eye(n_out + 1)[-1], T)[:, None]
            aff = logits + Affine([(self.key_mask, mask)], np.zeros(T * (n_out + 1)))
            return self.materialize(ar, rot, "head.masked", aff, self.output_layout).val
        head, per_pos = w["head.weight"], Layout(T, n_out, S, self.block)
        local, pooled = [], []
        for j, (x, m) in enumerate(h.terms):
            cin = x.layout.channels
            blk = m[:C, :cin]
            if m.shape == (T * C, T * cin) and np.allclose(m, per_position(blk, T)):
                local.append(
                    (
                        x.val,
                        self.map_of(
                            ("head", j), per_position(head @ blk / T, T), x.layout, per_pos
                        ),
                    )
                )
            else:  # any other linear map: the head and the mean as one dense map
                pool = np.tile(np.eye(C), T) / T
                pooled.append(
                    (x.val, self.map_of(("head", j), head @ pool @ m, x.layout, self.output_layout))
                )
        bias = self.placed(
            ("head",),
            head @ (np.tile(np.eye(C), T) / T) @ h.bias + w["head.bias"],
            self.output_layout,
        )
        out = (
            rotate_and_sum(ar, apply_maps(ar, local, None, rot, self.n_slots), S, pow2(T))
            if local
            else None
        )
        if pooled:
            rest = apply_maps(ar, pooled, None, rot, self.n_slots)
            out = rest if out is None else ar.add(out, rest)
        assert out is not None, "a head with neither local nor pooled terms"
        return ar.add_plain(out, bias)
