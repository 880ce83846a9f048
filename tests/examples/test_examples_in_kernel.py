"""The worked examples' checked-in models go through the same kernel tests
as every other module: their KUnit suites on UML (module == twin, bit for
bit, on golden vectors drawn from the example's own feature rows) and their
hook modules in Debian's kernel under qemu (golden-vector self-test at
load, the hook's scenario, 100 reload cycles, the module's trace replayed
through the twin; the admission module with the history its model was
trained with, compiled in)."""
import json
import shlex

import numpy as np
import pytest

from conftest import ROOT
from kmlc.api import compile as kcompile
from kmlc.hooks import check_hook_params, owner
from kmlc.targets import kunit, qemu

EX = ROOT / "examples"
# module name: (model, hook, the calibration rows the example compiles it with)
CASES = {
    "ex_readahead": (EX / "readahead/readahead.onnx", "readahead",
                     EX / "readahead/calibration.npy"),
    "ex_nfs_rsize": (EX / "nfs_rsize/nfs_rsize.onnx", "nfs-rsize",
                     EX / "nfs_rsize/calibration.npy"),
    "ex_admit": (EX / "admission/results/heimdall.onnx", "admission",
                     EX / "admission/results/calibration.npy"),
}
GOLDEN = 64


def compiled_as_the_example(command: str) -> dict:
    """An example's own compile options, from its checked-in command line:
    the module carries what its model was trained with (--hook-param: the
    admission history, the readahead class table) and the inputs' clamp
    margin."""
    cmd = shlex.split(command)
    out = {"hook_params": [cmd[i + 1] for i, a in enumerate(cmd) if a == "--hook-param"]}
    if "--input-margin" in cmd:
        out["input_margin"] = float(cmd[cmd.index("--input-margin") + 1])
    return out


def results(example: str) -> dict:
    return json.loads((EX / example / "results/results.json").read_text())


OPTIONS = {"ex_admit": compiled_as_the_example(results("admission")["kmlc"]["compile"]),
           "ex_readahead": compiled_as_the_example(
               results("readahead")["compile"]["fixed"]["command"])}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    root = tmp_path_factory.mktemp("examples")
    out = {}
    for name, (model, hook, cal) in CASES.items():
        rows = np.load(cal)
        pick = np.linspace(0, len(rows) - 1, GOLDEN).astype(int)
        kcompile(model, root / name, name=name, numerics="fixed", calibration=rows,
                 hooks=[hook], golden_data=rows[pick], golden_count=GOLDEN,
                 **OPTIONS.get(name, {}))
        out[name] = root / name
    return out


@pytest.mark.kunit
def test_examples_kunit_uml(compiled):
    res = kunit.run(list(compiled.values()), arch="um")
    assert res["ok"], res["summary"]
    for name in CASES:
        assert res["suites"][f"kml_{name}"]["passed"] == kunit.cases(compiled[name]), \
            res["summary"]
        assert kunit.cases(compiled[name]) >= GOLDEN + 1


@pytest.mark.kernel
def test_examples_hooks_in_real_kernel(compiled):
    """Every step of each hook's scenario passes with the example's model,
    and its trace replays bit for bit through the twin (qemu.run's replay
    verdicts); the modules run with what they were compiled with (3 reload
    cycles: tests/e2e/test_qemu.py runs the hooks' long loops)."""
    res = qemu.run(list(compiled.values()), cycles=3)
    assert res["ok"], "\n".join(res["lines"])
    dumps = qemu.traces(res["log"])
    for name, (_, hook, _) in CASES.items():
        mine = [ln for ln in res["lines"] if ln.startswith(f"kml_{name}")]
        assert any("8/8 golden vectors" in ln for ln in mine), mine
        assert any("reload-cycles: PASS 3 cycles" in ln for ln in mine), mine
        assert any("replay" in ln and ": PASS" in ln for ln in mine), mine
        text = next(iter(dumps[f"kml_{name}"].values()))
        if hook == "admission":
            # with the compiled-in history_writes=N no write completion
            # enters the history, though the scenario writes through the target
            params = check_hook_params([hook], OPTIONS["ex_admit"]["hook_params"])
            rows = np.concatenate([m["rows"] for m in owner(hook).parse(text)["mirrors"]
                                   .values()])
            assert (rows[:, 0] == 2).any() == params["history_writes"]
        if hook == "readahead":
            # faults through a mapping reach the module, and it sets the
            # example's class table
            t = owner(hook).parse(text)
            assert (t["rows"][:, 3] & 4).any()
            table = check_hook_params([hook], OPTIONS["ex_readahead"]["hook_params"])["ra_pages"]
            assert set(t["decisions"][:, 3].tolist()) <= set(table)
