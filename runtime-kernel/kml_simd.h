/* SPDX-License-Identifier: GPL-2.0 */
/*
 * SIMD paths of kmlc's fixed-point models
 *
 * A fixed-point model whose dense layers sum in int32 (passes/lower.py,
 * "paired layers") has up to three paths that compute the same integers:
 *
 *   scalar  general-purpose registers only; any context, NMI included
 *   sse2    pmaddwd on 128-bit vectors, every x86-64 CPU
 *   avx2    vpmaddwd on 256-bit vectors, where the CPU has AVX2
 *
 * pmaddwd multiplies eight (sixteen) int16 pairs and adds each two adjacent
 * products into an int32 lane; the lanes then add with wrap-around.  Every
 * step is exact modulo 2^32 (pmaddwd's one wrapping case, four times
 * -32768, is also exact modulo 2^32), and the overflow proof bounds each
 * final sum by 2^31, so the sum modulo 2^32 is the sum: the same integer
 * as the scalar path's, bit for bit, in any order.  Layers whose sums need
 * int64 add each pmaddwd's pair sums (exact in int32) to int64 lanes.
 * Requantization into int16 (ReLU, Clip, a plain clamp) and the input
 * encoding run in vectors too, each the integer arithmetic of kml_fixed.h
 * lane by lane; other activations (tables, leaky ReLU) stay scalar.
 *
 * The SIMD functions are compiled for their instruction set with a target
 * attribute, in the same translation unit as the scalar code, and run
 * only between kml_simd_begin() and kml_simd_end() (kernel_fpu_begin/end),
 * in a context where kml_simd_usable() holds.  The CPU's paths are known
 * once (static_cpu_has(), patched at module load; cpuid and xgetbv in the
 * userspace twin).
 */
#ifndef KML_SIMD_H
#define KML_SIMD_H

#include "kml_types.h"
#include "kml_fixed.h"

/*
 * The smallest model (multiply-adds on the SIMD paths) for which a SIMD
 * path pays for its FPU section: docs/performance.md derives it from the
 * measured costs.  A module parameter (simd_min_macs) overrides it.
 */
#define KML_SIMD_MIN_MACS 512

enum kml_path {
	KML_PATH_SCALAR,
	KML_PATH_SSE2,
	KML_PATH_AVX2,
	KML_NR_PATHS
};

/* Compiled where x86-64 vectors exist: not in UML, not on other arches. */
#if defined(__x86_64__) && !(defined(__KERNEL__) && defined(CONFIG_UML))
#define KML_SIMD_X86 1
#endif

#ifdef KML_SIMD_X86

#define KML_TARGET_SSE2 __attribute__((target("sse2")))
#define KML_TARGET_AVX2 __attribute__((target("avx2")))

typedef s8 kml_s8x16 __attribute__((vector_size(16)));
typedef u8 kml_u8x16 __attribute__((vector_size(16)));
typedef s16 kml_s16x8 __attribute__((vector_size(16)));
typedef s16 kml_s16x16 __attribute__((vector_size(32)));
typedef s32 kml_s32x4 __attribute__((vector_size(16)));
typedef s32 kml_s32x8 __attribute__((vector_size(32)));
typedef u32 kml_u32x4 __attribute__((vector_size(16)));
typedef u32 kml_u32x8 __attribute__((vector_size(32)));
typedef u64 kml_u64x2 __attribute__((vector_size(16)));
typedef s64 kml_s64x2 __attribute__((vector_size(16)));
typedef u64 kml_u64x4 __attribute__((vector_size(32)));
typedef s64 kml_s64x4 __attribute__((vector_size(32)));
typedef s16 kml_s16x4 __attribute__((vector_size(8)));

/*
 * Inputs 2k and 2k + 1 as one 32-bit word of two int16 (the first in the
 * low half), the operand pmaddwd pairs with the weights of every output.
 * The caller guarantees that both lie in int16.
 */
static inline u32 kml_pair16(s32 lo, s32 hi)
{
	return (u32)(u16)lo | (u32)(u16)hi << 16;
}

/* The same word read from two adjacent int16 inputs: one 32-bit load (x86 is little-endian). */
static inline u32 kml_pair16_at(const s16 *x)
{
	u32 xx;

	__builtin_memcpy(&xx, x, sizeof(xx));
	return xx;
}

/*
 * Eight bytes into the low half of a vector, the high half zero: one movq
 * (an 8-byte store over a zeroed vector on the stack, read back whole,
 * would stall store forwarding).
 */
static inline KML_TARGET_SSE2 kml_s8x16 kml_load8_sse2(const s8 *w)
{
	kml_u64x2 v;
	u64 q;

	__builtin_memcpy(&q, w, sizeof(q));
	v = (kml_u64x2){ q, 0 };
	return (kml_s8x16)v;
}

/*
 * int8 to int16 on SSE2, which has no pmovsxbw: each byte doubled into a
 * word (punpcklbw/punpckhbw of a vector with itself: b | b << 8), then
 * psraw 8 leaves b sign-extended, two instructions per eight weights
 * where __builtin_convertvector takes six.
 */
static inline KML_TARGET_SSE2 kml_s16x8 kml_sext_hi_bytes_sse2(kml_s8x16 doubled)
{
	return __builtin_ia32_psrawi128((kml_s16x8)doubled, 8);
}

