"""The parts under the one-call API, for a script that composes its own experiment in memory (the
benchmarks, a notebook): a task's data, training, the integer program, a model compiled with
explicit scheme parameters, and the service client. The one-call API (:mod:`fhe.api`) works on
files; these work on objects. Every benchmark imports the toolkit from here or from :mod:`fhe.api`.

    from fhe.api import parts
    data = parts.load_task("digits", patch=4)
    cfg = parts.config_for_task(data, attention="inhibitor", d_model=16, norm="batchnorm")
    model = parts.train(cfg, data, parts.TrainConfig(epochs=5)).model
    params = parts.TfheParams(quant=parts.DEFAULT_QUANT)
    compiled = parts.compile_model(model, data.x_train[:500], params, parts.DEFAULT_QUANT)
    x = data.x_test[:1]  # TFHE runs one sample at a time
    compiled.keygen(); print(compiled.encrypt_run_decrypt(x[0]), compiled.clear(x)[0])  # equal

=========================  ================================================================
data and models            :data:`TASKS`, :func:`load_task`, :func:`load_task_of`,
                           :data:`PRESETS`, :class:`AttentionKind`
training in memory         :class:`TrainConfig`, :func:`config_for_task`, :func:`train`,
                           :func:`predict`, :func:`evaluate`, :func:`save_checkpoint`,
                           :func:`load_checkpoint`
the integer program        :class:`QuantConfig`, :class:`OverflowPolicy`, :func:`export`,
                           :data:`DEFAULT_CALIB_SAMPLES`, :func:`train_program` (program QAT),
                           :func:`program_score`, :func:`prepare_qat`/:func:`strip_qat` (brevitas
                           QAT), :func:`accuracy`, :func:`program_summary`
compiling (both schemes)   :func:`compile_model` (a :class:`~fhe.harness.CompiledModel`)
TFHE                       :class:`TfheParams`, :data:`DEFAULT_QUANT` (the recipe's bits),
                           :func:`resolve_quant`, :func:`estimated_latency_s`,
                           :class:`TfheBackend` (an integer program's graph compiled directly)
CKKS                       :class:`CkksParams`, :class:`ApproxConfig`, :func:`compare_ckks`,
                           :func:`float_inference_form`
serving and batches        :class:`Client`, :class:`ServiceError`, :func:`run_batch`,
                           :class:`Worker`, :class:`FheError`
=========================  ================================================================
"""

from __future__ import annotations

from fhe.ckks.approx import ApproxConfig
from fhe.ckks.compare import compare_ckks
from fhe.ckks.program import float_inference_form
from fhe.deploy.batch import Worker, run_batch
from fhe.deploy.client import Client, ServiceError
from fhe.errors import FheError
from fhe.harness import compile_model
from fhe.schemes import CkksParams, TfheParams
from fhe.tfhe.backend import TfheBackend
from fhe.tfhe.recipe import DEFAULT_QUANT, estimated_latency_s, resolve_quant
from models.config import AttentionKind
from models.presets import PRESETS
from models.tasks import TASKS, load_task, load_task_of
from models.training import (
    TrainConfig,
    config_for_task,
    evaluate,
    load_checkpoint,
    predict,
    save_checkpoint,
    train,
)
from quant import OverflowPolicy, QuantConfig
from quant.config import DEFAULT_CALIB_SAMPLES
from quant.export import export
from quant.program_qat import program_score, train_program
from quant.qat import prepare_qat, strip_qat
from quant.report import accuracy, program_summary

__all__ = [
    "DEFAULT_CALIB_SAMPLES",
    "DEFAULT_QUANT",
    "PRESETS",
    "TASKS",
    "ApproxConfig",
    "AttentionKind",
    "CkksParams",
    "Client",
    "FheError",
    "OverflowPolicy",
    "QuantConfig",
    "ServiceError",
    "TfheBackend",
    "TfheParams",
    "TrainConfig",
    "Worker",
    "accuracy",
    "compare_ckks",
    "compile_model",
    "config_for_task",
    "estimated_latency_s",
    "evaluate",
    "export",
    "float_inference_form",
    "load_checkpoint",
    "load_task",
    "load_task_of",
    "predict",
    "prepare_qat",
    "program_score",
    "program_summary",
    "resolve_quant",
    "run_batch",
    "save_checkpoint",
    "strip_qat",
    "train",
    "train_program",
]
