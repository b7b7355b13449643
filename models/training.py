"""Training, evaluation and the ``model.pt`` checkpoint format."""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from models.attention.power_softmax import (
    activation_range_loss,
    norm_range_loss,
    range_loss,
    set_range_tracking,
)
from models.config import TransformerConfig
from models.progress import progress_bar
from models.tasks import Metric, TaskData, score
from models.transformer import Transformer

CHECKPOINT_VERSION = (
    2  # 1: torch.save pickle (still read, with weights_only=True); 2: safetensors + JSON
)
CHECKPOINT_FORMAT = "fhe-attention-model"


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 5
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.01
    seed: int = 0
    range_loss_weight: float = 0.0  # PowerSoftmax paper Eq. (9); 0 disables
    act_range_loss_weight: float = 0.0  # max |activation input| (Alg. 1 step 2); 0 disables
    range_threshold: float = (
        0.0  # hinge: penalise max |score| only beyond this (0: Eq. 9 as printed)
    )
    act_range_threshold: float = 0.0
    # LayerNorm variance spread (models.layers.RangedLayerNorm): hinge beyond max/min = ratio
    norm_range_loss_weight: float = 0.0  # 0 disables
    norm_range_ratio: float = 3.0
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        if self.epochs < 0 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"invalid training configuration: {self}")
        if self.norm_range_ratio <= 1:
            raise ValueError(
                "norm_range_ratio is a max/min ratio of variances: > 1, got "
                f"{self.norm_range_ratio}"
            )


@dataclass
class TrainResult:
    model: Transformer
    test_score: float
    metric: Metric
    history: list[dict] = field(default_factory=list)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def config_for_task(task: TaskData, **overrides) -> TransformerConfig:
    """A TransformerConfig whose input/output sizes match ``task``."""
    fields = dict(
        seq_len=task.seq_len,
        in_features=task.in_features,
        n_outputs=task.n_outputs,
        input_kind=task.input_kind,
        pooling=task.pooling,
    )
    return TransformerConfig(**{**fields, **overrides})


@torch.no_grad()
def predict(model: nn.Module, x: Tensor, batch_size: int = 512) -> Tensor:
    """The model's outputs on ``x`` in eval mode, in batches."""
    model.eval()
    return torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])


def evaluate(model: nn.Module, task: TaskData) -> float:
    """The model's test score on ``task`` (its metric)."""
    return score(task.metric, predict(model, task.x_test), task.y_test)


def train(
    model_config: TransformerConfig,
    task: TaskData,
    train_config: TrainConfig = TrainConfig(),
    progress: bool = True,
    model: Transformer | None = None,
) -> TrainResult:
    """AdamW with a cosine learning-rate schedule; adds the PowerSoftmax range loss when asked.

    Pass ``model`` to fine-tune an existing network instead of building a fresh one.
    """
    seed_everything(train_config.seed)
    model = model if model is not None else Transformer(model_config)
    opt = torch.optim.AdamW(
        model.parameters(), lr=train_config.lr, weight_decay=train_config.weight_decay
    )
    n = len(task.x_train)
    steps = max(1, train_config.epochs * math.ceil(n / train_config.batch_size))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    loss_fn = task.loss_fn()
    weights = (
        train_config.range_loss_weight,
        train_config.act_range_loss_weight,
        train_config.norm_range_loss_weight,
    )
    use_range = any(w > 0 for w in weights)
    thresholds = (
        train_config.range_threshold,
        train_config.act_range_threshold,
        train_config.norm_range_ratio,
    )
    set_range_tracking(model, use_range, *thresholds)
    history: list[dict] = []
    bar = progress_bar(
        progress,
        total=steps,
        desc=f"train {task.name}/{model_config.attention.value}",
        leave=False,
        unit="step",
    )
    g = torch.Generator().manual_seed(train_config.seed)
    for epoch in range(train_config.epochs):
        model.train()
        perm = torch.randperm(n, generator=g)
        total = 0.0
        for i in range(0, n, train_config.batch_size):
            idx = perm[i : i + train_config.batch_size]
            out = model(task.x_train[idx])
            loss = loss_fn(out, task.y_train[idx])
            if use_range:
                loss = (
                    loss
                    + train_config.range_loss_weight * range_loss(model)
                    + train_config.act_range_loss_weight * activation_range_loss(model)
                    + train_config.norm_range_loss_weight * norm_range_loss(model)
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), train_config.grad_clip)
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}")
        set_range_tracking(model, False)
        test = evaluate(model, task)
        set_range_tracking(model, use_range, *thresholds)
        history.append(
            {"epoch": epoch + 1, "train_loss": total / n, f"test_{task.metric.value}": test}
        )
    bar.close()
    set_range_tracking(model, False)
    return TrainResult(model, evaluate(model, task), task.metric, history)


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------
def save_checkpoint(
    path: str | Path, model: Transformer, task: TaskData | None = None, **extra
) -> None:
    """``model.pt``: weights as safetensors, with the config, the task record (what is needed to
    rebuild its inputs) and ``extra`` as JSON in the file's metadata. No pickle: loading a model
    file never runs code. Written to a temporary file and renamed, so an interrupted save leaves no
    half file."""
    task_record = (
        None
        if task is None
        else {"name": task.name, "metric": task.metric.value, "meta": task.meta}
    )
    metadata = {
        "format": CHECKPOINT_FORMAT,
        "version": str(CHECKPOINT_VERSION),
        "config": json.dumps(model.config.to_dict()),
        "task": json.dumps(task_record),
        "extra": json.dumps(extra, default=_jsonable),
    }
    tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (np.ndarray, Tensor)):
        return v.tolist()
    raise TypeError(f"cannot store {type(v).__name__} in a model file")


@dataclass
class Checkpoint:
    model: Transformer
    task: dict | None
    extra: dict


def _read_payload(path: Path) -> dict:
    """The checkpoint's parts from a safetensors model file, or from a legacy ``torch.save`` file
    read with ``weights_only=True`` (tensors and plain containers only: no code runs)."""
    with path.open("rb") as fh:
        head = fh.read(4)
    if head[:2] == b"PK":  # a zip archive: the pickle-based format of version 1
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a refused global or a corrupt file
            raise ValueError(
                f"{path} is a torch.save file that holds more than tensors and plain containers; "
                f"it is not loaded, because unpickling it could run code ({type(exc).__name__})"
            ) from exc
    with safe_open(str(path), framework="pt") as fh:
        metadata = fh.metadata() or {}
        if metadata.get("format") != CHECKPOINT_FORMAT:
            raise ValueError("no fhe-attention metadata")
        state = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - safe_open has keys(), not __iter__
    return {
        "config": json.loads(metadata["config"]),
        "state_dict": state,
        "task": json.loads(metadata["task"]),
        "extra": json.loads(metadata["extra"]),
    }


def load_checkpoint(path: str | Path) -> Checkpoint:
    """A model file written by :func:`save_checkpoint` (weights through safetensors, never
    unpickled)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"model file not found: {path} (train one with `fhe train ... -o {path}`)"
        )
    try:
        payload = _read_payload(path)
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not our format"
        raise ValueError(f"{path} is not a readable fhe-attention model file: {exc}") from exc
    if not isinstance(payload, dict) or "config" not in payload or "state_dict" not in payload:
        raise ValueError(f"{path} is not an fhe-attention model file (no config/state_dict)")
    model = Transformer(TransformerConfig.from_dict(payload["config"]))
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return Checkpoint(model, payload.get("task"), payload.get("extra", {}))