/* Bytes 0..7 of v sign-extended to int16 (punpcklbw, psraw). */
static inline KML_TARGET_SSE2 kml_s16x8 kml_sext_lo8_sse2(kml_s8x16 v)
{
	return kml_sext_hi_bytes_sse2(__builtin_shufflevector(v, v, 0, 0, 1, 1, 2, 2, 3, 3,
							      4, 4, 5, 5, 6, 6, 7, 7));
}

/*
 * One step of a tile of eight outputs over one input pair: acc[i] +=
 * w[i][0] * x_lo + w[i][1] * x_hi, modulo 2^32, for outputs i = 0..7 of the
 * tile; w holds the pair's 16 weights, [output][input].  Eight outputs are
 * two SSE2 vectors (outputs 0..3, 4..7) or one AVX2 vector.
 */
static inline KML_TARGET_SSE2 void kml_tile8_s8_sse2(kml_u32x4 *acc, const s8 *w, u32 xx)
{
	kml_s16x8 x = (kml_s16x8)(kml_u32x4){ xx, xx, xx, xx };
	kml_s8x16 v;
	kml_s16x8 lo, hi;

	__builtin_memcpy(&v, w, sizeof(v));
	lo = kml_sext_lo8_sse2(v);
	hi = kml_sext_hi_bytes_sse2(__builtin_shufflevector(v, v, 8, 8, 9, 9, 10, 10, 11, 11,
							    12, 12, 13, 13, 14, 14, 15, 15));
	acc[0] += (kml_u32x4)__builtin_ia32_pmaddwd128(lo, x);
	acc[1] += (kml_u32x4)__builtin_ia32_pmaddwd128(hi, x);
}

static inline KML_TARGET_SSE2 void kml_tile8_s16_sse2(kml_u32x4 *acc, const s16 *w, u32 xx)
{
	kml_s16x8 x = (kml_s16x8)(kml_u32x4){ xx, xx, xx, xx };
	kml_s16x8 lo, hi;

	__builtin_memcpy(&lo, w, sizeof(lo));
	__builtin_memcpy(&hi, w + 8, sizeof(hi));
	acc[0] += (kml_u32x4)__builtin_ia32_pmaddwd128(lo, x);
	acc[1] += (kml_u32x4)__builtin_ia32_pmaddwd128(hi, x);
}

/*
 * The same step over a tile stored by offset pairs (kml_fixed.h,
 * kml_w8_lane): u8 weights w + 128, zero-extended to int16 (punpcklbw and
 * punpckhbw with a zero vector: one instruction per eight weights), so
 * that the sums gain 128 times the inputs' sum, which the kernel takes
 * off before its epilogue.  Each pmaddwd pair sum is exact: |(w + 128) *
 * x| <= 255 * 32768, two of them below 2^31.
 */
static inline KML_TARGET_SSE2 void kml_tile8_u8_sse2(kml_u32x4 *acc, const u8 *w, u32 xx)
{
	kml_s16x8 x = (kml_s16x8)(kml_u32x4){ xx, xx, xx, xx };
	kml_u8x16 v, z = { 0 };
	kml_s16x8 lo, hi;

	__builtin_memcpy(&v, w, sizeof(v));
	lo = (kml_s16x8)__builtin_shufflevector(v, z, 0, 16, 1, 17, 2, 18, 3, 19,
						4, 20, 5, 21, 6, 22, 7, 23);
	hi = (kml_s16x8)__builtin_shufflevector(v, z, 8, 24, 9, 25, 10, 26, 11, 27,
						12, 28, 13, 29, 14, 30, 15, 31);
	acc[0] += (kml_u32x4)__builtin_ia32_pmaddwd128(lo, x);
	acc[1] += (kml_u32x4)__builtin_ia32_pmaddwd128(hi, x);
}

/*
 * The sum of n int16 inputs, the offset pairs' correction (times 128), by
 * pmaddwd against ones, in int32 lanes modulo 2^32: exact, as the layers
 * that take offset pairs have 255 * n * max|x| < 2^31.  The AVX2 path
 * calls it too: 16-byte loads, as wide as the stores that wrote x, forward
 * from them where 32-byte ones measured slower.
 */
static inline KML_TARGET_SSE2 s64 kml_sum16_sse2(const s16 *x, unsigned int n)
{
	kml_s16x8 ones = { 1, 1, 1, 1, 1, 1, 1, 1 }, v;
	kml_u32x4 acc = { 0 };
	unsigned int k;
	s64 c = 0;

	for (k = 0; k + 8 <= n; k += 8) {
		__builtin_memcpy(&v, x + k, sizeof(v));
		acc += (kml_u32x4)__builtin_ia32_pmaddwd128(v, ones);
	}
	for (; k < n; k++)
		c += x[k];
	return c + kml_s32_of(acc[0] + acc[1] + acc[2] + acc[3]);
}

/* A tile's eight sums, as the signed int32 they are (exact: see above). */
static inline KML_TARGET_SSE2 void kml_sums8_sse2(const kml_u32x4 *acc, s64 *a)
{
	int i;

	for (i = 0; i < 4; i++) {
		a[i] = kml_s32_of(acc[0][i]);
		a[i + 4] = kml_s32_of(acc[1][i]);
	}
}

/*
 * 16 int8 weights sign-extended to int16 in one vpmovsxbw (gcc would split
 * __builtin_convertvector into two 128-bit halves and an insert).
 */
