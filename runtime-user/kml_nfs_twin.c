// SPDX-License-Identifier: GPL-2.0
/*
 * The NFS rsize hook's trace replayed in the userspace twin, through the
 * module's own window code, votes and clamps (kml_features.h) and decision
 * (kml_binding.h)
 */
#include "kml_binding.h"

long kml_twin_replay(const s64 *ev, unsigned long n, s32 *features, s32 *decisions, void *buf);

#define KML_NFS_DECISION 4

/*
 * ev holds n rows {kind, mount, t, a, rsize, orig, flags, window, scans,
 * pages, want, vote}, each mount's together and in their order, as the
 * kml_nfs_event and kml_nfs_decision events list them.  An event (kind
 * KML_NFS_READ, _DONE or _PAGE; a its offset, latency or page index;
 * scans and pages the reclaim totals it saw) first closes the window
 * (flags KML_NFS_CLOSES: its features go to features), opens one
 * (KML_NFS_OPENS), then joins it.  A decision (kind KML_NFS_DECISION; a:
 * the index of its window's features) decides that window again and
 * votes and clamps the rsize its class asks (want) as the module did:
 * {class, rsize} to decisions.  Returns the number of windows, or a
 * negative errno.
 */
long kml_twin_replay(const s64 *ev, unsigned long n, s32 *features, s32 *decisions, void *buf)
{
	struct kml_nfs_window w = { 0 };
	struct kml_nfs_votes v = { 0 };
	struct kml_nfs_reclaim r;
	unsigned long i, windows = 0, decided = 0;
	s64 mount = 0;
	int cls;

	for (i = 0; i < n; i++, ev += 12) {
		if (!i || ev[1] != mount) {
			mount = ev[1];
			w = (struct kml_nfs_window){ 0 };
			v = (struct kml_nfs_votes){ 0 };
		}
		if (ev[0] == KML_NFS_DECISION) {
			if (ev[3] < 0 || (unsigned long)ev[3] >= windows)
				return -EINVAL;
			cls = kml_model_decide(features + ev[3] * KML_NFS_FEATURES, buf);
			if (cls < 0)
				return cls;
			decisions[2 * decided] = cls;
			decisions[2 * decided++ + 1] = (s32)kml_nfs_decide(&v, (u32)ev[10],
									(u32)ev[11], (u32)ev[5]);
			continue;
		}
		if (ev[0] < KML_NFS_READ || ev[0] > KML_NFS_PAGE)
			return -EINVAL;
		r.scans = (u64)ev[8];
		r.pages = (u64)ev[9];
		if (ev[6] & KML_NFS_CLOSES)
			kml_nfs_features(&w, &r, (u64)ev[2], (u32)ev[4], kml_model_frac(),
					 features + windows++ * KML_NFS_FEATURES);
		if (ev[6] & KML_NFS_OPENS)
			kml_nfs_open(&w, &r, (u64)ev[2]);
		kml_nfs_add(&w, (unsigned int)ev[0], (u64)ev[2], (u64)ev[3]);
	}
	return (long)windows;
}
