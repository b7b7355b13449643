"""``fhe run`` and ``fhe batch`` as calls: test samples through a compiled artifact's client and
server."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fhe.errors import BadOptionError, FheError
from fhe.schemes import Scheme

if TYPE_CHECKING:
    from fhe.deploy.batch import BatchResult


# ------------------------------------------------------------------------------------------
# artifacts
@dataclass(frozen=True)
class ArtifactRun:
    """One test sample through a compiled artifact: the client encrypts, the server runs, the client
    decrypts."""

    scheme: str
    sample: int | None  # None: a text given on the command line
    label: int | None
    logits: np.ndarray
    seconds: float
    notes: tuple[str, ...] = ()
    labels: tuple[str, ...] | None = None  # the outputs' names (a next-word model's words)

    @property
    def prediction(self) -> int:
        return int(np.asarray(self.logits).argmax())

    def describe(self) -> str:
        scheme = ", CKKS" if Scheme(self.scheme) is Scheme.CKKS else ""
        what = (
            "text"
            if self.sample is None
            else f"sample {self.sample}: label {named(self.label, self.labels)},"
        )
        return (
            f"{what} encrypted prediction {named(self.prediction, self.labels)} "
            f"({self.seconds:.1f} s{scheme}); logits {np.round(self.logits, 3).tolist()}"
        )


def named(output: int | None, labels: tuple[str, ...] | None) -> str:
    """An output index, with its name when the model has them: ``3 ("of")``."""
    if output is None or not labels or not 0 <= output < len(labels):
        return str(output)
    return f'{output} ("{labels[output]}")'


def load_task_of_artifact(meta: dict, data_dir: str | Path | None = None):
    """The task data an artifact was compiled for, from its metadata."""
    from models.tasks import DataFileError, load_task

    try:
        return load_task(
            meta["task"],
            data_dir=data_dir,
            seq_len=meta.get("words") or meta["seq_len"],  # a text model reads `words` words
            patch=meta.get("patch"),
        )
    except DataFileError as exc:
        raise BadOptionError(str(exc)) from exc


def pick_test_sample(data, index: int, task: str) -> tuple[np.ndarray, int]:
    """Test sample ``index`` of ``data`` and its label; :class:`BadOptionError` outside the
    split."""
    if not 0 <= index < len(data.x_test):
        raise BadOptionError(
            f"--sample must be in [0, {len(data.x_test) - 1}] for {task}, got {index}"
        )
    return data.x_test[index].numpy(), int(data.y_test[index])


def client_input(
    client,
    sample: int | None = None,
    text: str | None = None,
    input_path: str | Path | None = None,
    data_dir: str | Path | None = None,
) -> tuple[np.ndarray, int | None]:
    """One input for ``client`` (:class:`~fhe.deploy.client.Client`) and its label (None when
    unknown), from exactly one of: test sample ``sample`` of the artifact's task, a ``text`` (a
    text model: the client's front end embeds it), a ``.npy`` file."""
    if sum(v is not None for v in (sample, text, input_path)) != 1:
        raise BadOptionError("give exactly one of --sample N, --text TEXT or --input FILE.npy")
    if text is not None:
        try:
            return client.encode_text(text), None
        except FheError as exc:
            raise BadOptionError(f"--text: {exc}") from exc
    if input_path is not None:
        return read_input(input_path), None
    assert sample is not None  # exactly one of the three was given
    x, label = pick_test_sample(
        load_task_of_artifact(client.meta, data_dir), sample, client.meta["task"]
    )
    if client.text is not None:  # token ids: embedded on the client, as a text would be
        x = client.text.embed_ids(x[None])[0]
    return x, label


