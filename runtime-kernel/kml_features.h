/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Integer feature extractors for kmlc's kernel hooks
 *
 * One definition, compiled into the hook module and into the userspace
 * twin, so that a recorded event trace replayed through the twin gives the
 * features and decisions the module computed, bit for bit.  Integer
 * arithmetic only (hooks run in atomic context); every division has a
 * non-zero divisor; every result is saturated to s32.
 *
 * Features leave here already encoded for a fixed-point model:
 * value * 2^frac, rounded to nearest (ties up), saturated to s32.
 */
#ifndef KML_FEATURES_H
#define KML_FEATURES_H

#include "kml_types.h"

#define KML_S32_MAX 2147483647LL

/* v * 2^frac for a non-negative integer v, saturated to s32. */
static inline s32 kml_q_int(u64 v, unsigned int frac)
{
	return v > ((u64)KML_S32_MAX >> frac) ? (s32)KML_S32_MAX : (s32)(v << frac);
}

/*
 * round(num * 2^frac / den), ties up, saturated to s32; den 0 counts as 1.
 * Long division, one bit at a time, so no intermediate exceeds
 * 2 * den: exact for any u64 operands, no 128-bit arithmetic.
 */
static inline s32 kml_q_div(u64 num, u64 den, unsigned int frac)
{
	u64 q, r;
	unsigned int i;

	if (!den)
		den = 1;
	q = num / den;
	r = num % den;
	if (q > ((u64)KML_S32_MAX >> frac))
		return (s32)KML_S32_MAX;
	for (i = 0; i < frac; i++) {
		q <<= 1;
		if (r >= den - r) {	/* 2r >= den, without overflow */
			q |= 1;
			r = r - (den - r);
		} else {
			r <<= 1;
		}
	}
	if (r >= den - r)	/* round half up */
		q++;
	return q > KML_S32_MAX ? (s32)KML_S32_MAX : (s32)q;
}

/* ---- Heimdall admission (brief §2) -------------------------------------------
 *
 * Per replicated device: the current queue length (reads in flight on the
 * primary) and the last three completions on it: queue length at submit,
 * latency and throughput.  Feature vector, in this order:
 *   size (B), queue length, 3 x past queue length, 3 x latency (us),
 *   3 x throughput (B/us).
 * Latencies are floored at 1 us, so throughput never divides by zero.
 */
#define KML_ADMIT_FEATURES 11
#define KML_ADMIT_HISTORY 3

struct kml_admit_state {
	u32 qlen[KML_ADMIT_HISTORY];
	u64 lat_us[KML_ADMIT_HISTORY];
	u64 bytes[KML_ADMIT_HISTORY];
};

/* A read finished on the primary: it had qlen reads ahead of it. */
static inline void kml_admit_complete(struct kml_admit_state *s, u32 qlen, u64 lat_ns,
				      u64 bytes)
{
	int i;

	for (i = KML_ADMIT_HISTORY - 1; i > 0; i--) {
		s->qlen[i] = s->qlen[i - 1];
		s->lat_us[i] = s->lat_us[i - 1];
		s->bytes[i] = s->bytes[i - 1];
	}
	s->qlen[0] = qlen;
	s->lat_us[0] = lat_ns / 1000 ? lat_ns / 1000 : 1;
	s->bytes[0] = bytes;
}

/* The encoded feature vector for a read of size bytes with qlen in flight. */
static inline void kml_admit_features(const struct kml_admit_state *s, u64 size, u32 qlen,
				      const u8 *frac, s32 *f)
{
	int i;

	f[0] = kml_q_int(size, frac[0]);
	f[1] = kml_q_int(qlen, frac[1]);
	for (i = 0; i < KML_ADMIT_HISTORY; i++) {
		f[2 + i] = kml_q_int(s->qlen[i], frac[2 + i]);
		f[5 + i] = kml_q_int(s->lat_us[i], frac[5 + i]);
		/* an empty slot (no completion yet) has throughput 0 */
		f[8 + i] = s->lat_us[i] ? kml_q_div(s->bytes[i], s->lat_us[i], frac[8 + i]) : 0;
	}
}

