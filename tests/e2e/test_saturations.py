"""Saturation is counted: the fixed-point entry point returns how many
values it saturated, and kmlc's integer evaluator (kmlc.ops.saturations)
gives the same count row by row.

Heimdall's published network (int64 features, ReLU layers with an exact
wide first layer) and MIXED (int32 features, Max/Min/Where/Neg/Abs) are run
on rows inside their calibrated ranges (no saturation), far beyond them
(activations leave their encodings), and at each integer type's extremes.
"""
import sys

import numpy as np
import pytest

from conftest import ROOT
from kmlc.api import compile as kcompile, load
from kmlc.ops import saturations

sys.path.insert(0, str(ROOT / "tests" / "data" / "heimdall"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import heimdall_model as hm  # noqa: E402
from test_decision_models import hostile, mixed, mixed_rows  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("sat")
    out = {}
    for name, model, cal in (("hd", hm.model(0), hm.rows(0, 4000, 1)),
                             ("mixed", mixed(), mixed_rows(2000, 21))):
        res = kcompile(model, root / name, name=f"sat_{name}", targets="user",
                       numerics="fixed", calibration=cal)
        out[name] = (load(root / name), res.program.quant.int_graph)
    return out


def rows_for(name, what, n=400):
    if name == "hd":
        x = {"in": hm.rows(0, n, 7), "far": hm.rows(0, n, 8, beyond=1000)}.get(what)
    else:
        x = {"in": mixed_rows(n, 7), "far": mixed_rows(n, 8) * 1000}.get(what)
    return x


@pytest.mark.parametrize("name", ["hd", "mixed"])
def test_count_is_the_evaluators_row_by_row(built, name):
    twin, g = built[name]
    x = np.concatenate([rows_for(name, "in"), rows_for(name, "far"),
                        hostile(twin.in_dtype, twin.in_elems, 400)]).astype(twin.in_dtype)
    before = twin.saturations
    twin.run_raw(x)
    got = twin.last_saturations
    want = np.array([saturations(g, row[None]) for row in x])
    assert np.array_equal(got, want)
    assert twin.saturations - before == want.sum()
    n = len(rows_for(name, "in"))
    assert not got[:n].any(), "rows inside the calibrated ranges saturate nothing"
    assert got[n:2 * n].any() and got[2 * n:].any(), "far and extreme rows must saturate"


def test_int64_features_beyond_int32_count(built):
    twin, g = built["hd"]
    x = hm.rows(0, 2, 9)
    x[1, 1] = 2**40                       # a size beyond int32: saturated on entry
    twin.run_raw(x)
    assert twin.last_saturations[1] >= 1 + twin.last_saturations[0]
