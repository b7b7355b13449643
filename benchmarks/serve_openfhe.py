"""A bootstrapped CKKS model served: `fhe serve` / `fhe client` on an OpenFHE-engine artifact
against `fhe run` on the same artifact, in one run (issue 28).

    python benchmarks/serve_openfhe.py                 # 2 test samples each way
    python benchmarks/serve_openfhe.py --n 1 --epochs 20
    python benchmarks/serve_openfhe.py --recipe ckks   # make demo's CKKS model (no bootstrap)
    python benchmarks/serve_openfhe.py --n 1 --layers 4   # 4 blocks: serve_openfhe_L4.md|json

The model is `fhe train --task digits --recipe ckks-deep` (issue 28's target: 2 blocks, LayerNorm,
polynomial GELU; `--epochs` shortens its training), compiled with `--engine openfhe` (N = 2^16,
128-bit: depth 61, beyond a fresh query's 24 levels, so the server bootstraps). Then, one after
the other so that only one copy of the keys is in memory at a time:

1. `fhe run` (fhe.api.run_artifact): client and server in this process, one query per sample;
2. `fhe serve` in a subprocess on a loopback port, and fhe.deploy.Client: the key set uploaded once
   (seconds and bytes), one query per sample (round trip, the server's compute, key loading).
   The served process tree's resident memory is sampled every second; its peak is reported.

Both ways are compared with the clear polynomial program (max error, argmax), and the served round
trip with `fhe run`'s seconds in the same run. Writes benchmarks/results/serve_openfhe.md|json
(with `--layers L`: serve_openfhe_L<L>.md|json).
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import command_line, write_results  # noqa: E402

GIB = 2**30


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            status = (entry / "status").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
        line = next((ln for ln in status.splitlines() if ln.startswith("VmRSS:")), "VmRSS: 0 kB")
        rss[int(entry.name)] = int(line.split()[1]) * 1024
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += children.get(p, [])
    return total


class Sampler(threading.Thread):
    """The peak of :func:`tree_rss` over the thread's life."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            self.peak = max(self.peak, tree_rss(self.pid))


