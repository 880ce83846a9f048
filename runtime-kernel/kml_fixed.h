/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Integer arithmetic for kmlc's fixed-point models
 *
 * The one definition of rounding, requantization, clamping and the
 * table-driven nonlinearities used by both the kernel module and the
 * userspace twin (docs/numerics.md, "Fixed point").  Integer operations
 * only: no FPU, no division, no right shift of a negative value, and no
 * signed overflow for operands within the bounds the compiler proves
 * (passes/bound_ranges.py).
 *
 * Rounding rule, everywhere: to nearest, ties away from zero, computed on
 * the magnitude in unsigned arithmetic and then given the sign back.
 */
#ifndef KML_FIXED_H
#define KML_FIXED_H

#include "kml_types.h"
#include "kml_elem.h"
#include "kml_lut.h"

/* |v| as u64; defined for every s64, including S64_MIN. */
static inline u64 kml_abs_u64(s64 v)
{
	return v < 0 ? -(u64)v : (u64)v;
}

/* m with the sign of v; m must not exceed 2^63 - 1. */
static inline s64 kml_with_sign(s64 v, u64 m)
{
	return v < 0 ? -(s64)m : (s64)m;
}

/*
 * A dense layer's requantization word per output channel: the multiplier
 * (below 2^26) in the high bits, the shift (0..62) in the low six.
 */
static inline u32 kml_rq_mult(u32 rq)
{
	return rq >> 6;
}

static inline unsigned int kml_rq_shift(u32 rq)
{
	return rq & 63;
}

/* round(v / 2^shift), ties away from zero; shift <= 62. */
static inline s64 kml_round_shift(s64 v, unsigned int shift)
{
	u64 m = kml_abs_u64(v);

	if (shift)
		m = (m + (1ULL << (shift - 1))) >> shift;
	return kml_with_sign(v, m);
}

/*
 * round(acc * mult / 2^shift), ties away from zero: requantization by an
 * integer multiplier and a shift.  Requires |acc| * mult < 2^63 and
 * shift <= 62, which the compiler proves for every call it generates.
 */
static inline s64 kml_requant(s64 acc, u32 mult, unsigned int shift)
{
	u64 m = kml_abs_u64(acc) * mult;

	if (shift)
		m = (m + (1ULL << (shift - 1))) >> shift;
	return kml_with_sign(acc, m);
}

/*
 * kml_requant for any acc: the product in 128 bits, and the result, which
 * a clamp to int16 or int32 always follows, saturated to 2^63 - 1 (where
 * |acc| * mult < 2^63 it is kml_requant's, bit for bit).  The first dense
 * layer uses it on its exact path, for inputs beyond int16, where the
 * proof bounds |acc| only by 2^62.
 */
static inline s64 kml_requant_wide(s64 acc, u32 mult, unsigned int shift)
{
	unsigned __int128 m = (unsigned __int128)kml_abs_u64(acc) * mult;
	u64 top = ~0ULL >> 1;

	if (shift)
		m = (m + ((unsigned __int128)1 << (shift - 1))) >> shift;
	return kml_with_sign(acc, m > top ? top : (u64)m);
}

/* Whether each of x[0..n-1] lies in int16: the first layer's fast path. */
static inline bool kml_all_s16(const s32 *x, unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++)
		if (x[i] < -32768 || x[i] > 32767)
			return false;
	return true;
}

/*
 * Paired outputs (passes/lower.py): two outputs' sums share one 64-bit
 * accumulator p = lo + hi * 2^32 (mod 2^64), built by multiplying x[k] by
 * the pair of weights kml_pack2(w_lo, w_hi) = w_lo + w_hi * 2^32, packed at
 * run time from the weights as stored (int8 or int16), so that one
 * 64 x 64 -> 64-bit multiply adds both products.  Unsigned arithmetic
 * wraps modulo 2^64 by definition, so every step is defined and p is
 * exact modulo 2^64 whatever the partial sums were; kml_unpack2 recovers
 * lo and hi exactly whenever the final sums lie in [-2^31, 2^31), which
 * the overflow proof guarantees for every layer that uses it (its
 * accumulator is s32).
 */
static inline u64 kml_pack2(s64 lo, s64 hi)
{
	return (u64)lo + ((u64)hi << 32);
}

/* The low 32 bits of v as a signed value in [-2^31, 2^31). */
static inline s64 kml_s32_of(u64 v)
{
	return (s64)((v & 0xffffffffULL) ^ 0x80000000ULL) - 0x80000000LL;
}

