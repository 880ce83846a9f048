"""kml_math.h against its Python mirror (bit for bit) and against float64
libm (error bounds).  Both builds of every model use kml_math.h, so this is
the numerical core of the bit-identity contract."""
import ctypes
import subprocess

import numpy as np
import pytest

from kmlc import fmath
from kmlc.runtime_kernel import DIR as RUNTIME

HARNESS = r"""
#include "kml_math.h"
void eval(int fn, const float *x, float *y, unsigned long n)
{
	unsigned long i;

	for (i = 0; i < n; i++) {
		switch (fn) {
		case 0: y[i] = kml_expf(x[i]); break;
		case 1: y[i] = kml_sigmoidf(x[i]); break;
		case 2: y[i] = kml_tanhf(x[i]); break;
		case 3: y[i] = kml_reluf(x[i]); break;
		case 4: y[i] = kml_leaky_reluf(x[i], 0.01f); break;
		case 5: y[i] = kml_clipf(x[i], -1.5f, 2.25f); break;
		}
	}
}
"""
FUNCS = {0: fmath.expf, 1: fmath.sigmoidf, 2: fmath.tanhf, 3: fmath.reluf,
         4: lambda x: fmath.leaky_reluf(x, np.float32(0.01)),
         5: lambda x: fmath.clipf(x, np.float32(-1.5), np.float32(2.25))}
REF = {0: np.exp, 1: lambda x: 1 / (1 + np.exp(-x)), 2: np.tanh}
BOUND_ULP = {0: 1.0, 1: 2.5, 2: 1.5}  # docs/numerics.md, kml_math.h


@pytest.fixture(scope="module", params=["gcc -O2", "gcc -O0", "clang -O2"])
def lib(request, tmp_path_factory):
    cc, opt = request.param.split()
    d = tmp_path_factory.mktemp("fmath")
    (d / "h.c").write_text(HARNESS)
    so = d / "h.so"
    subprocess.run([cc, opt, "-ffp-contract=off", "-fPIC", "-shared", f"-I{RUNTIME}",
                    "-o", so, d / "h.c"], check=True)
    return ctypes.CDLL(str(so))


def run_c(lib, fn, x):
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    lib.eval(fn, x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p),
             ctypes.c_ulong(x.size))
    return y


def inputs():
    rng = np.random.default_rng(1)
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 88.7228317,
                          88.72284, -103.972084, -103.97209, 0.625, -0.625, 0.62499994,
                          3.4028235e38, -3.4028235e38, 1.17549435e-38])
    bits = rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    sweep = np.linspace(-110, 100, 300_000, dtype=np.float32)
    return np.concatenate([special, bits, sweep])


@pytest.mark.parametrize("fn", sorted(FUNCS))
def test_c_matches_python_mirror_bit_for_bit(lib, fn):
    x = inputs()
    y, m = run_c(lib, fn, x), FUNCS[fn](x)
    same = (y.view(np.uint32) == m.view(np.uint32)) | (np.isnan(y) & np.isnan(m))
    assert same.all(), f"first mismatch at x={x[~same][0]!r}: C {y[~same][0]!r}, mirror {m[~same][0]!r}"


@pytest.mark.parametrize("fn", sorted(REF))
def test_error_bound_in_ulp(lib, fn):
    x = inputs()
    x = x[np.isfinite(x)]
    y = run_c(lib, fn, x).astype(np.float64)
    with np.errstate(all="ignore"):
        r = REF[fn](x.astype(np.float64))
    normal = np.isfinite(r) & (np.abs(r) >= np.finfo(np.float32).tiny) & (np.abs(r) <= 3.4e38)
    ulp = np.spacing(np.abs(r[normal]).astype(np.float32)).astype(np.float64)
    err = np.abs(y[normal] - r[normal]) / ulp
    assert err.max() < BOUND_ULP[fn], f"max {err.max():.3f} ulp at x={x[normal][err.argmax()]}"


def test_special_values(lib):
    x = np.float32([np.nan, np.inf, -np.inf, 100.0, -200.0, 0.0])
    e, s, t = (run_c(lib, fn, x) for fn in (0, 1, 2))
    assert np.isnan(e[0]) and np.isnan(s[0]) and np.isnan(t[0])
    assert list(e[1:]) == [np.inf, 0.0, np.inf, 0.0, 1.0]
    assert list(s[1:]) == [1.0, 0.0, 1.0, 0.0, 0.5]
    assert list(t[1:]) == [1.0, -1.0, 1.0, -1.0, 0.0]
