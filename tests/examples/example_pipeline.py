"""What the trained examples' tests (readahead, nfs_rsize) share: their
one-command pipelines run twice with --quick (the quick_runs fixture; a test
module imports it and defines EXAMPLE), the README's results block, and
run.py's one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_quick(example: Path, workdir: Path) -> dict:
    res = subprocess.run([sys.executable, str(example / "run.py"), "--quick", "--workdir",
                          str(workdir)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads((workdir / "results" / "results.json").read_text())


@pytest.fixture(scope="module")
def quick_runs(request, tmp_path_factory):
    """Two --quick runs of the test module's EXAMPLE: ((workdir, results), ...)."""
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    example = request.module.EXAMPLE
    a, b = tmp_path_factory.mktemp("qa"), tmp_path_factory.mktemp("qb")
    return (a, run_quick(example, a)), (b, run_quick(example, b))


def readme_results(example: Path) -> tuple[str, dict]:
    """The README's results block, checked to be results/results.md as
    run.py wrote it, and results/results.json."""
    readme = (example / "README.md").read_text()
    block = readme.split("<!-- results:begin -->\n", 1)[1].split("<!-- results:end -->", 1)[0]
    assert block == (example / "results" / "results.md").read_text()
    r = json.loads((example / "results" / "results.json").read_text())
    assert r["command"] == f"python examples/{example.name}/run.py"
    assert (example / "results" / f"{example.name}.png").is_file()
    return block, r


def assert_one_line_errors(example: Path, cases) -> None:
    """run.py with each (args, message): non-zero exit, stderr exactly
    ``run.py: message``."""
    for args, msg in cases:
        r = subprocess.run([sys.executable, str(example / "run.py"), *args],
                           capture_output=True, text=True)
        assert r.returncode != 0 and r.stderr.strip().splitlines() == [f"run.py: {msg}"]


def compile_with_hook(onnx: Path, calibration: Path, hooks: str, tmp: Path) -> tuple[Path, Path]:
    """The example's checked-in model (small) compiled with its hook, fixed
    point on CALIBRATION and float, by the kmlc command line: (fixed, float)."""
    from conftest import kmlc_cli

    assert onnx.is_file() and onnx.stat().st_size < 20_000
    fx, fl = tmp / "fx", tmp / "fl"
    r = kmlc_cli("compile", onnx, "-o", fx, "--numerics", "fixed", "--calibration", calibration,
                 "--hooks", hooks)
    assert r.returncode == 0, r.stderr
    r = kmlc_cli("compile", onnx, "-o", fl, "--hooks", hooks)
    assert r.returncode == 0, r.stderr
    return fx, fl
