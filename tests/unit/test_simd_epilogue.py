"""The vector epilogues of runtime-kernel/kml_simd.h, called directly on
hostile operands, against requantization written out in Python integers
(round(|a| * mult / 2^shift), ties away from zero, then the zero point,
the counts and the clamp): every shift 0..62, sums of every magnitude the
proof allows, results either side of the 2^20 limit the vector code puts
on magnitudes, ReLU and plain layers, clamps at the int16 ends and inside.
The model tests (tests/e2e/test_simd_paths.py) compare whole paths with
each other; this one reaches operands no calibrated model produces."""
import ctypes
import subprocess

import numpy as np
import pytest

from kmlc.runtime_kernel import DIR as RUNTIME

HARNESS = r"""
#include "kml_simd.h"

/* n groups of 8 outputs; p: relu, zp, lo, hi, count_lo, count_hi */
KML_TARGET_SSE2 void rq_sse2(const s32 *acc, const s32 *b, const u32 *rq, s16 *y, const s32 *p, s32 *sat, long n)
{
	long g;
	int h, i;

	for (g = 0; g < n; g++) {
		kml_s32x4 c = { 0 };

		for (h = 0; h < 2; h++) {
			kml_u32x4 a;

			__builtin_memcpy(&a, acc + 8 * g + 4 * h, sizeof(a));
			kml_requant4_sse2(a, b + 8 * g + 4 * h, rq + 8 * g + 4 * h, y + 8 * g + 4 * h,
					  p[0], p[1], p[2], p[3], p[4], p[5], &c);
		}
		for (i = 0; i < 4; i++)
			sat[g] += c[i];
	}
}

KML_TARGET_AVX2 void rq_avx2(const s32 *acc, const s32 *b, const u32 *rq, s16 *y, const s32 *p, s32 *sat, long n)
{
	long g;

	for (g = 0; g < n; g++) {
		kml_s32x8 c = { 0 };
		kml_u32x8 a;

		__builtin_memcpy(&a, acc + 8 * g, sizeof(a));
		kml_requant8_avx2(a, b + 8 * g, rq + 8 * g, y + 8 * g, p[0], p[1], p[2], p[3], p[4],
				  p[5], &c);
		sat[g] = kml_sat_total_avx2(c);
	}
}

KML_TARGET_AVX2 void rq_s64_avx2(const s64 *acc, const s64 *b, const u32 *rq, s16 *y,
				 const s32 *p, s32 *sat, long n)
{
	long g;
	int h;

	for (g = 0; g < n; g++) {
		kml_s64x4 c = { 0 };

		for (h = 0; h < 2; h++) {
			kml_s64x4 a;

			__builtin_memcpy(&a, acc + 8 * g + 4 * h, sizeof(a));
			kml_requant4_s64_avx2(&a, b + 8 * g + 4 * h, rq + 8 * g + 4 * h,
					      y + 8 * g + 4 * h, p[0], p[1], p[2], p[3], p[4], p[5], &c);
		}
		sat[g] = kml_sat_total64_avx2(c);
	}
}

KML_TARGET_SSE2 void centre_sse2(const s32 *x, const s32 *c, const u8 *s, s32 *y, long n)
{
	long i;

	for (i = 0; i < n; i += 4)
		kml_centre4_sse2(x + i, c + i, s + i, y + i);
}

KML_TARGET_AVX2 void centre_avx2(const s32 *x, const s32 *c, const u8 *s, s32 *y, long n)
{
	long i;

	for (i = 0; i < n; i += 4)
		kml_centre4_avx2(x + i, c + i, s + i, y + i);
}
"""

AVX2 = "avx2" in open("/proc/cpuinfo").read()


@pytest.fixture(scope="module", params=["gcc -O2", "clang -O2", "gcc -O0"])
def lib(request, tmp_path_factory):
    cc, opt = request.param.split()
    d = tmp_path_factory.mktemp("simd_epilogue")
    (d / "h.c").write_text(HARNESS)
    subprocess.run([cc, opt, "-fPIC", "-shared", "-Wall", "-Werror", f"-I{RUNTIME}",
                    "-o", d / "h.so", d / "h.c"], check=True)
    return ctypes.CDLL(str(d / "h.so"))


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def oracle(a, mult, shift, relu, zp, lo, hi, count_lo, count_hi):
    """One output, in Python integers: the scalar code's definition."""
    m = max(a, 0) if relu else abs(a)
    q, r = divmod(m * mult, 1 << shift)
    m = q + (1 if shift and 2 * r >= (1 << shift) else 0)
    v = (m if relu or a >= 0 else -m) + zp
    sat = (count_hi and v > 32767) + (count_lo and v < -32768)
    return min(max(v, lo), hi), sat


