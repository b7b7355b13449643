"""Our digits model against the peer, Concrete ML's digits MLP, measured in the same run.

The machine is shared and its speed drifts by 2x and more between hours, so absolute latencies from
different runs do not compare. This script alternates the two measurements (peer, ours, peer,
ours, ...) and reports each round's latency ratio next to the absolute figures and the load.

The peer is what issue 9 describes: a 64-32-10 ReLU MLP on sklearn's digits (8x8 pixels / 16,
the same stratified 80/20 split as our digits task), trained in float with torch, then compiled by
Concrete ML's ``compile_torch_model`` with ``n_bits=6`` and ``rounding_threshold_bits=6`` and its
default error probabilities. Concrete ML pins concrete-python 2.10 and torch 2.3, which conflict
with this project's pins, so it runs in a separate virtual environment given by ``--peer-python``:

    python3 -m venv /tmp/cml && /tmp/cml/bin/pip install "setuptools<80" torch==2.13.0 numpy==1.26.4
    /tmp/cml/bin/pip install --no-deps concrete-ml==1.9.0
    /tmp/cml/bin/pip install brevitas==0.10.2 concrete-ml-extensions==0.1.9 \\
        concrete-python==2.10.0 "hummingbird-ml[onnx]==0.4.11" onnx==1.17.0 onnxoptimizer==0.3.13 \\
        onnxruntime==1.18 pandas==2.0.3 "protobuf>=5.28.3,<6" scikit-learn==1.5.0 skops==0.5.0 \\
        skorch==0.11.0 xgboost==1.6.2 torch==2.13.0 numpy==1.26.4 "setuptools<80"
    /tmp/cml/bin/pip install onnxscript "ml-dtypes<0.6" numpy==1.26.4  # torch 2.13's ONNX export
    python benchmarks/peer_concrete_ml.py --peer-python /tmp/cml/bin/python --model runs/m.pt

Our side is ``benchmarks/tfhe_model.py``'s measurement of the checkpoint ``--model`` (compile with
the TFHE defaults, simulate the test split, keygen, encrypted samples), in a child process too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HIDDEN = 32
PEER_TIMEOUT_S = 3600


# ------------------------------------------------------------------------------ the peer (child)
def peer_measure(n_exec: int, epochs: int) -> dict:
    """Train, compile, simulate and run the peer MLP (in the Concrete ML environment)."""
    import numpy as np
    import torch
    from concrete.ml.torch.compile import compile_torch_model
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    torch.manual_seed(0)
    torch.set_num_threads(2)
    data = load_digits()
    x = (data.images.reshape(len(data.images), -1) / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, data.target, test_size=0.2, random_state=0, stratify=data.target
    )
    model = torch.nn.Sequential(
        torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10)
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    for _ in range(epochs):
        for idx in torch.randperm(len(xt)).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        float_acc = float((model(torch.from_numpy(x_te)).argmax(-1).numpy() == y_te).mean())
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    qm = compile_torch_model(model, x_tr, n_bits=6, rounding_threshold_bits=6)
    compile_s = time.perf_counter() - start
    circuit = qm.fhe_circuit
    clear = qm.forward(x_te, fhe="disable").argmax(-1)
    sim = qm.forward(x_te, fhe="simulate").argmax(-1)
    start = time.perf_counter()
    circuit.keygen()
    keygen_s = time.perf_counter() - start
    lat, agree = [], []
    for i in range(n_exec):
        q_in = qm.quantize_input(x_te[i : i + 1])
        enc = circuit.encrypt(q_in)
        start = time.perf_counter()
        out = circuit.run(enc)
        lat.append(time.perf_counter() - start)
        got = circuit.decrypt(out)
        agree.append(bool(np.array_equal(got, circuit.simulate(q_in))))
    key_bytes = int(circuit.size_of_bootstrap_keys + circuit.size_of_keyswitch_keys)
    upload_bytes = len(circuit.client.evaluation_keys.serialize())
    return {
        "float_accuracy": float_acc,
        "clear_accuracy": float((clear == y_te).mean()),
        "sim_accuracy": float((sim == y_te).mean()),
        "pbs": int(circuit.programmable_bootstrap_count),
        "complexity": float(circuit.complexity),
        "max_bit_width": int(circuit.graph.maximum_integer_bit_width()),
        "key_mib": key_bytes / 2**20,
        "key_upload_mib": upload_bytes / 2**20,
        "compile_s": compile_s,
        "keygen_s": keygen_s,
        "latency_s": lat,
        "latency_median_s": float(np.median(lat)),
        "encrypted_equals_simulated": agree,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "load_avg_1min_before": load_before,
        "load_avg_1min_after": os.getloadavg()[0],
    }


def run_peer(python: str, n_exec: int, epochs: int) -> dict:
    from benchmarks.tfhe_model import run_json_command

    cmd = [python, __file__, "--peer-child", json.dumps({"n_exec": n_exec, "epochs": epochs})]
    return run_json_command(cmd, PEER_TIMEOUT_S, "the peer measurement")


# ------------------------------------------------------------------------------------- the report
def report(rounds: list[dict], model: str, options: dict | None = None) -> list[str]:
    import numpy as np

    from benchmarks._results import command_line

    peer0, ours0 = rounds[0]["peer"], rounds[0]["ours"]
    lines = [
        "# Our digits model against Concrete ML's digits MLP, same run",
        "",
        f"`{command_line()}`",
        "",
        f"Ours: `{model}` (the Inhibitor transformer, TFHE defaults, seeded keys"
        + (f"; with {options}" if options else "")
        + "), measured by `benchmarks/tfhe_model.py`. Peer: Concrete ML 1.9 (concrete-python "
        "2.10), a 64-32-10 ReLU MLP trained in float, `compile_torch_model(n_bits=6, "
        "rounding_threshold_bits=6)` with its default error probabilities. Same test split (360 "
        "digits). Machine: 2 cores, shared; the two are measured alternately, each in its own "
        "process, so each round's ratio compares like with like.",
        "",
        "## Latency per encrypted sample, round by round",
        "",
        "| round | peer median (s) | ours median (s) | ours / peer | load before peer / ours |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(rounds):
        p, o = r["peer"], r["ours"]
        lines.append(
            f"| {i + 1} | {p['latency_median_s']:.1f} | {o['latency_median_s']:.1f} | "
            f"{o['latency_median_s'] / p['latency_median_s']:.2f} | "
            f"{p['load_avg_1min_before']:.1f} / {o['load_avg_1min_before']:.1f} |"
        )
    ratios = [r["ours"]["latency_median_s"] / r["peer"]["latency_median_s"] for r in rounds]
    lines += [
        "",
        f"Ratio ours / peer over the rounds: median {np.median(ratios):.2f} "
        f"(min {min(ratios):.2f}, max {max(ratios):.2f}).",
        "",
        "## Cost and accuracy (first round)",
        "",
        "| | ours | peer |",
        "|---|---|---|",
        f"| PBS | {ours0['pbs']} | {peer0['pbs']} |",
        f"| Concrete's complexity | {ours0['complexity']:.3g} | "
        f"{_general(peer0.get('complexity'))} |",
        f"| max lookup input bits / max width | {ours0['max_lookup_input_bits']} / "
        f"{ours0['max_bit_width']} | — / {peer0['max_bit_width']} |",
        f"| evaluation keys in memory (MiB) | {ours0['key_mib']:.0f} | {peer0['key_mib']:.0f} |",
        f"| keys uploaded (MiB) | {ours0['key_upload_mib']:.0f} | {peer0['key_upload_mib']:.0f} |",
        f"| keygen (s) | {ours0['keygen_s']:.1f} | {peer0['keygen_s']:.1f} |",
        f"| peak RSS (GiB) | {ours0['peak_rss_gib']:.2f} | {peer0['peak_rss_gib']:.2f} |",
        f"| accuracy: clear integer / simulated | {100 * ours0['clear_accuracy']:.2f}% / "
        f"{100 * ours0['sim_accuracy']:.2f}% | {100 * peer0['clear_accuracy']:.2f}% / "
        f"{100 * peer0['sim_accuracy']:.2f}% (float {100 * peer0['float_accuracy']:.2f}%) |",
        f"| simulation == clear program, all logits / argmax (ours, test split) | "
        f"{100 * ours0['sim_exact_match']:.2f}% / {100 * ours0['sim_argmax_agreement']:.2f}% | — |",
        f"| encrypted == clear (ours) / == simulated (peer) | "
        f"{sum(ours0['encrypted_equals_clear'])}/{len(ours0['encrypted_equals_clear'])} | "
        f"{sum(peer0['encrypted_equals_simulated'])}/{len(peer0['encrypted_equals_simulated'])} |",
    ]
    return lines


def _general(v: float | None) -> str:  # "—" where a run did not record the figure
    return "—" if v is None else f"{v:.3g}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--peer-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--peer-python", default=os.environ.get("CML_PYTHON"))
    ap.add_argument("--model", default="runs/digits-inhibitor.pt", help="our checkpoint")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n-exec", type=int, default=3, help="encrypted samples per measurement")
    ap.add_argument("--peer-epochs", type=int, default=60)
    ap.add_argument("--stem", default="peer_concrete_ml")
    ap.add_argument(
        "--ours-options",
        default=None,
        help="JSON overrides of our measurement, e.g. '{\"global_p_error\": 1e-3}' or "
        "'{\"exact_rounding\": false}' (benchmarks/tfhe_model.py's spec keys)",
    )
    args = ap.parse_args()
    if args.peer_child:
        spec = json.loads(args.peer_child)
        print(json.dumps(peer_measure(spec["n_exec"], spec["epochs"])))
        return
    if not args.peer_python:
        ap.error("--peer-python (or CML_PYTHON): the Python of a Concrete ML environment")
    # imported here: the peer's environment has a ``benchmarks`` package of its own
    from benchmarks._results import write_results
    from benchmarks.tfhe_model import run_child

    try:
        options = json.loads(args.ours_options) if args.ours_options else {}
    except json.JSONDecodeError as exc:
        ap.error(f"--ours-options is not JSON: {exc}")
    rounds = []
    for i in range(args.rounds):
        peer = run_peer(args.peer_python, args.n_exec, args.peer_epochs)
        print(f"round {i + 1}: peer {peer['latency_median_s']:.1f} s", flush=True)
        spec = {"model": args.model, "n_exec": args.n_exec, "simulate": i == 0, **options}
        ours = run_child(spec)
        print(f"round {i + 1}: ours {ours['latency_median_s']:.1f} s", flush=True)
        rounds.append({"peer": peer, "ours": ours})
    lines = report(rounds, args.model, options)
    print("\n".join(lines))
    write_results(args.stem, lines, {"model": args.model, "options": options, "rounds": rounds})


if __name__ == "__main__":
    main()
