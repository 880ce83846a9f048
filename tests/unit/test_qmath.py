"""kml_fixed.h against its Python mirror, bit for bit, and the LUT
nonlinearities against the exact functions (error bounds in LSB)."""
import ctypes
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from kmlc import qmath
from kmlc.runtime_kernel import DIR as RUNTIME

HARNESS = r"""
#define KML_LUT_SIGMOID
#define KML_LUT_TANH
#define KML_LUT_EXP
#include "kml_fixed.h"
void lut3(const s32 *x, s32 *y, long n)
{
	long i;

	for (i = 0; i < n; i++) {
		y[3 * i] = kml_sigmoid_q15(x[i]);
		y[3 * i + 1] = kml_tanh_q15(x[i]);
		y[3 * i + 2] = kml_exp_q15(x[i]);
	}
}
void requant(const s64 *acc, const u32 *mult, const u32 *shift, s64 *y, long n)
{
	long i;

	for (i = 0; i < n; i++)
		y[i] = kml_requant(acc[i], mult[i], shift[i]);
}
void requant_wide(const s64 *acc, const u32 *mult, const u32 *shift, s64 *y, long n)
{
	long i;

	for (i = 0; i < n; i++)
		y[i] = kml_requant_wide(acc[i], mult[i], shift[i]);
}
void round_shift(const s64 *v, const u32 *shift, s64 *y, long n)
{
	long i;

	for (i = 0; i < n; i++)
		y[i] = kml_round_shift(v[i], shift[i]);
}
void tab(const s16 *t, const s32 *x, const s32 *p, s32 *y, long n)
{
	long i;

	for (i = 0; i < n; i++)
		y[i] = kml_tab(t, x[i], p[0], p[1], p[2], p[3], p[4]);
}
void qmul(const s16 *a, const s16 *b, const s64 *p, s64 *y, u32 *sat, long m)
{
	long i;

	for (i = 0; i < m; i++)
		y[i] = kml_qmul(a[i], p[0], b[i], p[1], p[2], (unsigned int)p[3], p[4], sat);
}
"""


@pytest.fixture(scope="module", params=["gcc -O2", "clang -O0"])
def lib(request, tmp_path_factory):
    cc, opt = request.param.split()
    d = tmp_path_factory.mktemp("qmath")
    (d / "h.c").write_text(HARNESS)
    subprocess.run([cc, opt, "-fPIC", "-shared", f"-I{RUNTIME}", "-o", d / "h.so", d / "h.c"],
                   check=True)
    return ctypes.CDLL(str(d / "h.so"))


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def test_luts_match_mirror_on_every_input(lib):
    x = np.arange(-2**31, 2**31, 2**16 - 1, dtype=np.int64)
    x = np.concatenate([np.arange(-40000, 40000), x, [-2**31, 2**31 - 1]]).astype(np.int32)
    y = np.empty(3 * len(x), dtype=np.int32)
    lib.lut3(ptr(x), ptr(y), ctypes.c_long(len(x)))
    y = y.reshape(-1, 3)
    assert np.array_equal(y[:, 0], qmath.sigmoid_q15(x))
    assert np.array_equal(y[:, 1], qmath.tanh_q15(x))
    assert np.array_equal(y[:, 2], qmath.exp_q15(x))


def test_lut_error_bounds_in_lsb():
    x = np.arange(-32768, 32768)
    sig = 32768 / (1 + np.exp(-x / 2048.0))
    assert np.abs(qmath.sigmoid_q15(x) - np.minimum(sig, 32767)).max() < 1.0
    tanh = np.clip(np.tanh(x / 4096.0) * 32768, -32767, 32767)
    assert np.abs(qmath.tanh_q15(x) - tanh).max() < 1.0
    d = np.arange(-32768, 1)
    assert np.abs(qmath.exp_q15(d) - np.exp(d / 2048.0) * 32768).max() < 1.6
    # saturation beyond the tables' domains
    assert qmath.sigmoid_q15(2**31 - 1) == 32767 and qmath.sigmoid_q15(-2**31) == 0
    assert qmath.tanh_q15(-2**31) == -32767 and qmath.exp_q15(-2**31) == 0


