// SPDX-License-Identifier: GPL-2.0
/*
 * Per-event cost of the hooks' feature steps, through the twin's feature
 * library (runtime-user/kml_features_twin.c, which compiles the hooks' own
 * kml_features.h): what a kprobe or tracepoint handler computes for one
 * event, without the module's table lookup and locking.
 *
 *   features ra|nfs|guard|noguard EVENTS ROUNDS
 *
 * Synthetic streams, the same every run: readahead, 64 files read in turn,
 * half sequentially and half at random pages, 64-event windows; NFS, 4
 * mounts, each event a READ sent, a READ done or a page added (every 16th
 * event a reclaim scan), 100 us apart, 1 s windows; guard, one decision
 * per event through kml_guard.h as kml_guarded_decide() takes it (the
 * envelope check of 5 features, then kml_guard_decide() for one of 64
 * keys) with every guard on (envelope 10% of 256, benefit 1 in 8 over 64
 * samples, rate 1 s), and each decision's cost reported when it has an
 * arm; noguard, the same with every guard off.  Prints, per round,
 * "ns_per_event windows" (guard: periods ended).  Built with the twin's
 * flags (benchmarks/bench_c.py).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kml_features.h"
#include "kml_guard.h"

/* The twin library's slots and steps (kml_features_twin.c, linked in). */
struct kml_ra_file {
	s64 id;
	struct kml_ra_window w;
	u64 cost;
};

int kml_ra_step_miss(struct kml_ra_file *f, s64 t, s64 page, u32 ra_pages,
		     u32 window_events, u64 window_ns, const u8 *frac, s32 *features);
int kml_nfs_step_event(struct kml_nfs_window *w, struct kml_nfs_reclaim *r, u32 kind, s64 t,
		       s64 a, u32 rsize, u64 window_ns, const u8 *frac, s32 *features);
void kml_nfs_step_reclaim(struct kml_nfs_reclaim *r, u64 pages);

#define FILES 64
#define MOUNTS 4

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static u64 rng(u64 *s)
{
	*s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
	return *s >> 33;
}

/* Each event: the file, its page, its time; drawn before timing. */
struct ra_ev {
	u32 file;
	s64 page, t;
};

static long run_ra(const struct ra_ev *ev, long n, double *ns)
{
	static const u8 frac[KML_RA_FEATURES] = { 0, 4, 4, 4, 16 };
	static struct kml_ra_file files[FILES];
	s32 f[KML_RA_FEATURES];
	long i, windows = 0;
	double t0;

	memset(files, 0, sizeof(files));
	t0 = now_ns();
	for (i = 0; i < n; i++)
		windows += kml_ra_step_miss(&files[ev[i].file], ev[i].t, ev[i].page, 32, 64,
					    1000000000ULL, frac, f);
	*ns = (now_ns() - t0) / n;
	return windows;
}

struct nfs_ev {
	u32 mount, kind;
	s64 a, t;
};

static long run_nfs(const struct nfs_ev *ev, long n, double *ns)
{
	static const u8 frac[KML_NFS_FEATURES] = { 4, 4, 4, 4, 8, 8, 8, 8 };
	static struct kml_nfs_window w[MOUNTS];
	struct kml_nfs_reclaim r = { 0, 0 };
	s32 f[KML_NFS_FEATURES];
	long i, windows = 0;
	double t0;

	memset(w, 0, sizeof(w));
	t0 = now_ns();
	for (i = 0; i < n; i++) {
		if (ev[i].kind == KML_NFS_RECLAIM)
			kml_nfs_step_reclaim(&r, (u64)ev[i].a);
		else
			windows += kml_nfs_step_event(&w[ev[i].mount], &r, ev[i].kind, ev[i].t,
						      ev[i].a, 262144, 1000000000ULL, frac, f);
	}
	*ns = (now_ns() - t0) / n;
	return windows;
}

#define KEYS 64

volatile long kml_bench_sink;