def serve(server_dir: Path, keys_dir: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fhe = str(Path(sys.executable).with_name("fhe"))
    log = open(keys_dir.parent / "serve.log", "w")  # noqa: SIM115 - closed by the caller
    proc = subprocess.Popen(
        [fhe, "serve", str(server_dir), "--port", str(port), "--keys-dir", str(keys_dir)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    import httpx

    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):  # opening the artifact verifies the hashes of GBs of keys
        if proc.poll() is not None:
            raise RuntimeError((keys_dir.parent / "serve.log").read_text())
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            time.sleep(0.5)
    raise RuntimeError("fhe serve did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2, help="test samples, each way")
    parser.add_argument("--epochs", type=int, default=None, help="shorter training than the recipe")
    parser.add_argument("--recipe", default="ckks-deep", help="fhe train's recipe for the model")
    parser.add_argument("--layers", type=int, default=None, help="blocks (default: the recipe's)")
    args = parser.parse_args()
    from fhe import api
    from fhe.api.parts import Client

    load = f"{os.getloadavg()[0]:.2f}"
    with tempfile.TemporaryDirectory(prefix="serve-openfhe-") as tmp:
        tmp = Path(tmp)
        given = {"epochs": args.epochs, "layers": args.layers}
        extra = {k: v for k, v in given.items() if v is not None}
        request = api.TrainRequest(task="digits", recipe=args.recipe, **extra)
        outcome = api.train_model(request, progress=False)
        outcome.save(tmp / "model.pt")
        c = api.compile_file(tmp / "model.pt", api.CompileOptions(scheme="ckks", engine="openfhe"))
        backend = c.compiled.backend
        report = backend.report()
        api.keygen(c)
        api.save_artifacts(c, tmp / "art")
        keygen_s = backend.timings_s["keygen"]
        x_test = c.data.x_test[: args.n].numpy()
        clear = backend.simulate(x_test)
        backend.close()  # its two workers hold the keys: one copy in memory at a time

        local = []
        for i in range(args.n):
            run = api.run_artifact(tmp / "art", sample=i)
            local.append({"seconds": run.seconds, "logits": run.logits.tolist()})
            print(f"fhe run sample {i}: {run.seconds:.1f} s", flush=True)

        proc, url, log = serve(tmp / "art" / "server", tmp / "keys")
        sampler = Sampler(proc.pid)
        sampler.start()
        try:
            client = Client(tmp / "art" / "client", url, timeout_s=7200)
            key_bytes = client.local.key_file.stat().st_size
            start = time.perf_counter()
            client.upload_keys()
            upload_s = time.perf_counter() - start
            print(f"keys uploaded: {key_bytes / GIB:.2f} GiB in {upload_s:.1f} s", flush=True)
            served = []
            for i in range(args.n):
                p = client.predict(x_test[i : i + 1])
                served.append(
                    {
                        "round_trip_s": p.round_trip_s,
                        "server_s": p.server_s,
                        "keys_s": client.last_keys_s,
                        "logits": p.logits[0].tolist(),
                    }
                )
                print(f"served sample {i}: {served[-1]['round_trip_s']:.1f} s", flush=True)
        finally:
            sampler.done.set()
            proc.terminate()
            proc.wait(timeout=60)
            log.close()

    def errors(rows, key):
        got = np.array([r[key] for r in rows])
        return float(np.abs(got - clear).max()), int((got.argmax(1) == clear.argmax(1)).sum())

    local_err, local_agree = errors(local, "logits")
    served_err, served_agree = errors(served, "logits")
    local_s = float(np.median([r["seconds"] for r in local]))
    served_s = float(np.median([r["round_trip_s"] for r in served]))
    server_s = float(np.median([r["server_s"] for r in served]))
    data = {
        "load": load,
        "n": args.n,
        "train": {"recipe": args.recipe, **extra},
        "accuracy_float": outcome.float_score,
        "bootstraps": report["bootstraps"],
        "program_depth": report["depth"],
        "slots": report["slots"],
        "keygen_s": keygen_s,
        "key_set_bytes": key_bytes,
        "upload_s": upload_s,
        "first_query_keys_s": served[0]["keys_s"],
        "serve_peak_bytes": sampler.peak,
        "fhe_run": local,
        "served": served,
        "clear": clear.tolist(),
    }
    layers = "" if args.layers is None else f" --layers {args.layers}"
    lines = [
        "# A bootstrapped CKKS model served (`fhe serve`, OpenFHE engine) against `fhe run`",
        "",
        f"`{command_line()}`",
        "",
        f"Digits, `--recipe {args.recipe}{layers}` "
        f"(float accuracy {100 * outcome.float_score:.2f}%), "
        f"compiled with `--engine openfhe`: N = 2^16, 128-bit, {report['slots']} slots, depth "
        f"{report['depth']}, {report['bootstraps']} bootstraps per query on the server, no client "
        f"refresh. {args.n} test sample(s) each way, one query each, the same artifact, one after "
        f"the other in one run. Load average {load} at the start (2 cores, shared).",
        "",
        "| | latency / query (median, s) | server compute (s) | max error vs clear | "
        "argmax == clear |",
        "|---|---|---|---|---|",
        f"| `fhe run` (in process) | {local_s:.1f} | | {local_err:.1e} | {local_agree}/{args.n} |",
        f"| `fhe serve` + `fhe client` (round trip) | {served_s:.1f} | {server_s:.1f} | "
        f"{served_err:.1e} | {served_agree}/{args.n} |",
        "",
        f"- served / in-process latency, same run: **{served_s / local_s:.2f}x**",
        f"- key set uploaded once: {key_bytes / GIB:.2f} GiB in {upload_s:.0f} s (spooled to disk, "
        f"hashed, checked by loading it into the OpenFHE worker); key loading at the first "
        f"query: {served[0]['keys_s']:.0f} s (the keys checked at upload stay loaded)",
        f"- keygen {keygen_s:.0f} s; peak resident memory of the whole `fhe serve` process tree "
        f"(service, worker, OpenFHE worker): {sampler.peak / GIB:.2f} GiB = "
        f"{sampler.peak / 1e9:.2f} GB",
    ]
    name = "serve_openfhe" if args.layers is None else f"serve_openfhe_L{args.layers}"
    write_results(name, lines, data)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
