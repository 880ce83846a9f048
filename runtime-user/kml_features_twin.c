// SPDX-License-Identifier: GPL-2.0
/*
 * The hooks' feature extractors as a userspace library, with no model
 *
 * Simulators and training scripts turn event streams into the exact
 * features a kmlc hook module computes: the same kml_features.h, built
 * with the twin's flags (kmlc.features loads this file as a shared
 * library).  Every entry point returns the number of feature rows written,
 * or a negative errno.
 */
#include <stdlib.h>
#include <string.h>
#include "kml_features.h"

const u8 kml_ra_float_frac[KML_RA_FEATURES] = KML_RA_FLOAT_FRAC;
const u8 kml_nfs_float_frac[KML_NFS_FEATURES] = KML_NFS_FLOAT_FRAC;

/* The batch extractors' slots (kml_slots()): the s64 id comes first. */
struct kml_ra_file {
	s64 id;
	struct kml_ra_window w;
	u64 cost;			/* the last window's, ns per page (kml_ra_step()) */
};

struct kml_nfs_mount {
	s64 id;
	struct kml_nfs_window w;
};

const unsigned long kml_ra_file_size = sizeof(struct kml_ra_file);
const unsigned long kml_admit_state_size = sizeof(struct kml_admit_state);
const unsigned long kml_nfs_window_size = sizeof(struct kml_nfs_window);
const unsigned long kml_nfs_reclaim_size = sizeof(struct kml_nfs_reclaim);
const unsigned long kml_nfs_votes_size = sizeof(struct kml_nfs_votes);

int kml_ra_step_miss(struct kml_ra_file *f, s64 t, s64 page, u32 ra_pages,
		     u32 window_events, u64 window_ns, const u8 *frac, s32 *features);
u64 kml_ra_file_cost(const struct kml_ra_file *f);
long kml_ra_extract(const s64 *ev, unsigned long n, u32 window_events, u64 window_ns,
		    const u8 *frac, s32 *features, s64 *closed_by);
void kml_admit_step_complete(struct kml_admit_state *s, u32 qlen, u64 lat_ns, u64 bytes);
void kml_admit_step_read(const struct kml_admit_state *s, u64 size, u32 qlen, const u8 *frac,
			 s32 *features);
long kml_admit_extract(const s64 *ev, unsigned long n, const u8 *frac, s32 *features);
int kml_nfs_step_event(struct kml_nfs_window *w, struct kml_nfs_reclaim *r, u32 kind, s64 t,
		       s64 a, u32 rsize, u64 window_ns, const u8 *frac, s32 *features);
void kml_nfs_step_reclaim(struct kml_nfs_reclaim *r, u64 pages);
u32 kml_nfs_step_decide(struct kml_nfs_votes *v, u32 want, u32 k, u32 negotiated);
long kml_nfs_extract(const s64 *ev, unsigned long n, u64 window_ns, const u8 *frac,
		     s32 *features, s64 *closed_by);

/*
 * Readahead, one miss at a time, for simulators: f is one file's state
 * (zeroed to start), t the time in ns, ra_pages the file's readahead now.
 * Returns 1 when this miss closes a window (its features written), else 0:
 * the hook's own step (kml_ra_step(), kml_features.h), without the model.
 */
int kml_ra_step_miss(struct kml_ra_file *f, s64 t, s64 page, u32 ra_pages,
		     u32 window_events, u64 window_ns, const u8 *frac, s32 *features)
{
	return kml_ra_step(&f->w, (u64)t, (u64)page, ra_pages, window_events, window_ns, frac,
			   features, &f->cost);
}

/* The cost of the last window f closed (the benefit guard's, kml_ra_step()). */
u64 kml_ra_file_cost(const struct kml_ra_file *f)
{
	return f->cost;
}

/* Slots of the batch extractors: structs whose first member is an s64 id. */
static int kml_cmp_id(const void *a, const void *b)
{
	s64 x = *(const s64 *)a, y = *(const s64 *)b;

	return x < y ? -1 : x > y;
}

/*
 * One zeroed slot of size bytes per distinct id in column col of the n
 * rows of cols values in ev, sorted by id, which each slot starts with;
 * *count gets their number.  NULL when out of memory.  Find a key's slot
 * with kml_slot().
 */
static void *kml_slots(const s64 *ev, unsigned long n, unsigned int cols, unsigned int col,
		       size_t size, unsigned long *count)
{
	unsigned char *slots = calloc(n ? n : 1, size);
	unsigned long i, k = 0;

	if (!slots)
		return NULL;
	for (i = 0; i < n; i++)
		*(s64 *)(slots + i * size) = ev[cols * i + col];
	qsort(slots, n, size, kml_cmp_id);
	for (i = 0; i < n; i++)
		if (!k || *(s64 *)(slots + (k - 1) * size) != *(s64 *)(slots + i * size))
			*(s64 *)(slots + k++ * size) = *(s64 *)(slots + i * size);
	*count = k;
	return slots;
}

static void *kml_slot(void *slots, unsigned long count, size_t size, s64 id)
{
	return bsearch(&id, slots, count, size, kml_cmp_id);
}

/*
 * Readahead: ev holds n rows {time ns, file id, page index, ra_pages}, in
 * time order; each row is a miss that reached readahead, with the file's
 * readahead at that moment.  Windows open and close per file exactly as in
 * the hook (kml_ra_window_closes()); a closed window writes its encoded
 * features and the index of the event that closed it.  Unlike the module,
 * whose table has 256 slots, files never share state here.
 */