static inline KML_TARGET_AVX2 kml_s16x16 kml_widen16_avx2(const s8 *w)
{
	kml_s8x16 v;

	__builtin_memcpy(&v, w, sizeof(v));
#ifdef __clang__
	return __builtin_convertvector(v, kml_s16x16);
#else
	/* gcc's v16qi: plain char */
	return (kml_s16x16)__builtin_ia32_pmovsxbw256((char __attribute__((vector_size(16))))v);
#endif
}

/*
 * acc += the pair products of 16 weights (two per lane: [lane][2]) and the
 * int16 pairs x, lane by lane, modulo 2^32: one vpmaddwd.
 */
static inline KML_TARGET_AVX2 void kml_dot8_s8_avx2(kml_u32x8 *acc, const s8 *w, kml_u32x8 x)
{
	*acc += (kml_u32x8)__builtin_ia32_pmaddwd256(kml_widen16_avx2(w), (kml_s16x16)x);
}

static inline KML_TARGET_AVX2 void kml_dot8_s16_avx2(kml_u32x8 *acc, const s16 *w, kml_u32x8 x)
{
	kml_s16x16 v;

	__builtin_memcpy(&v, w, sizeof(v));
	*acc += (kml_u32x8)__builtin_ia32_pmaddwd256(v, (kml_s16x16)x);
}

/* 16 bytes w + 128 of an offset-pairs tile zero-extended to int16: one vpmovzxbw. */
static inline KML_TARGET_AVX2 kml_s16x16 kml_widen16_u8_avx2(const u8 *w)
{
	kml_u8x16 v;

	__builtin_memcpy(&v, w, sizeof(v));
#ifdef __clang__
	return __builtin_convertvector(v, kml_s16x16);
#else
	return (kml_s16x16)__builtin_ia32_pmovzxbw256((char __attribute__((vector_size(16))))v);
#endif
}

static inline KML_TARGET_AVX2 void kml_tile8_u8_avx2(kml_u32x8 *acc, const u8 *w, u32 xx)
{
	kml_u32x8 x = { xx, xx, xx, xx, xx, xx, xx, xx };

	*acc += (kml_u32x8)__builtin_ia32_pmaddwd256(kml_widen16_u8_avx2(w), (kml_s16x16)x);
}

static inline KML_TARGET_AVX2 void kml_tile8_s8_avx2(kml_u32x8 *acc, const s8 *w, u32 xx)
{
	kml_dot8_s8_avx2(acc, w, (kml_u32x8){ xx, xx, xx, xx, xx, xx, xx, xx });
}

static inline KML_TARGET_AVX2 void kml_tile8_s16_avx2(kml_u32x8 *acc, const s16 *w, u32 xx)
{
	kml_dot8_s16_avx2(acc, w, (kml_u32x8){ xx, xx, xx, xx, xx, xx, xx, xx });
}

static inline KML_TARGET_AVX2 void kml_sums8_avx2(const kml_u32x8 *acc, s64 *a)
{
	int i;

	for (i = 0; i < 8; i++)
		a[i] = kml_s32_of((*acc)[i]);
}

/*
 * Layers narrower than a tile (passes/lower.py, narrow_plan): one vector of
 * weights spans several input pairs, [pair][output][2], and each lane takes
 * its own pair's inputs, placed by KML_PICK() from the step's P input
 * pairs, loaded at once by kml_xpairs<P>: lane i of the result is lane
 * idx[i] of v (a constant shuffle: the indices must be literals).
 */
#define KML_PICK(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)

static inline KML_TARGET_SSE2 kml_u32x4 kml_xpairs1_sse2(const s16 *x)
{
	u32 xx = kml_pair16_at(x);

	return (kml_u32x4){ xx, xx, xx, xx };
}

static inline KML_TARGET_SSE2 kml_u32x4 kml_xpairs2_sse2(const s16 *x)
{
	return (kml_u32x4)kml_load8_sse2((const s8 *)x);	/* pairs 2, 3: zero */
}

static inline KML_TARGET_SSE2 kml_u32x4 kml_xpairs4_sse2(const s16 *x)
{
	kml_u32x4 v;

	__builtin_memcpy(&v, x, sizeof(v));
	return v;
}

static inline KML_TARGET_AVX2 kml_u32x8 kml_xpairs8_avx2(const s16 *x)
{
	kml_u32x8 v;

	__builtin_memcpy(&v, x, sizeof(v));
	return v;
}

/* The SSE2 step: 8 weights, four lanes of pairs. */
static inline KML_TARGET_SSE2 void kml_dot4_s8_sse2(kml_u32x4 *acc, const s8 *w, kml_u32x4 x)
{
	kml_s16x8 v = kml_sext_lo8_sse2(kml_load8_sse2(w));

	*acc += (kml_u32x4)__builtin_ia32_pmaddwd128(v, (kml_s16x8)x);
}

/*
 * An odd K's last input x, alone: acc[i] += w[i] * x for the tile's eight
 * outputs (w: the input's row, one weight per output), modulo 2^32.
 */
