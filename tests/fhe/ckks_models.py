"""A tiny untrained polynomial-friendly transformer shared by the CKKS tests."""

from models.config import TransformerConfig
from models.transformer import Transformer


def tiny(**overrides) -> Transformer:
    cfg = dict(
        seq_len=4,
        in_features=3,
        n_outputs=3,
        attention="power-softmax",
        d_model=4,
        n_heads=2,
        norm="none",
        ffn_activation="gelu",
        power_form="length-agnostic",
    )
    cfg.update(overrides)
    return Transformer(TransformerConfig(**cfg)).double().eval()


def secret_key_windows(ctx, n: int = 24, size: int = 64) -> list[bytes]:
    """``n`` evenly spaced ``size``-byte pieces of the secret key's serialisation (what a secret-key
    serialisation adds to a parameters-only one), to search artifacts for. A few dozen suffice: a
    copy of the key holds them all, and each search scans the whole artifact (Galois keys: hundreds
    of MB)."""
    bare = ctx.serialize(
        save_public_key=False, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
    )
    with_sk = ctx.serialize(
        save_public_key=False, save_secret_key=True, save_galois_keys=False, save_relin_keys=False
    )
    step = max(1, (len(with_sk) - size) // (4 * n))
    pieces = [with_sk[i : i + size] for i in range(0, len(with_sk) - size, step)]
    return [w for w in pieces if w not in bare][::4][:n]
