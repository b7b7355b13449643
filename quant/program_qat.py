"""Quantization-aware training through the integer program's own fake-quantized twin.

Brevitas QAT (:mod:`quant.qat`) quantizes the inputs and weights of linear layers; the exported
integer program also rounds every lookup input (``lut_bits``), requantizes residual branches and
attention scores, and fits its ranges on calibration data. Those differences cost the demo model 6.7
points between its QAT accuracy and its integer program's. Here training runs the export's
:class:`~quant.lowering.Lowering` itself with straight-through gradients, so the model is fine-tuned
on exactly the computation that will run encrypted:

1. fold BatchNorms into the linear layers (the program's float model);
2. every epoch, refit the program's quantizers on the calibration set (ranges follow the weights);
3. minimise the task loss of the twin's output, ``lower_transformer(...).fake``;
4. refit once more and export: the program's accuracy *is* the QAT accuracy (same quantizers, same
   forward; tests/quant/test_program_qat.py checks the two agree).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from models.fold import fold_norms
from models.progress import progress_bar
from models.tasks import TaskData
from models.training import TrainConfig, seed_everything
from models.transformer import Transformer
from quant.config import DEFAULT_CALIB_SAMPLES, QuantConfig
from quant.export import QuantizedProgram, export, lower_transformer
from quant.ir import OverflowPolicy
from quant.lowering import Fitted, Lowering


@dataclass
class ProgramQatResult:
    model: Transformer  # the folded float model whose integer program was trained
    program: QuantizedProgram
    program_score: float  # the integer program's test metric
    history: list[dict] = field(default_factory=list)


def fit_quantizers(model: Transformer, calib_x: torch.Tensor, config: QuantConfig) -> Fitted:
    """The program's quantizers (and rounding bits) for ``model`` on ``calib_x``."""
    low = Lowering(config)
    with torch.no_grad():
        lower_transformer(low, model, calib_x)
    return low.fitted


def twin_forward(
    model: Transformer, x: torch.Tensor, config: QuantConfig, fitted: Fitted
) -> torch.Tensor:
    """The integer program's fake-quantized forward on ``x``, differentiable in the model's
    weights."""
    low = Lowering(config, fitted, differentiable=True)
    return lower_transformer(low, model, x).fake


def program_score(program: QuantizedProgram, task: TaskData) -> float:
    """The integer program's test score on ``task`` (out-of-width values clipped and counted)."""
    out = program.forward(task.x_test, policy=OverflowPolicy.CLIP)
    return task.score(torch.from_numpy(np.asarray(out)), task.y_test)


def train_program(
    model: Transformer,
    task: TaskData,
    quant: QuantConfig,
    train_config: TrainConfig,
    n_calib: int = DEFAULT_CALIB_SAMPLES,
    progress: bool = True,
    distill: float = 0.5,
) -> ProgramQatResult:
    """Fine-tune ``model`` through its integer program (AdamW, cosine schedule); returns the folded
    model, its exported program and the program's test score.

    ``distill`` weighs a distillation term: the KL divergence from the float model's predictions
    (the teacher, frozen) to the program's, next to the task loss (classification tasks only)."""
    seed_everything(train_config.seed)
    teacher = fold_norms(model.eval())
    model = _trainable_copy(teacher)
    distill = distill if task.metric.value == "accuracy" else 0.0
    calib_x = task.x_train[:n_calib]
    opt = torch.optim.AdamW(
        model.parameters(), lr=train_config.lr, weight_decay=train_config.weight_decay
    )
    n = len(task.x_train)
    steps = max(1, train_config.epochs * math.ceil(n / train_config.batch_size))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    loss_fn = task.loss_fn()
    g = torch.Generator().manual_seed(train_config.seed)
    history: list[dict] = []
    bar = progress_bar(
        progress,
        total=steps,
        desc=f"program QAT {quant.n_bits} bits",
        leave=False,
        unit="step",
    )
    for epoch in range(train_config.epochs):
        model.eval()  # no dropout: the twin is the inference program
        fitted = fit_quantizers(model, calib_x, quant)
        perm = torch.randperm(n, generator=g)
        total = 0.0
        for i in range(0, n, train_config.batch_size):
            idx = perm[i : i + train_config.batch_size]
            out = twin_forward(model, task.x_train[idx], quant, fitted).float()
            loss = loss_fn(out, task.y_train[idx])
            if distill:
                with torch.no_grad():
                    target = torch.softmax(teacher(task.x_train[idx]), -1)
                kl = torch.nn.functional.kl_div(
                    torch.log_softmax(out, -1), target, reduction="batchmean"
                )
                loss = (1 - distill) * loss + distill * kl
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.grad_clip)
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}")
        history.append({"epoch": epoch + 1, "train_loss": total / n})
    bar.close()
    model.eval()
    program = export(model, calib_x, quant)
    score = program_score(program, task)
    if history:
        history[-1][f"program_test_{task.metric.value}"] = score
    return ProgramQatResult(model, program, score, history)


def _trainable_copy(model: Transformer) -> Transformer:
    copy = Transformer(model.config)
    copy.load_state_dict(model.state_dict())
    return copy.train(False).requires_grad_(True)