static inline KML_TARGET_SSE2 void kml_last8_s8_sse2(kml_u32x4 *acc, const s8 *w, s32 x)
{
	kml_s16x8 v = kml_sext_lo8_sse2(kml_load8_sse2(w));
	kml_s16x8 xs = (kml_s16x8)(kml_u32x4){ (u16)x, (u16)x, (u16)x, (u16)x };

	/*
	 * (w_i, w_i) pairs against (x, 0): w_i * x per lane; the pairs made
	 * from words (punpcklwd, punpckhwd): a byte shuffle to the same end is
	 * taken apart byte by byte in general-purpose registers.
	 */
	acc[0] += (kml_u32x4)__builtin_ia32_pmaddwd128(__builtin_shufflevector(v, v, 0, 0, 1, 1,
										2, 2, 3, 3), xs);
	acc[1] += (kml_u32x4)__builtin_ia32_pmaddwd128(__builtin_shufflevector(v, v, 4, 4, 5, 5,
										6, 6, 7, 7), xs);
}

static inline KML_TARGET_SSE2 void kml_last8_s16_sse2(kml_u32x4 *acc, const s16 *w, s32 x)
{
	kml_s16x8 xs = (kml_s16x8)(kml_u32x4){ (u16)x, (u16)x, (u16)x, (u16)x };
	kml_s16x8 lo, hi, wv;

	__builtin_memcpy(&wv, w, sizeof(wv));
	lo = __builtin_shufflevector(wv, wv, 0, 0, 1, 1, 2, 2, 3, 3);
	hi = __builtin_shufflevector(wv, wv, 4, 4, 5, 5, 6, 6, 7, 7);
	acc[0] += (kml_u32x4)__builtin_ia32_pmaddwd128(lo, xs);
	acc[1] += (kml_u32x4)__builtin_ia32_pmaddwd128(hi, xs);
}

/*
 * Eight weights sign-extended to int32 in one vpmovsxbd/vpmovsxwd (gcc
 * takes __builtin_convertvector to int32 apart, element by element).
 */
static inline KML_TARGET_AVX2 kml_s32x8 kml_widen8_s8_avx2(const s8 *w)
{
	kml_s8x16 v = kml_load8_sse2(w);

#ifdef __clang__
	return __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
				       kml_s32x8);
#else
	return (kml_s32x8)__builtin_ia32_pmovsxbd256((char __attribute__((vector_size(16))))v);
#endif
}

static inline KML_TARGET_AVX2 kml_s32x8 kml_widen8_s16_avx2(const s16 *w)
{
	kml_s16x8 v;

	__builtin_memcpy(&v, w, sizeof(v));
#ifdef __clang__
	return __builtin_convertvector(v, kml_s32x8);
#else
	return (kml_s32x8)__builtin_ia32_pmovsxwd256(v);
#endif
}

/* Four s32 sign-extended to s64 in one vpmovsxdq. */
static inline KML_TARGET_AVX2 kml_s64x4 kml_widen4_s32_avx2(kml_s32x4 v)
{
#ifdef __clang__
	return __builtin_convertvector(v, kml_s64x4);
#else
	return __builtin_ia32_pmovsxdq256(v);
#endif
}

/* |w * x| < 2^30: int16 weights and inputs (the SIMD paths' contract) */
static inline KML_TARGET_AVX2 void kml_last8_s8_avx2(kml_u32x8 *acc, const s8 *w, s32 x)
{
	*acc += (kml_u32x8)(kml_widen8_s8_avx2(w) * x);
}

static inline KML_TARGET_AVX2 void kml_last8_s16_avx2(kml_u32x8 *acc, const s16 *w, s32 x)
{
	*acc += (kml_u32x8)(kml_widen8_s16_avx2(w) * x);
}

/*
 * Layers whose sums the proof puts in int64: each step's int32 pair sums
 * (exact, see above), sign-extended and added to int64 lanes, outputs in
 * order (SSE2: four vectors of two per tile; AVX2: two of four).
 */

static inline KML_TARGET_SSE2 void kml_widen_add_sse2(kml_s64x2 *acc, const kml_u32x4 *s)
{
	kml_s32x4 v = (kml_s32x4)*s;

	acc[0] += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1), kml_s64x2);
	acc[1] += __builtin_convertvector(__builtin_shufflevector(v, v, 2, 3), kml_s64x2);
}

static inline KML_TARGET_AVX2 void kml_widen_add_avx2(kml_s64x4 *acc, const kml_u32x8 *s)
{
	kml_s32x8 v = (kml_s32x8)*s;
	kml_s32x4 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3);
	kml_s32x4 hi = __builtin_shufflevector(v, v, 4, 5, 6, 7);

#ifdef __clang__
	acc[0] += __builtin_convertvector(lo, kml_s64x4);
	acc[1] += __builtin_convertvector(hi, kml_s64x4);
#else
	/* one vpmovsxdq each (gcc would split the conversion in halves) */
	acc[0] += (kml_s64x4)__builtin_ia32_pmovsxdq256(lo);
	acc[1] += (kml_s64x4)__builtin_ia32_pmovsxdq256(hi);
#endif
}

/* A tile's eight int64 sums, in order. */
static inline void kml_sums8_s64(const void *acc, s64 *a)
{
	__builtin_memcpy(a, acc, 8 * sizeof(*a));
}

/*
 * The epilogue of four (SSE2) or eight (AVX2) outputs whose layer clamps:
 * kml_fixed.h's kml_requant (or, for a ReLU, kml_requant_relu) of the sum
 * a[i] + b[i] by the requantization word rq[i], plus the zero point zp,
 * clamped to [lo, hi], stored as int16; each lane of *sat counts the
 * values that left the int16 encoding, above 32767 where count_hi and
 * below -32768 where count_lo (kml_count16 and friends): kml_sat_total()
 * adds the lanes up once per layer.  The same integers as the
 * scalar code: the magnitude times the multiplier in 64 bits (pmuludq, on
 * even and odd lanes), the rounding constant and the per-lane shift in
 * 64 bits, the result limited to 2^20 (which changes neither the clamp nor
 * the counts: |zp| <= 32768), then the sign back, in 32-bit lanes.
 */