static inline void kml_unpack2_to(u64 p, s64 *lo, s64 *hi)
{
	*lo = kml_s32_of(p);
	*hi = kml_s32_of((p - (u64)*lo) >> 32);
}

static inline void kml_unpack2(u64 p, s64 *a)
{
	kml_unpack2_to(p, &a[0], &a[1]);
}

/*
 * Offset pairs (passes/lower.py): the scalar path of int8 weights stored in
 * input pairs, for a full tile of 8 outputs.  Such a tile's weights are
 * stored offset, as u8 w + 128 in 0..255, and its 16 bytes for inputs 2k
 * and 2k + 1 are [n][j] (output n, input 2k + j).  An 8-byte load at byte
 * i of a quad (bytes 0..7: outputs 0..3; 8..15: outputs 4..7), masked,
 * keeps bytes i and i + 4: kml_w8_lane(q, 2 * p + j) is (w + 128 of output
 * p) + (w + 128 of output p + 2) * 2^32 for input 2k + j, p = 0, 1, ready
 * for one 64-bit multiply (kml_pack2's lanes) with no sign to extend: a
 * load and a mask per pair of weights.  Every lane then sums x[k] *
 * (w[k] + 128), the layer's sum plus 128 times the inputs' sum, which the
 * epilogue takes off; the compiler takes this path only where 255 * K *
 * max|x| < 2^31, so that each lane's sum lies in int32 whatever the int8
 * weights are (kml_unpack2 is exact, and a new weight set needs no new
 * proof).  The loads at bytes 1..3 of a quad read up to KML_W8_OVERREAD
 * bytes past it, which the mask drops: the weight set holds at least that
 * many bytes after every such array (passes/lower.py, static_assert in
 * the model's C).
 */
#define KML_W8_LANES 0x000000ff000000ffULL
#define KML_W8_OVERREAD 3

static inline u64 kml_w8_lane(const u8 *q, unsigned int i)
{
	u64 v;

	__builtin_memcpy(&v, q + i, sizeof(v));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	v = __builtin_bswap64(v);	/* byte i in the low bits, as on little-endian */
#endif
	return v & KML_W8_LANES;
}

/*
 * The sum of x[0..n-1], the offset pairs' correction (times 128): four
 * independent partial sums, so that the adds do not wait on each other.
 */
#define KML_SUM4(x, n)							\
	({								\
		__auto_type x_ = (x);					\
		unsigned int n_ = (n), k_;				\
		s64 s_[4] = { 0, 0, 0, 0 };				\
									\
		for (k_ = 0; k_ + 4 <= n_; k_ += 4) {			\
			s_[0] += x_[k_];				\
			s_[1] += x_[k_ + 1];				\
			s_[2] += x_[k_ + 2];				\
			s_[3] += x_[k_ + 3];				\
		}							\
		for (; k_ < n_; k_++)					\
			s_[0] += x_[k_];				\
		s_[0] + s_[1] + s_[2] + s_[3];				\
	})

static inline s64 kml_sum_s16(const s16 *x, unsigned int n)
{
	return KML_SUM4(x, n);
}

static inline s64 kml_sum_s32(const s32 *x, unsigned int n)
{
	return KML_SUM4(x, n);
}

/*
 * kml_requant(acc, mult, shift) for acc >= 0, and 0 for acc < 0.  Where a
 * clamp at or above the zero point follows (ReLU), a negative sum, whose
 * requantized value is <= 0, ends at the clamp's floor either way, so the
 * sign handling can go.  Requires |acc| * mult < 2^63, shift <= 62.
 */
static inline s64 kml_requant_relu(s64 acc, u32 mult, unsigned int shift)
{
	u64 m = (acc > 0 ? (u64)acc : 0) * mult;

	return (s64)((m + ((1ULL << shift) >> 1)) >> shift);
}

