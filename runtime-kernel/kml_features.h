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
 * Per replicated device: the current queue length (reads and writes in
 * flight on the primary) and the last three completions on it, reads and
 * writes alike: queue length at submit, latency and throughput.  As in
 * Heimdall, whose kernel and client integrations record every I/O they
 * send to the device and count both kinds in the queue.  Feature vector,
 * in this order:
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

/* A read or write finished on the primary: it had qlen I/Os ahead of it. */
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
#define KML_RA_SPAN 1048576LL		/* 2^20 */

struct kml_ra_window {
	u32 n;
	u64 t0;				/* when its first event came, ns */
	s64 first, last, min, max;	/* offsets relative to first, clamped */
	s64 sum;
	u64 sum_sq, sum_abs_diff;
	u64 pages;			/* pages the reader consumed (kml_ra_step()) */
};

/* A miss as the hook's trace flags it. */
#define KML_RA_NEW 1		/* the miss opens a window */
#define KML_RA_CLOSES 2		/* it closes the window: features */
#define KML_RA_FAULT 4		/* a page fault (mmap), not a read */

static inline void kml_ra_reset(struct kml_ra_window *w)
{
	w->n = 0;
	w->sum = 0;
	w->sum_sq = 0;
	w->sum_abs_diff = 0;
	w->pages = 0;
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

static inline void kml_ra_features(const struct kml_ra_window *w, u32 ra_pages,
				   const u8 *frac, s32 *f);

/*
 * One miss of a file, as the hook handles it: at time t (ns), page offset
 * index, with the file's readahead ra_pages.  Adds the miss to the file's
 * window, opening one if none is open; if the window closes with it
 * (kml_ra_window_closes()), writes its features to f and its cost to
 * *cost, empties the window and returns true.  The hook, the twin's
 * replay and kmlc.features use this one step.
 *
 * The cost (the benefit guard's, kml_guard.h) is the window's time per
 * page the reader consumed, ns: a miss that moves forward by at most the
 * file's readahead counts the pages it moved over (the reader went
 * through them: they were read ahead, and hit), any other miss one page.
 * Readahead that is too small for a sequential reader makes it miss more
 * often per page; readahead that is too large for a random reader makes
 * each miss slower and consumes no more pages: either way the cost rises.
 */
static inline bool kml_ra_step(struct kml_ra_window *w, u64 t, u64 index, u32 ra_pages,
			       u32 window_events, u64 window_ns, const u8 *frac, s32 *f,
			       u64 *cost)
{
	s64 prev = w->last, step;

	if (!w->n)
		w->t0 = t;
	if (kml_ra_add(w, index)) {
		step = w->last - prev;
		w->pages += w->n > 1 && step > 0 && step <= (s64)ra_pages ? (u64)step : 1;
	}
	if (!kml_ra_window_closes(w, t - w->t0, window_events, window_ns))
		return false;
	kml_ra_features(w, ra_pages, frac, f);
	*cost = (t - w->t0) / (w->pages ? w->pages : 1);
	kml_ra_reset(w);
	return true;
}

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

/* ---- KML NFS rsize (brief §2) ------------------------------------------------
 *
 * Per NFS mount and window (window_ns; KML: one second), from four kinds of
 * event: an NFS READ sent (a: its file offset in bytes), a READ done (a:
 * ns since the matching send, or KML_NFS_NO_LATENCY), a page added to the
 * page cache of one of the mount's files (a: page index), and a reclaim
 * scan anywhere in the system (a: pages it reclaimed).  Feature vector, in
 * this order and these units (examples/models/seed_models.py, NFS_MEAN):
 *   0 events per second: the mount's reads, dones and page adds, and the
 *     system's reclaim scans, over the window's length
 *   1 mean read -> done latency (us)
 *   2 mean gap between successive reads (us)
 *   3 mean gap between successive dones (us)
 *   4 mean |offset difference| between successive reads (4 KiB units)
 *   5 mean |page index difference| between successive page adds (pages)
 *   6 mean pages reclaimed per reclaim scan
 *   7 current rsize / 4096
 * A mean over fewer events than it needs is 0.  Sums saturate at 2^64 - 1
 * instead of wrapping; the mean gaps are exact because successive gaps
 * telescope to (last - first).
 */
#define KML_NFS_FEATURES 8
#define KML_NFS_READ 0
#define KML_NFS_DONE 1
#define KML_NFS_PAGE 2
#define KML_NFS_RECLAIM 3
#define KML_NFS_NO_LATENCY (~0ULL)	/* a done whose send was not seen */
#define KML_NFS_OPENS 1		/* trace flags: the event opens a window */
#define KML_NFS_CLOSES 2	/* the window closed before the event: features */
#define KML_NFS_NSEC_PER_SEC 1000000000ULL

/* Fraction bits of the features handed to a float model (exact below 2^31). */
#define KML_NFS_FLOAT_FRAC { 4, 4, 4, 4, 8, 8, 8, 8 }

static inline u64 kml_sat_add(u64 a, u64 b)
{
	return a + b < a ? ~0ULL : a + b;
}

static inline u64 kml_sat_mul(u64 a, u64 b)
{
	return b && a > ~0ULL / b ? ~0ULL : a * b;
}

static inline u64 kml_abs_diff(u64 a, u64 b)
{
	return a > b ? a - b : b - a;
}

/* The system's reclaim scans so far (a window keeps its own start values). */
struct kml_nfs_reclaim {
	u64 scans, pages;
};

static inline void kml_nfs_reclaimed(struct kml_nfs_reclaim *r, u64 pages)
{
	r->scans++;
	r->pages = kml_sat_add(r->pages, pages);
}

struct kml_nfs_window {
	u64 t0, n;			/* start (ns); this mount's events in it */
	u64 scans0, pages0;		/* reclaim totals when it opened */
	u64 reads, read_first, read_last, off_last, off_diff;
	u64 dones, done_first, done_last, lat_n, lat_sum;
	u64 pages, page_last, page_diff;
};

/* Opens an empty window at time t (ns). */
static inline void kml_nfs_open(struct kml_nfs_window *w, const struct kml_nfs_reclaim *r,
				u64 t)
{
	*w = (struct kml_nfs_window){ .t0 = t, .scans0 = r->scans, .pages0 = r->pages };
}

/* Whether an event at time t closes the open window: window_ns have passed. */
static inline bool kml_nfs_window_closes(const struct kml_nfs_window *w, u64 t, u64 window_ns)
{
	return w->n && t >= w->t0 && t - w->t0 >= window_ns;
}

/* Adds one of the mount's events (not a reclaim scan) at time t. */
static inline void kml_nfs_add(struct kml_nfs_window *w, unsigned int kind, u64 t, u64 a)
{
	if (kind == KML_NFS_READ) {
		if (w->reads)
			w->off_diff = kml_sat_add(w->off_diff, kml_abs_diff(a, w->off_last));
		else
			w->read_first = t;
		w->read_last = t;
		w->off_last = a;
		w->reads++;
	} else if (kind == KML_NFS_DONE) {
		if (!w->dones)
			w->done_first = t;
		w->done_last = t;
		w->dones++;
		if (a != KML_NFS_NO_LATENCY) {
			w->lat_sum = kml_sat_add(w->lat_sum, a);
			w->lat_n++;
		}
	} else {
		if (w->pages)
			w->page_diff = kml_sat_add(w->page_diff, kml_abs_diff(a, w->page_last));
		w->page_last = a;
		w->pages++;
	}
	w->n++;
}

/* The encoded features of the window, closed at time t with the mount's rsize. */
static inline void kml_nfs_features(const struct kml_nfs_window *w,
				    const struct kml_nfs_reclaim *r, u64 t, u32 rsize,
				    const u8 *frac, s32 *f)
{
	u64 scans = r->scans - w->scans0, reclaimed = r->pages - w->pages0;
	u64 events = kml_sat_add(w->n, scans);

	f[0] = kml_q_div(kml_sat_mul(events, KML_NFS_NSEC_PER_SEC), t - w->t0, frac[0]);
	f[1] = w->lat_n ? kml_q_div(w->lat_sum, kml_sat_mul(w->lat_n, 1000), frac[1]) : 0;
	f[2] = w->reads > 1 ? kml_q_div(w->read_last - w->read_first,
					kml_sat_mul(w->reads - 1, 1000), frac[2]) : 0;
	f[3] = w->dones > 1 ? kml_q_div(w->done_last - w->done_first,
					kml_sat_mul(w->dones - 1, 1000), frac[3]) : 0;
	f[4] = w->reads > 1 ? kml_q_div(w->off_diff, kml_sat_mul(w->reads - 1, 4096), frac[4]) : 0;
	f[5] = w->pages > 1 ? kml_q_div(w->page_diff, w->pages - 1, frac[5]) : 0;
	f[6] = scans ? kml_q_div(reclaimed, scans, frac[6]) : 0;
	f[7] = kml_q_div(rsize, 4096, frac[7]);
}

/*
 * One event of a mount, as the hook handles it: if the event comes
 * window_ns or more after the window opened, the window closes first
 * (without it): its features go to f and the result is true.  Then the
 * event is added, opening a new window if none is open.
 */
static inline bool kml_nfs_step(struct kml_nfs_window *w, const struct kml_nfs_reclaim *r,
				unsigned int kind, u64 t, u64 a, u32 rsize, u64 window_ns,
				const u8 *frac, s32 *f)
{
	bool closes = kml_nfs_window_closes(w, t, window_ns);

	if (closes)
		kml_nfs_features(w, r, t, rsize, frac, f);
	if (closes || !w->n)
		kml_nfs_open(w, r, t);
	kml_nfs_add(w, kind, t, a);
	return closes;
}

/*
 * Smoothing: a majority vote over the rsize of the last k predictions (k
 * clamped to 1..KML_NFS_VOTES; k = 1 is no smoothing).  Classes that ask
 * for the same rsize vote together; a tie goes to the most recent.
 */
#define KML_NFS_VOTES 16

struct kml_nfs_votes {
	u32 rsize[KML_NFS_VOTES];
	u32 head, count;		/* newest at rsize[head] */
};

static inline u32 kml_nfs_vote(struct kml_nfs_votes *v, u32 rsize, u32 k)
{
	u32 i, j, m, best = rsize, best_votes = 0;

	v->head = (v->head + 1) % KML_NFS_VOTES;
	v->rsize[v->head] = rsize;
	if (v->count < KML_NFS_VOTES)
		v->count++;
	k = k < 1 ? 1 : k > KML_NFS_VOTES ? KML_NFS_VOTES : k;
	m = k < v->count ? k : v->count;
	for (i = 0; i < m; i++) {		/* newest first */
		u32 val = v->rsize[(v->head + KML_NFS_VOTES - i) % KML_NFS_VOTES], votes = 0;

		for (j = 0; j < m; j++)
			votes += v->rsize[(v->head + KML_NFS_VOTES - j) % KML_NFS_VOTES] == val;
		if (votes > best_votes) {
			best = val;
			best_votes = votes;
		}
	}
	return best;
}

/*
 * The clamps: the largest power of two in [KML_NFS_RSIZE_MIN,
 * KML_NFS_RSIZE_MAX] (4 KiB .. 256 KiB, the sizes KML's NFSv4 client
 * offered) that is at most both the wanted rsize and the rsize the mount
 * negotiated with its server.  A mount that negotiated less than 4 KiB is
 * left as it is.
 */
#define KML_NFS_RSIZE_MIN 4096U
#define KML_NFS_RSIZE_MAX 262144U

static inline u32 kml_nfs_clamp(u32 want, u32 negotiated)
{
	u32 r = KML_NFS_RSIZE_MAX;

	if (negotiated < KML_NFS_RSIZE_MIN)
		return negotiated;
	while (r > KML_NFS_RSIZE_MIN && (r > want || r > negotiated))
		r >>= 1;
	return r;
}

/* A prediction's rsize, smoothed over the last k and clamped: what to set. */
static inline u32 kml_nfs_decide(struct kml_nfs_votes *v, u32 want, u32 k, u32 negotiated)
{
	return kml_nfs_clamp(kml_nfs_vote(v, want, k), negotiated);
}

#endif /* KML_FEATURES_H */
