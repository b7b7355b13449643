"""Benchmarks read like a user's script: they reach the toolkit through ``fhe.api`` (one call per
command) or ``fhe.api.parts`` (the same parts in memory), never through its internal modules, so a
change of the internals that keeps the API keeps every benchmark running. A kernel study, which
times one internal kernel on raw ciphertexts or tensors, is the listed exception."""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TOOLKIT = ("models", "quant", "fhe", "fhe_cli", "circuits")

# script -> what it times that no API call exposes
KERNEL_STUDIES = {
    "ckks_softmax.py": "fhe.ckks.softmax's three softmax kernels on encrypted rows (TenSEAL)",
    "ckks_bootstrap.py": "one OpenFHE bootstrap in the engine's worker processes",
    "ckks_layouts.py": "two packings of one attention head on a bare TenSEAL context",
    "inhibitor_memory.py": "the Inhibitor fused and broadcast forms (models.attention.functional)",
    "overflow.py": "bare attention circuits (circuits.attention) under both TFHE range modes",
}


def toolkit_imports(path: Path) -> list[str]:
    """The toolkit modules ``path`` imports, other than fhe.api and what is under it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
            if node.module == "fhe":  # from fhe import api
                modules = [f"fhe.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        for m in modules:
            if m.split(".")[0] in TOOLKIT and not (m == "fhe.api" or m.startswith("fhe.api.")):
                found.append(m)
    return found


def test_benchmarks_reach_the_toolkit_through_its_api_only():
    scripts = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
    assert len(scripts) > 20
    offenders = {
        p.name: toolkit_imports(p)
        for p in scripts
        if p.name not in KERNEL_STUDIES and toolkit_imports(p)
    }
    assert offenders == {}


def test_the_listed_kernel_studies_exist_and_need_the_exception():
    for name in KERNEL_STUDIES:
        assert toolkit_imports(BENCHMARKS / name), f"{name} no longer needs to be listed"


def test_every_name_a_benchmark_takes_from_the_api_exists():
    """Most imports sit inside the scripts' functions, run only by a long benchmark: checked here
    by name, so that an API change breaks this test rather than a run hours later."""
    import importlib

    missing = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in (
                "fhe",
                "fhe.api",
                "fhe.api.parts",
            ):
                module = importlib.import_module(node.module)
                missing += [
                    f"{path.name}: {node.module}.{a.name}"
                    for a in node.names
                    if not hasattr(module, a.name)
                    and importlib.util.find_spec(f"{node.module}.{a.name}") is None
                ]
    assert missing == []


def test_every_name_of_the_parts_module_resolves():
    from fhe.api import parts

    missing = [n for n in parts.__all__ if not hasattr(parts, n)]
    assert missing == [] and len(parts.__all__) == len(set(parts.__all__))
    # the parts are the toolkit's own objects, not copies
    from fhe.harness import compile_model
    from models.training import train

    assert parts.compile_model is compile_model and parts.train is train


def test_every_public_name_of_the_api_says_what_it_is():
    from fhe import api
    from fhe.api import parts

    undocumented = [
        f"{mod.__name__}.{name}"
        for mod in (api, parts)
        for name in mod.__all__
        if callable(obj := getattr(mod, name)) and not (obj.__doc__ or "").strip()
    ]
    assert undocumented == []
