"""CKKS parameters for a program's multiplicative depth at 128-bit security.

TenSEAL (Microsoft SEAL) refuses parameter sets weaker than 128 bits: the coefficient modulus may
total at most 109, 218, 438 or 881 bits at poly_modulus_degree N = 4096, 8192, 16384, 32768
(HomomorphicEncryption.org standard). A depth-L program with scale 2^s needs the chain
[outer, s × L, outer]: with s = 40 and 60-bit outer primes that is depth 2, 7 and 19 at
N = 8192, 16384 and 32768. TenSEAL has no bootstrapping, so a deeper program does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from fhe.errors import FheError

MAX_COEFF_BITS_128 = {4096: 109, 8192: 218, 16384: 438, 32768: 881}


class DepthError(FheError):
    """The program is deeper than any chain holds; ``summary`` is the first sentence (what, not the
    fixes)."""

    def __init__(self, message: str, summary: str | None = None) -> None:
        super().__init__(message)
        self.summary = summary or message


@dataclass(frozen=True)
class CkksPlan:
    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    scale_bits: int
    depth: int  # levels available in the chain
    security_bits: int = 128
    refresh: bool = False

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2

    def to_dict(self) -> dict:
        return {
            "poly_modulus_degree": self.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(self.coeff_mod_bit_sizes),
            "scale_bits": self.scale_bits,
            "max_depth": self.depth,
            "security_bits": self.security_bits,
            "slots": self.slots,
            "client_assisted_refresh": self.refresh,
        }


def max_depth(n: int, scale_bits: int, outer_bits: int = 60) -> int:
    return max(0, (MAX_COEFF_BITS_128[n] - 2 * outer_bits) // scale_bits)


def plan_parameters(
    depth: int,
    scale_bits: int = 40,
    outer_bits: int = 60,
    poly_modulus_degree: int | None = None,
    refresh: bool = False,
    depth_per_tag: dict[str, int] | None = None,
) -> CkksPlan:
    """The smallest N whose 128-bit chain holds ``depth`` levels (or the given N).

    With ``refresh`` the program may be deeper than the chain: it then runs with the full chain of N
    (default 16384) and the data owner refreshes ciphertexts that run out of levels.
    """
    if not 20 <= scale_bits <= outer_bits:
        raise ValueError(f"scale_bits must be in [20, {outer_bits}], got {scale_bits}")
    sizes = [poly_modulus_degree] if poly_modulus_degree else sorted(MAX_COEFF_BITS_128)
    for n in sizes:
        if n not in MAX_COEFF_BITS_128:
            raise ValueError(
                f"poly_modulus_degree must be one of {sorted(MAX_COEFF_BITS_128)}, got {n}"
            )
    fitting = [n for n in sizes if max_depth(n, scale_bits, outer_bits) >= depth]
    if fitting:
        n = fitting[0]
        return CkksPlan(
            n, (outer_bits, *[scale_bits] * depth, outer_bits), scale_bits, depth
        )  # no refresh needed
    if refresh:
        n = poly_modulus_degree or 16384
        d = max_depth(n, scale_bits, outer_bits)
        if d < 2:
            raise DepthError(
                f"N={n} holds only {d} levels at scale 2^{scale_bits}; a refresh needs at least 2"
            )
        return CkksPlan(n, (outer_bits, *[scale_bits] * d, outer_bits), scale_bits, d, refresh=True)
    largest = max(sizes)
    per_tag = ""
    if depth_per_tag:
        per_tag = (
            " Depth reached after each stage: "
            + ", ".join(f"{t} {d}" for t, d in depth_per_tag.items())
            + "."
        )
    summary = (
        f"the program needs multiplicative depth {depth}, but the largest 128-bit chain at "
        f"N={largest} with scale 2^{scale_bits} holds {max_depth(largest, scale_bits, outer_bits)}"
    )
    raise DepthError(
        f"{summary} and TenSEAL cannot bootstrap.{per_tag} To fit: fewer Goldschmidt/Newton "
        "iterations (a looser tolerance, or a narrower interval by range-loss fine-tuning), "
        "lower-degree activations, fewer layers, a smaller --scale-bits, or opt in to the "
        "client-assisted refresh (--refresh: the data owner decrypts and re-encrypts between "
        "stages).",
        summary,
    )