def test_requant_matches_mirror_and_exact_rounding(lib):
    rng = np.random.default_rng(0)
    n = 200_000
    shift = rng.integers(0, 63, n).astype(np.uint32)
    mult = rng.integers(1, 2**31, n).astype(np.uint32)
    # |acc| * mult < 2^63, as the compiler guarantees
    lim = (2**63 - 1) // mult.astype(object)
    acc = np.array([int(rng.integers(-min(int(l), 2**62), min(int(l), 2**62)))
                    for l in lim], dtype=np.int64)
    acc[:4] = [0, 1, -1, -(2**31)]
    y = np.empty(n, dtype=np.int64)
    lib.requant(ptr(acc), ptr(mult), ptr(shift), ptr(y), ctypes.c_long(n))
    assert np.array_equal(y, qmath.requant(acc, mult, shift))
    # an independent oracle: exact rational rounding with Python ints
    for a, m, s, got in list(zip(acc.tolist(), mult.tolist(), shift.tolist(), y.tolist()))[:5000]:
        num = abs(a) * m
        q, r = divmod(num, 1 << s)
        exact = q + (1 if s and 2 * r >= (1 << s) else 0)
        assert got == (-exact if a < 0 else exact)


@pytest.mark.parametrize("o, down, m, k", [(-32768, 0, 0, 16), (-32768, 0, 10, 6),
                                            (32767, 1, 16, 0), (-3000, 0, 5, 0),
                                            (100, 1, 4, 3), (0, 0, 6, 2)])
def test_tab_matches_mirror_and_its_segments(lib, o, down, m, k):
    """kml_tab against its mirror on every int16 input, and against an
    independent oracle: segments 2^k wide below 2^(m + k), 2^m equal ones
    to an octave beyond; the value on the line between a segment's two
    entries, its correction rounded half up on its magnitude (exact
    rationals); u held in [0, umax]."""
    from fractions import Fraction

    rng = np.random.default_rng(m * 31 + k)
    umax = (o + 32768) if down else (32767 - o)
    count = int(qmath.tab_index(np.array([umax]), m, k)[0][0]) + 2
    t = rng.integers(-32768, 32768, count).astype(np.int16)
    t[:2] = [-32768, 32767]                    # the widest step there is
    x = np.arange(-32768, 32768, dtype=np.int32)
    y = np.empty(len(x), dtype=np.int32)
    p = np.array([o, down, m, k, umax], dtype=np.int32)
    lib.tab(ptr(t), ptr(x), ptr(p), ptr(y), ctypes.c_long(len(x)))
    assert np.array_equal(y, qmath.tab(t, x, o, down, m, k, umax))
    starts = qmath.tab_starts(count, m, k)
    for xi in rng.choice(x, 3000).tolist() + [-32768, 32767, o]:
        u = min(max((o - xi) if down else (xi - o), 0), umax)
        if u < 1 << (m + k):
            w = 1 << k
            j = u // w
        else:
            e = u.bit_length() - 1
            w = 1 << (e - m)
            j = (1 << m) + (e - m - k) * (1 << m) + (u - (1 << e)) // w
        assert starts[j] == u - u % w and (j + 1 == count or starts[j + 1] == starts[j] + w)
        d = int(t[j + 1]) - int(t[j])
        c = int(Fraction(abs(d) * (u % w), w) + Fraction(1, 2))
        r = int(t[j]) + (c if d >= 0 else -c)
        assert abs(r - (t[j] + Fraction(d * (u % w), w))) <= Fraction(1, 2)
        assert y[xi + 32768] == r, (xi, u, j, w)


