"""SEAL's evaluator (``tenseal.sealapi``) as program arithmetic, for the packed layout's rotations.

TenSEAL's CKKSVector has no rotation; ``tenseal.sealapi`` exposes SEAL itself, so the packed layout
runs on raw SEAL ciphertexts: ``Evaluator.rotate_vector`` with Galois keys made for exactly the
steps the program uses (the clear run lists them), and products relinearised and rescaled as TenSEAL
does. After each rescale the scale is set back to 2^scale_bits (the primes are within ~2⁻²⁰ of it,
the same approximation TenSEAL makes); operands are mod-switched to the deeper one's level before
they meet.

The keys come from a TenSEAL context (public, relinearisation and secret keys); the Galois keys are
made here from its secret key and saved in SEAL's own serialisation (``GaloisKeys.save/load``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import tenseal as ts
import tenseal.sealapi as sa

from fhe.ckks.arith import Arith


def galois_elements(steps, poly_modulus_degree: int) -> list[int]:
    """SEAL's Galois element of a left rotation by each step (0 < step < N/2): 3^step mod 2N."""
    return [pow(3, int(s), 2 * poly_modulus_degree) for s in steps]


def make_galois_keys(ctx: ts.Context, steps, poly_modulus_degree: int) -> sa.GaloisKeys:
    keys = sa.GaloisKeys()
    if steps:
        gen = sa.KeyGenerator(ctx.seal_context().data, ctx.secret_key().data)
        gen.create_galois_keys(galois_elements(steps, poly_modulus_degree), keys)
    return keys


def galois_keys_memory(n_keys: int, poly_modulus_degree: int, n_primes: int) -> int:
    """Bytes the server holds for ``n_keys`` Galois keys: each is one key-switching key, a
    ciphertext of 2 polynomials over all ``n_primes`` primes per data prime (n_primes − 1 of them),
    8 bytes a coefficient. (SEAL's zstd serialisation, what is uploaded, is ~0.7x that; measuring it
    means compressing GBs, so the report computes this instead.)"""
    return n_keys * (n_primes - 1) * 2 * n_primes * poly_modulus_degree * 8


def to_bytes(obj: sa.Ciphertext | sa.GaloisKeys) -> bytes:
    """A SEAL object in SEAL's own serialisation (``save`` writes files only, hence the temporary
    one)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "obj"
        obj.save(str(path))
        return path.read_bytes()


def from_bytes(cls: type, ctx: ts.Context, blob: bytes):
    """``cls`` (sa.Ciphertext, sa.GaloisKeys) loaded from :func:`to_bytes`; SEAL checks that it is
    valid for ``ctx``'s parameters and raises ValueError/RuntimeError otherwise."""
    obj = cls()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "obj"
        path.write_bytes(blob)
        obj.load(ctx.seal_context().data, str(path))
    return obj


class SealCodec:
    """Client side: encode and encrypt slot vectors, decrypt and decode (needs the secret key to
    decrypt)."""

    def __init__(self, ctx: ts.Context, scale_bits: int) -> None:
        self.ctx, self.scale = ctx, 2.0**scale_bits
        self.seal = ctx.seal_context().data
        self.encoder = sa.CKKSEncoder(self.seal)
        self.encryptor = sa.Encryptor(self.seal, ctx.public_key().data)

    def encrypt(self, slots: np.ndarray) -> sa.Ciphertext:
        pt, ct = sa.Plaintext(), sa.Ciphertext()
        self.encoder.encode(np.asarray(slots, dtype=np.float64).tolist(), self.scale, pt)
        self.encryptor.encrypt(pt, ct)
        return ct

    def decrypt(self, ct: sa.Ciphertext) -> np.ndarray:
        pt = sa.Plaintext()
        sa.Decryptor(self.seal, self.ctx.secret_key().data).decrypt(ct, pt)
        return np.asarray(self.encoder.decode_double(pt))


