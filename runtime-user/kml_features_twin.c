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

struct kml_ra_file {
	s64 id;
	u64 t0;				/* when the open window started, ns */
	struct kml_ra_window w;
};

const unsigned long kml_ra_file_size = sizeof(struct kml_ra_file);
const unsigned long kml_admit_state_size = sizeof(struct kml_admit_state);

int kml_ra_step(struct kml_ra_file *f, s64 t, s64 page, u32 ra_pages, u32 window_events,
		u64 window_ns, const u8 *frac, s32 *features);
long kml_ra_extract(const s64 *ev, unsigned long n, u32 window_events, u64 window_ns,
		    const u8 *frac, s32 *features, s64 *closed_by);
void kml_admit_step_complete(struct kml_admit_state *s, u32 qlen, u64 lat_ns, u64 bytes);
void kml_admit_step_read(const struct kml_admit_state *s, u64 size, u32 qlen, const u8 *frac,
			 s32 *features);
long kml_admit_extract(const s64 *ev, unsigned long n, const u8 *frac, s32 *features);

/*
 * Readahead, one miss at a time, for simulators: f is one file's state
 * (zeroed to start), t the time in ns, ra_pages the file's readahead now.
 * Returns 1 when this miss closes a window (its features written), else 0:
 * exactly the hook's kml_miss() without the model.
 */
int kml_ra_step(struct kml_ra_file *f, s64 t, s64 page, u32 ra_pages, u32 window_events,
		u64 window_ns, const u8 *frac, s32 *features)
{
	if (!f->w.n)
		f->t0 = (u64)t;
	kml_ra_add(&f->w, (u64)page);
	if (!kml_ra_window_closes(&f->w, (u64)t - f->t0, window_events, window_ns))
		return 0;
	kml_ra_features(&f->w, ra_pages, frac, features);
	kml_ra_reset(&f->w);
	return 1;
}

static int kml_cmp_id(const void *a, const void *b)
{
	s64 x = ((const struct kml_ra_file *)a)->id, y = ((const struct kml_ra_file *)b)->id;

	return x < y ? -1 : x > y;
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
	struct kml_ra_file *files, key;
	unsigned long i, nfiles = 0, windows = 0;

	files = calloc(n ? n : 1, sizeof(*files));
	if (!files)
		return -ENOMEM;
	for (i = 0; i < n; i++)		/* one slot per distinct file id */
		files[i].id = ev[4 * i + 1];
	qsort(files, n, sizeof(*files), kml_cmp_id);
	for (i = 0; i < n; i++)
		if (!nfiles || files[nfiles - 1].id != files[i].id)
			files[nfiles++].id = files[i].id;
	for (i = 0; i < n; i++) {
		const s64 *e = ev + 4 * i;
		struct kml_ra_file *f;

		key.id = e[1];
		f = bsearch(&key, files, nfiles, sizeof(*files), kml_cmp_id);
		if (kml_ra_step(f, e[0], e[2], (u32)e[3], window_events, window_ns, frac,
				features + windows * KML_RA_FEATURES))
			closed_by[windows++] = (s64)i;
	}
	free(files);
	return (long)windows;
}

/* Admission, one event at a time: a completion on the primary, and a read. */
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
 * module's trace records them: kind 0 is a read on the primary (a: size in
 * bytes, b: reads in flight), kind 1 a completion on the primary (a: its
 * queue length at submit, b: latency ns, c: bytes).  Writes one feature
 * row per read.
 */
long kml_admit_extract(const s64 *ev, unsigned long n, const u8 *frac, s32 *features)
{
	struct kml_admit_state st;
	unsigned long i, reads = 0;

	memset(&st, 0, sizeof(st));
	for (i = 0; i < n; i++, ev += 4) {
		if (ev[0] == 1)
			kml_admit_complete(&st, (u32)ev[1], (u64)ev[2], (u64)ev[3]);
		else
			kml_admit_features(&st, (u64)ev[1], (u32)ev[2], frac,
					   features + reads++ * KML_ADMIT_FEATURES);
	}
	return (long)reads;
}
