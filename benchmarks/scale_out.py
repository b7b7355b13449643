"""Serving and scale-out: HTTP overhead of `fhe serve`, and batch throughput against Ray workers.

TFHE: the digits Inhibitor model (the `make demo` recipe, compiled with the defaults). CKKS: a small
GEGLU-only polynomial model (4 tokens of 3 features, no client refresh), batches of SIMD blocks.
For each scheme: the same encrypted payloads answered in this process, by 1 Ray worker and by 2
(each worker loads the server artifact and the evaluation keys once: the key-shipping cost), outputs
compared with the in-process run; and a real `fhe serve` round trip against the bare server run.

    python benchmarks/scale_out.py [--samples 4]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks._results import command_line, write_results  # noqa: E402

FHE = str(Path(sys.executable).with_name("fhe"))


def tfhe_artifact(tmp: Path) -> tuple[Path, np.ndarray]:
    from fhe.api.parts import (
        DEFAULT_QUANT,
        TrainConfig,
        config_for_task,
        load_task,
        save_checkpoint,
        train,
        train_program,
    )

    data = load_task("digits", patch=4)
    cfg = config_for_task(data, attention="inhibitor", d_model=16, n_heads=2, norm="batchnorm")
    res = train(cfg, data, TrainConfig(epochs=60, batch_size=64, lr=3e-3, seed=0), progress=False)
    qat = train_program(
        res.model,
        data,
        DEFAULT_QUANT,
        TrainConfig(epochs=100, lr=2e-3, seed=0, batch_size=64),
        progress=False,
    )
    model = tmp / "digits.pt"
    save_checkpoint(model, qat.model, data, quant=DEFAULT_QUANT.to_dict())
    subprocess.run(
        [FHE, "compile", str(model), "--out", str(tmp / "tfhe"), "--no-run"],
        check=True,
        capture_output=True,
    )
    return tmp / "tfhe", data.x_test.numpy()


def ckks_artifact(tmp: Path):
    """The saved CKKS artifact and its compiled model (``.clear`` is the reference)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fhe"))
    from ckks_models import tiny

    from fhe.api.parts import ApproxConfig, CkksParams, compile_model

    torch.manual_seed(0)
    cm = compile_model(
        tiny(attention="geglu-only"),
        torch.randn(300, 4, 3, dtype=torch.float64),
        CkksParams(approx=ApproxConfig(reciprocal_tol=0.05, activation_tol=0.05)),
    )
    cm.keygen()
    cm.save(tmp / "ckks", include_secret_key=True)
    return tmp / "ckks", cm


def batch_rows(art: Path, payloads: list[bytes], client, scheme: str, samples: int) -> list[dict]:
    from fhe.api.parts import run_batch

    keys = client.public_keys()
    rows, reference = [], None
    for workers in (0, 1, 2):
        load = os.getloadavg()[0]
        res = run_batch(art / "server", keys, payloads, workers=workers)
        outs = [np.asarray(client.decrypt(o)) for o in res.outputs]
        if reference is None:
            reference = outs
        same = all(
            np.array_equal(a, b) if scheme == "tfhe" else np.allclose(a, b, atol=1e-6)
            for a, b in zip(reference, outs, strict=True)
        )
        rows.append(
            {
                "scheme": scheme,
                "workers": workers,
                "payloads": len(payloads),
                "samples": samples,
                "keys_mib": len(keys) / 2**20,
                "setup_s": res.setup_s,
                "per_worker_setup_s": res.per_worker_setup_s,
                "run_s": res.run_s,
                "samples_per_s": samples / res.run_s,
                "same_as_in_process": same,
                "load_before": load,
            }
        )
        print(rows[-1], flush=True)
        if workers:
            import ray

            ray.shutdown()
    base = rows[0]["samples_per_s"]
    for r in rows:
        r["speedup_vs_in_process"] = r["samples_per_s"] / base
    return rows


