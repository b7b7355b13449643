"""Encrypted (CKKS/TenSEAL) versus clear polynomial versus float model, on a task's test split.

Trains the model first with the polynomial recipe (PowerSoftmax paper Alg. 1: length-agnostic
PowerSoftmax with ε, hinge range losses on scores and activations) unless ``--model`` names one,
then runs ``fhe compare --scheme ckks`` logic: every test sample encrypted in the SIMD slots of one
run.

    python benchmarks/ckks_compare.py --task digits --n 360
    python benchmarks/ckks_compare.py --task mnist --n 1000 --refresh --poly-modulus-degree 16384
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import command_line, write_results  # noqa: E402
from fhe.api.parts import (  # noqa: E402
    ApproxConfig,
    CkksParams,
    TrainConfig,
    compare_ckks,
    compile_model,
    config_for_task,
    load_checkpoint,
    load_task,
    save_checkpoint,
    train,
)

RECIPE = dict(
    attention="power-softmax",
    norm="none",
    ffn_activation="gelu",
    power_form="length-agnostic",
    power_eps=0.05,
    d_model=16,
    n_heads=2,
)
TRAIN_CLI = (
    "fhe train --task {task} --attention power-softmax --norm none --ffn-activation gelu "
    "--power-form length-agnostic --power-eps 0.05 --d-model 16 --heads 2 --epochs {epochs} "
    "--range-loss 0.1 --range-threshold 1.0 --act-range-loss 0.05 --act-range-threshold 3"
)
# The shallow recipe for one packed query at N = 16384 (depth 10): x² instead of x⁴ (one level),
# the exact quad activation instead of fitted GELU (two levels instead of six), ε = 1 so the
# division's interval is [1, 2] and one Goldschmidt iteration meets 5e-2.
SHALLOW_RECIPE = {**RECIPE, "ffn_activation": "quad", "power_p": 2, "power_eps": 1.0}
SHALLOW_TRAIN_CLI = TRAIN_CLI.replace(
    "--ffn-activation gelu", "--ffn-activation quad --power-p 2"
).replace("--power-eps 0.05", "--power-eps 1.0")
# The same with LayerNorm inside the chain (Newton 1/√σ², PowerSoftmax paper App. G's breakdown)
LAYERNORM_RECIPE = {**SHALLOW_RECIPE, "norm": "layernorm"}
LAYERNORM_TRAIN_CLI = SHALLOW_TRAIN_CLI.replace("--norm none", "--norm layernorm")
# The shallow recipe with BatchNorm, folded into the linear layers at compile time: free (depth 10)
BATCHNORM_RECIPE = {**SHALLOW_RECIPE, "norm": "batchnorm"}
BATCHNORM_TRAIN_CLI = SHALLOW_TRAIN_CLI.replace("--norm none", "--norm batchnorm")
RECIPES = {
    "gelu": (RECIPE, TRAIN_CLI),
    "quad": (SHALLOW_RECIPE, SHALLOW_TRAIN_CLI),
    "quad-layernorm": (LAYERNORM_RECIPE, LAYERNORM_TRAIN_CLI),
    "quad-batchnorm": (BATCHNORM_RECIPE, BATCHNORM_TRAIN_CLI),
}


def recipe_suffix(args) -> str:
    """The results-file suffix of a trained recipe (none for --model or the default recipe)."""
    return "" if args.model or args.recipe == "gelu" else f"_{args.recipe}"


def get_model(args):
    if args.model:
        return load_checkpoint(
            args.model
        ).model, f"model {args.model}, trained by the command in its results note"
    data = load_task(args.task)
    name = getattr(args, "recipe", "gelu")
    recipe, _ = RECIPES[name]
    cfg = config_for_task(data, **recipe)
    tcfg = TrainConfig(
        epochs=args.epochs,
        batch_size=64 if args.task == "digits" else 128,
        lr=3e-3,
        seed=0,
        range_loss_weight=0.1,
        range_threshold=1.0,
        act_range_loss_weight=0.05,
        act_range_threshold=3.0,
    )
    result = train(cfg, data, tcfg, progress=True)
    out = Path("runs") / f"ckks_{args.task}{'' if name == 'gelu' else '_' + name}.pt"
    out.parent.mkdir(exist_ok=True)
    save_checkpoint(out, result.model, data)
    return result.model, f"trained here, saved to {out}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--task", default="digits", choices=["digits", "mnist"])
    ap.add_argument(
        "--model", default=None, help="a trained model.pt (default: train one with the recipe)"
    )
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument(
        "--n", type=int, default=360, help="test samples (all in the slots of one encrypted run)"
    )
    ap.add_argument(
        "--calib", type=int, default=5000, help="calibration samples (intervals; clear, cheap)"
    )
    ap.add_argument(
        "--refresh", action="store_true", help="allow the labelled client-assisted refresh"
    )
    ap.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default="gelu",
        help="training recipe when no --model (see benchmarks/ckks_packed.py)",
    )
    ap.add_argument("--poly-modulus-degree", type=int, default=None)
    ap.add_argument("--scale-bits", type=int, default=40)
    ap.add_argument(
        "--outer-bits", type=int, default=60, help="bits of the chain's first and special primes"
    )
    ap.add_argument("--reciprocal-tol", type=float, default=1e-2)
    ap.add_argument("--activation-tol", type=float, default=2e-2)
    args = ap.parse_args()
    model, origin = get_model(args)
    data = load_task(args.task, seq_len=model.config.seq_len)
    params = CkksParams(
        poly_modulus_degree=args.poly_modulus_degree,
        scale_bits=args.scale_bits,
        outer_bits=args.outer_bits,
        refresh=args.refresh,
        approx=ApproxConfig(reciprocal_tol=args.reciprocal_tol, activation_tol=args.activation_tol),
    )
    compiled = compile_model(model, data.x_train[: args.calib], params, meta={"task": args.task})
    x, y = data.x_test[: args.n], data.y_test[: args.n].numpy()
    result = compare_ckks(compiled, x, y, execute=True, progress=print)
    rep = compiled.report()
    result["report"] = rep
    acc = result["accuracy"]
    mse = result["mse_encrypted_vs_clear"]
    lines = [
        f"# CKKS: encrypted vs clear polynomial vs float on {args.task}",
        "",
        f"Command: `{command_line()}` ({origin})"
        if args.model
        else f"Command: `{command_line()}` ({origin}; the same recipe as a CLI command: "
        f"`{RECIPES[args.recipe][1].format(task=args.task, epochs=args.epochs)}`)",
        "",
        f"{result['n']} test samples, all in the SIMD slots of one encrypted run "
        f"(N = {rep['poly_modulus_degree']}, depth {rep['depth']} of chain "
        f"{rep['coeff_mod_bit_sizes']}, "
        "client-assisted refresh: "
        f"{'yes, ' + str(rep['op_counts']['client_refresh']) + ' ciphertexts' if rep['client_assisted_refresh'] else 'no'}).",  # noqa: E501
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| accuracy float model (as trained) | {100 * acc['float']:.2f}% | |",
        f"| accuracy float inference form (Eq. 7) | {100 * acc['float_inference']:.2f}% | |",
        f"| accuracy clear polynomial program | {100 * acc['poly_clear']:.2f}% | within 1 point of "
        "float |",
        f"| accuracy encrypted | {100 * acc['encrypted']:.2f}% | |",
        f"| argmax agreement encrypted vs clear polynomial | "
        f"{100 * result['agreement']['encrypted_vs_poly_clear']:.2f}% | ≥ 99% |",
        f"| output MSE encrypted vs clear, max over samples | {mse['max_per_sample']:.2e} | ≤ "
        "0.005 |",
        f"| output MSE encrypted vs clear, mean | {mse['mean']:.2e} | |",
        f"| encrypted run (s), whole batch | {sum(result['latency_s']['per_batch']):.1f} | |",
        f"| amortised per sample (s) | {result['latency_s']['amortised_per_sample']:.3f} | |",
        "",
        "Operation counts: " + ", ".join(f"{k} {v}" for k, v in rep["op_counts"].items()),
        "",
        "Level after each stage: " + ", ".join(f"{k} {v}" for k, v in rep["depth_per_tag"].items()),
        "",
        "Keys (MiB): "
        + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in rep["key_sizes_bytes"].items()),
        "",
        "Time per stage (s, the paper's App. G breakdown): "
        + ", ".join(f"{k.removeprefix('stage.')} {v:.1f}" for k, v in rep["timings_s"].items()),
        "",
        "Approximations: "
        + "; ".join(
            f"{k}: calibrated [{v['calibrated'][0]:.3g}, {v['calibrated'][1]:.3g}], "
            + (
                f"{v['iterations']} "
                + ("Newton-type steps" if v.get("kind") == "invsqrt" else "Goldschmidt iterations")
                if "iterations" in v
                else f"degree {v['degree']}"
            )
            for k, v in rep["approximations"].items()
        ),
    ]
    suffix = recipe_suffix(args) + ("_refresh" if args.refresh else "")
    paths = write_results(f"ckks_compare_{args.task}{suffix}", lines, result)
    print("\n".join(lines))
    print(f"wrote {paths['md']}")


if __name__ == "__main__":
    main()
