"""kml_math.h against its Python mirror (bit for bit) and against float64
libm (error bounds).  Both builds of every model use kml_math.h, so this is
the numerical core of the bit-identity contract."""
import ctypes
import math
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
		case 6: y[i] = kml_sqrtf(x[i]); break;
		case 7: y[i] = kml_logf(x[i]); break;
		case 8: y[i] = kml_erff(x[i]); break;
		}
	}
}
"""
FUNCS = {0: fmath.expf, 1: fmath.sigmoidf, 2: fmath.tanhf, 3: fmath.reluf,
         4: lambda x: fmath.leaky_reluf(x, np.float32(0.01)),
         5: lambda x: fmath.clipf(x, np.float32(-1.5), np.float32(2.25)),
         6: fmath.sqrtf, 7: fmath.logf, 8: fmath.erff}
SQRT, LOG, ERF = 6, 7, 8
erf64 = np.frompyfunc(math.erf, 1, 1)
REF = {0: np.exp, 1: lambda x: 1 / (1 + np.exp(-x)), 2: np.tanh, LOG: np.log,
       ERF: lambda x: erf64(x).astype(np.float64)}
BOUND_ULP = {0: 1.0, 1: 2.5, 2: 1.5, LOG: 1.0, ERF: 1.0}  # docs/numerics.md, kml_math.h


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
    check_ulp(lib, fn, inputs())


def check_ulp(lib, fn, x):
    x = x[np.isfinite(x)]
    y = run_c(lib, fn, x).astype(np.float64)
    with np.errstate(all="ignore"):
        r = REF[fn](x.astype(np.float64))
    normal = np.isfinite(r) & (np.abs(r) >= np.finfo(np.float32).tiny) & (np.abs(r) <= 3.4e38)
    ulp = np.spacing(np.abs(r[normal]).astype(np.float32)).astype(np.float64)
    err = np.abs(y[normal] - r[normal]) / ulp
    assert err.max() < BOUND_ULP[fn], f"max {err.max():.3f} ulp at x={x[normal][err.argmax()]}"
    return y, r


def test_special_values(lib):
    x = np.float32([np.nan, np.inf, -np.inf, 100.0, -200.0, 0.0])
    e, s, t = (run_c(lib, fn, x) for fn in (0, 1, 2))
    assert np.isnan(e[0]) and np.isnan(s[0]) and np.isnan(t[0])
    assert list(e[1:]) == [np.inf, 0.0, np.inf, 0.0, 1.0]
    assert list(s[1:]) == [1.0, 0.0, 1.0, 0.0, 0.5]
    assert list(t[1:]) == [1.0, -1.0, 1.0, -1.0, 0.0]


def sqrt_inputs():
    """2 million random bit patterns, every power of two (subnormal ones
    too) and its neighbours, all small subnormals, the extremes."""
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    pow2 = np.concatenate([np.arange(1, 255, dtype=np.int64) << 23, 1 << np.arange(23)])
    near = (pow2[:, None] + np.arange(-3, 4)).ravel()
    edge = np.concatenate([near, np.arange(0, 4096), 0x7f7fffff - np.arange(16),
                           0x00800000 - np.arange(16), [0x7f800000, 0x7fc00000, 0x7f800001]])
    edge = edge.astype(np.uint32)
    return np.concatenate([bits, edge, edge | np.uint32(0x80000000)]).view(np.float32)


def same_bits(a, b):
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def test_sqrtf_is_ieee_sqrt(lib):
    """Correct rounding: the C and the mirror equal IEEE sqrt bit for bit."""
    x = sqrt_inputs()
    with np.errstate(invalid="ignore"):
        want = np.sqrt(x)
    for got in (run_c(lib, SQRT, x), fmath.sqrtf(x)):
        ok = same_bits(got, want)
        assert ok.all(), f"x={x[~ok][0]!r}: {got[~ok][0]!r}, IEEE {want[~ok][0]!r}"


def test_logf_error_in_every_binade(lib):
    """1 million positive bit patterns (every binade, subnormals included)
    and a dense sweep of [1/2, 2], where the reduction switches."""
    rng = np.random.default_rng(3)
    bits = rng.integers(1, 0x7f800000, 1_000_000, dtype=np.uint32).view(np.float32)
    x = np.concatenate([bits, np.linspace(0.5, 2, 500_000, dtype=np.float32)])
    check_ulp(lib, LOG, x)


def test_erff_error_dense(lib):
    """Every branch densely, both signs; also absolute error below 6e-8."""
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.uniform(-4.5, 4.5, 1_000_000).astype(np.float32),
                        np.linspace(-0.9, 0.9, 200_000, dtype=np.float32),
                        (rng.integers(0x30000000, 0x3f580000, 200_000, dtype=np.uint32)
                         .view(np.float32))])
    y, r = check_ulp(lib, ERF, x)
    assert np.abs(y - r).max() < 6e-8


def test_sqrt_log_erf_special_values(lib):
    tiny = np.float32(1e-45)
    x = np.float32([np.nan, np.inf, -np.inf, -1.0, 0.0, -0.0, 4.0, tiny, -tiny, 10.0])
    s, lg, e = (run_c(lib, fn, x) for fn in (SQRT, LOG, ERF))
    assert np.isnan(s[[0, 2, 3, 8]]).all() and np.isnan(lg[[0, 2, 3, 8]]).all()
    assert list(s[[1, 4, 5, 6, 7]]) == [np.inf, 0.0, 0.0, 2.0, np.sqrt(tiny)]
    assert np.signbit(s[5]) and not np.signbit(s[4])
    assert list(lg[[1, 4, 5, 6]]) == [np.inf, -np.inf, -np.inf, np.float32(1.3862944)]
    assert lg[7] == np.float32(np.log(np.float64(tiny)))
    assert np.isnan(e[0]) and list(e[1:]) == [1.0, -1.0, -np.float32(0.8427008), 0.0, 0.0,
                                               1.0, tiny, -tiny, 1.0]
    assert np.signbit(e[5]) and not np.signbit(e[4])
