"""Heimdall's published weights (both trained devices), built as ONNX by
tests/data/heimdall/heimdall_model.py from the repository's numbers: int64
features in, the decline decision (GreaterOrEqual) inside the graph.

The range acceptance of fixed point: calibrated on rows within the
training ranges the published normalization encodes, fixed point must
decide as float on >= 99% of rows up to 10x beyond those ranges, and on
every start-up row (no history yet: throughputs at the kernel's
placeholder 99999999, far beyond any calibrated value).  Float must be
onnxruntime's decisions exactly, and close to the authors' own int64
inference (which rounds every first-layer product down to its 2^-30 step).
"""
import sys

import numpy as np
import pytest

from conftest import ROOT
from kmlc.api import compile as kcompile, load

sys.path.insert(0, str(ROOT / "tests" / "data" / "heimdall"))
import heimdall_model as hm  # noqa: E402

DEVS = (0, 1)
N = 5000


def beyond_all(dev, n, seed):
    """Every feature (but io_type) between 1x and 10x its range past its maximum."""
    r = np.random.default_rng(seed)
    lo, width = hm.feature_range(dev)
    x = np.round(lo + width * (1 + r.uniform(0, 9, (n, 12)))).astype(np.int64)
    x[:, 0] = 1
    return x


ROWS = {"in range": lambda d: hm.rows(d, N, 2),
        "up to 10x (scaled rows)": lambda d: hm.rows(d, N, 3, beyond=10),
        "1-10x beyond (every feature)": lambda d: beyond_all(d, N, 4),
        "start-up": lambda d: hm.startup_rows(d, 500, 5)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("heimdall")
    out = {}
    for dev in DEVS:
        m = hm.model(dev)
        for numerics in ("float", "fixed"):
            kw = {"calibration": hm.rows(dev, 4000, 1)} if numerics == "fixed" else {}
            d = root / f"dev{dev}_{numerics}"
            kcompile(m, d, name=f"heimdall{dev}_{numerics[:2]}", targets="user",
                     numerics=numerics, **kw)
            out[dev, numerics] = load(d)
    return out


def onnxruntime(m, x):
    import onnxruntime as ort
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"features": x})[0].reshape(-1)


@pytest.mark.parametrize("dev", DEVS)
def test_float_is_onnxruntime_and_near_the_authors_integers(built, dev):
    m = hm.model(dev)
    for what, make in ROWS.items():
        x = make(dev)
        got = built[dev, "float"].run(x).reshape(-1)
        assert got.dtype == np.bool_
        assert np.array_equal(got, onnxruntime(m, x)), what
        authors = hm.authors_int64(dev, x)
        assert (got == authors).mean() >= 0.99, (what, (got == authors).mean())


@pytest.mark.parametrize("dev", DEVS)
def test_fixed_decides_as_float_on_every_range(built, dev):
    for what, make in ROWS.items():
        x = make(dev)
        ref = built[dev, "float"].run(x).reshape(-1)
        got = built[dev, "fixed"].run(x).reshape(-1)
        agree = (got == ref).mean()
        need = 1.0 if what == "start-up" else 0.99
        assert agree >= need, (what, agree, ref.mean(), got.mean())
