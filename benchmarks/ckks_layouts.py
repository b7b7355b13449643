"""Two CKKS packings of one attention head's first stages, measured in the same run (TenSEAL).

- ``simd``: one ciphertext per (position, channel) scalar, samples in the slots (the backend's
  layout): a linear layer is T·C·C clear-weighted products, scores T·T·d ciphertext products; no
  rotations, no Galois keys; cost per sample = run time / samples packed.
- ``packed``: one sample per ciphertext, vec(X) in the slots. TenSEAL's Python API has no rotation,
  so every cross-slot move is a vector × plain-matrix ``mm`` (rotations inside, Galois keys needed,
  one level each): Q = mm(x), K = mm(x) directly replicated into the (i, j, c) layout, one
  ciphertext product, and a summing ``mm`` over c gives the T·T scores.

Both compute S = (xW_q)(xW_k)ᵀ for a random head and are checked against numpy. Reported: time,
depth (levels used), key sizes, per sample and per batch.

    python benchmarks/ckks_layouts.py --seq-len 8 --d 8 --samples 256
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import command_line, write_results  # noqa: E402
from fhe.ckks.backend import make_context  # noqa: E402


def context(n: int, depth: int, galois: bool):
    return make_context(n, [60] + [40] * depth + [60], 40, galois=galois)


def key_bytes(ctx) -> dict:
    base = len(
        ctx.serialize(
            save_public_key=True,
            save_secret_key=False,
            save_galois_keys=False,
            save_relin_keys=True,
        )
    )
    if not ctx.has_galois_keys():
        return {"public_and_relin": base, "galois": 0}
    return {
        "public_and_relin": base,
        "galois": len(
            ctx.serialize(
                save_public_key=True,
                save_secret_key=False,
                save_galois_keys=True,
                save_relin_keys=True,
            )
        )
        - base,
    }


def simd_scores(ctx, x: np.ndarray, wq: np.ndarray, wk: np.ndarray) -> tuple[np.ndarray, float]:
    import tenseal as ts

    B, T, F = x.shape
    d = wq.shape[1]
    cts = [[ts.ckks_vector(ctx, x[:, t, f].tolist()) for f in range(F)] for t in range(T)]
    start = time.perf_counter()

    def linear(w):
        return [
            [
                sum((cts[t][f] * float(w[f, c]) for f in range(1, F)), cts[t][0] * float(w[0, c]))
                for c in range(d)
            ]
            for t in range(T)
        ]

    q, k = linear(wq), linear(wk)
    s = [
        [sum((q[i][c] * k[j][c] for c in range(1, d)), q[i][0] * k[j][0]) for j in range(T)]
        for i in range(T)
    ]
    elapsed = time.perf_counter() - start
    sk = ctx.secret_key()
    out = np.stack(
        [np.stack([np.asarray(s[i][j].decrypt(sk)) for j in range(T)], -1) for i in range(T)], -2
    )
    return out, elapsed


def packed_scores(
    ctx, x: np.ndarray, wq: np.ndarray, wk: np.ndarray, samples: int
) -> tuple[np.ndarray, float]:
    import tenseal as ts

    B, T, F = x.shape
    d = wq.shape[1]
    # replication maps: vec(x) (T·F) -> (i, j, c) layout (T·T·d) of q_ic and of k_jc
    mq, mk = np.zeros((T * F, T * T * d)), np.zeros((T * F, T * T * d))
    for i in range(T):
        for j in range(T):
            for c in range(d):
                col = (i * T + j) * d + c
                mq[i * F : (i + 1) * F, col] = wq[:, c]
                mk[j * F : (j + 1) * F, col] = wk[:, c]
    msum = np.zeros((T * T * d, T * T))
    for p in range(T * T):
        msum[p * d : (p + 1) * d, p] = 1.0
    outs, start = [], time.perf_counter()
    for b in range(samples):
        v = ts.ckks_vector(ctx, x[b].reshape(-1).tolist())
        prod = v.mm(mq.tolist()) * v.mm(mk.tolist())
        outs.append(prod.mm(msum.tolist()))
    elapsed = time.perf_counter() - start
    sk = ctx.secret_key()
    return np.stack([np.asarray(o.decrypt(sk)).reshape(T, T) for o in outs]), elapsed


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seq-len", type=int, default=8)
    ap.add_argument("--features", type=int, default=8)
    ap.add_argument("--d", type=int, default=8, help="head dimension")
    ap.add_argument("--samples", type=int, default=256, help="samples in the SIMD run")
    ap.add_argument(
        "--packed-samples",
        type=int,
        default=2,
        help="samples timed one by one in the packed layout",
    )
    ap.add_argument("--n", type=int, default=16384, help="poly_modulus_degree for both")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    T, F, d = args.seq_len, args.features, args.d
    x = rng.normal(0, 1, (args.samples, T, F))
    wq, wk = rng.normal(0, 0.3, (F, d)), rng.normal(0, 0.3, (F, d))
    ref = np.einsum("btf,fc,bsg,gc->bts", x, wq, x, wk)

    rows = []
    t0 = time.perf_counter()
    ctx = context(args.n, 3, galois=False)
    keygen = time.perf_counter() - t0
    got, elapsed = simd_scores(ctx, x, wq, wk)
    rows.append(
        {
            "layout": "simd",
            "depth": 2,
            "keygen_s": keygen,
            "keys_bytes": key_bytes(ctx),
            "samples": args.samples,
            "run_s": elapsed,
            "per_sample_s": elapsed / args.samples,
            "latency_one_sample_s": elapsed,
            "max_error": float(np.abs(got - ref).max()),
        }
    )
    t0 = time.perf_counter()
    ctx = context(args.n, 3, galois=True)
    keygen = time.perf_counter() - t0
    got, elapsed = packed_scores(ctx, x, wq, wk, args.packed_samples)
    per = elapsed / args.packed_samples
    rows.append(
        {
            "layout": "packed",
            "depth": 3,
            "keygen_s": keygen,
            "keys_bytes": key_bytes(ctx),
            "samples": args.packed_samples,
            "run_s": elapsed,
            "per_sample_s": per,
            "latency_one_sample_s": per,
            "max_error": float(np.abs(got - ref[: args.packed_samples]).max()),
        }
    )
    lines = [
        "# CKKS layouts: one attention head's scores S = (xW_q)(xW_k)ᵀ, both packings in one run",
        "",
        f"Command: `{command_line()}`",
        "",
        f"T = {T}, {F} input features, head dimension {d}, N = {args.n} for both (128-bit). The "
        f"SIMD run packs {args.samples} samples (up to N/2 = {args.n // 2} fit at the same cost); "
        "the packed layout runs one sample per ciphertext.",
        "",
        "| layout | depth | Galois keys (MiB) | relin+public (MiB) | keygen (s) | latency, 1 "
        "sample (s) | per sample (s) | max error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {r['depth']} | {r['keys_bytes']['galois'] / 2**20:.1f} | "
            f"{r['keys_bytes']['public_and_relin'] / 2**20:.1f} | {r['keygen_s']:.1f} | "
            f"{r['latency_one_sample_s']:.2f} | {r['per_sample_s']:.4f} | {r['max_error']:.1e} |"
        )
    simd, packed = rows
    lat = packed["latency_one_sample_s"] / simd["run_s"]
    per = packed["per_sample_s"] / simd["per_sample_s"]
    lines += [
        "",
        f"Packed vs SIMD: latency of one sample {lat:.2f}× the SIMD run; per sample at "
        f"{args.samples} samples {per:.0f}× the SIMD cost. The packed layout also spends one more "
        "level (the summing mm) before the PowerSoftmax powers, and each further cross-slot move "
        "(row sums, broadcasting 1/a, the attention-weighted values) would be another mm and "
        "another level.",
    ]
    paths = write_results("ckks_layouts", lines, rows)
    print("\n".join(lines))
    print(f"wrote {paths['md']}")


if __name__ == "__main__":
    main()
