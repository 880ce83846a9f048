"""The modules in Debian's real 6.1 kernel, booted in qemu: each model's
self-test runs its golden vectors through the real module (the float ones
inside the real kernel_fpu_begin/end), and a corrupted golden vector must
stop a module from loading."""
import re

import pytest

from conftest import EXAMPLES, SEED_MODELS, seed_models
from kmlc.api import compile as kcompile
from kmlc.targets import qemu


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("qemu")
    out = []
    for name in SEED_MODELS:
        kcompile(EXAMPLES / f"{name}.onnx", root / f"{name}_fp", name=f"{name}_fp",
                 targets="kernel")
        kcompile(EXAMPLES / f"{name}.onnx", root / f"{name}_fx", name=f"{name}_fx",
                 targets="kernel", numerics="fixed",
                 calibration=seed_models.sample_inputs(name, 1000, seed=41))
        out += [root / f"{name}_fp", root / f"{name}_fx"]
    return out


@pytest.mark.kernel
def test_modules_selftest_in_real_kernel(models):
    res = qemu.run(models)
    assert res["ok"], "\n".join(res["lines"])
    passed = [ln for ln in res["lines"] if "PASS" in ln and "8/8 golden vectors" in ln]
    assert len(passed) == 6, res["lines"]


@pytest.mark.kernel
def test_corrupted_golden_vector_stops_the_module(models, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(models[0], bad)
    src = next((bad / "kernel").glob("*_mod.c"))
    text = src.read_text()
    m = re.search(r"\.out = \{\s*0x([0-9a-f]{8})", text)
    src.write_text(text[:m.start(1) - 2] + f"0x{int(m.group(1), 16) ^ 1:08x}"
                   + text[m.end(1):])
    res = qemu.run([bad])
    assert not res["ok"]
    assert any("FAIL insmod" in ln for ln in res["lines"]), res["lines"]
    assert "1 of 8 golden vectors differ from the twin" in res["log"]
