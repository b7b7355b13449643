"""A non-editable install ships the whole library: a wheel built from the checkout holds every
package of it, and imported from that wheel alone (outside the checkout) `fhe --help` runs and
`fhe.api` imports."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("models", "quant", "fhe", "circuits", "fhe_cli")


def test_a_wheel_holds_every_package_and_runs_outside_the_checkout(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = (tmp_path / "dist").glob("fhe_attention-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = sorted(
        str(p.parent.relative_to(ROOT))
        for top in LIBRARY
        for p in (ROOT / top).rglob("__init__.py")
    )
    missing = [p for p in packages if f"{p}/__init__.py" not in names]
    assert not missing, f"the wheel lacks {missing}"
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    # -P: the working directory (this checkout's sources) is not put on sys.path
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import fhe, fhe.api, fhe.api.parts, fhe.deploy.server; "
        "assert fhe.__file__.startswith(sys.argv[1]), fhe.__file__; "
        "from fhe_cli import main; main(['--help'])"
    )
    res = subprocess.run(
        [sys.executable, "-P", "-c", probe, str(target)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "serve" in res.stdout and "compile" in res.stdout