class SealArith(Arith):
    """Raw SEAL ciphertexts as program values (packed layout; no client-assisted refresh).

    ``plain_cache``: encoded plaintexts by (array identity, level), kept between runs of the same
    program (a server answering many queries encodes its matrices once)."""

    def __init__(
        self,
        ctx: ts.Context,
        galois_keys: sa.GaloisKeys,
        scale_bits: int,
        max_depth: int,
        plain_cache: dict | None = None,
    ) -> None:
        super().__init__(max_depth, refresh=False)
        self.seal = ctx.seal_context().data
        self.encoder = sa.CKKSEncoder(self.seal)
        self.evaluator = sa.Evaluator(self.seal)
        self.relin_keys = ctx.relin_keys().data
        self.galois_keys = galois_keys
        self.scale = 2.0**scale_bits
        self.plain_cache = {} if plain_cache is None else plain_cache

    # ---------------------------------------------------------------- helpers
    def _at_level_of(
        self, a: sa.Ciphertext, b: sa.Ciphertext
    ) -> tuple[sa.Ciphertext, sa.Ciphertext]:
        """Both operands at the deeper one's level (copies where switched; inputs untouched)."""
        na, nb = a.coeff_modulus_size(), b.coeff_modulus_size()
        if na > nb:
            c = sa.Ciphertext()
            self.evaluator.mod_switch_to(a, b.parms_id(), c)
            return c, b
        if nb > na:
            c = sa.Ciphertext()
            self.evaluator.mod_switch_to(b, a.parms_id(), c)
            return a, c
        return a, b

    def _rescale(self, ct: sa.Ciphertext) -> sa.Ciphertext:
        self.evaluator.rescale_to_next_inplace(ct)
        ct.scale = self.scale
        return ct

    def _plain(self, values, parms_id, scale: float, cache: bool = False) -> sa.Plaintext:
        """Encoded at ``parms_id``; arrays are cached by identity (checked, so a reused id cannot
        hit)."""
        cache_key = (id(values), tuple(parms_id), scale) if cache else None
        hit = self.plain_cache.get(cache_key) if cache else None
        if hit is not None and hit[0] is values:
            return hit[1]
        pt = sa.Plaintext()
        if np.ndim(values) == 0:
            self.encoder.encode(float(values), parms_id, scale, pt)
        else:
            self.encoder.encode(np.asarray(values, dtype=np.float64).tolist(), parms_id, scale, pt)
        if cache:
            self.plain_cache[cache_key] = (values, pt)
        return pt

    # ---------------------------------------------------------------- the Arith hooks
    def _mul(self, a, b):
        a, b = self._at_level_of(a, b)
        out = sa.Ciphertext()
        self.evaluator.multiply(a, b, out)
        self.evaluator.relinearize_inplace(out, self.relin_keys)
        return self._rescale(out)

    def _square(self, a):
        out = sa.Ciphertext()
        self.evaluator.square(a, out)
        self.evaluator.relinearize_inplace(out, self.relin_keys)
        return self._rescale(out)

    def _add(self, a, b):
        a, b = self._at_level_of(a, b)
        out = sa.Ciphertext()
        self.evaluator.add(a, b, out)
        return out

    def _add_scalar(self, a, c):
        out = sa.Ciphertext()
        self.evaluator.add_plain(a, self._plain(c, a.parms_id(), a.scale), out)
        return out

    def _neg(self, a):
        out = sa.Ciphertext()
        self.evaluator.negate(a, out)
        return out

    def _mul_scalar(self, a, c):
        if c == 0:  # SEAL refuses a product that is transparent (all zero): 0·a as a − a
            out = sa.Ciphertext()
            self.evaluator.sub(a, a, out)
            self.evaluator.mod_switch_to_next_inplace(out)
            out.scale = self.scale
            return out
        out = sa.Ciphertext()
        self.evaluator.multiply_plain(a, self._plain(c, a.parms_id(), self.scale), out)
        return self._rescale(out)

    def _rotate(self, a, step):
        out = sa.Ciphertext()
        self.evaluator.rotate_vector(a, int(step), self.galois_keys, out)
        return out

    def _dot_plain(self, datas, plains):
        deepest = min(datas, key=lambda c: c.coeff_modulus_size())
        pairs = [(ct, p) for ct, p in zip(datas, plains, strict=True) if np.any(p)]
        if not pairs:
            return self._mul_scalar(self._at_level_of(datas[0], deepest)[0], 0.0)
        acc = None
        for ct, plain in pairs:
            ct = self._at_level_of(ct, deepest)[0]
            term = sa.Ciphertext()
            self.evaluator.multiply_plain(
                ct, self._plain(plain, ct.parms_id(), self.scale, cache=True), term
            )
            if acc is None:
                acc = term
            else:
                self.evaluator.add_inplace(acc, term)
        return self._rescale(acc)

    def _add_plain(self, a, plain):
        out = sa.Ciphertext()
        self.evaluator.add_plain(a, self._plain(plain, a.parms_id(), a.scale, cache=True), out)
        return out
