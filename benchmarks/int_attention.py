"""Inhibitor vs dot-product attention in plaintext 16-bit integer arithmetic (Inhibitor paper Table
3).

Both mechanisms run single-head on int16 Q, K, V (values in [-127, 127], d = 16 by default) with
numpy integer kernels, at T = 32, 64, 128, 256. Dot-product: int32 QKᵀ, a row-max shift, an int16
exp table lookup, an integer reciprocal and the int32 weighted sum of V. Inhibitor: int16 Manhattan
scores (Eq. 5) with shift, ReLU inhibition and sums (Eq. 6). Timings are medians of repeated runs of
both in the same process, reported as a ratio (the paper reports a 30-50% saving for the Inhibitor).

    python benchmarks/int_attention.py --seq-lens 32,64,128,256 --d 16 --repeats 30
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import write_results  # noqa: E402

EXP_FRAC = 8  # fixed-point fraction bits of the int16 softmax


def make_exp_table(shift: int) -> np.ndarray:
    """exp(-k / 2^shift) in Q.EXP_FRAC for k = 0 .. 4095 (int16)."""
    k = np.arange(4096)
    return np.round(np.exp(-k / 2.0**shift) * 2**EXP_FRAC).astype(np.int16)


def dot_product_int(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, exp_table: np.ndarray, shift: int
) -> np.ndarray:
    s = q.astype(np.int32) @ k.T.astype(np.int32)  # (T, T) int32 scores
    s = s >> shift  # scale by ~1/√d in fixed point
    gap = np.minimum(s.max(axis=1, keepdims=True) - s, exp_table.size - 1)  # >= 0
    e = exp_table[gap]  # int16 exp lookup
    den = e.sum(axis=1, keepdims=True, dtype=np.int32)
    num = e.astype(np.int32) @ v.astype(np.int32)  # (T, d)
    return (num // den).astype(np.int16)


def inhibitor_int(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, gamma_shift: int, alpha: int
) -> np.ndarray:
    z = np.abs(q[:, None, :] - k[None, :, :]).sum(axis=2, dtype=np.int16) >> gamma_shift  # Eq. (5)
    z = np.maximum(z - alpha, 0)  # shifted score
    return np.maximum(v[None, :, :] - z[:, :, None], 0).sum(axis=1, dtype=np.int16)  # Eq. (6)


C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
/* Dot-product attention, int16 in/out, int32 accumulators, exp by table, integer division. */
void dot_product(const int16_t *q, const int16_t *k, const int16_t *v, int T, int d,
                 const int16_t *exp_table, int table_size, int shift, int16_t *out, int32_t *s,
                 int16_t *e) {
    for (int i = 0; i < T; i++) {
        int32_t m = INT32_MIN;
        for (int j = 0; j < T; j++) {
            int32_t acc = 0;
            for (int c = 0; c < d; c++) acc += (int32_t)q[i * d + c] * k[j * d + c];
            s[j] = acc >> shift;
            if (s[j] > m) m = s[j];
        }
        int32_t den = 0;
        for (int j = 0; j < T; j++) {
            int32_t g = m - s[j];
            e[j] = exp_table[g < table_size ? g : table_size - 1];
            den += e[j];
        }
        for (int c = 0; c < d; c++) {
            int32_t num = 0;
            for (int j = 0; j < T; j++) num += (int32_t)e[j] * v[j * d + c];
            out[i * d + c] = (int16_t)(num / den);
        }
    }
}
/* Inhibitor, Eqs. (5)-(6): Manhattan scores, shift, ReLU inhibition; int16 throughout. */
void inhibitor(const int16_t *q, const int16_t *k, const int16_t *v, int T, int d, int gamma_shift,
               int alpha, int16_t *out, int16_t *z) {
    for (int i = 0; i < T; i++) {
        for (int j = 0; j < T; j++) {
            int16_t acc = 0;
            for (int c = 0; c < d; c++) acc += (int16_t)abs(q[i * d + c] - k[j * d + c]);
            int16_t zz = (int16_t)((acc >> gamma_shift) - alpha);
            z[j] = zz > 0 ? zz : 0;
        }
        for (int c = 0; c < d; c++) {
            int16_t h = 0;
            for (int j = 0; j < T; j++) {
                int16_t t = (int16_t)(v[j * d + c] - z[j]);
                h += t > 0 ? t : 0;
            }
            out[i * d + c] = h;
        }
    }
}
"""