long kml_ra_extract(const s64 *ev, unsigned long n, u32 window_events, u64 window_ns,
		    const u8 *frac, s32 *features, s64 *closed_by)
{
	struct kml_ra_file *files;
	unsigned long i, nfiles, windows = 0;

	files = kml_slots(ev, n, 4, 1, sizeof(*files), &nfiles);	/* one per file id */
	if (!files)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		const s64 *e = ev + 4 * i;
		struct kml_ra_file *f = kml_slot(files, nfiles, sizeof(*files), e[1]);

		if (kml_ra_step_miss(f, e[0], e[2], (u32)e[3], window_events, window_ns, frac,
				     features + windows * KML_RA_FEATURES))
			closed_by[windows++] = (s64)i;
	}
	free(files);
	return (long)windows;
}

/* Admission, one event at a time: a completion (read or write) on the primary, and a read. */
void kml_admit_step_complete(struct kml_admit_state *s, u32 qlen, u64 lat_ns, u64 bytes)
{
	kml_admit_complete(s, qlen, lat_ns, bytes);
}

void kml_admit_step_read(const struct kml_admit_state *s, u64 size, u32 qlen, const u8 *frac,
			 s32 *features)
{
	kml_admit_features(s, size, qlen, frac, features);
}

/*
 * Admission: ev holds n rows {kind, a, b, c} in time order, as the
 * module's trace records them: kind 0 is a read offered to the primary
 * (a: size in bytes, b: reads and writes in flight on the primary), kind 1
 * a read's and kind 2 a write's completion on the primary (a: its queue
 * length at submit, b: latency ns, c: bytes).  Writes one feature row per
 * read; returns the number of reads, or -EINVAL for an unknown kind.
 */
long kml_admit_extract(const s64 *ev, unsigned long n, const u8 *frac, s32 *features)
{
	struct kml_admit_state st;
	unsigned long i, reads = 0;

	memset(&st, 0, sizeof(st));
	for (i = 0; i < n; i++, ev += 4) {
		if (ev[0] == 1 || ev[0] == 2)
			kml_admit_complete(&st, (u32)ev[1], (u64)ev[2], (u64)ev[3]);
		else if (ev[0] == 0)
			kml_admit_features(&st, (u64)ev[1], (u32)ev[2], frac,
					   features + reads++ * KML_ADMIT_FEATURES);
		else
			return -EINVAL;
	}
	return (long)reads;
}

/*
 * NFS rsize, one event of a mount at a time, for simulators: w is the
 * mount's window state and r the system's reclaim totals (both zeroed to
 * start), kind KML_NFS_READ, _DONE or _PAGE, t the time in ns, a the
 * offset, latency (ns, or -1: unknown) or page index, rsize the mount's
 * rsize now.  Returns 1 when the event closes a window (its features
 * written), else 0: exactly the hook's kml_event() without the model.
 */
int kml_nfs_step_event(struct kml_nfs_window *w, struct kml_nfs_reclaim *r, u32 kind, s64 t,
		       s64 a, u32 rsize, u64 window_ns, const u8 *frac, s32 *features)
{
	return kml_nfs_step(w, r, kind, (u64)t, (u64)a, rsize, window_ns, frac, features);
}

/* A reclaim scan anywhere in the system that reclaimed pages. */
void kml_nfs_step_reclaim(struct kml_nfs_reclaim *r, u64 pages)
{
	kml_nfs_reclaimed(r, pages);
}

/* The rsize the hook sets for a prediction asking want (its vote and clamps). */
u32 kml_nfs_step_decide(struct kml_nfs_votes *v, u32 want, u32 k, u32 negotiated)
{
	return kml_nfs_decide(v, want, k, negotiated);
}

/*
 * NFS rsize: ev holds n rows {time ns, kind, mount id, a, rsize}, in time
 * order: kind 0 a READ sent (a: offset), 1 a READ done (a: latency ns, -1
 * unknown), 2 a page added to the mount's page cache (a: index), 3 a
 * reclaim scan anywhere (a: pages reclaimed; mount ignored); rsize is the
 * mount's rsize at that moment.  Windows open and close per mount exactly
 * as in the hook (kml_nfs_step()); a closed window writes its encoded
 * features and the index of the event that closed it.
 */
long kml_nfs_extract(const s64 *ev, unsigned long n, u64 window_ns, const u8 *frac,
		     s32 *features, s64 *closed_by)
{
	struct kml_nfs_mount *mounts;
	struct kml_nfs_reclaim r = { 0, 0 };
	unsigned long i, nmounts, windows = 0;

	mounts = kml_slots(ev, n, 5, 2, sizeof(*mounts), &nmounts);	/* one per mount id */
	if (!mounts)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		const s64 *e = ev + 5 * i;
		struct kml_nfs_mount *m;

		if (e[1] == KML_NFS_RECLAIM) {
			kml_nfs_reclaimed(&r, (u64)e[3]);
			continue;
		}
		m = kml_slot(mounts, nmounts, sizeof(*mounts), e[2]);
		if (kml_nfs_step(&m->w, &r, (unsigned int)e[1], (u64)e[0], (u64)e[3], (u32)e[4],
				 window_ns, frac, features + windows * KML_NFS_FEATURES))
			closed_by[windows++] = (s64)i;
	}
	free(mounts);
	return (long)windows;
}
