"""The compiler's own fixed-point error bound (passes/error_bound.py),
held against onnxruntime, the independent oracle: on the rows a model was
calibrated on, |fixed - float| never exceeds the bound kmlc states in
kmlc.json, and a class output agrees wherever float's top-2 gap exceeds
the stated gap.  The fuzzer's oracle (tests/fuzz/kmlfuzz.py) does the
comparison: float32 slack of 1e-5 of the row's largest magnitude."""
import importlib
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import EXAMPLES, SEED_MODELS, kmlc_cli, seed_models
from kmlc.api import compile as kcompile, load
from kmlc.qmath import multiplier
from kmlc.ops import interpret

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
import kmlfuzz  # noqa: E402

br = importlib.import_module("kmlc.passes.bound_ranges")   # the module, not its function


def within_bound(tmp_path, model: onnx.ModelProto, cal: np.ndarray, weight_bits="auto"):
    res = kcompile(model, tmp_path / "o", targets="user", numerics="fixed", calibration=cal,
                   weight_bits=weight_bits)
    y = load(tmp_path / "o").run(cal)
    return res, kmlfuzz.oracle(model.SerializeToString(), res.manifest, cal, y)


@pytest.mark.parametrize("seed", range(40))
def test_bound_holds_on_random_models(tmp_path, seed):
    """Random MLPs of every activation kind (LeakyRelu of negative slope,
    Clip with min > max, Softmax, ArgMax heads, layers without bias)."""
    rng = np.random.default_rng([7, seed])
    m = kmlfuzz.fresh_model(rng)
    cal = kmlfuzz.clean_rows(rng, m, None, 300)
    res, wrong = within_bound(tmp_path, m, cal)
    assert not wrong, wrong
    assert not res.warnings


@pytest.mark.parametrize("name", SEED_MODELS)
@pytest.mark.parametrize("bits", ["auto", "16"])
@pytest.mark.parametrize("headroom", [None, 1.5])
def test_bound_holds_and_means_something_on_seed_models(tmp_path, name, bits, headroom):
    """Sound with the default widths (int8 on the seed shapes) and int16,
    with the default headroom (10x) and a narrow one; with int16 weights
    also tight: under 3% of the calibrated output span with --headroom 1.5,
    under 12% with the default, whose 10x coarser hidden steps the worst
    case adds up layer by layer (heimdall's sigmoid: 0.021, 0.111).  int8
    weights' rounding, summed as a worst case over the layer, gives bounds
    of 0.4-1.4 on outputs whose real error stays under 0.09."""
    cal = seed_models.sample_inputs(name, 2000, seed=21)
    m = onnx.load(EXAMPLES / f"{name}.onnx")
    res = kcompile(m, tmp_path / "o", targets="user", numerics="fixed", calibration=cal,
                   weight_bits=bits, headroom=headroom)
    y = load(tmp_path / "o").run(cal)
    wrong = kmlfuzz.oracle(m.SerializeToString(), res.manifest, cal, y)
    assert not wrong, wrong
    g = res.program.quant.float_graph
    ref = np.stack([np.concatenate([o.reshape(-1) for o in interpret(g, r[None])])
                    for r in cal[:500]])
    span = float(ref.max() - ref.min())
    for o in res.manifest["fixed"]["outputs"]:
        assert 0 < o["error_bound"], o
        if bits == "16":
            assert o["error_bound"] < (0.03 if headroom else 0.12) * span, (o, span)


def test_few_multiplier_bits_are_counted_and_said(tmp_path, monkeypatch):
    """Multipliers cut to 3 bits (what a huge proven accumulator would
    leave): outputs are off by up to 1/8 of their value; the bound still
    holds, and the compile says which layers break kmlc verify's SQNR."""
    monkeypatch.setattr(br, "multiplier", lambda s, b, **k: multiplier(s, b, mult_bits=3))
    name = "nfs_rsize"
    cal = seed_models.sample_inputs(name, 500, seed=21)
    m = onnx.load(EXAMPLES / f"{name}.onnx")
    res, wrong = within_bound(tmp_path, m, cal)
    assert not wrong, wrong
    assert res.warnings and all("requantization may be off by up to" in w and "SQNR" in w
                                for w in res.warnings), res.warnings
    assert any("node_linear_3 (Gemm)" in w for w in res.warnings), res.warnings
    y = load(tmp_path / "o").run(cal)
    from kmlc.verify import reference_outputs
    err = np.abs(y - reference_outputs(m, res.program, cal)).max()
    assert err > 0.01, "3-bit multipliers should cost accuracy; the test lost its teeth"


def test_compile_states_the_bound(tmp_path):
    cal = seed_models.sample_inputs("heimdall", 300, seed=21)
    np.save(tmp_path / "cal.npy", cal)
    r = kmlc_cli("compile", EXAMPLES / "heimdall.onnx", "-o", tmp_path / "o", "--target", "user",
                 "--numerics", "fixed", "--calibration", tmp_path / "cal.npy")
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if "fixed point, output" in ln]
    assert line and "|fixed - float| <=" in line[0], r.stdout
    report = (tmp_path / "o" / "report.txt").read_text()
    assert "error bound |fixed - float| per layer" in report