/* One guarded decision and its cost, as a hook takes them (noinline: callgrind counts it). */
__attribute__((noinline)) int kml_bench_guard_step(struct kml_guard *g,
						   const struct kml_guard_cfg *c,
						   struct kml_guard_key *k, const s32 *f, s32 model,
						   u64 now, u64 cost)
{
	static const s32 lo[KML_RA_FEATURES] = { 0, 0, 0, 0, 0 };
	static const s32 hi[KML_RA_FEATURES] = { 1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20 };
	bool outside = c->envelope_pct && kml_guard_outside(f, lo, hi, KML_RA_FEATURES);
	u32 arm, why;
	s32 d = kml_guard_decide(g, c, k, model, KML_GUARD_KERNEL, outside, 0, now, &arm, &why);

	return kml_guard_cost(g, c, arm, 0, cost) + d;
}

static long run_guard(const struct ra_ev *ev, long n, const struct kml_guard_cfg *c, double *ns)
{
	static struct kml_guard_key keys[KEYS];
	struct kml_guard g;
	s32 f[KML_RA_FEATURES];
	long i, sum = 0;
	double t0;

	memset(keys, 0, sizeof(keys));
	memset(&g, 0, sizeof(g));
	t0 = now_ns();
	for (i = 0; i < n; i++) {
		f[0] = f[1] = f[2] = f[3] = (s32)(ev[i].page & 0x1fffff);
		f[4] = 1 << 16;
		sum += kml_bench_guard_step(&g, c, &keys[ev[i].file], f, (s32)(ev[i].page & 3),
					    (u64)ev[i].t, (u64)(ev[i].page & 1023));
	}
	*ns = (now_ns() - t0) / n;
	kml_bench_sink = sum;	/* the decisions are used */
	return (long)g.periods;
}

int main(int argc, char **argv)
{
	long n, rounds, i, k, windows = 0;
	u64 seed = 1;
	double ns;

	if (argc != 4)
		return 2;
	n = atol(argv[2]);
	rounds = atol(argv[3]);
	if (!strcmp(argv[1], "ra") || !strcmp(argv[1], "guard") || !strcmp(argv[1], "noguard")) {
		struct ra_ev *ev = calloc(n, sizeof(*ev));
		s64 next[FILES] = { 0 };
		struct kml_guard_cfg on = { 0, 10, 256, 8, 64, 2, 2, 1000, 64 };
		struct kml_guard_cfg off = { 0, 0, 256, 0, 64, 2, 2, 0, 64 };

		for (i = 0; i < n; i++) {
			u32 file = i % FILES;

			ev[i].file = file;
			ev[i].t = i * 1000;
			ev[i].page = file & 1 ? (s64)rng(&seed) % 262144 : next[file]++ * 4;
		}
		for (k = 0; k < rounds; k++) {
			if (argv[1][0] == 'r')
				windows = run_ra(ev, n, &ns);
			else
				windows = run_guard(ev, n, argv[1][0] == 'g' ? &on : &off, &ns);
			printf("%.2f %ld\n", ns, windows);
		}
		free(ev);
	} else if (!strcmp(argv[1], "nfs")) {
		struct nfs_ev *ev = calloc(n, sizeof(*ev));
		s64 off[MOUNTS] = { 0 };

		for (i = 0; i < n; i++) {
			u32 m = i % MOUNTS;

			ev[i].mount = m;
			ev[i].t = i * 100000;
			ev[i].kind = i % 16 == 15 ? KML_NFS_RECLAIM : (u32)(i / MOUNTS) % 3;
			if (ev[i].kind == KML_NFS_READ)
				ev[i].a = m & 1 ? (s64)(rng(&seed) % 65536) * 4096 : (off[m] += 65536);
			else if (ev[i].kind == KML_NFS_DONE)
				ev[i].a = 150000 + (s64)(rng(&seed) % 100000);
			else if (ev[i].kind == KML_NFS_PAGE)
				ev[i].a = (s64)(rng(&seed) % 1000000);
			else
				ev[i].a = (s64)(rng(&seed) % 64);
		}
		for (k = 0; k < rounds; k++) {
			windows = run_nfs(ev, n, &ns);
			printf("%.2f %ld\n", ns, windows);
		}
		free(ev);
	} else {
		return 2;
	}
	return windows < 0;
}
