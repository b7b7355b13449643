"""OpenFHE bootstrapping through the engine's worker, at the engine's 128-bit parameters (issue 28).

    python benchmarks/ckks_bootstrap.py     # 2048 slots, 1 and 2 threads, baby steps 0x0 and 8x8
    python benchmarks/ckks_bootstrap.py --slots 256 --threads 2 --baby-steps 8x8

For each (slots, threads, baby steps of the bootstrap's linear transforms; 0x0 is OpenFHE's own
choice, the engine's is ``BOOTSTRAP_BABY_STEPS``): keygen in a client worker, the evaluation keys
opened by a server worker (no secret key), then bootstraps of a fresh ciphertext of values in
[-1, 1] and [-16, 16]. Each bootstrap is timed twice in the same run: inside the worker (OpenFHE's
EvalBootstrap alone) and around the call (what the toolkit pays, the pipe and serialisation
included). The same ciphertext is also bootstrapped as deserialised, not adopted into the server's
context (``Worker._adopt``), timed inside the worker: what adoption saves, in the same run.
Precision is -log2(max |error|) after the client decrypts. Peak memory is each worker's own
(ru_maxrss). Writes benchmarks/results/ckks_bootstrap.md|json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import command_line, write_results  # noqa: E402
from fhe.ckks.openfhe import backend as ob  # noqa: E402
from fhe.ckks.openfhe.engine import (  # noqa: E402
    Ciphertext,
    EngineError,
    WorkerProcess,
)

REFERENCE_S = 28.6  # OpenFHE, N = 2^16, 128-bit, one thread (measured on this machine, issue 28)


def measure(slots: int, threads: int, baby_steps: tuple[int, int], repeats: int) -> dict:
    after, depth = ob.chain_at_128_bits()
    params = {
        "secure": True,
        "ring_dim": ob.SECURE_RING,
        "scale_bits": ob.SCALE_BITS,
        "first_mod_bits": ob.FIRST_MOD_BITS,
        "large_digits": ob.LARGE_DIGITS,
        "total_depth": after + depth,
        "slots": slots,
        "level_budget": list(ob.LEVEL_BUDGET),
        "baby_steps": list(baby_steps),
        "bootstrap": True,
        "rotation_steps": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        maker = WorkerProcess(threads=threads)  # as the backend: keygen in a worker of its own
        reply, _ = maker.call(
            "keygen", params=params, server_dir=f"{tmp}/server", client_dir=f"{tmp}/client"
        )
        peak_keygen = maker.call("peak_memory")[0]["bytes"]
        maker.close()
        client = WorkerProcess(threads=threads)
        client.call("open_client", folder=f"{tmp}/client")
        server = WorkerProcess(threads=threads)
        start = time.perf_counter()
        server.call("open_server", folder=f"{tmp}/server")
        open_s = time.perf_counter() - start
        rng = np.random.default_rng(0)
        rows = {}
        for magnitude in (1.0, 16.0):
            x = rng.uniform(-magnitude, magnitude, slots)
            inner, outer, errors, unadopted = [], [], [], []
            for _ in range(repeats):
                blob = client.to_bytes(client.encrypt(x, depth + after - 2))
                as_received = server.from_bytes(blob, adopt=False)
                unadopted.append(server.call("bootstrap", a=as_received.handle)[0]["seconds"])
                ct = server.from_bytes(blob)  # adopted, as the engine serves it
                start = time.perf_counter()
                out, _ = server.call("bootstrap", a=ct.handle)
                outer.append(time.perf_counter() - start)
                inner.append(out["seconds"])
                back = Ciphertext(server, int(out["handle"]))
                got = client.decrypt(client.from_bytes(server.to_bytes(back)))[:slots]
                errors.append(float(np.max(np.abs(got - x))))
                levels_left = after + depth - out["level"]
            rows[magnitude] = {
                "openfhe_s": statistics.median(inner),
                "engine_s": statistics.median(outer),
                "not_adopted_s": statistics.median(unadopted),
                "max_error": max(errors),
                "bits": -float(np.log2(max(errors))),
                "levels_left": levels_left,
            }
        peak_client = client.call("peak_memory")[0]["bytes"]
        peak_server = server.call("peak_memory")[0]["bytes"]
        client.close()
        server.close()
    return {
        "slots": slots,
        "threads": threads,
        "baby_steps": list(baby_steps),
        "rotation_keys": reply["rotation_keys"],
        "levels_after": after,
        "bootstrap_depth": depth,
        "keygen_s": reply["keygen_s"],
        "server_open_s": open_s,
        "key_bytes": reply["sizes"],
        "peak_keygen_bytes": peak_keygen,
        "peak_client_bytes": peak_client,
        "peak_server_bytes": peak_server,
        "by_magnitude": rows,
    }


def baby_text(baby_steps) -> str:
    return "OpenFHE's" if tuple(baby_steps) == (0, 0) else "x".join(map(str, baby_steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slots", default="2048")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--baby-steps", default="0x0,8x8", help="e.g. 0x0,8x8 (0: OpenFHE's)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    load = f"{os.getloadavg()[0]:.2f}"
    results, failed = [], []
    dims = [tuple(int(n) for n in d.split("x")) for d in args.baby_steps.split(",")]
    configs = [
        (int(s), int(t), (d[0], d[1]))
        for s in args.slots.split(",")
        for t in args.threads.split(",")
        for d in dims
    ]
    for slots, threads, baby in configs:
        try:
            r = measure(slots, threads, baby, args.repeats)
        except EngineError as exc:  # e.g. a worker killed for memory
            print(f"slots {slots} threads {threads} baby steps {baby}: {exc}", flush=True)
            failed.append(
                {"slots": slots, "threads": threads, "baby_steps": baby, "error": str(exc)}
            )
            continue
        results.append(r)
        one = r["by_magnitude"][1.0]
        print(
            f"slots {slots:5d} threads {threads} baby steps {baby}: {r['rotation_keys']} "
            f"rotation keys, bootstrap {one['engine_s']:.1f} s (OpenFHE alone "
            f"{one['openfhe_s']:.1f} s, not adopted {one['not_adopted_s']:.1f} s), "
            f"{one['bits']:.1f} bits, keygen {r['keygen_s']:.1f} s, "
            f"peak keygen / client / server {r['peak_keygen_bytes'] / 2**30:.1f} / "
            f"{r['peak_client_bytes'] / 2**30:.1f} / {r['peak_server_bytes'] / 2**30:.1f} GiB",
            flush=True,
        )
    gib = 2**30
    lines = [
        "# OpenFHE bootstrapping through the engine (issue 28)",
        "",
        f"`{command_line()}`",
        "",
        f"N = 2^16, 128-bit (HEStd_128_classic), scale 2^{ob.SCALE_BITS}, first prime "
        f"{ob.FIRST_MOD_BITS} bits, level budget {ob.LEVEL_BUDGET}, {ob.LARGE_DIGITS} "
        f"key-switching digits, uniform ternary secret: {results[0]['levels_after']} levels left "
        f"after a bootstrap, {results[0]['bootstrap_depth']} used by it. Load average {load} at "
        "the start (2 cores, shared).",
        "",
        "`engine` is the bootstrap as the toolkit runs it (pipe and serialisation included),"
        " `OpenFHE` the same call timed inside the worker; the reference is OpenFHE alone at N = "
        f"2^16, one thread, {REFERENCE_S} s (issue 28, slots not recorded there). Baby steps are "
        "those of the bootstrap's two linear transforms (OpenFHE's: its own choice); the rotation "
        "keys are the bootstrap's, the keys column every evaluation key. `not adopted` is the same "
        "bootstrap (inside the worker) of the received ciphertext as deserialised, without the "
        "fresh zero the server adds to it (`Worker._adopt`).",
        "",
        "| slots | threads | baby steps | rotation keys | engine (s) | OpenFHE (s) "
        "| engine / OpenFHE | engine / reference | not adopted (s) "
        "| bits, values in [-1, 1] | bits, values in [-16, 16] | keygen (s) | keys (GiB) "
        "| peak keygen / client / server (GiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        one, big = r["by_magnitude"][1.0], r["by_magnitude"][16.0]
        keys = sum(r["key_bytes"].values()) / gib
        lines.append(
            f"| {r['slots']} | {r['threads']} | {baby_text(r['baby_steps'])} | "
            f"{r['rotation_keys']} | {one['engine_s']:.1f} | {one['openfhe_s']:.1f} | "
            f"{one['engine_s'] / one['openfhe_s']:.3f} | {one['engine_s'] / REFERENCE_S:.2f} | "
            f"{one['not_adopted_s']:.1f} | "
            f"{one['bits']:.1f} | {big['bits']:.1f} (abs. error {big['max_error']:.1e}) | "
            f"{r['keygen_s']:.1f} | {keys:.2f} | {r['peak_keygen_bytes'] / gib:.1f} / "
            f"{r['peak_client_bytes'] / gib:.1f} / {r['peak_server_bytes'] / gib:.1f} |"
        )
    for f in failed:
        baby = baby_text(f["baby_steps"])
        lines.append(f"| {f['slots']} | {f['threads']} | {baby} | failed: {f['error']} |")
    write_results("ckks_bootstrap", lines, {"load": load, "results": results, "failed": failed})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