#define KML_RQ_LIMIT 0x100000	/* 2^20 */

/*
 * v >> c, lane by lane (c < 64): psrlq shifts both lanes by one count, the
 * low 64 bits of its operand, so one psrlq per lane's count and a lane of
 * each result.  (A vector shift by a vector, written in C, is shifted lane
 * by lane in general-purpose registers on SSE2: gcc and clang alike.)
 */
static inline KML_TARGET_SSE2 kml_u64x2 kml_srl64_sse2(kml_u64x2 v, kml_u64x2 c)
{
	kml_s64x2 lo = __builtin_ia32_psrlq128((kml_s64x2)v, (kml_s64x2)c);
	kml_s64x2 hi = __builtin_ia32_psrlq128((kml_s64x2)v,
					      (kml_s64x2)__builtin_shufflevector(c, c, 1, 1));

	return (kml_u64x2)__builtin_shufflevector(lo, hi, 0, 3);
}

/*
 * round(m / 2^s) with ties up, lane by lane, for m < 2^63 and s <= 62:
 * ((2m >> s) + 1) >> 1, as floor((floor(2m / 2^s) + 1) / 2) = floor((m +
 * 2^(s - 1)) / 2^s), and m itself where s = 0: a right shift by a vector
 * only (SSE2 has no vector left shift by a vector either).
 */
static inline KML_TARGET_SSE2 kml_u64x2 kml_round_shr_sse2(kml_u64x2 m, kml_u64x2 s)
{
	kml_u64x2 one = { 1, 1 };

	return (kml_srl64_sse2(m + m, s) + one) >> 1;
}

/*
 * The low 32 bits of each lane of p (outputs 0 and 2) and q (1 and 3), in
 * output order.
 */
static inline KML_TARGET_SSE2 kml_u32x4 kml_low32_sse2(kml_u64x2 p, kml_u64x2 q)
{
	return __builtin_shufflevector((kml_u32x4)p, (kml_u32x4)q, 0, 4, 2, 6);
}

/*
 * The magnitudes m[i] requantized by the words w[i], limited to 2^20: each
 * product p < 2^58 rounded by kml_round_shr_sse2.  A result r < 2^58
 * reaches 2^20 exactly where r >> 20, folded into its low 32 bits as
 * (r >> 20) | (r >> 52), is not zero.
 */
static inline KML_TARGET_SSE2 kml_u32x4 kml_rq_mag4_sse2(kml_u32x4 m, kml_u32x4 w)
{
	kml_u32x4 mult = w >> 6, r, small;
	kml_u32x4 limit = { KML_RQ_LIMIT, KML_RQ_LIMIT, KML_RQ_LIMIT, KML_RQ_LIMIT };
	kml_u64x2 p, q;

	p = (kml_u64x2)__builtin_ia32_pmuludq128((kml_s32x4)m, (kml_s32x4)mult);
	q = (kml_u64x2)__builtin_ia32_pmuludq128((kml_s32x4)((kml_u64x2)m >> 32),
						 (kml_s32x4)((kml_u64x2)mult >> 32));
	p = kml_round_shr_sse2(p, (kml_u64x2)w & 63);
	q = kml_round_shr_sse2(q, ((kml_u64x2)w >> 32) & 63);
	r = kml_low32_sse2(p, q);
	small = (kml_u32x4)(kml_low32_sse2((p >> 20) | (p >> 52), (q >> 20) | (q >> 52)) == 0);
	return (r & small) | (limit & ~small);
}

/*
 * v clamped to [lo, hi] (both in int16) and stored as four int16: packssdw
 * saturates to int16, which a clamp inside int16 cannot tell apart, then
 * pmaxsw and pminsw (SSE2 has no 32-bit min and max); no pmaxsw where the
 * caller knows no lane is below lo (!floor).
 */
static inline KML_TARGET_SSE2 void kml_clamp_store4_sse2(s16 *y, kml_s32x4 v, s16 lo, s16 hi,
							 bool floor)
{
	kml_s16x8 l = { lo, lo, lo, lo, lo, lo, lo, lo };
	kml_s16x8 h = { hi, hi, hi, hi, hi, hi, hi, hi };
	kml_s16x8 s = (kml_s16x8)__builtin_ia32_packssdw128(v, v);
	u64 out;

#ifdef __clang__
	if (floor)
		s = __builtin_elementwise_max(s, l);
	s = __builtin_elementwise_min(s, h);
#else
	if (floor)
		s = __builtin_ia32_pmaxsw128(s, l);
	s = __builtin_ia32_pminsw128(s, h);
#endif
	out = ((kml_u64x2)s)[0];
	__builtin_memcpy(y, &out, sizeof(out));
}

