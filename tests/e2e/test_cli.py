"""The command line and packaging, as a user meets them."""
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import EXAMPLES, ROOT, kmlc_cli, mlp_model, readahead_policy
from kmlc.passes import GRAPH_PASSES, banner


def test_print_after_all_shows_every_stage_in_order(tmp_path):
    res = kmlc_cli("compile", EXAMPLES / "readahead.onnx", "-o", tmp_path / "o",
                   "--target", "user", "--print-after-all")
    assert res.returncode == 0, res.stderr
    stages = ["import"] + [n for n, _ in GRAPH_PASSES] + ["lower", "plan-memory"]
    positions = [res.stderr.index(banner(s), res.stderr.index(banner(stages[i - 1])) + 1
                                  if i else 0) for i, s in enumerate(stages)]
    assert positions == sorted(positions)
    assert "graph @readahead(%features: f32[1,5]) -> (f32[1,4])" in res.stderr
    assert "dense(" in res.stderr and "schedule @readahead float" in res.stderr
    assert "memory plan: workspace" in res.stderr


def test_inspect(tmp_path):
    res = kmlc_cli("inspect", EXAMPLES / "heimdall.onnx")
    assert res.returncode == 0 and "act = relu" in res.stdout and "k4 matmul" in res.stdout


def test_run_matches_python_api_and_relative_outdir(tmp_path):
    onnx.save(mlp_model([6, 8, 3], act="Tanh"), tmp_path / "m.onnx")
    assert kmlc_cli("compile", "m.onnx", "-o", "rel/out", cwd=tmp_path).returncode == 0
    x = np.random.default_rng(0).standard_normal((10, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    res = kmlc_cli("run", "rel/out", "--input", "x.npy", "--output", "y.npy", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    import kmlc

    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.float32 and y.shape == (10, 3)
    assert np.array_equal(y, kmlc.load(tmp_path / "rel" / "out").run(x))


def test_verify_reports_against_float64(tmp_path):
    res = kmlc_cli("verify", EXAMPLES / "nfs_rsize.onnx", "--samples", "200")
    assert res.returncode == 0 and "PASS" in res.stdout and "200 rows" in res.stdout
    assert "against onnxruntime float64" in res.stdout and "arithmetic bound" in res.stdout
    # no tolerance at all: the arithmetic alone decides, and the twin is
    # within its bound of float64 (tests/unit/test_verify_bound.py fails a
    # twin with one weight 1% off)
    res = kmlc_cli("verify", EXAMPLES / "nfs_rsize.onnx", "--samples", "200", "--atol", "0",
                   "--rtol", "0")
    assert res.returncode == 0 and "PASS" in res.stdout, res.stdout + res.stderr


def clean_source(tmp_path):
    """The repository's sources without build products (a stale build/
    directory would otherwise leak old files into the wheel)."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", "build", "*.egg-info", ".git", "__pycache__", ".pytest_cache"))
    return src


def test_wheel_carries_runtime_and_templates(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path,
                    clean_source(tmp_path)], check=True, capture_output=True)
    whl = next(tmp_path.glob("kmlc-*.whl"))
    names = set(zipfile.ZipFile(whl).namelist())
    templates = {p.name for p in (ROOT / "compiler" / "codegen" / "templates").glob("*.j2")}
    runtime = {p.name for p in (ROOT / "runtime-kernel").iterdir() if p.suffix in (".c", ".h")}
    user = {p.name for p in (ROOT / "runtime-user").iterdir() if p.suffix in (".c", ".h")}
    tools = {p.name for p in (ROOT / "compiler" / "targets" / "qemu_tools").glob("*.c")}
    assert {"model_core.c.j2", "kernels_fixed.c.j2", "binding.h.j2"} <= templates
    assert {"kml_math.h", "kml_fixed.h", "kml_types.h", "kml_hook.c", "kml_ra.c",
            "kml_admit_trace.h"} <= runtime
    assert {"kml_reader.c", "kml_dmsetup.c", "kml_mount.c"} <= tools
    for f in ([f"kmlc/codegen/templates/{t}" for t in templates]
              + [f"kmlc/runtime_kernel/{h}" for h in runtime]
              + [f"kmlc/runtime_user/{h}" for h in user]
              + [f"kmlc/targets/qemu_tools/{t}" for t in tools]
              + ["kmlc/frontends/onnx.py", "kmlc/hooks/admission.py",
                 "kmlc/passes/quantize.py", "kmlc/cli.py"]):
        assert f in names, f
    assert any(n.endswith("entry_points.txt") for n in names)


def test_wheel_installs_and_compiles(tmp_path):
    """``pip install .`` (not editable) into a fresh target works end to end."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    tmp_path / "site", clean_source(tmp_path)], check=True, capture_output=True)
    code = ("import kmlc, sys, numpy as np; assert kmlc.__file__.startswith(sys.argv[1]);"
            "r = kmlc.compile(sys.argv[2], sys.argv[3], targets='user');"
            "print(kmlc.load(sys.argv[3]).run([[1, 2, 3, 4, 5]]).shape);"
            "cal = np.random.default_rng(0).uniform(0, 1e3, (100, 5)).astype('f4');"
            "kmlc.compile(sys.argv[2], sys.argv[3] + 'q', targets='user', numerics='fixed',"
            " calibration=cal); print(kmlc.load(sys.argv[3] + 'q').run(cal[:3]).shape)")
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site"),
                          str(EXAMPLES / "readahead.onnx"), str(tmp_path / "o")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 0 and "(1, 4)" in res.stdout and "(3, 4)" in res.stdout, res.stderr


@pytest.mark.kernel
def test_wheel_in_a_fresh_venv_runs_qemu_test(tmp_path):
    """A regular install from a built wheel, in a fresh virtualenv, compiles
    a model with a hook and runs kmlc qemu-test: the hook's runtime C, the
    templates and the guest's tools (qemu_tools/*.c) come from the wheel."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path,
                    clean_source(tmp_path)], check=True, capture_output=True)
    whl = next(tmp_path.glob("kmlc-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site,
                    whl], check=True, capture_output=True)
    script = tmp_path / "s.sh"
    script.write_text("kml_reader seq $KML_DISK 256 256 > /dev/null && "
                      "[ -f /sys/module/$KML_MODULE/parameters/window_events ]\n")
    m, cal = readahead_policy()
    onnx_path = tmp_path / "ra.onnx"
    onnx.save(m, onnx_path)
    np.save(tmp_path / "cal.npy", cal)
    # the dependencies from this environment; kmlc itself only from the wheel
    env = {"PYTHONPATH": sysconfig.get_path("purelib"), "PATH": f"{venv}/bin:/usr/bin:/bin",
           "HOME": str(Path.home())}
    code = ("import sys, kmlc; assert kmlc.__file__.startswith(sys.argv[1]), kmlc.__file__;"
            "from kmlc.cli import main; sys.exit(main(sys.argv[2:]))")
    run = lambda *a: subprocess.run([py, "-c", code, site, *map(str, a)],  # noqa: E731
                                    capture_output=True, text=True, env=env, cwd=tmp_path)
    res = run("compile", onnx_path, "-o", tmp_path / "o", "--name", "wheelra", "--numerics",
              "fixed", "--calibration", tmp_path / "cal.npy", "--hooks", "readahead")
    assert res.returncode == 0, res.stderr
    res = run("qemu-test", tmp_path / "o", "--script", script)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "kml_wheelra-script: PASS exit 0" in res.stdout


def test_bad_usage_is_one_line(tmp_path):
    res = kmlc_cli("compile", EXAMPLES / "readahead.onnx", "-o", tmp_path / "o", "--target",
                   "gpu")
    assert res.returncode == 1 and "unknown target 'gpu'" in res.stderr
    assert "Traceback" not in res.stderr
