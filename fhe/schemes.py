"""Schemes and their parameters: typed configuration that drives backend dispatch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum

from fhe.ckks.approx import ApproxConfig
from fhe.scheme import Scheme
from models.config import coerce_enums
from quant.config import QuantConfig

__all__ = [
    "CkksEngine",
    "CkksLayout",
    "CkksParams",
    "CompareMode",
    "LayoutOption",
    "Ranges",
    "Rounding",
    "Scheme",
    "TfheParams",
]


class Ranges(str, Enum):
    """Where a TFHE value's bit width comes from (see :class:`TfheParams`)."""

    CALIBRATED = "calibrated"  # the calibration set; the client refuses inputs that would overflow
    PROVEN = "proven"  # interval arithmetic over every input the client accepts (wider, slower)


class Rounding(str, Enum):
    """Concrete's rounding of a lookup's input (``TfheParams.exact_rounding``)."""

    EXACT = "exact"  # extra PBS; encrypted == clear program
    APPROXIMATE = "approximate"  # cheaper; near a rounding boundary it may read the neighbour


@dataclass(frozen=True)
class TfheParams:
    """TFHE compilation settings (concrete-python).

    ``quant``: the quantization the integer program is built with (bits, rounding, ranges), owned
    here only: ``n_bits`` reads it. Rounding is applied by the quantizer (it changes the integer
    program itself, so the clear and encrypted runs agree exactly). ``p_error``: probability that
    one PBS returns a wrong value; ``global_p_error``: for the whole circuit (Concrete takes the
    stricter). ``exact_rounding``: Concrete's exact rounding (extra PBS, encrypted == clear) or its
    approximate rounding (cheaper lookups; values near a rounding boundary may read the neighbouring
    table entry).

    ``ranges``: where every value's bit width comes from. ``calibrated`` (default, cheapest): from
    the calibration set; an input unlike it can push a value past its width, where the encrypted
    circuit would wrap around, so the client refuses such inputs
    (:class:`fhe.harness.InputOverflowError`). ``proven``: from interval arithmetic over every input
    the client accepts (quant/ranges.py): no value can overflow, at the cost of wider values
    (measured in benchmarks/results/overflow.md).

    ``compress_keys``: Concrete's seeded evaluation keys. The client serialises (and uploads) each
    key's random masks as a seed, about 4-5x fewer bytes; the server expands them when it loads the
    keys, so its memory and the run time are unchanged (benchmarks/results/tfhe_model.md).
    """

    quant: QuantConfig = field(default_factory=QuantConfig)
    p_error: float | None = None
    global_p_error: float | None = 1e-5
    dataflow_parallelize: bool = False
    loop_parallelize: bool = True
    inputset_size: int = 500
    exact_rounding: bool = True
    ranges: Ranges = Ranges.CALIBRATED
    compress_keys: bool = True

    def __post_init__(self) -> None:
        coerce_enums(self, ranges=Ranges)
        for name in ("p_error", "global_p_error"):
            v = getattr(self, name)
            if v is not None and not 0 < v < 1:
                raise ValueError(f"{name} must be in (0, 1), got {v}")
        if self.inputset_size < 1:
            raise ValueError("inputset_size must be >= 1")

    @property
    def n_bits(self) -> int:
        return self.quant.n_bits

    def replace(self, **changes) -> TfheParams:
        return dataclasses.replace(self, **changes)


class CkksLayout(str, Enum):
    """Where a CKKS program puts its values (fhe/ckks/packing.py, fhe/ckks/program.py)."""

    BATCH = "batch"  # SIMD over samples: one run costs the same for 1 or N/2 samples (throughput)
    PACKED = (
        "packed"  # one sample's activations in one ciphertext, rotations: the latency of one query
    )


class LayoutOption(str, Enum):
    """``--layout``: a :class:`CkksLayout`, or AUTO (``fhe.api.choose_layout`` picks one)."""

    AUTO = "auto"
    BATCH = "batch"
    PACKED = "packed"


class CompareMode(str, Enum):
    """What ``fhe compare`` sets beside the float model and the clear program."""

    SIMULATE = "simulate"  # TFHE: Concrete's simulation (no keys); CKKS: the clear polynomials
    EXECUTE = "execute"  # encrypted runs (keys made first)


class CkksEngine(str, Enum):
    """The library that runs a CKKS program (fhe/ckks/backend*.py, fhe/ckks/openfhe/)."""

    TENSEAL = "tenseal"  # SEAL through TenSEAL: one modulus chain, no bootstrapping
    OPENFHE = "openfhe"  # OpenFHE in a Python 3.10 worker: server-side bootstrapping, packed layout
    AUTO = "auto"  # TenSEAL when the program fits its one chain, else OpenFHE (fhe.harness)


@dataclass(frozen=True)
class CkksParams:
    """CKKS settings (TenSEAL). ``poly_modulus_degree=None`` lets the planner pick the smallest N
    whose 128-bit coefficient chain holds the program's depth. ``refresh`` opts in to the
    client-assisted refresh (the data owner decrypts and re-encrypts ciphertexts that ran out of
    levels): never implicit. ``batch_size`` caps the samples packed per ciphertext (SIMD slots; N/2
    at most). ``layout``: batch (samples in the slots) or packed (one sample per ciphertext,
    rotations; see :class:`CkksLayout`). ``engine``: :class:`CkksEngine`; OpenFHE bootstraps where
    the chain runs out, so a deep program needs no refresh. ``insecure_ring_dim`` (tests only): an
    OpenFHE ring below 128-bit security, labelled insecure in every report."""

    poly_modulus_degree: int | None = None
    scale_bits: int = 40
    outer_bits: int = 60
    refresh: bool = False
    approx: ApproxConfig = field(default_factory=ApproxConfig)
    batch_size: int | None = None
    layout: CkksLayout = CkksLayout.BATCH
    engine: CkksEngine = CkksEngine.TENSEAL
    insecure_ring_dim: int | None = None

    def __post_init__(self) -> None:
        coerce_enums(self, layout=CkksLayout, engine=CkksEngine)
        if self.engine is CkksEngine.OPENFHE:
            if self.layout is not CkksLayout.PACKED:
                raise ValueError("the OpenFHE engine runs the packed layout only")
            if self.refresh:
                raise ValueError("the OpenFHE engine bootstraps; it has no client-assisted refresh")
            if self.poly_modulus_degree is not None:
                raise ValueError(
                    "the OpenFHE engine picks its own chain (N = 65536, 128-bit, with bootstraps); "
                    "drop --poly-modulus-degree"
                )
        if self.insecure_ring_dim is not None and (
            self.engine is not CkksEngine.OPENFHE
            or self.insecure_ring_dim not in (1 << 11, 1 << 12, 1 << 13)
        ):
            raise ValueError("insecure_ring_dim (tests only): 2048, 4096 or 8192, OpenFHE engine")
        if self.poly_modulus_degree is not None and self.poly_modulus_degree not in (
            4096,
            8192,
            16384,
            32768,
        ):
            raise ValueError(
                "poly_modulus_degree must be 4096, 8192, 16384 or 32768, got "
                f"{self.poly_modulus_degree}"
            )
        if not 20 <= self.scale_bits <= self.outer_bits <= 60:
            raise ValueError(
                f"need 20 <= scale_bits <= outer_bits <= 60, got {self.scale_bits}, "
                f"{self.outer_bits}"
            )
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")

    def replace(self, **changes) -> CkksParams:
        return dataclasses.replace(self, **changes)