static inline KML_TARGET_SSE2 void
kml_requant4_sse2(kml_u32x4 acc, const s32 *b, const u32 *rq, s16 *y, bool relu,
		  s32 zp, s32 lo, s32 hi, bool count_lo, bool count_hi, kml_s32x4 *sat)
{
	kml_u32x4 w;
	kml_s32x4 v, neg;

	__builtin_memcpy(&w, b, sizeof(w));
	v = (kml_s32x4)(acc + w);		/* the sum, exact (proven in int32) */
	neg = v < 0;
	v = relu ? v & ~neg : (v ^ neg) - neg;
	__builtin_memcpy(&w, rq, sizeof(w));
	v = (kml_s32x4)kml_rq_mag4_sse2((kml_u32x4)v, w);
	v = (relu ? v : (v ^ neg) - neg) + zp;
	*sat -= (v > 32767) & -(s32)count_hi;
	*sat -= (v < -32768) & -(s32)count_lo;
	/* a ReLU's value is zp + r, r >= 0: nothing below lo = zp */
	kml_clamp_store4_sse2(y, v, lo, hi, !relu || lo != zp);
}

/*
 * A model's input encoding (kml_fixed.h, kml_round_shift), four inputs at a
 * time: y[i] = round((x[i] - c[i]) / 2^s[i]), ties away from zero, for s32
 * x and c (the difference exact in 64 bits) and shifts 0..62, the result's
 * low 32 bits (the compiler proves it fits).  The magnitude rounds as in
 * kml_round_shr_sse2, then takes the sign back.
 */
static inline KML_TARGET_SSE2 void kml_centre4_sse2(const s32 *x, const s32 *c, const u8 *s,
						    s32 *y)
{
	kml_s32x4 xv, cv, neg;
	kml_s64x2 lo, hi, nlo, nhi;

	__builtin_memcpy(&xv, x, sizeof(xv));
	__builtin_memcpy(&cv, c, sizeof(cv));
	/* x - c < 0 exactly where x < c: the sign from a 32-bit compare */
	neg = xv < cv;
	nlo = (kml_s64x2)__builtin_shufflevector(neg, neg, 0, 0, 1, 1);
	nhi = (kml_s64x2)__builtin_shufflevector(neg, neg, 2, 2, 3, 3);
	/* each s32 sign-extended: its sign mask above it */
	lo = (kml_s64x2)__builtin_shufflevector(xv, xv < 0, 0, 4, 1, 5) -
	     (kml_s64x2)__builtin_shufflevector(cv, cv < 0, 0, 4, 1, 5);
	hi = (kml_s64x2)__builtin_shufflevector(xv, xv < 0, 2, 6, 3, 7) -
	     (kml_s64x2)__builtin_shufflevector(cv, cv < 0, 2, 6, 3, 7);
	lo = (lo ^ nlo) - nlo;
	hi = (hi ^ nhi) - nhi;
	lo = (kml_s64x2)kml_round_shr_sse2((kml_u64x2)lo, (kml_u64x2){ s[0], s[1] });
	hi = (kml_s64x2)kml_round_shr_sse2((kml_u64x2)hi, (kml_u64x2){ s[2], s[3] });
	xv = __builtin_shufflevector((kml_s32x4)((lo ^ nlo) - nlo), (kml_s32x4)((hi ^ nhi) - nhi),
				     0, 2, 4, 6);
	__builtin_memcpy(y, &xv, sizeof(xv));
}

static inline KML_TARGET_AVX2 void kml_centre4_avx2(const s32 *x, const s32 *c, const u8 *s,
						    s32 *y)
{
	kml_s32x4 xv, cv;
	kml_s64x4 v, neg;
	kml_u64x4 one = { 1, 1, 1, 1 }, m;

	__builtin_memcpy(&xv, x, sizeof(xv));
	__builtin_memcpy(&cv, c, sizeof(cv));
	v = kml_widen4_s32_avx2(xv) - kml_widen4_s32_avx2(cv);
	neg = v < 0;
	m = (kml_u64x4)((v ^ neg) - neg);
	m = ((m + m) >> (kml_u64x4){ s[0], s[1], s[2], s[3] }) + one;
	v = ((kml_s64x4)(m >> 1) ^ neg) - neg;
	xv = __builtin_shufflevector((kml_s32x8)v, (kml_s32x8)v, 0, 2, 4, 6);
	__builtin_memcpy(y, &xv, sizeof(xv));
}

/*
 * v clamped to [lo, hi] lane by lane, one vpmaxsd and one vpminsd; no
 * vpmaxsd where the caller knows no lane is below lo (!floor).
 */
static inline KML_TARGET_AVX2 kml_s32x8 kml_clamp8_avx2(kml_s32x8 v, s32 lo, s32 hi,
							bool floor)
{
	kml_s32x8 l = { lo, lo, lo, lo, lo, lo, lo, lo };
	kml_s32x8 h = { hi, hi, hi, hi, hi, hi, hi, hi };

#ifdef __clang__
	if (floor)
		v = __builtin_elementwise_max(v, l);
	return __builtin_elementwise_min(v, h);
#else
	if (floor)
		v = __builtin_ia32_pmaxsd256(v, l);
	return __builtin_ia32_pminsd256(v, h);
#endif
}