/* ---- KML readahead (brief §2) ------------------------------------------------
 *
 * Per file and window: the page offsets of the page-cache misses that
 * reach readahead.  Feature vector, in this order:
 *   transactions in the window, variance of the offsets / (max - min)
 *   (population, and with n - 1), mean |offset difference| between
 *   successive events, current readahead in sectors / 1024.
 * The variance is computed exactly from integer sums, which is what
 * Welford's method computes in exact arithmetic.  Offsets are taken
 * relative to the window's first one and clamped to +-2^20 pages, and a
 * window holds at most KML_RA_MAX_EVENTS events, so n * sum(d^2) < 2^61.
 */
#define KML_RA_FEATURES 5
#define KML_RA_MAX_EVENTS 1024
#define KML_RA_SPAN (1LL << 20)

struct kml_ra_window {
	u32 n;
	s64 first, last, min, max;	/* offsets relative to first, clamped */
	s64 sum;
	u64 sum_sq, sum_abs_diff;
};

static inline void kml_ra_reset(struct kml_ra_window *w)
{
	w->n = 0;
	w->sum = 0;
	w->sum_sq = 0;
	w->sum_abs_diff = 0;
}

/* Adds a miss at page offset index; false once the window is full. */
static inline bool kml_ra_add(struct kml_ra_window *w, u64 index)
{
	s64 d;

	if (w->n >= KML_RA_MAX_EVENTS)
		return false;
	if (!w->n) {
		w->first = (s64)(index & (((u64)1 << 62) - 1));
		w->last = 0;
		w->min = 0;
		w->max = 0;
	}
	d = (s64)(index & (((u64)1 << 62) - 1)) - w->first;
	d = d < -KML_RA_SPAN ? -KML_RA_SPAN : d > KML_RA_SPAN ? KML_RA_SPAN : d;
	if (w->n)
		w->sum_abs_diff += d > w->last ? (u64)(d - w->last) : (u64)(w->last - d);
	w->last = d;
	w->min = d < w->min ? d : w->min;
	w->max = d > w->max ? d : w->max;
	w->sum += d;
	w->sum_sq += (u64)(d < 0 ? -d : d) * (u64)(d < 0 ? -d : d);
	w->n++;
	return true;
}

/*
 * Whether the window closes with the event just added: it holds at least
 * two events, and window_events of them (clamped to 2..KML_RA_MAX_EVENTS)
 * or it has been open window_ns.  The hook and every twin use this.
 */
static inline bool kml_ra_window_closes(const struct kml_ra_window *w, u64 open_ns,
					u32 window_events, u64 window_ns)
{
	u32 most = window_events < 2 ? 2 : window_events > KML_RA_MAX_EVENTS ?
		   KML_RA_MAX_EVENTS : window_events;

	return w->n >= 2 && (w->n >= most || open_ns >= window_ns);
}

/* Fraction bits of the features handed to a float model (exact below 2^31). */
#define KML_RA_FLOAT_FRAC { 0, 4, 4, 4, 16 }

/* The encoded features of a window of at least two events. */
static inline void kml_ra_features(const struct kml_ra_window *w, u32 ra_pages,
				   const u8 *frac, s32 *f)
{
	u64 n = w->n, range = (u64)(w->max - w->min);
	u64 s = w->sum < 0 ? (u64)(-w->sum) : (u64)w->sum;
	u64 var_n2 = n * w->sum_sq - s * s;	/* n^2 * variance, exact and >= 0 */

	f[0] = kml_q_int(n, frac[0]);
	f[1] = range ? kml_q_div(var_n2, n * n * range, frac[1]) : 0;
	f[2] = range && n > 1 ? kml_q_div(var_n2, n * (n - 1) * range, frac[2]) : 0;
	f[3] = n > 1 ? kml_q_div(w->sum_abs_diff, n - 1, frac[3]) : 0;
	f[4] = kml_q_div((u64)ra_pages * 8, 1024, frac[4]);	/* sectors / 1024 */
}

#endif /* KML_FEATURES_H */
