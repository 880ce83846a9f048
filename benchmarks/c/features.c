// SPDX-License-Identifier: GPL-2.0
/*
 * Per-event cost of the hooks' feature steps, through the twin's feature
 * library (runtime-user/kml_features_twin.c, which compiles the hooks' own
 * kml_features.h): what a kprobe or tracepoint handler computes for one
 * event, without the module's table lookup and locking.
 *
 *   features ra|nfs EVENTS ROUNDS
 *
 * Synthetic streams, the same every run: readahead, 64 files read in turn,
 * half sequentially and half at random pages, 64-event windows; NFS, 4
 * mounts, each event a READ sent, a READ done or a page added (every 16th
 * event a reclaim scan), 100 us apart, 1 s windows.  Prints, per round,
 * "ns_per_event windows".  Built with the twin's flags (benchmarks/bench_c.py).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kml_features.h"

/* The twin library's slots and steps (kml_features_twin.c, linked in). */
struct kml_ra_file {
	s64 id;
	struct kml_ra_window w;
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

int main(int argc, char **argv)
{
	long n, rounds, i, k, windows = 0;
	u64 seed = 1;
	double ns;

	if (argc != 4)
		return 2;
	n = atol(argv[2]);
	rounds = atol(argv[3]);
	if (!strcmp(argv[1], "ra")) {
		struct ra_ev *ev = calloc(n, sizeof(*ev));
		s64 next[FILES] = { 0 };

		for (i = 0; i < n; i++) {
			u32 file = i % FILES;

			ev[i].file = file;
			ev[i].t = i * 1000;
			ev[i].page = file & 1 ? (s64)rng(&seed) % 262144 : next[file]++ * 4;
		}
		for (k = 0; k < rounds; k++) {
			windows = run_ra(ev, n, &ns);
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
