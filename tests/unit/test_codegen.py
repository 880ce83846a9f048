"""Codegen details that the end-to-end tests would catch only by luck."""
import ctypes
import subprocess

import numpy as np
import pytest

from conftest import EXAMPLES
from kmlc.api import compile as kcompile
from kmlc.codegen.emit import cfloat, cwrap, nest


def test_float_literals_round_trip_exactly(tmp_path):
    rng = np.random.default_rng(0)
    vals = rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    vals = vals[np.isfinite(vals)]
    vals = np.concatenate([vals, np.float32([0.0, -0.0, 1.0, -1.0, 0.1, 1e-45, -1e-45,
                                             3.4028235e38, 1.17549435e-38, 16777217.0])])
    src = "const float v[] = {" + ", ".join(cfloat(v) for v in vals) + "};\n"
    (tmp_path / "v.c").write_text(src)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", tmp_path / "v.so", tmp_path / "v.c"],
                   check=True)
    lib = ctypes.CDLL(str(tmp_path / "v.so"))
    got = np.ctypeslib.as_array((ctypes.c_float * len(vals)).in_dll(lib, "v"))
    assert np.array_equal(got.view(np.uint32), vals.view(np.uint32))


def test_non_finite_constants_are_refused():
    with pytest.raises(ValueError):
        cfloat(np.inf)


def test_nest_braces_only_around_more_than_a_simple_statement():
    assert nest("y[i] = x[i];", [("i", 4)], depth=0) == "for (i = 0; i < 4; i++)\n\ty[i] = x[i];"
    assert nest("y[i] = x[i];", [("p", 2), ("i", 4)], depth=0) == (
        "for (p = 0; p < 2; p++) {\n\tfor (i = 0; i < 4; i++)\n\t\ty[i] = x[i];\n}")
    assert nest("a;\nb;", [("i", 3)], depth=1) == "\tfor (i = 0; i < 3; i++) {\n\t\ta;\n\t\tb;\n\t}"


def test_cwrap_aligns_to_the_parenthesis():
    line = "static void k0_" + "x" * 60 + "(const float *restrict a, float *restrict y)"
    out = cwrap(line).split("\n")
    assert len(out) == 2 and all(len(ln.expandtabs(8)) <= 100 for ln in out)
    assert len(out[1].expandtabs(8)) - len(out[1].expandtabs(8).lstrip()) == line.index("(") + 1


def test_forty_character_name_stays_within_100_columns(tmp_path):
    from conftest import readahead_policy

    name = "a" * 20 + "_" + "b" * 19
    kcompile(EXAMPLES / "heimdall.onnx", tmp_path / "o", name=name, golden_count=4)
    # a float model behind a hook has the integer-feature entry point too
    kcompile(readahead_policy()[0], tmp_path / "h", name=name, golden_count=4,
             hooks=["readahead"])
    files = [p for d in ("o", "h") for p in (tmp_path / d).rglob("*") if p.suffix in (".c", ".h")]
    assert len(files) >= 30
    for p in files:
        for i, ln in enumerate(p.read_text().splitlines()):
            if 'pr_info("' in ln or 'TP_printk("' in ln:
                continue  # user-visible strings are never split (kernel style)
            assert len(ln.expandtabs(8)) <= 100, f"{p.name}:{i + 1}: {ln}"


def test_compiled_templates_are_kept_and_a_bad_cache_changes_nothing(tmp_path):
    """Each kmlc command keeps the templates Jinja compiled in the cache
    (KMLC_CACHE/templates); a later command with the cache filled, with
    every entry garbled, or with a cache that cannot be written, renders
    the same files byte for byte."""
    import os
    import shutil
    import sys

    def run(cache, out):
        env = dict(os.environ, KMLC_CACHE=str(cache))
        res = subprocess.run([sys.executable, "-m", "kmlc.cli", "compile",
                              str(EXAMPLES / "readahead.onnx"), "-o", str(out), "--target",
                              "kernel"], env=env, capture_output=True, text=True)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*"))
                if p.is_file()}

    first = run(tmp_path / "c", tmp_path / "o1")
    kept = list((tmp_path / "c" / "templates").glob("*/*.cache"))
    assert len(kept) >= 5, kept
    assert run(tmp_path / "c", tmp_path / "o2") == first
    for f in kept:
        f.write_bytes(b"j2 not a template" * 3)
    assert run(tmp_path / "c", tmp_path / "o3") == first
    shutil.rmtree(tmp_path / "c")
    (tmp_path / "c").write_text("a file where the cache directory would be")
    assert run(tmp_path / "c", tmp_path / "o4") == first