def operands(n, wide, seed):
    """n groups of 8 outputs: sums, biases and requantization words whose
    products stay within the proof's bound (|a| * mult < 2^63, and |a| <
    2^31 for int32 sums), with results spread over every magnitude."""
    r = np.random.default_rng(seed)
    shift = r.integers(0, 63, 8 * n)
    shift[:8] = [0, 1, 2, 20, 31, 32, 61, 62]
    mult = r.integers(1, 2**26, 8 * n)
    mult[::7] = 2**26 - 1
    # the result's magnitude 2^e: e from -4 to 40, so some land far past 2^20
    e = r.uniform(-4, 40, 8 * n)
    target = np.exp2(e + shift) / mult
    cap = 2**31 - 1 if not wide else np.minimum(2**62, (2**63 - 1) // mult)
    total = np.minimum(target, cap).astype(np.int64) * r.choice([-1, 1], 8 * n)
    total[8:16] = [0, 1, -1, 2**31 - 1 if not wide else 2**36, -(2**31) + 1, 3, -3, 7]
    # results at the limit's edges: 2^20 - 1, 2^20, 2^20 + 1, 2^32, 2^52
    # (bits 20..51 clear), -2^52, 2^51 rounded, and the largest product
    edge = [(2**20 - 1, 1, 0), (2**20, 1, 0), (2**20 + 1, 1, 0), (2**7, 2**25, 0),
            (2**27, 2**25, 0), (-(2**27), 2**25, 0), (2**27 + 1, 2**25, 1),
            (2**31 - 1, 2**26 - 1, 0)]
    for i, (t, m, sh) in enumerate(edge):
        total[16 + i], mult[16 + i], shift[16 + i] = t, m, sh
    if wide:
        b = r.integers(-2**40, 2**40, 8 * n)
        acc = total - b
    else:       # int32 lanes that add, modulo 2^32, to the proven int32 total
        b = r.integers(-2**31, 2**31, 8 * n)
        acc = (total - b + 2**31) % 2**32 - 2**31
    rq = (mult.astype(np.uint64) << 6 | shift.astype(np.uint64)).astype(np.uint32)
    return acc, b, rq, mult, shift, [int(v) for v in total]


PARAMS = [  # relu, zp, lo, hi, count_lo, count_hi
    (1, -32768, -32768, 32767, 0, 1),     # a ReLU at the bottom of int16
    (1, -100, -100, 32767, 0, 1),         # a ReLU whose floor is its zero point
    (1, 5, -32768, 32767, 0, 1),          # a ReLU above its floor
    (1, 5, 300, 32767, 0, 1),             # a ReLU below its floor (the lower clamp stays)
    (0, 0, -32768, 32767, 1, 1),          # no activation: both ends counted
    (0, 1234, -20000, 25000, 1, 1),       # a Clip inside int16
    (0, -32768, -32768, -32768, 1, 0),    # a one-value range
]


@pytest.mark.parametrize("path", ["sse2", "avx2", "s64_avx2"])
@pytest.mark.parametrize("params", PARAMS, ids=lambda p: "relu" if p[0] else "plain")
def test_epilogue_is_requantization_in_integers(lib, path, params):
    if "avx2" in path and not AVX2:
        pytest.skip("this CPU has no AVX2")
    wide = path == "s64_avx2"
    n = 500
    acc, b, rq, mult, shift, total = operands(n, wide, seed=PARAMS.index(params))
    t = np.int64 if wide else np.int32
    acc, b = acc.astype(t), b.astype(t)
    y = np.zeros(8 * n, np.int16)
    sat = np.zeros(n, np.int32)
    p = np.array(params, np.int32)
    getattr(lib, f"rq_{path}")(ptr(acc), ptr(b), ptr(rq), ptr(y), ptr(p), ptr(sat),
                               ctypes.c_long(n))
    want = [oracle(int(a), int(m), int(s), *params) for a, m, s in zip(total, mult, shift)]
    got = y.astype(int).tolist()
    bad = [i for i, (w, g) in enumerate(zip(want, got)) if w[0] != g]
    assert not bad, [(total[i], int(mult[i]), int(shift[i]), want[i][0], got[i]) for i in bad[:5]]
    counts = np.array([w[1] for w in want]).reshape(n, 8).sum(1)
    assert np.array_equal(sat, counts)
    # the operands reach what they are meant to: both sides of the limit
    mag = np.array([abs(w[0] - params[1]) for w in want])
    big = [abs(a) * int(m) >> int(s) > 2**20 for a, m, s in zip(total, mult, shift)]
    assert 0.2 < np.mean(big) < 0.8 and (mag < 2**15).any()


@pytest.mark.parametrize("path", ["sse2", "avx2"])
def test_input_encoding_is_round_shift_in_integers(lib, path):
    """kml_centre4_*: round((x - c) / 2^s), ties away from zero, the low 32
    bits, for any s32 x and c (the difference needs 33 bits) and every
    shift 0..62; ties, zero and the int32 ends included."""
    if path == "avx2" and not AVX2:
        pytest.skip("this CPU has no AVX2")
    r = np.random.default_rng(5)
    n = 40_000
    x = r.integers(-2**31, 2**31, n) >> r.integers(0, 32, n)
    c = r.integers(-2**31, 2**31, n) >> r.integers(0, 32, n)
    s = r.integers(0, 63, n)
    x[:8] = [2**31 - 1, -2**31, 0, 5, -5, 6, -6, 3]
    c[:8] = [-2**31, 2**31 - 1, 0, 0, 0, 0, 0, 0]
    s[:8] = [0, 1, 5, 1, 1, 2, 2, 1]         # 5/2, -5/2, 6/4, -6/4, 3/2: ties
    x, c, s = x.astype(np.int32), c.astype(np.int32), s.astype(np.uint8)
    y = np.empty(n, np.int32)
    getattr(lib, f"centre_{path}")(ptr(x), ptr(c), ptr(s), ptr(y), ctypes.c_long(n))
    want = []
    for xi, ci, si in zip(x.tolist(), c.tolist(), s.tolist()):
        v = xi - ci
        q, rem = divmod(abs(v), 1 << si)
        m = q + (1 if si and 2 * rem >= (1 << si) else 0)
        want.append(((m if v >= 0 else -m) + 2**31) % 2**32 - 2**31)
    assert y.tolist() == want
    assert want[3:8] == [3, -3, 2, -2, 2]      # the ties, away from zero