static inline KML_TARGET_AVX2 kml_u32x8 kml_rq_mag8_avx2(kml_u32x8 m, kml_u32x8 w)
{
	kml_u32x8 mult = w >> 6;
	kml_u64x4 one = { 1, 1, 1, 1 }, sh, p, q;
	kml_s64x4 big;

	p = (kml_u64x4)__builtin_ia32_pmuludq256((kml_s32x8)m, (kml_s32x8)mult);
	sh = (kml_u64x4)w & 63;
	p = (p + ((one << sh) >> 1)) >> sh;
	big = (kml_s64x4)p > KML_RQ_LIMIT;
	p = (p & ~(kml_u64x4)big) | ((kml_u64x4)big & KML_RQ_LIMIT);
	q = (kml_u64x4)__builtin_ia32_pmuludq256((kml_s32x8)((kml_u64x4)m >> 32),
						 (kml_s32x8)((kml_u64x4)mult >> 32));
	sh = ((kml_u64x4)w >> 32) & 63;
	q = (q + ((one << sh) >> 1)) >> sh;
	big = (kml_s64x4)q > KML_RQ_LIMIT;
	q = (q & ~(kml_u64x4)big) | ((kml_u64x4)big & KML_RQ_LIMIT);
	return (kml_u32x8)(p | q << 32);
}

static inline KML_TARGET_AVX2 void
kml_requant8_avx2(kml_u32x8 acc, const s32 *b, const u32 *rq, s16 *y, bool relu,
		  s32 zp, s32 lo, s32 hi, bool count_lo, bool count_hi, kml_s32x8 *sat)
{
	kml_u32x8 w;
	kml_s32x8 v, neg;
	kml_s16x8 out;

	__builtin_memcpy(&w, b, sizeof(w));
	v = (kml_s32x8)(acc + w);		/* the sum, exact (proven in int32) */
	neg = v < 0;
	v = relu ? v & ~neg : (v ^ neg) - neg;
	__builtin_memcpy(&w, rq, sizeof(w));
	v = (kml_s32x8)kml_rq_mag8_avx2((kml_u32x8)v, w);
	v = (relu ? v : (v ^ neg) - neg) + zp;
	*sat -= (v > 32767) & -(s32)count_hi;
	*sat -= (v < -32768) & -(s32)count_lo;
	/* a ReLU's value is zp + r, r >= 0: nothing below lo = zp */
	v = kml_clamp8_avx2(v, lo, hi, !relu || lo != zp);
	out = __builtin_convertvector(v, kml_s16x8);
	__builtin_memcpy(y, &out, sizeof(out));
}

/*
 * The same epilogue for sums the proof keeps in int64 (a layer of int16
 * weights over int16 inputs), on AVX2 only (SSE2 has neither 64-bit
 * compares nor per-lane 64-bit shifts): four outputs per call,
 * each lane kml_requant (or kml_requant_relu) of acc[i] + b[i] exactly as
 * kml_fixed.h computes it: the magnitude times the multiplier as two
 * pmuludq, of its low and of its high 32 bits (exact: the proof bounds
 * |acc| * mult below 2^63, kml_requant's own precondition), the rounding
 * constant and the per-lane shift in 64 bits, the sign back; then the
 * zero point, the counts (per lane, in *sat) and the clamp, in 64-bit
 * lanes, and the low 16 bits stored.
 */
static inline KML_TARGET_AVX2 void
kml_requant4_s64_avx2(const kml_s64x4 *acc, const s64 *b, const u32 *rq, s16 *y, bool relu,
		      s32 zp, s32 lo, s32 hi, bool count_lo, bool count_hi, kml_s64x4 *sat)
{
	kml_u64x4 one = { 1, 1, 1, 1 }, w, sh, m;
	kml_s64x4 v, neg;
	kml_u32x4 r;
	kml_s16x4 out;

	__builtin_memcpy(&r, rq, sizeof(r));
	w = __builtin_convertvector(r, kml_u64x4);
	sh = w & 63;
	__builtin_memcpy(&v, b, sizeof(v));
	v += *acc;
	neg = v < 0;
	m = (kml_u64x4)(relu ? v & ~neg : (v ^ neg) - neg);
	m = (kml_u64x4)__builtin_ia32_pmuludq256((kml_s32x8)m, (kml_s32x8)(w >> 6)) +
	    ((kml_u64x4)__builtin_ia32_pmuludq256((kml_s32x8)(m >> 32),
						  (kml_s32x8)(w >> 6)) << 32);
	v = (kml_s64x4)((m + ((one << sh) >> 1)) >> sh);
	v = (relu ? v : (v ^ neg) - neg) + zp;
	*sat -= (v > 32767) & -(s64)count_hi;
	*sat -= (v < -32768) & -(s64)count_lo;
	neg = v < lo;
	v = (v & ~neg) | (lo & neg);
	neg = v > hi;
	v = (v & ~neg) | (hi & neg);
	/* the low 16 bits of each lane (gcc would convert lane by lane) */
	out = __builtin_shufflevector((kml_s16x16)v, (kml_s16x16)v, 0, 4, 8, 12);
	__builtin_memcpy(y, &out, sizeof(out));
}

static inline KML_TARGET_AVX2 unsigned int kml_sat_total64_avx2(kml_s64x4 sat)
{
	return (u32)sat[0] + (u32)sat[1] + (u32)sat[2] + (u32)sat[3];
}

static inline KML_TARGET_SSE2 unsigned int kml_sat_total_sse2(kml_s32x4 sat)
{
	return (u32)sat[0] + (u32)sat[1] + (u32)sat[2] + (u32)sat[3];
}

static inline KML_TARGET_AVX2 unsigned int kml_sat_total_avx2(kml_s32x8 sat)
{
	unsigned int i, n = 0;

	for (i = 0; i < 8; i++)
		n += (u32)sat[i];
	return n;
}

