/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The readahead hook's trace events, under events/kml_<model>/ in tracefs
 *
 * kml_ra_miss: a page-cache miss of a tracked file that reached readahead.
 *   file	the file's id (one per struct file the hook tracks)
 *   seq	the file's miss count before this one: the order of its misses
 *   index	the page offset
 *   ra_pages	the file's readahead when the miss came, before the hook acts
 *   flags	KML_RA_NEW (the miss starts a window), KML_RA_CLOSES (it closes
 *		one), KML_RA_FAULT (a page fault rather than a read)
 *   f		the features of the window the miss closes (zeros otherwise)
 * kml_ra_decision: the model's class for the window that miss seq of file
 *   closed, and the readahead it set (pages).
 *
 * Replay (kmlc.hooks.readahead) reads these fields by the names printed
 * here: this header is the one definition of the format.
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM KML_TRACE_SYSTEM

#if !defined(KML_RA_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define KML_RA_TRACE_H

#include <linux/tracepoint.h>
#include "kml_features.h"

TRACE_EVENT(kml_ra_miss,
	    TP_PROTO(u64 file, u64 seq, u64 index, u32 ra_pages, u32 flags, const s32 *f),
	    TP_ARGS(file, seq, index, ra_pages, flags, f),
	    TP_STRUCT__entry(__field(u64, file)
			     __field(u64, seq)
			     __field(u64, index)
			     __field(u32, ra_pages)
			     __field(u32, flags)
			     __array(s32, f, KML_RA_FEATURES)),
	    TP_fast_assign(__entry->file = file;
			   __entry->seq = seq;
			   __entry->index = index;
			   __entry->ra_pages = ra_pages;
			   __entry->flags = flags;
			   memcpy(__entry->f, f, sizeof(__entry->f))),
	    TP_printk("file=%llu seq=%llu index=%llu ra_pages=%u flags=%u f=%d,%d,%d,%d,%d",
		      __entry->file, __entry->seq, __entry->index, __entry->ra_pages,
		      __entry->flags, __entry->f[0], __entry->f[1], __entry->f[2],
		      __entry->f[3], __entry->f[4])
);

TRACE_EVENT(kml_ra_decision,
	    TP_PROTO(u64 file, u64 seq, int cls, u32 ra_pages),
	    TP_ARGS(file, seq, cls, ra_pages),
	    TP_STRUCT__entry(__field(u64, file)
			     __field(u64, seq)
			     __field(int, cls)
			     __field(u32, ra_pages)),
	    TP_fast_assign(__entry->file = file;
			   __entry->seq = seq;
			   __entry->cls = cls;
			   __entry->ra_pages = ra_pages),
	    TP_printk("file=%llu seq=%llu cls=%d ra_pages=%u",
		      __entry->file, __entry->seq, __entry->cls, __entry->ra_pages)
);

#endif /* KML_RA_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE kml_ra_trace
#include <trace/define_trace.h>
