/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The NFS rsize hook's trace events, under events/kml_<model>/ in tracefs
 *
 * kml_nfs_event: an event of a tracked mount.
 *   mount	the mount's id (a mount started afresh gets a new one)
 *   seq	the mount's event count before this one: the events' order
 *   kind	KML_NFS_READ (a READ sent), _DONE (a READ done), _PAGE (a page
 *		added to the mount's page cache)
 *   t		ns since the module loaded
 *   a		offset, latency (ns; -1: the send was not seen) or page index
 *   rsize	the mount's rsize when the event came
 *   orig	the rsize the mount negotiated
 *   scans, pages  the system's reclaim scans and pages reclaimed so far
 *   flags	KML_NFS_OPENS (the event opens a window), KML_NFS_CLOSES (the
 *		window closed before it: features f)
 *   window	the number of the window closed here, 0 none
 * kml_nfs_decision: the model's class for window, the rsize its class asks
 *   (want), the vote length and what kml_nfs_decide() voted (rsize; the
 *   guards may apply the negotiated rsize instead: kml_guard events).
 *
 * Replay (kmlc.hooks.nfs_rsize) reads these fields by the names printed
 * here: this header is the one definition of the format.
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM KML_TRACE_SYSTEM

#if !defined(KML_NFS_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define KML_NFS_TRACE_H

#include <linux/tracepoint.h>
#include "kml_features.h"

TRACE_EVENT(kml_nfs_event,
	    TP_PROTO(u32 mount, u64 seq, u32 kind, u64 t, u64 a, u32 rsize, u32 orig,
		     const struct kml_nfs_reclaim *r, u32 flags, u64 window, const s32 *f),
	    TP_ARGS(mount, seq, kind, t, a, rsize, orig, r, flags, window, f),
	    TP_STRUCT__entry(__field(u32, mount)
			     __field(u64, seq)
			     __field(u32, kind)
			     __field(u64, t)
			     __field(u64, a)
			     __field(u32, rsize)
			     __field(u32, orig)
			     __field(u64, scans)
			     __field(u64, pages)
			     __field(u32, flags)
			     __field(u64, window)
			     __array(s32, f, KML_NFS_FEATURES)),
	    TP_fast_assign(__entry->mount = mount;
			   __entry->seq = seq;
			   __entry->kind = kind;
			   __entry->t = t;
			   __entry->a = a;
			   __entry->rsize = rsize;
			   __entry->orig = orig;
			   __entry->scans = r->scans;
			   __entry->pages = r->pages;
			   __entry->flags = flags;
			   __entry->window = window;
			   memcpy(__entry->f, f, sizeof(__entry->f))),
	    TP_printk("mount=%u seq=%llu kind=%u t=%llu a=%lld rsize=%u orig=%u scans=%llu pages=%llu flags=%u window=%llu f=%d,%d,%d,%d,%d,%d,%d,%d",
		      __entry->mount, __entry->seq, __entry->kind, __entry->t,
		      (s64)__entry->a, __entry->rsize, __entry->orig, __entry->scans,
		      __entry->pages, __entry->flags, __entry->window, __entry->f[0],
		      __entry->f[1], __entry->f[2], __entry->f[3], __entry->f[4],
		      __entry->f[5], __entry->f[6], __entry->f[7])
);

TRACE_EVENT(kml_nfs_decision,
	    TP_PROTO(u32 mount, u64 seq, u64 window, int cls, u32 want, u32 vote, u32 orig,
		     u32 rsize),
	    TP_ARGS(mount, seq, window, cls, want, vote, orig, rsize),
	    TP_STRUCT__entry(__field(u32, mount)
			     __field(u64, seq)
			     __field(u64, window)
			     __field(int, cls)
			     __field(u32, want)
			     __field(u32, vote)
			     __field(u32, orig)
			     __field(u32, rsize)),
	    TP_fast_assign(__entry->mount = mount;
			   __entry->seq = seq;
			   __entry->window = window;
			   __entry->cls = cls;
			   __entry->want = want;
			   __entry->vote = vote;
			   __entry->orig = orig;
			   __entry->rsize = rsize),
	    TP_printk("mount=%u seq=%llu window=%llu cls=%d want=%u vote=%u orig=%u rsize=%u",
		      __entry->mount, __entry->seq, __entry->window, __entry->cls,
		      __entry->want, __entry->vote, __entry->orig, __entry->rsize)
);

#endif /* KML_NFS_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE kml_nfs_trace
#include <trace/define_trace.h>