def test_qmul_matches_mirror_and_exact_rounding(lib):
    """kml_qmul at the compiler's limits (|a - za|, |b - zb| < 2^16, m <
    2^30), against its mirror and exact rationals, saturations counted."""
    from fractions import Fraction

    rng = np.random.default_rng(3)
    m = 100_000
    a = rng.integers(-32768, 32768, m).astype(np.int16)
    b = rng.integers(-32768, 32768, m).astype(np.int16)
    a[:3], b[:3] = [-32768, 32767, -32768], [-32768, 32767, 32767]
    for za, zb, mult, shift, zp in ((32767, -32768, 2**30 - 1, 60, -5),
                                    (0, 0, 12345, 40, 0), (-7, 3, 1, 0, 0)):
        p = np.array([za, zb, mult, shift, zp], dtype=np.int64)
        y = np.empty(m, dtype=np.int64)
        sat = ctypes.c_uint32(0)
        lib.qmul(ptr(a), ptr(b), ptr(p), ptr(y), ctypes.byref(sat), ctypes.c_long(m))
        v = qmath.qmul(a, za, b, zb, mult, shift, zp)
        assert np.array_equal(y, np.clip(v, -32768, 32767))
        assert sat.value == int(np.count_nonzero((v < -32768) | (v > 32767)))
        for i in range(0, m, 97):
            e = Fraction((int(a[i]) - za) * (int(b[i]) - zb) * mult, 1 << shift)
            r = int(abs(e) + Fraction(1, 2)) * (1 if e >= 0 else -1) + zp
            assert y[i] == min(max(r, -32768), 32767)


def test_requant_wide_is_exact_for_any_accumulator(lib):
    """kml_requant_wide (the first layer's exact path) against its mirror
    and exact rational rounding with Python ints, over every int64 acc
    (S64_MIN included) and multiplier, saturating at 2^63 - 1 where the
    true result is larger; equal to kml_requant where that one applies."""
    rng = np.random.default_rng(1)
    n = 50_000
    shift = rng.integers(0, 63, n).astype(np.uint32)
    mult = rng.integers(1, 2**31, n).astype(np.uint32)
    acc = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64, endpoint=True)
    acc = acc >> rng.integers(0, 63, n)
    acc[:6] = [-2**63, 2**63 - 1, 2**62, -2**62, 0, -1]
    y = np.empty(n, dtype=np.int64)
    lib.requant_wide(ptr(acc), ptr(mult), ptr(shift), ptr(y), ctypes.c_long(n))
    assert np.array_equal(y, qmath.requant(acc, mult, shift))
    sat = 0
    for a, m, s, got in zip(acc.tolist(), mult.tolist(), shift.tolist(), y.tolist()):
        q, r = divmod(abs(a) * m, 1 << s)
        exact = min(q + (1 if s and 2 * r >= (1 << s) else 0), 2**63 - 1)
        sat += exact == 2**63 - 1
        assert got == (-exact if a < 0 else exact), (a, m, s)
    assert sat > 100          # the saturating region was reached
    small = np.abs(acc.astype(object)) * mult.astype(object) < 2**63
    z = np.empty(n, dtype=np.int64)
    lib.requant(ptr(acc), ptr(mult), ptr(shift), ptr(z), ctypes.c_long(n))
    assert np.array_equal(y[small.astype(bool)], z[small.astype(bool)])


def test_round_shift_ties_away_from_zero(lib):
    v = np.array([5, -5, 6, -6, 7, -7, 2**62, -2**62, -(2**63)], dtype=np.int64)
    s = np.array([1, 1, 2, 2, 1, 1, 62, 62, 62], dtype=np.uint32)
    y = np.empty(len(v), dtype=np.int64)
    lib.round_shift(ptr(v), ptr(s), ptr(y), ctypes.c_long(len(v)))
    assert y.tolist() == [3, -3, 2, -2, 4, -4, 1, -1, -2]
    assert np.array_equal(y, [int(qmath.round_shift(a, int(b))) for a, b in zip(v, s)])


@pytest.mark.parametrize("scale", [1e-9, 3.7e-5, 0.5, 1.0, 0.999999, 123.456, 2.0 ** -40])
@pytest.mark.parametrize("max_acc", [1, 2**15, 2**31 - 1, 2**47])
def test_multiplier_is_accurate_and_safe(scale, max_acc):
    mult, shift = qmath.multiplier(scale, max_acc)
    assert 0 <= shift <= 62 and 0 <= mult < 2**31
    assert max_acc * mult < 2**63
    if mult:
        rel = abs(mult / 2.0 ** shift - scale) / scale
        bits = min(31, 63 - max_acc.bit_length())
        assert rel <= 2.0 ** -(bits - 1)


def test_lut_header_is_what_the_generator_writes():
    res = subprocess.run([sys.executable, ROOT / "scripts" / "gen_luts.py", "--check"])
    assert res.returncode == 0, "runtime-kernel/kml_lut.h differs from scripts/gen_luts.py"
