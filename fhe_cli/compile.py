"""``fhe compile``, ``fhe run``, ``fhe compare`` and ``fhe batch``: a model file compiled,
run encrypted and compared with its clear program."""

from __future__ import annotations

from pathlib import Path

import click

from fhe.schemes import CompareMode
from fhe_cli._common import echo_err, library_errors, write_json
from fhe_cli.fhe_options import fhe_options


@click.command(name="compile")
@click.argument("model_path", type=click.Path(path_type=Path))
@fhe_options
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write the report."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Write client/ (with secret keys) and server/ (circuit + evaluation keys only) artifacts.",
)
@click.option(
    "--no-run", is_flag=True, help="Skip keygen and the timing run of one encrypted sample."
)
@library_errors
def compile_cmd(model_path, json_path, out_dir, no_run, **opts) -> None:
    """Compile MODEL_PATH into an encrypted program and print its cost report."""
    from fhe import api
    from fhe.summaries import format_report

    options = api.CompileOptions.from_mapping(opts)
    steps = api.steps_for(options.scheme)
    click.echo(f"compiling {model_path} for {steps.target(options)} ...")
    c = api.compile_file(model_path, options, on_message=click.echo)
    api.check_circuit(c, on_message=click.echo)
    if not no_run:
        api.keygen(c, on_message=click.echo)
        click.echo("running one encrypted test sample ...")
        click.echo(api.one_encrypted_sample(c).describe())
    if out_dir:
        paths = api.save_artifacts(c, out_dir, on_message=click.echo)
    rep = c.report()
    click.echo(format_report(rep))
    write_json(json_path, rep)
    if out_dir:
        click.echo(
            f"server artifact ({steps.server_label}): {paths['server']}; client artifact: "
            f"{paths['client']}"
        )


@click.command(name="run")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option(
    "--sample", type=int, default=0, show_default=True, help="Index into the task's test split."
)
@click.option(
    "--text", default=None, help="Text models: this text instead of a test sample (embedded here)."
)
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@click.option(
    "--allow-overflow",
    is_flag=True,
    help="TFHE: encrypt an input outside the calibrated widths anyway (the answer can be wrong).",
)
@library_errors
def run_cmd(artifact_dir, sample, text, data_dir, allow_overflow) -> None:
    """Encrypt a test sample (or --text) with the client artifact, run it on the server artifact,
    decrypt."""
    from fhe import api

    run = api.run_artifact(artifact_dir, sample, data_dir, allow_overflow, text=text)
    click.echo(run.describe())
    for note in run.notes:
        echo_err(note)


@click.command()
@click.argument("model_path", type=click.Path(path_type=Path))
@fhe_options
@click.option("--n", "n_samples", type=int, default=20, show_default=True, help="Test samples.")
@click.option(
    "--mode",
    type=click.Choice([m.value for m in CompareMode]),
    default=CompareMode.SIMULATE.value,
    show_default=True,
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="TFHE execute: spread the encrypted samples over N local Ray workers (0: in this "
    "process).",
)
@click.option(
    "--ray", "ray_address", default=None, help="TFHE execute: join the Ray cluster at this address."
)
@library_errors
def compare(model_path, n_samples, mode, json_path, workers, ray_address, **opts) -> None:
    """Float vs clear-integer vs simulated/encrypted accuracy and agreement on N test samples
    (CKKS: float vs clear polynomial program vs encrypted, with output MSE)."""
    from fhe import api
    from models.progress import progress_bar

    options = api.CompileOptions.from_mapping(opts)
    where = (
        f"{workers or 'cluster'} Ray workers"
        if mode == CompareMode.EXECUTE.value and (workers or ray_address)
        else "this process"
    )
    shows = api.steps_for(options.scheme).shows_progress
    with progress_bar(shows, desc=f"{mode} ({where})", unit="sample") as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        result = api.compare_file(
            model_path,
            options,
            n_samples,
            mode,
            workers,
            ray_address,
            progress=progress,
            on_message=echo_err,
        )
    for k, v in result.items():
        click.echo(f"{k:>24}: {v}")
    if result.get("refused_overflow"):
        echo_err(
            f"warning: {result['refused_overflow']} sample(s) would take a value outside the "
            "calibrated bit widths (the encrypted circuit would wrap around); the client refused "
            "them and the figures above leave them out. Compile with --ranges proven, or "
            "calibrate on data like them (--calib)."
        )
    write_json(json_path, result)


@click.command()
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option(
    "--n",
    "n_samples",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Test samples.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Local Ray workers (0: in this process).",
)
@click.option(
    "--ray", "ray_address", default=None, help="Join the Ray cluster at this address instead."
)
@click.option(
    "--block",
    type=click.IntRange(min=1),
    default=None,
    help="CKKS: samples per SIMD batch (one work item per batch; default: split evenly over "
    "workers).",
)
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@library_errors
def batch(artifact_dir, n_samples, workers, ray_address, block, data_dir) -> None:
    """Encrypt the first N test samples with ARTIFACT_DIR/client, run them on ARTIFACT_DIR/server
    (in this process or on Ray workers), decrypt, and print accuracy and throughput."""
    from fhe import api

    click.echo(
        api.batch_artifact(
            artifact_dir, n_samples, workers, ray_address, block, data_dir
        ).describe()
    )
