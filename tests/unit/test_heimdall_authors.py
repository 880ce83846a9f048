"""benchmarks/c/heimdall_authors.c, the authors' int64 Heimdall inference
written in C as a benchmark peer, decides as the numpy rewrite of the same
published algorithm (tests/data/heimdall/heimdall_model.py) on rows inside
the training ranges, far beyond them and at start-up, for both devices."""
import ctypes
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "data" / "heimdall"))
import heimdall_model as hm  # noqa: E402

P = ctypes.POINTER(ctypes.c_int64)


class Net(ctypes.Structure):
    _fields_ = [(k, P) for k in ("min", "scale0", "w1", "b1", "w2", "b2", "w3", "b3")]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    so = tmp_path_factory.mktemp("ha") / "ha.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-fsanitize=undefined",
                    "-fno-sanitize-recover=all", str(ROOT / "benchmarks" / "c" /
                                                     "heimdall_authors.c"), "-o", str(so)],
                   check=True)
    return ctypes.CDLL(str(so))


@pytest.mark.parametrize("dev", (0, 1))
def test_c_peer_is_the_published_algorithm(lib, dev):
    n = hm.numbers(dev)
    arrays = {k: np.ascontiguousarray(n[src], dtype=np.int64) for k, src in
              (("min", "weight_0_T"), ("scale0", "bias_0"), ("w1", "weight_1_T"),
               ("b1", "bias_1"), ("w2", "weight_2_T"), ("b2", "bias_2"), ("w3", "weight_3_T"),
               ("b3", "bias_3"))}
    net = Net(**{k: v.ctypes.data_as(P) for k, v in arrays.items()})
    fn = lib.heimdall_authors_decide
    fn.argtypes, fn.restype = [ctypes.POINTER(Net), P], ctypes.c_int
    x = np.concatenate([hm.rows(dev, 1000, 11), hm.rows(dev, 1000, 12, beyond=10),
                        hm.startup_rows(dev, 200, 13)])
    want = hm.authors_int64(dev, x)
    got = np.array([fn(ctypes.byref(net), np.ascontiguousarray(r).ctypes.data_as(P))
                    for r in x], bool)
    assert np.array_equal(got, want)
    assert 0.05 < want.mean() < 0.95 or dev == 1, want.mean()
