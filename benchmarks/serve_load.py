"""`fhe serve` under load and under a large upload: throughput, latency percentiles, errors and the
served process tree's peak memory, for 1 to 32 concurrent clients, TFHE and CKKS.

TFHE: a small integer circuit (4 inputs, a clear linear layer, one rounded lookup; the tests' own).
CKKS: the GEGLU-only polynomial model of scale_out.py. Each client sends ``--per-client`` requests
one after the other; every answer is decrypted and compared with the clear program. Answers 503
(queue full) are counted as refusals, not errors; anything else not 2xx, or a wrong answer, is an
error. Memory is the resident set of the server and its workers, sampled every 50 ms.

    python benchmarks/serve_load.py [--clients 1,4,16,32] [--per-client 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks._results import command_line, write_results  # noqa: E402
from benchmarks.scale_out import ckks_artifact  # noqa: E402

FHE = str(Path(sys.executable).with_name("fhe"))


def tfhe_artifact(tmp: Path):
    """The tests' small TFHE artifact (tests/test_deploy.py) and its clear reference."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_deploy import _tfhe_artifact

    graph = _tfhe_artifact(tmp / "tfhe")
    return tmp / "tfhe", lambda x: graph.run(np.asarray(x, dtype=np.int64))[0] * 0.5


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (from /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) << 10
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class Server:
    def __init__(self, art: Path, keys_dir: Path, *extra: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [FHE, "serve", str(art), "--port", str(self.port), "--keys-dir", str(keys_dir), *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(600):
            try:
                if httpx.get(self.url + "/health", timeout=1).is_success:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        self.peak, self._stop = tree_rss(self.proc.pid), False
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, tree_rss(self.proc.pid))
            time.sleep(0.05)

    def reset_peak(self) -> int:
        self.peak = tree_rss(self.proc.pid)
        return self.peak

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self._stop = True
        self.proc.terminate()
        self.proc.wait(timeout=60)


def load_row(
    server: Server, art: Path, scheme: str, clients: int, per_client: int, make_input, clear
) -> dict:
    from fhe.api.parts import Client, ServiceError

    latencies, refused, errors, wrong = [], 0, 0, 0
    transport: list[str] = []
    lock = threading.Lock()
    base = Client(art / "client", server.url)
    base.upload_keys()

    def one(i: int) -> None:
        nonlocal refused, errors, wrong
        c = Client(art / "client", server.url)
        for j in range(per_client):
            x = make_input(i * per_client + j)
            try:
                got = c.predict(x)
            except ServiceError as exc:
                with lock:
                    refused += exc.status == 503
                    errors += exc.status != 503
                continue
            except httpx.HTTPError as exc:  # no answer at all: an error too
                with lock:
                    errors += 1
                    transport.append(type(exc).__name__)
                continue
            ok = (
                np.array_equal(got.logits, clear(x))
                if scheme == "tfhe"
                else np.max(np.abs(got.logits - clear(x))) < 1e-3 * max(1.0, np.abs(clear(x)).max())
            )
            with lock:
                latencies.append(got.round_trip_s)
                wrong += not ok

    server.reset_peak()
    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    lat = np.array(latencies) if latencies else np.array([np.nan])
    return {
        "scheme": scheme,
        "clients": clients,
        "requests": clients * per_client,
        "answered": len(latencies),
        "refused_503": refused,
        "errors": errors,
        "transport_errors": transport,
        "wrong": wrong,
        "throughput_per_s": len(latencies) / wall,
        "p50_s": float(np.percentile(lat, 50)),
        "p95_s": float(np.percentile(lat, 95)),
        "max_s": float(lat.max()),
        "peak_rss_mib": server.peak / 2**20,
        "alive": server.alive(),
    }


def upload_row(server: Server, scheme: str, gib: float) -> dict:
    """A chunked upload of ``gib`` GiB of zeros (no Content-Length): the answer and peak memory."""
    chunk = b"\0" * (1 << 20)

    def body():
        for _ in range(int(gib * 1024)):
            yield chunk

    before = server.reset_peak()
    start = time.perf_counter()
    try:
        resp = httpx.put(
            server.url + "/keys",
            content=body(),
            headers={"content-type": "application/octet-stream"},
            timeout=600,
        )
        answer = f"{resp.status_code} {resp.json().get('detail', '')[:70]}"
    except httpx.HTTPError as exc:
        answer = f"connection closed ({type(exc).__name__})"
    return {
        "scheme": scheme,
        "upload_gib": gib,
        "answer": answer,
        "seconds": time.perf_counter() - start,
        "rss_before_mib": before / 2**20,
        "peak_rss_mib": server.peak / 2**20,
        "alive": server.alive(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="1,4,16,32")
    ap.add_argument("--per-client", type=int, default=2)
    ap.add_argument("--upload-gib", type=float, default=2.0)
    args = ap.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    rows, uploads, keys_mib = [], [], {}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tfhe_dir, tfhe_clear = tfhe_artifact(tmp)
        ckks_dir, ckks_model = ckks_artifact(tmp)
        ckks_inputs = [rng.standard_normal((8, 4, 3)) for _ in range(8)]
        tfhe_inputs = rng.integers(0, 16, size=(64, 4)).astype(float)
        plans = (
            ("tfhe", tfhe_dir, lambda i: tfhe_inputs[i % 64], tfhe_clear),
            ("ckks", ckks_dir, lambda i: ckks_inputs[i % 8], ckks_model.clear),
        )
        for scheme, art, make_input, clear in plans:
            from fhe.api.parts import Client

            keys_mib[scheme] = len(Client(art / "client").public_keys()) / 2**20
            server = Server(art, tmp / f"keys-{scheme}", "--queue", "32")
            try:
                for c in levels:
                    rows.append(
                        load_row(server, art, scheme, c, args.per_client, make_input, clear)
                    )
                    print(rows[-1], flush=True)
                uploads.append(upload_row(server, scheme, args.upload_gib))
                print(uploads[-1], flush=True)
            finally:
                server.stop()
    lines = [
        "# `fhe serve` under load and under a large upload",
        "",
        f"`{command_line()}`",
        "",
        f"Machine: {os.cpu_count()} cores, shared; 1-minute load average at the end "
        f"{os.getloadavg()[0]:.1f}. One worker process per server (each execution uses every "
        f"core), queue 32. Keys: TFHE {keys_mib['tfhe']:.0f} MiB, CKKS {keys_mib['ckks']:.1f} "
        "MiB. Peak memory: the server and its worker, resident.",
        "",
        "| scheme | clients | requests | answered | 503 | errors | wrong | answers/s | p50 (s) | "
        "p95 (s) | max (s) | peak RSS (MiB) | bound (MiB) | alive |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def bound(scheme: str) -> float:
        return 1.5 * keys_mib[scheme] + 1024

    for r in rows:
        lines.append(
            f"| {r['scheme']} | {r['clients']} | {r['requests']} | {r['answered']} | "
            f"{r['refused_503']} | {r['errors']} | {r['wrong']} | {r['throughput_per_s']:.2f} | "
            f"{r['p50_s']:.2f} | {r['p95_s']:.2f} | {r['max_s']:.2f} | {r['peak_rss_mib']:.0f} | "
            f"{bound(r['scheme']):.0f} | {r['alive']} |"
        )
    lines += [
        "",
        "## A chunked upload of zeros with no Content-Length",
        "",
        "| scheme | GiB sent | answer | seconds | RSS before (MiB) | peak RSS (MiB) | "
        "bound (MiB) | alive |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for u in uploads:
        lines.append(
            f"| {u['scheme']} | {u['upload_gib']} | {u['answer']} | {u['seconds']:.1f} | "
            f"{u['rss_before_mib']:.0f} | {u['peak_rss_mib']:.0f} | {bound(u['scheme']):.0f} | "
            f"{u['alive']} |"
        )
    write_results("serve_load", lines, {"load": rows, "uploads": uploads, "keys_mib": keys_mib})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
