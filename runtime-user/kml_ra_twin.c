// SPDX-License-Identifier: GPL-2.0
/*
 * The readahead hook's trace replayed in the userspace twin, through the
 * module's own window code (kml_features.h) and decision (kml_binding.h)
 */
#include "kml_binding.h"

long kml_twin_replay(const s64 *ev, unsigned long n, s32 *features, s32 *classes, void *buf);

/*
 * ev holds n rows {file, page index, ra_pages, flags}, each file's misses
 * together and in their order, as the kml_ra_miss events list them
 * (flags: KML_RA_NEW the miss opens a window, KML_RA_CLOSES it closes
 * one).  For each window closed, writes its encoded features and class.
 * Returns the number of windows, or a negative errno.
 */
long kml_twin_replay(const s64 *ev, unsigned long n, s32 *features, s32 *classes, void *buf)
{
	struct kml_ra_window w = { 0 };
	unsigned long i, windows = 0;
	s64 file = 0;
	s32 *f;
	int cls;

	for (i = 0; i < n; i++, ev += 4) {
		if (!i || ev[0] != file || (ev[3] & KML_RA_NEW)) {
			file = ev[0];
			kml_ra_reset(&w);
		}
		kml_ra_add(&w, (u64)ev[1]);
		if (!(ev[3] & KML_RA_CLOSES))
			continue;
		f = features + windows * KML_RA_FEATURES;
		kml_ra_features(&w, (u32)ev[2], kml_model_frac(), f);
		cls = kml_model_decide(f, buf);
		if (cls < 0)
			return cls;
		classes[windows++] = cls;
		kml_ra_reset(&w);
	}
	return (long)windows;
}
