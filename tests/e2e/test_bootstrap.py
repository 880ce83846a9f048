"""scripts/bootstrap.sh's output: one line per setup step with its time,
apt's and pip's own output in build/setup.log, shown (its last lines) when
a step fails, with the step's exit status.  Run on a copy of the script in
a scratch tree whose .venv/bin/python is a stand-in (no network, no pip):
the Debian packages are this machine's, installed by the real setup."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/bin/sh
# a stand-in for .venv/bin/python: pip's chatter, and a failure on request
case "$*" in
*"pip install"*"-e"*)
	echo "Obtaining file://$PWD"; echo "Installing collected packages: kmlc"
	[ -n "$KMLC_TEST_FAIL" ] && { echo "ERROR: $KMLC_TEST_FAIL" >&2; exit 3; }
	echo "Successfully installed kmlc" ;;
*"pip install"*) echo "Requirement already satisfied: pip"; echo "(more pip output)" ;;
*pytest*) echo "the test suite would run here" ;;
esac
"""


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", tmp_path / "scripts")
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "pyproject.toml").write_text("")
    py = tmp_path / ".venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(FAKE_PYTHON)
    py.chmod(0o755)
    return tmp_path


def bootstrap(tree, **env):
    if shutil.which("dpkg-query") is None:
        pytest.skip("not a Debian system")
    return subprocess.run(["bash", str(tree / "scripts" / "bootstrap.sh"), "test"],
                          capture_output=True, text=True, env={**os.environ, **env},
                          timeout=600)


def test_setup_prints_a_line_per_step_and_logs_the_rest(tree):
    r = bootstrap(tree, KMLC_TEST_JOBS="2")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("==> Debian packages: all ") and lines[0].endswith(" installed")
    assert lines[1].startswith("==> installing kmlc into .venv "
                               "(uv pip install -e .[test,torch,tvm,sklearn,trees]) ... done, ")
    assert lines[1].endswith("s")
    assert lines[2:] == ["==> running the test suite (2 workers)",
                         "the test suite would run here"]
    assert r.stderr == ""
    log = (tree / "build" / "setup.log").read_text()
    assert "Requirement already satisfied: pip" in log and "Successfully installed kmlc" in log
    # the second time, nothing to install: one line each, no pip
    again = bootstrap(tree)
    assert again.returncode == 0
    assert again.stdout.splitlines()[1] == \
        "==> .venv: kmlc[test,torch,tvm,sklearn,trees] installed, setup.py unchanged"
    assert "pip" not in (tree / "build" / "setup.log").read_text()


def test_a_failed_step_shows_the_log_and_its_status(tree):
    r = bootstrap(tree, KMLC_TEST_FAIL="no matching distribution found for torch")
    assert r.returncode == 3
    assert r.stdout.splitlines()[-1].endswith(" ... failed (exit 3)")
    assert "running the test suite" not in r.stdout
    err = r.stderr.splitlines()
    assert err[0] == f"--- the last 30 lines of {tree}/build/setup.log:"
    assert "ERROR: no matching distribution found for torch" in err
    assert err[-1] == f"--- (the whole log: {tree}/build/setup.log)"


def test_the_venv_holds_the_bytecode_of_what_kmlc_imports():
    """The setup writes the .pyc of every installed module (uv's
    --compile-bytecode): where PYTHONDONTWRITEBYTECODE is set Python writes
    none itself, and every kmlc process compiled numpy, onnx, jinja2 and
    click from source again, half of a short command's time."""
    code = ("import importlib.util, sys, sysconfig, kmlc.cli, onnx\n"
            "site = sysconfig.get_paths()['purelib']\n"
            "mods = [m for m in list(sys.modules.values()) if getattr(m, '__file__', None)\n"
            "        and m.__file__.startswith(site) and m.__file__.endswith('.py')]\n"
            "missing = [m.__name__ for m in mods if not\n"
            "           __import__('os').path.isfile(importlib.util.cache_from_source(m.__file__))]\n"
            "print(len(mods), len(missing), ' '.join(sorted(missing)[:20]))\n")
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", code], capture_output=True,
                       text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, check=True)
    mods, missing, names = (r.stdout.split(maxsplit=2) + [""])[:3]
    assert int(mods) > 100, r.stdout
    assert int(missing) == 0, f"{missing} of {mods} modules have no .pyc: {names}"
