/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What kmlc's kernel hooks share
 *
 * Each hook module is one model (the generated <name>.c and its math),
 * its binding (the generated kml_binding.h: the model's decision, its
 * feature encoding and the parameters' compiled-in defaults) and one hook
 * from this directory: kml_admit.c, kml_ra.c or kml_nfs.c.  This header and
 * kml_hook.c give the three of them:
 *
 *  - the model, attached with RCU: the enabled= parameter attaches and
 *    detaches it, kml_decide() runs it on a per-CPU buffer;
 *  - module parameters whose writes are range-checked: a bad write
 *    returns -EINVAL and changes nothing;
 *  - compile-time checks that a probed kernel function or tracepoint has
 *    the prototype the hook reads its arguments by;
 *  - debugfs files readable by root only.
 *
 * Locking rules, for every hook: event handlers (probes through ftrace,
 * tracepoint probes, device-mapper map/end_io) never run in NMI context
 * and never sleep; what they share with process context is guarded by
 * raw_spinlock_t (which does not sleep on PREEMPT_RT) held for O(1) work;
 * the model runs outside every lock, on a snapshot of its features.
 */
#ifndef KML_HOOK_H
#define KML_HOOK_H

#include <linux/build_bug.h>
#include <linux/compiler.h>
#include <linux/debugfs.h>
#include <linux/moduleparam.h>
#include "kml_binding.h"
#include "kml_guard.h"

struct seq_file;

/*
 * Fail the build when the kernel declares fn with another prototype than
 * the one the hook's handler reads fn's arguments by.
 */
#define KML_CHECK_PROTO(fn, proto)						\
	static_assert(__builtin_types_compatible_p(typeof(fn) *, proto),	\
		      #fn " has another prototype in these kernel headers")

/* ---- the model ---------------------------------------------------------- */

/* Whether a model is attached (enabled=1 and module exit not begun). */
bool kml_attached(void);

/*
 * Runs the attached model on encoded features f: the decision (a class,
 * or 1 decline / 0 admit), -ENODEV when no model is attached, or another
 * negative errno.  Any context but NMI; *ns gets the inference time, *gen
 * the generation of the weight set it ran on (kml_weights.h), for the
 * guards.  Integer (fixed-point) models only: float models run in process
 * context, through kml_decide_with().
 */
int kml_decide(const s32 *f, u64 *ns, u64 *gen);

/*
 * The same with the caller's buffer, for process context (a float model's
 * FPU section; the set's generation in buf->gen).  The caller holds
 * rcu_read_lock() across the decision and its effect, so that a detach
 * waits for both.
 */
int kml_decide_with(const s32 *f, struct kml_model_buf *buf);

/* The hook: module init calls kml_hook_init() after the self-test; exit, kml_hook_exit(). */
int kml_hook_init(void);
void kml_hook_exit(void);

/* Module init: attaches the model if enabled=1.  Module exit: detaches it for good. */
void kml_model_init(void);
void kml_model_exit(void);

/*
 * Each hook's own: what a detach undoes, called after the grace period
 * that detaches the model (process context, under the attach mutex).
 */
void kml_hook_detached(void);

/* ---- range-checked parameters -------------------------------------------- */

/*
 * A module parameter of unsigned ints whose writes are checked: each value
 * in lo..hi (or 0, with zero set), and an array written whole ("a,b,c,d", n values), else the
 * write fails with -EINVAL and nothing changes.  Readers take each value
 * with READ_ONCE().  Declared with
 *
 *	static unsigned int window_ms = ...;
 *	static struct kml_uint_param kml_window_ms = { &window_ms, 1, 1, 60000 };
 *	module_param_cb(window_ms, &kml_uint_param_ops, &kml_window_ms, 0644);
 */
struct kml_uint_param {
	unsigned int *v;
	unsigned int n, lo, hi;
	bool zero;		/* 0 is allowed too (a feature's "off") */
};

extern const struct kernel_param_ops kml_uint_param_ops;

/* ---- debugfs -------------------------------------------------------------- */

/*
 * The module's debugfs directory, /sys/kernel/debug/<module>; its files are
 * 0400: they show other users' files, offsets and I/O timing.
 */
struct dentry *kml_debugfs_dir(void);
void kml_debugfs_file(const char *name, const struct file_operations *fops);
void kml_debugfs_remove(void);

/* debugfs "saturated": values the model saturated over every decision. */
void kml_debugfs_saturated(void);

/*
 * Adds the counters of src to dst: structs of u64 only, size bytes (one
 * CPU's counters into a total).
 */
static inline void kml_sum_u64(void *dst, const void *src, size_t size)
{
	const u64 *s = src;
	u64 *d = dst;
	size_t i;

	for (i = 0; i < size / sizeof(u64); i++)
		d[i] += READ_ONCE(s[i]);
}

/* ---- guards (kml_guard.h, kml_guard.c) ------------------------------------ */

/*
 * One guard (a module's, or a mirror's) and its trace's numbering: the
 * caller's lock serializes its steps.
 */
struct kml_guarded {
	struct kml_guard g;
	u64 id;			/* the trace's guard= */
	u64 seq;
};

/*
 * The decision to apply for the model's decision model on features f
 * (dflt: the kernel's; KML_GUARD_KERNEL, what the kernel has), made with
 * the weight set of generation gen (kml_decide()), for key k (id key in
 * the trace); *arm: whose cost the decision reports, if any
 * (kml_guarded_cost(), with gen).  Any context but NMI; the caller holds
 * the lock that serializes gd and k.  Traced as kml_guard.
 */
s32 kml_guarded_decide(struct kml_guarded *gd, struct kml_guard_key *k, u64 key, s32 model,
		       s32 dflt, const s32 *f, u64 gen, u32 *arm);

/*
 * The cost of a decision made on arm with the set of generation gen (lower
 * is better); the same context and lock.
 */
void kml_guarded_cost(struct kml_guarded *gd, u64 key, u32 arm, u64 gen, u64 cost);

/* The guard's counters and state, one "name value" line each (kml_guard_counts()). */
void kml_guard_show(struct seq_file *m, const struct kml_guard_counts *g);

/* The running kernel's release, for the one line a refused load prints. */
const char *kml_release(void);

#endif /* KML_HOOK_H */
