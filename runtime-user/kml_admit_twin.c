// SPDX-License-Identifier: GPL-2.0
/*
 * The admission hook's trace replayed in the userspace twin, through the
 * module's own feature code (kml_features.h) and decision (kml_binding.h)
 */
#include "kml_binding.h"

long kml_twin_replay(const s64 *ev, unsigned long n, s32 *features, s32 *decisions, void *buf);

/*
 * ev holds n rows {kind, a, b, c} of one mirror, in their order: kind 0 a
 * read offered (a: size in bytes, b: reads and writes in flight on the
 * primary), kind 1 a read's and kind 2 a write's completion on the primary
 * that entered the history (a: its queue length at submission, b: latency
 * ns, c: bytes).  For each read, writes its encoded features and decision
 * (1 decline, 0 admit).  Returns the number of reads, or a negative errno
 * (-EINVAL for an unknown kind).
 */
long kml_twin_replay(const s64 *ev, unsigned long n, s32 *features, s32 *decisions, void *buf)
{
	struct kml_admit_state st = { 0 };
	unsigned long i, reads = 0;
	s32 *f;
	int d;

	for (i = 0; i < n; i++, ev += 4) {
		if (ev[0] == 1 || ev[0] == 2) {
			kml_admit_complete(&st, (u32)ev[1], (u64)ev[2], (u64)ev[3]);
			continue;
		}
		if (ev[0] != 0)
			return -EINVAL;
		f = features + reads * KML_ADMIT_FEATURES;
		kml_admit_features(&st, (u64)ev[1], (u32)ev[2], kml_model_frac(), f);
		d = kml_model_decide(f, buf);
		if (d < 0)
			return d;
		decisions[reads++] = d;
	}
	return (long)reads;
}