#ifdef __KERNEL__
#include <asm/cpufeature.h>
#include <asm/fpu/api.h>
#include <linux/preempt.h>

/* Whether the CPU has the path's instructions (alternatives: patched once). */
static inline bool kml_simd_cpu(int path)
{
	switch (path) {
	case KML_PATH_SCALAR:
		return true;
	case KML_PATH_SSE2:
		return static_cpu_has(X86_FEATURE_XMM2);
	case KML_PATH_AVX2:
		/* cleared at boot where the kernel does not manage YMM state */
		return static_cpu_has(X86_FEATURE_AVX2);
	}
	return false;
}

/*
 * Whether this context may use vector registers.  Not in NMI (nor in a
 * kprobe handler entered through int3, which runs as an NMI-like
 * exception: irq_fpu_usable() would warn there, so in_nmi() comes first),
 * not in a hard interrupt that arrived inside an FPU section or a softirq,
 * and not nested in another FPU section: irq_fpu_usable() in
 * arch/x86/kernel/fpu/core.c (6.1) decides the rest.
 */
static inline bool kml_simd_usable(void)
{
	return !in_nmi() && irq_fpu_usable();
}

/*
 * kernel_fpu_begin() disables preemption, saves the task's user FPU state
 * (XSAVE, once per return to user space: TIF_NEED_FPU_LOAD then defers
 * its restore to the exit) and loads the default MXCSR.
 */
static inline void kml_simd_begin(void)
{
	kernel_fpu_begin();
}

static inline void kml_simd_end(void)
{
	kernel_fpu_end();
}
#else /* the userspace twin */
#include <cpuid.h>

static inline bool kml_simd_cpu(int path)
{
	unsigned int a, b, c, d, lo, hi;

	switch (path) {
	case KML_PATH_SCALAR:
	case KML_PATH_SSE2:
		return true;	/* x86-64's baseline */
	case KML_PATH_AVX2:
		/* AVX2, and YMM state enabled by the OS (OSXSAVE, XCR0 bits 1-2) */
		if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX))
			return false;
		__asm__ ("xgetbv" : "=a" (lo), "=d" (hi) : "c" (0));
		if ((lo & 6) != 6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
			return false;
		return b & bit_AVX2;
	}
	return false;
}

static inline bool kml_simd_usable(void)
{
	return true;
}

static inline void kml_simd_begin(void)
{
}

static inline void kml_simd_end(void)
{
}
#endif /* __KERNEL__ */

#else /* no SIMD paths: scalar only */

static inline bool kml_simd_cpu(int path)
{
	return path == KML_PATH_SCALAR;
}

static inline bool kml_simd_usable(void)
{
	return false;
}

static inline void kml_simd_begin(void)
{
}

static inline void kml_simd_end(void)
{
}
#endif /* KML_SIMD_X86 */

/*
 * Calls per path, and calls that wanted a SIMD path but ran scalar because
 * the context may not use vector registers ("busy"): per CPU in the kernel
 * (this_cpu_inc is one instruction on x86, safe in NMI), atomic in the
 * twin.
 */
#define KML_PATH_BUSY KML_NR_PATHS

struct kml_path_calls {
	u64 n[KML_NR_PATHS + 1];
};

#ifdef __KERNEL__
#include <linux/percpu.h>

#define KML_DEFINE_PATH_CALLS(name) static DEFINE_PER_CPU(struct kml_path_calls, name)
#ifdef CONFIG_UML
/* UML: one CPU, no preemption (ARCH_NO_PREEMPT), no NMI; its this_cpu_inc warns */
#define kml_path_count(name, p) raw_cpu_inc((name).n[p])
#else
#define kml_path_count(name, p) this_cpu_inc((name).n[p])
#endif
#define kml_path_calls_sum(name, i) ({					\
	u64 __sum = 0;							\
	int __cpu;							\
	for_each_possible_cpu(__cpu)					\
		__sum += per_cpu_ptr(&(name), __cpu)->n[i];		\
	__sum;								\
})
#define KML_READ_ONCE(x) READ_ONCE(x)
#define KML_WRITE_ONCE(x, v) WRITE_ONCE(x, v)
#else
#define KML_DEFINE_PATH_CALLS(name) static struct kml_path_calls name
#define kml_path_count(name, p) __atomic_fetch_add(&(name).n[p], 1, __ATOMIC_RELAXED)
#define kml_path_calls_sum(name, i) __atomic_load_n(&(name).n[i], __ATOMIC_RELAXED)
#define KML_READ_ONCE(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define KML_WRITE_ONCE(x, v) __atomic_store_n(&(x), v, __ATOMIC_RELAXED)
#endif

/*
 * The best path this CPU has.  The kernel's static_cpu_has() costs
 * nothing; the twin asks cpuid once (in a VM, cpuid traps to the
 * hypervisor: microseconds) and remembers the answer in its own copy.
 */
static inline int kml_simd_best(void)
{
#ifndef __KERNEL__
	static int best = -1;
	int p = __atomic_load_n(&best, __ATOMIC_RELAXED);

	if (p >= 0)
		return p;
#else
	int p;
#endif
	p = KML_NR_PATHS - 1;
	while (p > KML_PATH_SCALAR && !kml_simd_cpu(p))
		p--;
#ifndef __KERNEL__
	__atomic_store_n(&best, p, __ATOMIC_RELAXED);
#endif
	return p;
}

#endif /* KML_SIMD_H */
