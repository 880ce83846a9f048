/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Float32 elementwise math for kmlc models
 *
 * This is the one definition of exp, log, sqrt, erf, sigmoid, tanh and the
 * clamping activations used by both the kernel module and the userspace
 * twin.  It uses nothing but float +, -, *, / and comparisons, each in the
 * order written, and integer operations on bit patterns; with
 * -ffp-contract=off and without -ffast-math every conforming compiler
 * evaluates them identically, so the two builds agree bit for bit.
 * No libm, no tables, no state.
 *
 * Error against the exact result, over every finite float32 input whose
 * result is a normal float32 (benchmarks/fmath_error.py measures it
 * exhaustively; tests/unit/test_fmath.py checks it on a sample):
 *   kml_expf     < 1 ulp    (measured 0.990)
 *   kml_sigmoidf < 2.5 ulp  (measured 2.402; absolute error < 9e-8)
 *   kml_tanhf    < 1.5 ulp  (measured 1.330; absolute error < 8e-8)
 *   kml_logf     < 1 ulp    (measured 0.829, at x = 0.699976802)
 *   kml_erff     < 1 ulp    (measured 0.890, at x = 0.836538494; absolute
 *                            error < 6e-8)
 *   kml_sqrtf    correctly rounded: IEEE sqrt's bits on all 2^32 inputs
 * (logf, erff and sqrtf were measured the same way, exhaustively, against
 * libm's log, erf and sqrtf.)
 *
 * Include only from a translation unit built with FPU code generation
 * enabled (the model's *_fp.c file).
 */
#ifndef KML_MATH_H
#define KML_MATH_H

#include "kml_elem.h"
#include "kml_types.h"

union kml_f32 {
	float f;
	u32 u;
};

static inline float kml_f32_from_bits(u32 u)
{
	union kml_f32 v = { .u = u };

	return v.f;
}

/* 2^n for -126 <= n <= 127, built from its bit pattern. */
static inline float kml_pow2f(int n)
{
	return kml_f32_from_bits((u32)(n + 127) << 23);
}

/*
 * expf: Cody-Waite reduction x = n * ln2 + r, |r| <= ln2 / 2, then the
 * degree-6 Cephes polynomial for e^r, then scaling by 2^n in two exact
 * steps so that subnormal results are rounded once.
 */
static inline float kml_expf(float x)
{
	float t, fn, r, z, p;
	int n, n1;

	if (x != x)			/* NaN */
		return x;
	if (x > 88.7228317f)		/* e^x > FLT_MAX */
		return kml_f32_from_bits(0x7f800000);	/* +inf */
	if (x < -103.972084f)		/* e^x < 2^-150 */
		return 0.0f;

	t = x * 1.44269504f;		/* log2(e) */
	n = (int)(t >= 0.0f ? t + 0.5f : t - 0.5f);
	fn = (float)n;
	r = x - fn * 0.693359375f;	/* ln2, high part: exact product */
	r = r - fn * -0.000212194440f;	/* ln2, low part */
	z = r * r;

	p = 0.00019875691500f;
	p = p * r + 0.0013981999507f;
	p = p * r + 0.0083334519073f;
	p = p * r + 0.041665795894f;
	p = p * r + 0.16666665459f;
	p = p * r + 0.50000001201f;
	p = p * z + r + 1.0f;

	n1 = n / 2;			/* n in [-150, 128]: both halves normal */
	return p * kml_pow2f(n1) * kml_pow2f(n - n1);
}

/* sigmoid(x) = 1 / (1 + e^-x), evaluated on the side that cannot overflow. */
static inline float kml_sigmoidf(float x)
{
	float e;

	if (x >= 0.0f) {
		e = kml_expf(-x);
		return 1.0f / (1.0f + e);
	}
	e = kml_expf(x);		/* also taken by NaN, which propagates */
	return e / (1.0f + e);
}

/* tanh: Cephes odd polynomial below 0.625, else 1 - 2 / (e^2|x| + 1). */
static inline float kml_tanhf(float x)
{
	float ax = x < 0.0f ? -x : x;
	float z;

	if (ax < 0.625f) {
		z = x * x;
		z = ((((-0.00570498872745f * z + 0.0206390887954f) * z
		       - 0.0537397155531f) * z + 0.133314422036f) * z
		     - 0.333332819422f) * z * x + x;
		return z;
	}
	z = 1.0f - 2.0f / (kml_expf(ax + ax) + 1.0f);
	return x < 0.0f ? -z : z;
}

/*
 * sqrtf, correctly rounded (to nearest even), in integer arithmetic only:
 * a positive finite x is f * 2^k with f a 24-bit integer (a subnormal is
 * normalized first, so it is exact too).  Scaled by 2^23 or 2^24 to leave
 * an even power of two, f becomes m in [2^46, 2^48), whose integer root q
 * (24 steps of the bit-by-bit method) has 24 bits and remainder
 * r = m - q^2; sqrt(m) rounds up exactly when r > q (a tie would need
 * sqrt(m) = q + 1/2, which no integer has).  Every root is a normal float.
 * Equal to IEEE sqrt on every input but NaN payloads (checked on all 2^32):
 * sqrt(-0) = -0, sqrt(+inf) = +inf, negative x and NaN give a quiet NaN.
 */
static inline float kml_sqrtf(float x)
{
	union kml_f32 v = { .f = x };
	u32 t = (v.u >> 23) & 0xff;	/* biased exponent */
	u32 f = v.u & 0x007fffff;
	u32 q = 0, r = 0;
	u64 m;
	int s;

	if (t == 0xff && f)		/* NaN: quieted */
		return kml_f32_from_bits(v.u | 0x00400000);
	if ((v.u & 0x7fffffff) == 0 || v.u == 0x7f800000)	/* +-0, +inf */
		return x;
	if (v.u & 0x80000000)		/* negative: NaN */
		return kml_f32_from_bits(0x7fc00000);

	/* x = f * 2^(t - 172), bit 23 of f set, t >= 0 */
	if (t) {
		f |= 0x00800000;
		t += 22;
	} else {			/* subnormal: at most 23 shifts */
		t = 23;
		while (!(f & 0x00800000)) {
			f <<= 1;
			t--;
		}
	}
	m = (u64)f << (t & 1 ? 23 : 24);	/* in [2^46, 2^48) */

	for (s = 46; s >= 0; s -= 2) {	/* q = isqrt(m), r = m - q * q */
		r = (r << 2) | (u32)((m >> s) & 3);
		q <<= 1;
		if (r >= 2 * q + 1) {
			r -= 2 * q + 1;
			q |= 1;
		}
	}
	/* q in [2^23, 2^24): a carry out of the fraction bumps the exponent */
	return kml_f32_from_bits((((t + 105) >> 1) - 1) * 0x00800000 + q + (r > q));
}

/*
 * logf: x = 2^e * (1 + f) with 1 + f in [sqrt(1/2), sqrt(2)], split from
 * the bits (a subnormal x is first scaled by 2^25, exactly), then the
 * Cephes polynomial log(1 + f) = f - f^2 / 2 + f^3 * P(f) and
 * e * ln2 added in two parts, the high part's product exact.  Error
 * < 1 ulp (measured 0.829 over every positive float32).
 * log(+-0) = -inf, log(x < 0) = NaN, log(+inf) = +inf, NaN propagates.
 */
static inline float kml_logf(float x)
{
	union kml_f32 v = { .f = x };
	float f, z, y, fe;
	int e = -127;

	if (x != x)			/* NaN */
		return x;
	if (x == 0.0f)
		return kml_f32_from_bits(0xff800000);	/* -inf */
	if (x < 0.0f)
		return kml_f32_from_bits(0x7fc00000);	/* NaN */
	if (v.u == 0x7f800000)		/* +inf */
		return x;
	if (v.u < 0x00800000) {		/* subnormal */
		v.f = x * 33554432.0f;	/* 2^25 */
		e -= 25;
	}
	e += (int)(v.u >> 23);
	v.u = (v.u & 0x007fffff) | 0x3f800000;	/* x = v.f * 2^e, v.f in [1, 2) */
	f = v.f;
	if (f > 1.41421356f) {
		f = f * 0.5f;
		e += 1;
	}
	f = f - 1.0f;			/* exact */
	fe = (float)e;
	z = f * f;

	y = 0.070376836292f;
	y = y * f - 0.11514610310f;
	y = y * f + 0.11676998740f;
	y = y * f - 0.12420140846f;
	y = y * f + 0.14249322787f;
	y = y * f - 0.16668057665f;
	y = y * f + 0.20000714765f;
	y = y * f - 0.24999993993f;
	y = y * f + 0.33333331174f;
	y = y * f * z;

	y = y + fe * -0.000212194440f;	/* ln2, low part */
	y = y - 0.5f * z;
	z = f + y;
	return z + fe * 0.693359375f;	/* ln2, high part: exact product */
}

/*
 * erff, odd, on |x| by the method and float coefficients of FreeBSD's
 * s_erff.c (fdlibm): below 0.84375, x + x * P(x^2) / Q(x^2); below 1.25,
 * erf(1)'s high 16 bits + P(s) / Q(s), s = |x| - 1; below 4,
 * 1 - e^(-z^2 - 9/16) * e^((z - |x|)(z + |x|) + R(s) / S(s)) / |x|,
 * s = 1 / x^2, with z = |x| cut to its high 11 bits, so that z^2 and
 * -z^2 - 9/16 are exact; from 4 on, 1 (erf(4) rounds to 1).  Error
 * < 1 ulp (measured 0.890 over every float32; absolute error < 6e-8).
 * erf(+-0) = +-0, erf(+-inf) = +-1, NaN propagates.
 *
 * The method and coefficients come from s_erff.c, whose notice follows:
 * Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
 * Developed at SunPro, a Sun Microsystems, Inc. business.
 * Permission to use, copy, modify, and distribute this
 * software is freely granted, provided that this notice
 * is preserved.
 */
static inline float kml_erff(float x)
{
	union kml_f32 v = { .f = x };
	u32 ix = v.u & 0x7fffffff;
	float ax, s, z, p, q, r;

	if (x != x)			/* NaN */
		return x;
	if (ix < 0x3f580000) {		/* |x| < 0.84375 */
		if (ix < 0x38800000)	/* |x| < 2^-14: 2 / sqrt(pi) * x */
			return x + 0.128379166f * x;
		z = x * x;
		p = -0.00186261395f;
		p = p * z - 0.336030394f;
		p = p * z + 0.128379166f;
		q = -0.00198859372f;
		q = q * z + 0.0216070414f;
		q = q * z + 0.312324315f;
		q = q * z + 1.0f;
		return x + x * (p / q);
	}
	v.u = ix;
	ax = v.f;
	if (ix < 0x3fa00000) {		/* |x| < 1.25 */
		s = ax - 1.0f;		/* exact */
		p = 0.0867677554f;
		p = p * s - 0.209395722f;
		p = p * s + 0.415109307f;
		p = p * s + 0.00000365041046f;
		q = 0.0392478965f;
		q = q * s + 0.371248513f;
		q = q * s + 0.495560974f;
		q = q * s + 1.0f;
		r = 0.842697144f + p / q;
	} else if (ix < 0x40800000) {	/* |x| < 4 */
		s = 1.0f / (ax * ax);
		if (ix < 0x4036db8c) {	/* |x| < 2.85715 */
			p = -0.691554189f;
			p = p * s - 1.66828310f;
			p = p * s - 0.543658376f;
			p = p * s - 0.00988156721f;
			q = 0.553855181f;
			q = q * s + 4.10799170f;
			q = q * s + 4.48581553f;
			q = q * s + 1.0f;
		} else {
			p = -1.84115684f;
			p = p * s - 0.548049808f;
			p = p * s - 0.00986496918f;
			q = -0.761900663f;
			q = q * s + 3.04982710f;
			q = q * s + 4.87132740f;
			q = q * s + 1.0f;
		}
		v.u = ix & 0xffffe000;
		z = v.f;
		r = kml_expf(-z * z - 0.5625f) * kml_expf((z - ax) * (z + ax) + p / q);
		r = 1.0f - r / ax;
	} else {			/* |x| >= 4, inf */
		r = 1.0f;
	}
	return x < 0.0f ? -r : r;
}

static inline float kml_reluf(float x)
{
	return x < 0.0f ? 0.0f : x;
}

static inline float kml_leaky_reluf(float x, float alpha)
{
	return x < 0.0f ? alpha * x : x;
}

/* ONNX Clip: min(max(x, lo), hi); gives hi when lo > hi; NaN propagates. */
static inline float kml_clipf(float x, float lo, float hi)
{
	x = x < lo ? lo : x;
	return x > hi ? hi : x;
}

/*
 * Four float32 lanes in one SSE register (GNU C vectors).  Every operation
 * below works lane by lane and rounds exactly like the scalar operation it
 * mirrors, in the same order, so lane i of kml_expf_x4(x) has the bits of
 * kml_expf(x[i]), and so on (tests/unit/test_fmath_x4.py checks every
 * function against its scalar twin).  Dense kernels use these to run four
 * outputs side by side: a lane's sum is the scalar loop's sum, bit for bit.
 * Comparisons give a kml_s32x4 mask: all ones where true.
 */
typedef float kml_f32x4 __attribute__((vector_size(4 * sizeof(s32))));
typedef s32 kml_s32x4 __attribute__((vector_size(4 * sizeof(s32))));

static inline kml_f32x4 kml_f32x4_splat(float x)
{
	return (kml_f32x4){ x, x, x, x };
}

/* Loads and stores of four floats at any float-aligned address. */
static inline kml_f32x4 kml_f32x4_load(const float *p)
{
	kml_f32x4 v;

	__builtin_memcpy(&v, p, sizeof(v));
	return v;
}

static inline void kml_f32x4_store(float *p, kml_f32x4 v)
{
	__builtin_memcpy(p, &v, sizeof(v));
}

/* Lanes where mask is all ones take a, the others b (bit for bit). */
static inline kml_f32x4 kml_select_x4(kml_s32x4 mask, kml_f32x4 a, kml_f32x4 b)
{
	return (kml_f32x4)((mask & (kml_s32x4)a) | (~mask & (kml_s32x4)b));
}

static inline kml_f32x4 kml_pow2f_x4(kml_s32x4 n)
{
	return (kml_f32x4)((n + 127) << 23);
}

/*
 * kml_expf on four lanes.  The special lanes (NaN, overflow, underflow)
 * run the polynomial on 0 instead, so no conversion sees an out-of-range
 * value, and take their special result at the end.
 */
static inline kml_f32x4 kml_expf_x4(kml_f32x4 x)
{
	kml_s32x4 nan = x != x, big = x > 88.7228317f, tiny = x < -103.972084f;
	kml_f32x4 zero = kml_f32x4_splat(0.0f);
	kml_f32x4 xs = kml_select_x4(nan | big | tiny, zero, x);
	kml_f32x4 t, fn, r, z, p;
	kml_s32x4 n, n1;

	t = xs * 1.44269504f;
	n = __builtin_convertvector(kml_select_x4(t >= 0.0f, t + 0.5f, t - 0.5f), kml_s32x4);
	fn = __builtin_convertvector(n, kml_f32x4);
	r = xs - fn * 0.693359375f;
	r = r - fn * -0.000212194440f;
	z = r * r;

	p = kml_f32x4_splat(0.00019875691500f);
	p = p * r + 0.0013981999507f;
	p = p * r + 0.0083334519073f;
	p = p * r + 0.041665795894f;
	p = p * r + 0.16666665459f;
	p = p * r + 0.50000001201f;
	p = p * z + r + 1.0f;

	n1 = n / 2;
	p = p * kml_pow2f_x4(n1) * kml_pow2f_x4(n - n1);
	p = kml_select_x4(tiny, zero, p);
	p = kml_select_x4(big, kml_f32x4_splat(kml_f32_from_bits(0x7f800000)), p);
	return kml_select_x4(nan, x, p);
}

static inline kml_f32x4 kml_sigmoidf_x4(kml_f32x4 x)
{
	kml_s32x4 pos = x >= 0.0f;
	kml_f32x4 e = kml_expf_x4(kml_select_x4(pos, -x, x));

	return kml_select_x4(pos, kml_f32x4_splat(1.0f), e) / (1.0f + e);
}

static inline kml_f32x4 kml_tanhf_x4(kml_f32x4 x)
{
	kml_s32x4 neg = x < 0.0f;
	kml_f32x4 ax = kml_select_x4(neg, -x, x);
	kml_f32x4 z = x * x, big;

	z = ((((-0.00570498872745f * z + 0.0206390887954f) * z
	       - 0.0537397155531f) * z + 0.133314422036f) * z
	     - 0.333332819422f) * z * x + x;
	big = 1.0f - 2.0f / (kml_expf_x4(ax + ax) + 1.0f);
	big = kml_select_x4(neg, -big, big);
	return kml_select_x4(ax < 0.625f, z, big);
}

static inline kml_f32x4 kml_reluf_x4(kml_f32x4 x)
{
	return kml_select_x4(x < 0.0f, kml_f32x4_splat(0.0f), x);
}

static inline kml_f32x4 kml_leaky_reluf_x4(kml_f32x4 x, float alpha)
{
	return kml_select_x4(x < 0.0f, alpha * x, x);
}

static inline kml_f32x4 kml_clipf_x4(kml_f32x4 x, float lo, float hi)
{
	x = kml_select_x4(x < lo, kml_f32x4_splat(lo), x);
	return kml_select_x4(x > hi, kml_f32x4_splat(hi), x);
}

/*
 * Decision ops on floats (ONNX Floor, Ceil, Round, Max, Min, Abs, Cast to
 * an integer), exact: bit operations, comparisons and additions of
 * integers below 2^24, so every result is the correctly rounded one.
 */

/* x rounded toward zero, its sign kept (-0.5 gives -0); NaN and inf kept. */
static inline float kml_truncf(float x)
{
	union kml_f32 v = { .f = x };
	u32 e = (v.u >> 23) & 0xff;

	if (e >= 127 + 23)		/* |x| >= 2^23: an integer, inf or NaN */
		return x;
	if (e < 127)			/* |x| < 1: a zero of x's sign */
		v.u &= 0x80000000u;
	else				/* clear the fraction's bits */
		v.u &= ~((1u << (127 + 23 - e)) - 1);
	return v.f;
}

static inline float kml_floorf(float x)
{
	float t = kml_truncf(x);

	return t > x ? t - 1.0f : t;
}

static inline float kml_ceilf(float x)
{
	float t = kml_truncf(x);

	return t < x ? t + 1.0f : t;
}

/* Round half to even (ONNX Round); the sign of a zero result is x's. */
static inline float kml_roundf(float x)
{
	float t = kml_truncf(x);
	float d = x - t;		/* exact: x's fraction, |d| < 1 */
	float step = x < 0.0f ? -1.0f : 1.0f;

	if (d > 0.5f || d < -0.5f)
		return t + step;
	if ((d == 0.5f || d == -0.5f) && ((s32)t & 1))	/* |t| < 2^23 here */
		return t + step;
	return t;
}

/*
 * A tree node's test (kmlc.ops "trees"), its mode in flags & 7: x <= t,
 * x < t, x >= t, x > t, x == t, x != t, as ONNX's BRANCH_LEQ ... BRANCH_NEQ
 * compare them; flags & 8 sends a NaN (a missing value) to the true branch.
 */
static inline bool kml_tree_testf(float x, float t, u8 flags)
{
	bool go;

	switch (flags & 7) {
	case 0:
		go = x <= t;
		break;
	case 1:
		go = x < t;
		break;
	case 2:
		go = x >= t;
		break;
	case 3:
		go = x > t;
		break;
	case 4:
		go = x == t;
		break;
	default:
		go = x != t;
		break;
	}
	return go || ((flags & 8) && x != x);
}

/* A missing value (NaN) at a node whose flags & 8 send it to the true branch */
static inline bool kml_tree_missingf(float x, u8 flags)
{
	return x != x && (flags & 8);
}

/* numpy's maximum and minimum: a NaN in either operand gives NaN. */
static inline float kml_maxf(float a, float b)
{
	return (a >= b || a != a) ? a : b;
}

static inline float kml_minf(float a, float b)
{
	return (a <= b || a != a) ? a : b;
}

static inline float kml_absf(float x)
{
	union kml_f32 v = { .f = x };

	v.u &= 0x7fffffffu;
	return v.f;
}

/*
 * Cast to an integer: truncation toward zero; NaN and values outside the
 * type's range give its minimum, as x86's cvttss2si does (C leaves the
 * conversion undefined there, so it is never reached out of range).
 */
static inline s32 kml_f32_to_s32(float x)
{
	if (x >= -2147483648.0f && x < 2147483648.0f)
		return (s32)x;
	return -2147483647 - 1;
}

static inline s64 kml_f32_to_s64(float x)
{
	if (x >= -9223372036854775808.0f && x < 9223372036854775808.0f)
		return (s64)x;
	return -9223372036854775807LL - 1;
}

#endif /* KML_MATH_H */