def serving_row(art: Path, make_input, scheme: str, repeats: int) -> dict:
    from fhe.api.parts import Client, Worker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [FHE, "serve", str(art), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = Client(art / "client", f"http://127.0.0.1:{port}")
        for _ in range(240):
            try:
                client.describe()
                break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.5)
        upload_start = time.perf_counter()
        client.upload_keys()
        upload_s = time.perf_counter() - upload_start
        worker = Worker(str(art / "server"), client.public_keys())
        first_start = time.perf_counter()
        client.predict(
            make_input(0)
        )  # the first request (keys already in the server's memory after upload)
        first_s = time.perf_counter() - first_start
        rows = []
        for i in range(1, repeats + 1):
            x = make_input(i)
            payload = client.encrypt(x)
            start = time.perf_counter()
            worker.run(payload)
            bare = time.perf_counter() - start
            got = client.predict(x)
            rows.append((got.round_trip_s, got.server_s, bare))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    rt, server, bare = (float(np.median(v)) for v in zip(*rows, strict=True))
    return {
        "scheme": scheme,
        "key_upload_s": upload_s,
        "first_round_trip_s": first_s,
        "round_trip_s": rt,
        "server_s": server,
        "bare_run_s": bare,
        "overhead_s": rt - bare,
        "overhead_share": (rt - bare) / bare,
        "repeats": repeats,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=4, help="TFHE encrypted samples per batch")
    ap.add_argument("--blocks", type=int, default=4, help="CKKS SIMD blocks per batch")
    ap.add_argument("--block-size", type=int, default=512, help="samples per CKKS block")
    ap.add_argument(
        "--repeats", type=int, default=3, help="served requests per scheme after the first"
    )
    args = ap.parse_args()
    from fhe.api.parts import Client

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tfhe_dir, x_test = tfhe_artifact(tmp)
        client = Client(tfhe_dir / "client")
        tfhe_rows = batch_rows(
            tfhe_dir,
            [client.encrypt(x) for x in x_test[: args.samples]],
            client,
            "tfhe",
            args.samples,
        )
        tfhe_serve = serving_row(tfhe_dir, lambda i: x_test[i], "tfhe", args.repeats)
        ckks_dir, _ = ckks_artifact(tmp)
        cclient = Client(ckks_dir / "client")
        rng = np.random.default_rng(0)
        blocks = [rng.standard_normal((args.block_size, 4, 3)) for _ in range(args.blocks)]
        ckks_rows = batch_rows(
            ckks_dir,
            [cclient.encrypt(b) for b in blocks],
            cclient,
            "ckks",
            args.blocks * args.block_size,
        )
        ckks_serve = serving_row(ckks_dir, lambda i: blocks[i % len(blocks)], "ckks", args.repeats)
    rows, serve_rows = tfhe_rows + ckks_rows, [tfhe_serve, ckks_serve]
    lines = [
        "# Serving overhead and Ray scale-out",
        "",
        f"`{command_line()}`",
        "",
        f"Machine: {os.cpu_count()} cores, shared (1-minute load average before each batch "
        "listed). TFHE: the digits Inhibitor model (d16, 2 heads, 4 tokens; defaults), one sample "
        "per payload. CKKS: a GEGLU-only model (4 tokens x 3 features), one SIMD block per "
        "payload. Workers split the cores (OMP_NUM_THREADS = cores / workers); in-process uses "
        "every core for one payload at a time.",
        "",
        "## Batch throughput",
        "",
        "| scheme | workers | payloads | samples | keys (MiB) | setup (s) | per-worker load (s) | "
        "run (s) | samples/s | vs in-process | same outputs | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scheme']} | {r['workers'] or 'in-process'} | {r['payloads']} | {r['samples']} "
            f"| {r['keys_mib']:.0f} | {r['setup_s']:.1f} | "
            f"{', '.join(f'{s:.1f}' for s in r['per_worker_setup_s'])} | {r['run_s']:.1f} | "
            f"{r['samples_per_s']:.3f} | {r['speedup_vs_in_process']:.2f}x | "
            f"{r['same_as_in_process']} | {r['load_before']:.1f} |"
        )
    lines += [
        "",
        "## Serving overhead (`fhe serve` on loopback, median of repeats)",
        "",
        "The round trip is the client's encrypt + upload + server + download + decrypt; the bare "
        "run is the same payload through the same runtime without HTTP. Key upload includes the "
        "server's check (deserialising the keys) and writing them to disk.",
        "",
        "| scheme | key upload (s) | first round trip (s) | round trip (s) | server compute (s) | "
        "bare run (s) | overhead (round trip - bare) | share of the run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in serve_rows:
        lines.append(
            f"| {r['scheme']} | {r['key_upload_s']:.2f} | {r['first_round_trip_s']:.2f} | "
            f"{r['round_trip_s']:.2f} | {r['server_s']:.2f} | {r['bare_run_s']:.2f} | "
            f"{r['overhead_s']:.2f} s | {100 * r['overhead_share']:.1f}% |"
        )
    lines += [
        "",
        "## Projection to M machines (a projection from the figures above, not a measurement)",
        "",
    ]
    for scheme, group in (("tfhe", tfhe_rows), ("ckks", ckks_rows)):
        best = max(group, key=lambda r: r["samples_per_s"])
        per_worker_setup = max(best["per_worker_setup_s"])
        rate = best["samples_per_s"]
        lines.append(
            f"- {scheme}: one {os.cpu_count()}-core machine answers {rate:.3f} samples/s "
            f"(best row: {best['workers'] or 'in-process'}); M such machines: about "
            f"M x {best['samples_per_s']:.3f} samples/s once each worker has loaded its "
            f"{best['keys_mib']:.0f} MiB of keys ({per_worker_setup:.1f} s here, plus the transfer "
            "over the network), so 10 000 samples take about "
            f"{10000 / best['samples_per_s'] / 60:.1f} min / M."
        )
    write_results("scale_out", lines, {"batch": rows, "serving": serve_rows})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
