/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The guards' trace event, under events/kml_<model>/ in tracefs
 *
 * kml_guard: one step of a guard (kml_guard.h).
 *   guard	the guard's id: 0 for a module's one guard (readahead, NFS),
 *		the mirror's id for a mirror's (admission)
 *   seq	the guard's step count before this one: the steps' order
 *   key	what the decision is for: the file's, mirror's or mount's id
 *   kind	0 a decision, 1 a cost
 *   model	the model's decision (kind 0)
 *   dflt	the kernel's decision (kind 0; -1: what the kernel has)
 *   flags	kind 0: bit 0 the decision's features lie outside the envelope,
 *		bit 1 shadow mode was on (guard_shadow)
 *   value	kind 0: the time, ns; kind 1: the cost
 *   applied	kind 0: the decision applied; kind 1: 1 if the cost ended a period
 *   why	kind 0: what decided (enum kml_guard_why)
 *   arm	the A/B arm (KML_GUARD_ARM_*)
 *   state	after the step: KML_GUARD_DEMOTED_BIT, KML_GUARD_TRIPPED_BIT
 *   gen	kind 0: the generation of the weight set the model decided with
 *		(kml_weights.h), kind 1: that of the decision whose cost it is;
 *		a decision under a later one than the guard's reset its benefit
 *		state first (kml_guard.h)
 *
 * A tracepoint takes at most 12 arguments (BPF's raw tracepoints): kind
 * and flags come as one, kf, the kind in bit 0 and the flags above it.
 *
 * Replay (kmlc.hooks.guard) reads these fields by the names printed here:
 * this header is the one definition of the format.
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM KML_TRACE_SYSTEM

#if !defined(KML_GUARD_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define KML_GUARD_TRACE_H

#include <linux/tracepoint.h>

TRACE_EVENT(kml_guard,
	    TP_PROTO(u64 guard, u64 seq, u64 key, u64 gen, u32 kf, s32 model, s32 dflt,
		     u64 value, s32 applied, u32 why, u32 arm, u32 state),
	    TP_ARGS(guard, seq, key, gen, kf, model, dflt, value, applied, why, arm, state),
	    TP_STRUCT__entry(__field(u64, guard)
			     __field(u64, seq)
			     __field(u64, key)
			     __field(u64, value)
			     __field(u64, gen)
			     __field(u32, kind)
			     __field(s32, model)
			     __field(s32, dflt)
			     __field(u32, flags)
			     __field(s32, applied)
			     __field(u32, why)
			     __field(u32, arm)
			     __field(u32, state)),
	    TP_fast_assign(__entry->guard = guard;
			   __entry->seq = seq;
			   __entry->key = key;
			   __entry->value = value;
			   __entry->gen = gen;
			   __entry->kind = kf & 1;
			   __entry->model = model;
			   __entry->dflt = dflt;
			   __entry->flags = kf >> 1;
			   __entry->applied = applied;
			   __entry->why = why;
			   __entry->arm = arm;
			   __entry->state = state),
	    TP_printk("guard=%llu seq=%llu key=%llu kind=%u model=%d dflt=%d flags=%u value=%llu applied=%d why=%u arm=%u state=%u gen=%llu",
		      __entry->guard, __entry->seq, __entry->key, __entry->kind, __entry->model,
		      __entry->dflt, __entry->flags, __entry->value, __entry->applied,
		      __entry->why, __entry->arm, __entry->state, __entry->gen)
);

#endif /* KML_GUARD_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE kml_guard_trace
#include <trace/define_trace.h>
