"""``fhe quantize`` as a call: a model file's integer program under one quantization, with its bit
widths and float vs integer accuracy. The options are declared once, here (the CLI's are generated
from them), with the defaults of :class:`~quant.QuantConfig`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fhe.api._common import coerce_enums, option_field
from fhe.api.train import load_for_encryption
from fhe.errors import BadOptionError, FheError
from quant.config import Granularity, QuantConfig, RangeMode
from quant.ir import OverflowPolicy

_QUANT = QuantConfig()


@dataclass(frozen=True)
class QuantizeOptions:
    """``fhe quantize``'s quantization (:meth:`config` makes the :class:`~quant.QuantConfig`) and
    calibration set."""

    n_bits: int = option_field(_QUANT.n_bits, "Activation bits.")
    weight_bits: int | None = option_field(_QUANT.weight_bits, "Weight bits (default: --n-bits).")
    input_bits: int | None = option_field(_QUANT.input_bits, "Input bits (default: --n-bits).")
    rounding_bits: int = option_field(
        _QUANT.rounding_bits,
        "LSBs each table lookup rounds away first (concrete round_bit_pattern).",
    )
    per_channel: bool = option_field(
        _QUANT.weight_granularity is Granularity.PER_CHANNEL, "Per-output-channel weight scales."
    )
    asymmetric: bool = option_field(
        not _QUANT.symmetric, "Asymmetric (zero-point) activation quantizers."
    )
    range_mode: RangeMode = option_field(
        _QUANT.range_mode,
        "Calibration ranges: min/max, or the 99.99th percentile (clips outliers; better at 4 "
        "bits).",
    )
    n_calib: int = option_field(
        500, "Calibration samples (from the training split).", option="--calib"
    )

    def __post_init__(self) -> None:
        coerce_enums(self, range_mode=RangeMode)

    def config(self) -> QuantConfig:
        """The quantization these options give (:class:`BadOptionError` if it cannot work)."""
        try:
            return QuantConfig(
                n_bits=self.n_bits,
                weight_bits=self.weight_bits,
                input_bits=self.input_bits,
                rounding_bits=self.rounding_bits,
                symmetric=not self.asymmetric,
                weight_granularity=(
                    Granularity.PER_CHANNEL if self.per_channel else Granularity.PER_TENSOR
                ),
                range_mode=self.range_mode,
            )
        except ValueError as exc:
            raise BadOptionError(str(exc)) from exc


def quantize_file(
    model_path: str | Path,
    options: QuantizeOptions = QuantizeOptions(),
    data_dir: str | Path | None = None,
    n_test: int | None = None,
    policy: OverflowPolicy | str = OverflowPolicy.CLIP,
):
    """``fhe quantize``: the model's integer program under ``options``, with its bit widths and
    float vs integer accuracy on the first ``n_test`` test samples. Returns (program, summary)."""
    from models.training import predict
    from quant import RangeOverflowError
    from quant.export import ExportError, export
    from quant.report import accuracy, program_summary

    config = options.config()
    inputs = load_for_encryption(model_path, data_dir)
    ckpt, data = inputs.checkpoint, inputs.data
    try:
        program = export(ckpt.model, data.x_train[: options.n_calib], config)
    except ExportError as exc:
        raise FheError(str(exc)) from exc
    x, y = data.x_test[:n_test], data.y_test[:n_test].numpy()
    try:
        out_int, clipped = program.run_int(program.quantize_input(x), OverflowPolicy(policy))
    except RangeOverflowError as exc:
        raise FheError(str(exc)) from exc
    summary = program_summary(program.graph)
    summary.update(
        n_bits=config.n_bits,
        float_accuracy=accuracy(predict(ckpt.model, x).numpy(), y),
        int_accuracy=accuracy(program.dequantize_output(out_int), y),
        n_test=len(y),
        clipped_values=sum(clipped.values()),
        input_clipped=program.input_clip_count(x),
    )
    return program, summary
