"""One trained text model's cost per sequence length, under both schemes (`fhe report MODEL
--seq-lens`), for the recipe model of each scheme.

    python benchmarks/text_lengths.py                  # T = 16, 32, 64, 128 (about 40 min)
    python benchmarks/text_lengths.py --seq-lens 8,16  # quicker

Each recipe model (`fhe train --task imdb --recipe tfhe|ckks`, trained at T = 16) is compiled at
every T with the same weights (positions interpolated) and run once encrypted where it fits
(fhe/api/lengths.py: pre-flight, budget, labelled estimates). Writes
benchmarks/results/text_lengths_<scheme>-recipe.md|json|png. Everything goes through fhe.api.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import RESULTS, command_line  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-lens", default="16,32,64,128")
    parser.add_argument("--recipes", default="tfhe,ckks", help="whose recipe models to report")
    parser.add_argument("--data-dir", default=None, help="IMDB folder (default ../shared/data)")
    parser.add_argument("--budget", type=float, default=1800.0, help="seconds per encrypted run")
    args = parser.parse_args()

    from fhe import api
    from fhe.api import lengths

    seq_lens = [int(t) for t in args.seq_lens.split(",")]
    data_dir = Path(args.data_dir) if args.data_dir else None
    load = f"{os.getloadavg()[0]:.2f}"
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in args.recipes.split(","):
            req = api.with_recipe(api.TrainRequest(task="imdb", recipe=recipe, data_dir=data_dir))
            path = Path(tmp) / f"imdb-{recipe}.pt"
            outcome = api.train_model(req, progress=False)
            outcome.save(path)
            print(f"== {recipe} recipe model: test score {outcome.test_score:.4f}", flush=True)
            rows = lengths.cost_per_length(
                path, seq_lens, data_dir=data_dir, budget_s=args.budget, on_message=print
            )
            stem = f"text_lengths_{recipe}-recipe"
            command = f"{command_line()}  (load average at the start {load})"
            paths = lengths.write(rows, RESULTS, stem, f"imdb, the {recipe} recipe", command)
            print(paths["md"].read_text())


if __name__ == "__main__":
    main()