def run_artifact(
    artifact_dir: str | Path,
    sample: int | None = 0,
    data_dir: str | Path | None = None,
    allow_overflow: bool = False,
    text: str | None = None,
) -> ArtifactRun:
    """``fhe run``: test sample ``sample`` (or a ``text``, for a text model) through
    ``artifact_dir``'s client and server, in this process (a CKKS program planned with
    client-assisted refreshes gets them from the client here)."""
    from fhe.deploy.client import Client, dequantize_output, quantize_input

    artifact_dir = Path(artifact_dir)
    try:
        # the scheme (and CKKS layout) of the artifact
        client = Client(artifact_dir / "client", allow_overflow=allow_overflow)
        server = _open_server(client.scheme, artifact_dir / "server")
    except (FileNotFoundError, RuntimeError) as exc:
        raise FheError(str(exc)) from exc
    meta = client.meta
    x, label = client_input(client, None if text is not None else sample, text, None, data_dir)
    local = client.local
    start = time.perf_counter()
    if client.scheme is Scheme.TFHE:
        x_int = quantize_input(meta, x)
        client.check_input(x_int)  # the same refusal as fhe client and fhe compare
        logits = dequantize_output(meta, local.decrypt(server.run(local.encrypt(x_int))))
    else:
        logits = local.decrypt(server.run(local.encrypt(x[None]), local.refresh(server.context)))[0]
    seconds = time.perf_counter() - start
    note = client.text_note(text)
    notes = tuple(client.warnings) + ((note,) if note else ())
    shown = None if text is not None else sample
    logits = np.asarray(logits).reshape(-1)
    return ArtifactRun(client.scheme, shown, label, logits, seconds, notes, client.labels)


def _open_server(scheme: str, folder: Path):
    if Scheme(scheme) is Scheme.TFHE:
        from fhe.tfhe.backend import TfheServer

        return TfheServer(folder)
    from fhe.ckks.backend_packed import open_server

    return open_server(folder)


@dataclass(frozen=True)
class BatchOutcome:
    n: int
    accuracy: float
    result: BatchResult  # setup and run times, workers

    def describe(self) -> str:
        r = self.result
        where = "in this process" if not r.workers else f"on {r.workers} Ray workers"
        per_worker = ", ".join(f"{s:.1f}" for s in r.per_worker_setup_s)
        return (
            f"{self.n} samples {where}: accuracy {self.accuracy:.4f}; setup {r.setup_s:.1f} s (per "
            f"worker {per_worker} s), run {r.run_s:.1f} s, {self.n / r.run_s:.3f} samples/s"
        )


def batch_artifact(
    artifact_dir: str | Path,
    n: int = 8,
    workers: int = 0,
    ray_address: str | None = None,
    block: int | None = None,
    data_dir: str | Path | None = None,
) -> BatchOutcome:
    """``fhe batch``: the first ``n`` test samples encrypted by the client artifact, run by the
    server artifact (here or on Ray workers) through the service's wire format, decrypted. CKKS
    sends ``block`` samples per SIMD batch (default: split evenly over the workers); TFHE one sample
    per request."""
    from fhe.deploy.batch import run_batch
    from fhe.deploy.client import Client

    artifact_dir = Path(artifact_dir)
    client = Client(artifact_dir / "client")
    data = load_task_of_artifact(client.meta, data_dir)
    x, y = data.x_test[:n].numpy(), data.y_test[:n].numpy()
    if client.text is not None:  # token ids: the client embeds them
        x = client.text.embed_ids(x)
    if client.scheme is Scheme.TFHE:
        groups = list(x)
    else:
        size = block or -(-len(x) // max(1, workers))
        groups = [x[i : i + size] for i in range(0, len(x), size)]
    result = run_batch(
        artifact_dir / "server",
        client.public_keys(),
        [client.encrypt(g) for g in groups],
        workers,
        ray_address,
    )
    logits = np.concatenate(
        [np.asarray(client.decrypt(o)).reshape(-1, data.n_outputs) for o in result.outputs]
    )
    return BatchOutcome(len(x), float((logits.argmax(-1) == y).mean()), result)


def read_input(path: str | Path) -> np.ndarray:
    """One input for ``fhe client --input``: a ``.npy`` file of floats (never unpickled)."""
    path = Path(path)
    if path.suffix != ".npy":
        raise BadOptionError(f"--input must be a .npy file, got {path.name}")
    try:
        return np.load(path, allow_pickle=False).astype(np.float64)
    except (OSError, ValueError) as exc:
        raise BadOptionError(f"cannot read {path}: {exc}") from exc
