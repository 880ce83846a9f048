"""The vector and paired helpers the dense kernels use, against their
scalar definitions, bit for bit.

* kml_math.h's four-lane functions (kml_expf_x4, kml_sigmoidf_x4, ...) must
  give, in every lane, the bits of the scalar function on that lane's input:
  the float kernels apply them to four outputs at once.
* kml_fixed.h's paired accumulators (kml_pack2, kml_unpack2) must return
  both sums exactly whenever they fit int32, and kml_requant_relu must be kml_requant followed by a ReLU clamp.
The scalar functions are the contract's reference (tests/unit/test_fmath.py,
test_qmath.py check them against their Python mirrors)."""
import ctypes
import subprocess

import numpy as np
import pytest

from kmlc.runtime_kernel import DIR as RUNTIME

HARNESS = r"""
#include "kml_math.h"
#include "kml_fixed.h"

/* y[i] = f(x[i]) through the four-lane function; z[i] through the scalar one */
void eval(int fn, const float *x, float *y, float *z, unsigned long n)
{
	unsigned long i;

	for (i = 0; i + 4 <= n; i += 4) {
		kml_f32x4 v = kml_f32x4_load(x + i), r;

		switch (fn) {
		case 0: r = kml_expf_x4(v); break;
		case 1: r = kml_sigmoidf_x4(v); break;
		case 2: r = kml_tanhf_x4(v); break;
		case 3: r = kml_reluf_x4(v); break;
		case 4: r = kml_leaky_reluf_x4(v, 0.01f); break;
		default: r = kml_clipf_x4(v, -1.5f, 2.25f); break;
		}
		kml_f32x4_store(y + i, r);
	}
	for (i = 0; i < n; i++) {
		switch (fn) {
		case 0: z[i] = kml_expf(x[i]); break;
		case 1: z[i] = kml_sigmoidf(x[i]); break;
		case 2: z[i] = kml_tanhf(x[i]); break;
		case 3: z[i] = kml_reluf(x[i]); break;
		case 4: z[i] = kml_leaky_reluf(x[i], 0.01f); break;
		default: z[i] = kml_clipf(x[i], -1.5f, 2.25f); break;
		}
	}
}

/* sums of x[k] * w0[k] and x[k] * w1[k], accumulated as one packed pair,
 * as the paired kernels take them */
void pairs(const s16 *x, const s16 *w0, const s16 *w1, unsigned long n, s64 *out)
{
	u64 p = 0;
	unsigned long k;

	for (k = 0; k < n; k++)
		p += (u64)x[k] * kml_pack2(w0[k], w1[k]);
	kml_unpack2(p, out);
}

void relu(const s64 *acc, const u32 *mult, const u8 *shift, unsigned long n, s64 *a, s64 *b)
{
	unsigned long i;

	for (i = 0; i < n; i++) {
		a[i] = kml_clamp(kml_requant_relu(acc[i], mult[i], shift[i]) - 32768, -32768, 32767);
		b[i] = kml_clamp(kml_requant(acc[i], mult[i], shift[i]) - 32768, -32768, 32767);
	}
}
"""


UBSAN = ["-fsanitize=undefined", "-fno-sanitize-recover=all", "-fsanitize-undefined-trap-on-error"]


@pytest.fixture(scope="module", params=["gcc -O2", "gcc -O0", "clang -O2", "gcc -O1 ubsan"])
def lib(request, tmp_path_factory):
    cc, opt, *san = request.param.split()
    d = tmp_path_factory.mktemp("fmath_x4")
    (d / "h.c").write_text(HARNESS)
    so = d / "h.so"
    subprocess.run([cc, opt, "-std=gnu11", "-ffp-contract=off", "-fPIC", "-shared", "-Wall",
                    "-Werror", *(UBSAN if san else []), f"-I{RUNTIME}", "-o", so, d / "h.c"],
                   check=True)
    return ctypes.CDLL(str(so))


def p(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def inputs():
    rng = np.random.default_rng(3)
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45,
                          88.7228317, 88.72284, -103.972084, -103.97209, 0.625, -0.625,
                          0.62499994, 3.4028235e38, -3.4028235e38, 1.17549435e-38, -1.5,
                          2.25, 1.0, -1.0, 44.36142, -51.98604])
    bits = rng.integers(0, 2**32, 400_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    sweep = np.linspace(-110, 100, 400_000, dtype=np.float32)
    x = np.concatenate([special, bits, sweep])
    return np.concatenate([x, rng.permutation(x)])  # specials next to ordinary lanes too


@pytest.mark.parametrize("fn", range(6))
def test_four_lanes_are_the_scalar_function(lib, fn):
    x = inputs()
    x = x[: len(x) // 4 * 4]
    y, z = np.empty_like(x), np.empty_like(x)
    lib.eval(fn, p(x), p(y), p(z), ctypes.c_ulong(x.size))
    same = y.view(np.uint32) == z.view(np.uint32)
    assert same.all(), f"x={x[~same][0]!r}: lanes {y[~same][0]!r}, scalar {z[~same][0]!r}"


def test_pairs_are_exact_up_to_the_int32_edges(lib):
    """Exact whenever both sums lie in [-2^31, 2^31), the proof's condition
    for pairing, however far the partial sums go (they wrap modulo 2^64,
    which unsigned arithmetic defines); Python integers are the oracle.
    The library is also built with UBSan trapping (the fixture's third
    build): no signed overflow, no shift of a negative value."""
    rng = np.random.default_rng(4)
    out = np.zeros(2, np.int64)
    edge = 0
    for trial in range(3000):
        n = int(rng.integers(1, 300))
        x = rng.integers(-32768, 32768, n).astype(np.int16)
        w0 = rng.integers(-32767, 32768, n).astype(np.int16)
        w1 = rng.integers(-32767, 32768, n).astype(np.int16)
        if trial % 3 == 0:  # extremes: the largest sums the lanes must hold
            m = min(n, 2)   # 2 * 32768 * 32767 < 2^31
            x[:], w0[:], w1[:] = 0, 0, 0
            x[:m] = rng.choice([-32768, 32767])
            w0[:m], w1[:m] = rng.choice([-32767, 32767]), rng.choice([-32767, 32767])
        s0 = int((x.astype(object) * w0.astype(object)).sum())
        s1 = int((x.astype(object) * w1.astype(object)).sum())
        lib.pairs(p(x), p(w0), p(w1), ctypes.c_ulong(n), p(out))
        if all(-2**31 <= s < 2**31 for s in (s0, s1)):
            assert (int(out[0]), int(out[1])) == (s0, s1), trial
            edge += max(abs(s0), abs(s1)) >= 2**30
    assert edge > 300, edge   # sums near the edge were exercised


def test_requant_relu_is_requant_then_relu_clamp(lib):
    rng = np.random.default_rng(5)
    n = 200_000
    acc = rng.integers(-2**40, 2**40, n).astype(np.int64) >> rng.integers(0, 40, n)
    acc[:6] = [0, -1, 1, -2**40, 2**40, -3]
    mult = rng.integers(1, 2**22, n).astype(np.uint32)
    shift = rng.integers(0, 40, n).astype(np.uint8)
    a, b = np.empty(n, np.int64), np.empty(n, np.int64)
    lib.relu(p(acc), p(mult), p(shift), ctypes.c_ulong(n), p(a), p(b))
    assert np.array_equal(a, b)