def load_c_kernels():
    """Compiles the C kernels with the system compiler (gcc -O2); None if no compiler is
    available."""
    import ctypes
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    tmp = Path(tempfile.mkdtemp())
    (tmp / "attn.c").write_text(C_SOURCE)
    subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", "-o", str(tmp / "attn.so"), str(tmp / "attn.c")], check=True
    )
    return ctypes.CDLL(str(tmp / "attn.so"))


def c_runners(lib, q, k, v, table, shift):
    import ctypes

    T, d = q.shape
    ptr = np.ctypeslib.as_ctypes
    out = np.zeros((T, d), np.int16)
    s, e, z = np.zeros(T, np.int32), np.zeros(T, np.int16), np.zeros(T, np.int16)
    args_dot = (
        ptr(q),
        ptr(k),
        ptr(v),
        T,
        d,
        ptr(table),
        table.size,
        shift,
        ptr(out),
        ptr(s),
        ptr(e),
    )
    args_inh = (ptr(q), ptr(k), ptr(v), T, d, 2, 64, ptr(out), ptr(z))
    del ctypes
    return (lambda: lib.dot_product(*args_dot)), (lambda: lib.inhibitor(*args_inh))


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seq-lens", default="32,64,128,256")
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    shift = int(np.log2(args.d) / 2) + 6  # /√d and /127 of the scores, in one shift
    table = make_exp_table(4)
    lib = load_c_kernels()
    rows = []
    for T in (int(t) for t in args.seq_lens.split(",")):
        q, k, v = (
            np.ascontiguousarray(rng.integers(-127, 128, (T, args.d)).astype(np.int16))
            for _ in range(3)
        )
        dot = median_time(
            lambda q=q, k=k, v=v: dot_product_int(q, k, v, table, shift), args.repeats
        )
        inh = median_time(lambda q=q, k=k, v=v: inhibitor_int(q, k, v, 2, 64), args.repeats)
        row = {
            "seq_len": T,
            "numpy_dot_s": dot,
            "numpy_inhibitor_s": inh,
            "numpy_saving": 1 - inh / dot,
        }
        if lib is not None:
            run_dot, run_inh = c_runners(lib, q, k, v, table, shift)
            c_dot, c_inh = median_time(run_dot, args.repeats), median_time(run_inh, args.repeats)
            row.update(c_dot_s=c_dot, c_inhibitor_s=c_inh, c_saving=1 - c_inh / c_dot)
        rows.append(row)
    lines = [
        "# Plaintext int16 attention: Inhibitor vs dot-product (Inhibitor paper, Table 3)",
        "",
        f"Command: `python benchmarks/int_attention.py {' '.join(sys.argv[1:])}`",
        "",
        f"Single head, d = {args.d}, median of {args.repeats} runs each, same process. C: plain "
        "loops compiled with `cc -O2` (the paper's low-level setting); numpy: vectorised kernels, "
        "where integer matmul is optimised and the Inhibitor's broadcast (T, T, d) tensor is not.",
        "",
        "| T | C dot (ms) | C inhibitor (ms) | C saving | numpy dot (ms) | numpy inhibitor (ms) "
        "| numpy saving |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = (
            f"{1e3 * r['c_dot_s']:.3f} | {1e3 * r['c_inhibitor_s']:.3f} | "
            f"{100 * r['c_saving']:.0f}%"
            if "c_dot_s" in r
            else "— | — | —"
        )
        lines.append(
            f"| {r['seq_len']} | {c} | {1e3 * r['numpy_dot_s']:.3f} | "
            f"{1e3 * r['numpy_inhibitor_s']:.3f} | {100 * r['numpy_saving']:.0f}% |"
        )
    lines += ["", "Paper (Rust, int16): 30-50% saving for the Inhibitor."]
    write_results("int_attention", lines, rows)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
