/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The admission hook's trace events, under events/kml_<model>/ in tracefs
 *
 * kml_admit_read: a read offered to the mirror.
 *   mirror	the table's id (one per dm table the target constructs)
 *   seq	the mirror's event count before this one: the events' order
 *   size	bytes
 *   qlen	reads and writes in flight on the primary (leg 0)
 *   decision	the model's: 1 decline, 0 admit, -1 none (detached, error)
 *   leg	the leg the read went to
 *   f		the encoded features the model saw
 * kml_admit_done: a read or write that completed on the primary and
 *   entered the history.
 *   write	0 a read, 1 a write
 *   qlen	its queue length at submission
 *   lat_ns, bytes
 *
 * Replay (kmlc.hooks.admission) reads these fields by the names printed
 * here: this header is the one definition of the format.
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM KML_TRACE_SYSTEM

#if !defined(KML_ADMIT_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define KML_ADMIT_TRACE_H

#include <linux/tracepoint.h>
#include "kml_features.h"

TRACE_EVENT(kml_admit_read,
	    TP_PROTO(u64 mirror, u64 seq, u64 size, u32 qlen, int decision, int leg,
		     const s32 *f),
	    TP_ARGS(mirror, seq, size, qlen, decision, leg, f),
	    TP_STRUCT__entry(__field(u64, mirror)
			     __field(u64, seq)
			     __field(u64, size)
			     __field(u32, qlen)
			     __field(int, decision)
			     __field(int, leg)
			     __array(s32, f, KML_ADMIT_FEATURES)),
	    TP_fast_assign(__entry->mirror = mirror;
			   __entry->seq = seq;
			   __entry->size = size;
			   __entry->qlen = qlen;
			   __entry->decision = decision;
			   __entry->leg = leg;
			   memcpy(__entry->f, f, sizeof(__entry->f))),
	    TP_printk("mirror=%llu seq=%llu size=%llu qlen=%u decision=%d leg=%d f=%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d",
		      __entry->mirror, __entry->seq, __entry->size, __entry->qlen,
		      __entry->decision, __entry->leg, __entry->f[0], __entry->f[1],
		      __entry->f[2], __entry->f[3], __entry->f[4], __entry->f[5],
		      __entry->f[6], __entry->f[7], __entry->f[8], __entry->f[9],
		      __entry->f[10])
);

TRACE_EVENT(kml_admit_done,
	    TP_PROTO(u64 mirror, u64 seq, int write, u32 qlen, u64 lat_ns, u64 bytes),
	    TP_ARGS(mirror, seq, write, qlen, lat_ns, bytes),
	    TP_STRUCT__entry(__field(u64, mirror)
			     __field(u64, seq)
			     __field(int, write)
			     __field(u32, qlen)
			     __field(u64, lat_ns)
			     __field(u64, bytes)),
	    TP_fast_assign(__entry->mirror = mirror;
			   __entry->seq = seq;
			   __entry->write = write;
			   __entry->qlen = qlen;
			   __entry->lat_ns = lat_ns;
			   __entry->bytes = bytes),
	    TP_printk("mirror=%llu seq=%llu write=%d qlen=%u lat_ns=%llu bytes=%llu",
		      __entry->mirror, __entry->seq, __entry->write, __entry->qlen,
		      __entry->lat_ns, __entry->bytes)
);

#endif /* KML_ADMIT_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE kml_admit_trace
#include <trace/define_trace.h>
