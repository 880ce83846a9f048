/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Integer elementwise helpers for kmlc models
 *
 * Max, min, abs and neg of s32 and s64 values, for the decision ops of
 * both numerics (ONNX Max, Min, Abs, Neg on integer tensors), and the
 * canonical NaN of float outputs.  ONNX leaves abs and neg of the most
 * negative integer open; here, as in onnxruntime and numpy, they wrap
 * around (two's complement): computed in unsigned arithmetic, so there is
 * no signed overflow in C, and converted back, which gcc and clang define
 * as modulo 2^N (so does the kernel, built with -fno-strict-overflow).
 * Integer only: includable from any translation unit.
 */
#ifndef KML_ELEM_H
#define KML_ELEM_H

#include "kml_types.h"

/*
 * Float32 NaNs in canonical form: each NaN among the n float32 values at out
 * becomes the quiet NaN 0x7fc00000.  Which NaN an operation makes is the
 * architecture's choice (an invalid operation gives 0xffc00000 on x86-64,
 * 0x7fc00000 on arm64, and they keep payloads from different operands),
 * and a model's outputs are the same bits on every architecture
 * (docs/numerics.md).  Integer only: the bits are moved, never loaded as
 * floats, so this runs outside the FPU section.
 */
static inline void kml_canon_nan_f32(void *out, unsigned long n)
{
	unsigned char *p = out;
	unsigned long i;
	u32 v;

	for (i = 0; i < n; i++, p += sizeof(v)) {
		__builtin_memcpy(&v, p, sizeof(v));
		if ((v & 0x7fffffffu) > 0x7f800000u) {
			v = 0x7fc00000u;
			__builtin_memcpy(p, &v, sizeof(v));
		}
	}
}

/* A tree node's integer test: kml_tree_testf's modes (no NaN here). */
static inline bool kml_tree_test_s64(s64 x, s64 t, u8 flags)
{
	switch (flags & 7) {
	case 0:
		return x <= t;
	case 1:
		return x < t;
	case 2:
		return x >= t;
	case 3:
		return x > t;
	case 4:
		return x == t;
	default:
		return x != t;
	}
}

static inline s32 kml_max_s32(s32 a, s32 b)
{
	return a >= b ? a : b;
}

static inline s32 kml_min_s32(s32 a, s32 b)
{
	return a <= b ? a : b;
}

static inline s64 kml_max_s64(s64 a, s64 b)
{
	return a >= b ? a : b;
}

static inline s64 kml_min_s64(s64 a, s64 b)
{
	return a <= b ? a : b;
}

static inline s32 kml_neg_s32(s32 a)
{
	return (s32)(0u - (u32)a);
}

static inline s64 kml_neg_s64(s64 a)
{
	return (s64)(0ull - (u64)a);
}

static inline s32 kml_abs_s32(s32 a)
{
	return a < 0 ? kml_neg_s32(a) : a;
}

static inline s64 kml_abs_s64(s64 a)
{
	return a < 0 ? kml_neg_s64(a) : a;
}

#endif /* KML_ELEM_H */
