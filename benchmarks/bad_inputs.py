"""Every bad input we try, and what the `fhe` command answers (exit code and message).

Runs the installed `fhe` console script on bad options, bad model files, bad data files and bad
artifacts, and writes the table to benchmarks/results/bad_inputs.md|json. A row whose answer is a
Python traceback (not a message) is marked as such: those are bugs.

    python benchmarks/bad_inputs.py
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks._results import command_line, write_results  # noqa: E402

FHE = str(Path(sys.executable).with_name("fhe"))


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def prepare(tmp: Path) -> dict[str, Path]:
    """A small trained model, its artifacts, and broken copies of each."""
    model = tmp / "model.pt"
    subprocess.run(
        [
            FHE,
            "train",
            "--task",
            "digits",
            "--patch",
            "4",
            "--d-model",
            "4",
            "--heads",
            "1",
            "--epochs",
            "2",
            "--quiet",
            "-o",
            str(model),
        ],
        check=True,
        capture_output=True,
    )
    art = tmp / "art"
    subprocess.run(
        [FHE, "compile", str(model), "--out", str(art), "--no-run", "--calib", "50"],
        check=True,
        capture_output=True,
    )
    evil = tmp / "evil.pt"
    torch.save({"config": {}, "state_dict": {}, "x": _Payload(str(tmp / "PWNED"))}, evil)
    truncated = tmp / "truncated.pt"
    truncated.write_bytes(model.read_bytes()[:200])
    corrupt_art = tmp / "corrupt_art"
    subprocess.run(["cp", "-r", str(art), str(corrupt_art)], check=True)
    blob = corrupt_art / "server" / "server.zip"
    raw = bytearray(blob.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    blob.write_bytes(bytes(raw))
    bad_mnist = tmp / "mnist"
    bad_mnist.mkdir()
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        (bad_mnist / f"{name}.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x07not an idx file"))
    return {
        "model": model,
        "art": art,
        "evil": evil,
        "truncated": truncated,
        "corrupt_art": corrupt_art,
        "bad_mnist": bad_mnist,
        "marker": tmp / "PWNED",
        "tmp": tmp,
    }


def cases(p: dict[str, Path]) -> list[tuple[str, list[str]]]:
    m, t = str(p["model"]), p["tmp"]
    return [
        ("unknown attention kind", ["train", "--attention", "fourier"]),
        (
            "d_model not divisible by heads",
            ["train", "--d-model", "10", "--heads", "3", "-o", str(t / "x.pt")],
        ),
        ("zero epochs", ["train", "--epochs", "0", "--quiet", "-o", str(t / "x.pt")]),
        ("negative epochs", ["train", "--epochs", "-1", "--quiet", "-o", str(t / "x.pt")]),
        (
            "--patch that does not divide the image",
            ["train", "--patch", "3", "-o", str(t / "x.pt")],
        ),
        (
            "--patch on a text task",
            ["train", "--task", "imdb", "--patch", "4", "-o", str(t / "x.pt")],
        ),
        ("missing data folder", ["train", "--task", "mnist", "--data-dir", str(t / "nowhere")]),
        (
            "corrupt IDX data",
            ["train", "--task", "mnist", "--data-dir", str(p["bad_mnist"]), "-o", str(t / "x.pt")],
        ),
        ("missing model file", ["compile", str(t / "missing.pt")]),
        ("model file with a pickle payload", ["compile", str(p["evil"])]),
        ("truncated model file", ["evaluate", str(p["truncated"])]),
        ("--n-bits out of range", ["compile", m, "--n-bits", "1", "--no-run"]),
        ("--lut-bits out of range", ["compile", m, "--lut-bits", "40", "--no-run"]),
        ("--global-p-error out of range", ["compile", m, "--global-p-error", "2", "--no-run"]),
        ("keys that will not fit in memory", ["compile", m]),
        ("an Inhibitor model under CKKS", ["compile", m, "--scheme", "ckks", "--no-run"]),
        ("--sample out of range", ["run", str(p["art"]), "--sample", "100000"]),
        ("artifact folder that does not exist", ["run", str(t / "no-artifact")]),
        ("artifact with a flipped byte", ["run", str(p["corrupt_art"]), "--sample", "0"]),
        ("--seq-lens 0", ["report", "--seq-lens", "0", "--out", str(t / "rep")]),
        (
            "--seq-lens not a list of integers",
            ["report", "--seq-lens", "a,b", "--out", str(t / "rep")],
        ),
    ]


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        p = prepare(Path(tmp))
        for label, args in cases(p):
            env = None
            if label == "keys that will not fit in memory":
                import os

                env = {**os.environ, "FHE_AVAILABLE_MEMORY_BYTES": "1000000"}
            res = subprocess.run([FHE, *args], capture_output=True, text=True, timeout=600, env=env)
            out = (res.stderr.strip() or res.stdout.strip()).splitlines()
            traceback = any(line.startswith("Traceback") for line in out)
            message = next((line for line in reversed(out) if line.strip()), "")
            rows.append(
                {
                    "input": label,
                    "command": "fhe " + " ".join(a.replace(tmp, "$TMP") for a in args),
                    "exit_code": res.returncode,
                    "traceback": traceback,
                    "message": message.replace(tmp, "$TMP")[:300],
                }
            )
            print(f"{res.returncode:>3} {label}: {rows[-1]['message']}", flush=True)
        ran_code = p["marker"].exists()
    lines = [
        "# Bad inputs and what `fhe` answers",
        "",
        f"`{command_line()}`",
        "",
        f"Pickle payload executed: {'YES (bug)' if ran_code else 'no'}. A traceback instead of a "
        "message is a bug.",
        "",
        "| input | command | exit | answer |",
        "|---|---|---|---|",
    ]
    for r in rows:
        answer = ("TRACEBACK: " if r["traceback"] else "") + r["message"].replace("|", "\\|")
        lines.append(f"| {r['input']} | `{r['command']}` | {r['exit_code']} | {answer} |")
    write_results("bad_inputs", lines, {"pickle_payload_executed": ran_code, "rows": rows})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