static inline s64 kml_clamp(s64 v, s64 lo, s64 hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/*
 * A ReLU's output code: r (kml_requant_relu's, >= 0) plus the zero point
 * zp, the ReLU's floor, clamped at hi; r + zp >= zp, so only the top is
 * tested.  kml_relu_out_n adds 1 to *sat when it clamps (hi = 32767: the
 * value left the int16 encoding), on a branch: a saturation is the rare
 * case, and one compare and a predicted jump cost less than counting and
 * clamping without one (a compare, a set, an add, a compare and a cmov,
 * as gcc 12 emits them: 5% of Heimdall's scalar call).
 */
static inline s64 kml_relu_out(s64 r, s64 zp, s64 hi)
{
	return r > hi - zp ? hi : r + zp;
}

static inline s64 kml_relu_out_n(s64 r, s64 zp, s64 hi, unsigned int *sat)
{
	if (__builtin_expect(r > hi - zp, 0)) {
		*sat += 1;
		return hi;
	}
	return r + zp;
}

/*
 * floor(v / 2^shift), |v| < 2^62, with no shift of a negative value: the
 * magnitude's quotient, rounded up for a negative v.
 */
static inline s64 kml_floor_shift(s64 v, unsigned int shift)
{
	if (v >= 0)
		return (s64)((u64)v >> shift);
	return -(s64)(((u64)-v + (1ULL << shift) - 1) >> shift);
}

/* The integer a real value v / 2^shift rounds to: ONNX Floor, Ceil, Round. */
static inline s64 kml_floor_q(s64 v, unsigned int shift)
{
	return kml_floor_shift(v, shift);
}

static inline s64 kml_ceil_q(s64 v, unsigned int shift)
{
	return -kml_floor_shift(-v, shift);
}

/* Half to even (ONNX Round); shift >= 1. */
static inline s64 kml_round_q(s64 v, unsigned int shift)
{
	s64 h = v + (1LL << (shift - 1));
	s64 q = kml_floor_shift(h, shift);

	if (((u64)h & ((1ULL << shift) - 1)) == 0 && ((u64)q & 1))	/* a tie, q odd */
		q--;
	return q;
}

/* v saturated to s32, the input type of the table lookups. */
static inline s32 kml_sat_s32(s64 v)
{
	return (s32)kml_clamp(v, -2147483647LL - 1, 2147483647LL);
}

/*
 * Saturation, counted: kml_sat_s32 adding 1 to *sat when v is beyond int32,
 * and v itself adding 1 when it lies beyond int16 (an activation leaving
 * its encoding, which the clamp that follows saturates).  The counts are
 * the entry point's return value (docs/numerics.md, "Saturation").
 */
static inline s32 kml_sat_s32_n(s64 v, unsigned int *sat)
{
	*sat += v < -2147483647LL - 1 || v > 2147483647LL;
	return kml_sat_s32(v);
}

static inline s64 kml_count16(s64 v, unsigned int *sat)
{
	*sat += v < -32768 || v > 32767;
	return v;
}

/* The same for an encoding with one end only: a ReLU's, or a Clip's. */
static inline s64 kml_count_above(s64 v, unsigned int *sat)
{
	*sat += v > 32767;
	return v;
}

static inline s64 kml_count_below(s64 v, unsigned int *sat)
{
	*sat += v < -32768;
	return v;
}

/*
 * A linear function of one or two activations (kmlc.ops: qlin):
 * round(((a - za) * ma + (b - zb) * mb) / 2^shift) + zp, ties away from
 * zero, saturated to int16 and counted when it leaves it.  A constant
 * operand's per-element multiplier is ma (b = 0), its offset b (mb = 1).
 * The compiler proves |(a - za) * ma + (b - zb) * mb| < 2^62 for every
 * call it generates (passes/bound_ranges.py), so no step overflows.
 */
static inline s64 kml_qlin(s64 a, s64 za, s64 ma, s64 b, s64 zb, s64 mb, unsigned int shift,
			   s64 zp, unsigned int *sat)
{
	s64 v = kml_round_shift((a - za) * ma + (b - zb) * mb, shift) + zp;

	*sat += v < -32768 || v > 32767;
	return kml_clamp(v, -32768, 32767);
}

/*
 * A product of two activations (kmlc.ops: qlin, prod): round((a - za) *
 * (b - zb) * m / 2^shift) + zp, ties away from zero, saturated to int16
 * and counted when it leaves it.  |a - za|, |b - zb| < 2^16 and m < 2^30
 * (the compiler proves both), so |(a - za) * (b - zb) * m| < 2^62.
 */
static inline s64 kml_qmul(s64 a, s64 za, s64 b, s64 zb, s64 m, unsigned int shift, s64 zp,
			   unsigned int *sat)
{
	s64 v = kml_round_shift((a - za) * (b - zb) * m, shift) + zp;

	*sat += v < -32768 || v > 32767;
	return kml_clamp(v, -32768, 32767);
}

/* floor(log2(u)) for 0 < u < 2^16. */
static inline unsigned int kml_ilog2_16(u32 u)
{
	unsigned int e = 0;

	if (u >> 8) {
		u >>= 8;
		e += 8;
	}
	if (u >> 4) {
		u >>= 4;
		e += 4;
	}
	if (u >> 2) {
		u >>= 2;
		e += 2;
	}
	return e + (u >> 1);
}

/*
 * A function of an int16 value x by a table of its encoded values
 * (kmlc.ops: qtab): u = x - o (o - x when down), taken into [0, umax], falls
 * in segment j of a table whose segments are 2^k codes wide below
 * 2^(m + k) and 2^m to an octave beyond (narrow where the function is
 * steep: near a square root's or a logarithm's 0); t[j] and t[j + 1] hold
 * the function at the segment's ends, and the value between them is the
 * line between them, its correction rounded on its magnitude like
 * kml_lut's.  The compiler's m + k <= 16 keeps every shift below 16, so
 * d * frac < 2^16 * 2^15.
 */
static inline s32 kml_tab(const s16 *t, s32 x, s32 o, bool down, unsigned int m, unsigned int k,
			  u32 umax)
{
	s32 v = down ? o - x : x - o;
	u32 u = v <= 0 ? 0 : (u32)v > umax ? umax : (u32)v;
	unsigned int sh = k, e;
	u32 j, frac, d, corr;
	s32 t0, t1;

	if (u >> (m + k)) {
		e = kml_ilog2_16(u);
		sh = e - m;
		j = ((e - m - k) << m) + (u >> sh);
	} else {
		j = u >> k;
	}
	frac = u & ((1U << sh) - 1);
	t0 = t[j];
	t1 = t[j + 1];
	d = t1 >= t0 ? (u32)(t1 - t0) : (u32)(t0 - t1);
	corr = (d * frac + ((1U << sh) >> 1)) >> sh;
	return t1 >= t0 ? t0 + (s32)corr : t0 - (s32)corr;
}

/*
 * Piecewise-linear table lookup: t[] holds f at u = 0, 32, 64, ...,
 * 32768 (1025 entries); u in [0, 32767].  The correction between two
 * entries is rounded on its magnitude, like everything else here.
 */
static inline s32 kml_lut(const u16 *t, u32 u)
{
	u32 seg = u >> 5, frac = u & 31;
	s32 t0 = t[seg], t1 = t[seg + 1];
	u32 d = t1 >= t0 ? (u32)(t1 - t0) : (u32)(t0 - t1);
	s32 corr = (s32)((d * frac + 16) >> 5);

	return t1 >= t0 ? t0 + corr : t0 - corr;
}

/* The canonical fixed-point formats of the nonlinearities (see kml_lut.h). */
#define KML_Q15_ONE 32768
#define KML_SIGMOID_IN_FRAC 11	/* input Q4.11: [-16, 16) */
#define KML_TANH_IN_FRAC 12	/* input Q3.12: [-8, 8) */
#define KML_EXP_IN_FRAC 11	/* input Q4.11: [-16, 0] */

/* Magnitude of a Q-format input, saturated to the table's domain. */
static inline u32 kml_lut_index(s32 x)
{
	u32 u = x < 0 ? -(u32)x : (u32)x;

	return u > 32767 ? 32767 : u;
}

#ifdef KML_LUT_SIGMOID
/* sigmoid: Q4.11 in, Q0.15 out in [0, 32767]; < 1 LSB from exact. */
static inline s32 kml_sigmoid_q15(s32 x)
{
	s32 y = kml_lut(kml_sigmoid_table, kml_lut_index(x));

	y = x < 0 ? KML_Q15_ONE - y : y;
	return y > 32767 ? 32767 : y;
}
#endif

#ifdef KML_LUT_TANH
/* tanh: Q3.12 in, Q0.15 out in [-32767, 32767]; < 1 LSB from exact. */
static inline s32 kml_tanh_q15(s32 x)
{
	s32 y = kml_lut(kml_tanh_table, kml_lut_index(x));

	y = y > 32767 ? 32767 : y;
	return x < 0 ? -y : y;
}
#endif

#ifdef KML_LUT_EXP
/* exp of a non-positive Q4.11 value, Q0.15 out in [0, 32768]; < 1.6 LSB. */
static inline s32 kml_exp_q15(s32 d)
{
	return kml_lut(kml_exp_table, kml_lut_index(d > 0 ? 0 : d));
}
#endif

#endif /* KML_FIXED_H */
