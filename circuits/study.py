"""``fhe report`` as one call: sweep attention over sequence lengths for a scheme and write the
report.

TFHE: single-head circuits (:mod:`circuits.sweep`, PBS, widths, parameters, keygen and run times);
CKKS: one-block models per kind and layout (:mod:`circuits.ckks_sweep`). Both write Markdown, JSON
and a PNG under ``out_dir``; CKKS rewrites them after every row (long sweeps keep partial results).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fhe.schemes import Scheme


def parse_seq_lens(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise ValueError(
            f"--seq-lens must be a comma-separated list of integers, got {text!r}"
        ) from None


def study(
    scheme: str,
    variants: list[str] | None,
    seq_lens: list[int],
    out_dir: str | Path,
    command: str,
    stem: str | None = None,
    execute: bool = True,
    layouts: tuple[str, ...] = ("batch", "packed"),
    d: int = 2,
    n_bits: int = 6,
    lut_bits: int | None = 5,
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Sweep ``variants`` (None: the scheme's default set) over ``seq_lens``; returns the written
    paths. Raises ValueError for variants the scheme does not know."""
    progress = progress or (lambda _: None)
    if Scheme(scheme) is Scheme.CKKS:
        from circuits import ckks_sweep

        kinds = variants or list(ckks_sweep.DEFAULT_KINDS)
        known = ckks_sweep.known_kinds()
        bad = [k for k in kinds if k not in known]
        if bad:
            raise ValueError(f"--variants for CKKS: {', '.join(known)}; got {', '.join(bad)}")
        stem = stem or "ckks_attention"
        reps = ckks_sweep.sweep(
            kinds,
            seq_lens,
            layouts,
            execute=execute,
            progress=lambda m: progress(f"  {m} ..."),
            on_row=lambda rows: ckks_sweep.write(rows, out_dir, stem, command),
        )
        return ckks_sweep.write(reps, out_dir, stem, command)
    from circuits.report import write
    from circuits.sweep import sweep

    reports = sweep(
        variants or ["inhibitor", "dot-product"],
        seq_lens,
        d,
        n_bits,
        lut_bits,
        execute=execute,
        repeats=repeats,
        progress=lambda spec: progress(f"  {spec.name} ..."),
    )
    return write(reports, Path(out_dir), stem or "tfhe_attention", command)
