// SPDX-License-Identifier: GPL-2.0
/*
 * Learned readahead: a kmlc model sets each file's readahead (KML)
 *
 * Probes on the three places a stock kernel decides readahead from
 * file->f_ra.ra_pages see every page-cache miss that reaches readahead:
 * page_cache_sync_ra() (a read missed), page_cache_async_ra() (a read or a
 * fault reached a page marked PG_readahead) and filemap_fault() on a page
 * that is not cached (mmap read-around, do_sync_mmap_readahead()).  Per
 * open file, misses form windows of window_events misses or window_ms
 * milliseconds; each window's KML features (kml_features.h) go through the
 * model, and the class it picks sets the file's readahead,
 * file->f_ra.ra_pages, from the ra_pages parameter (one value per class).
 *
 * Files.  A set-associative table of KML_RA_SETS x KML_RA_WAYS files,
 * least recently used replaced: every file being read gets its windows
 * while at most KML_RA_WAYS active files share a set.  A file evicted
 * gets back the readahead it had (the kernel's choice) and is counted.  A
 * fourth probe, on locks_remove_file(), which __fput() calls for every
 * file it releases, removes the file's entry before the file is freed: so
 * every entry is a live file, and detaching or unloading the model gives
 * each file it changed its own readahead back.
 *
 * Explicit choices are left alone.  A file opened with POSIX_FADV_RANDOM
 * (FMODE_RANDOM), whose readahead someone else set (POSIX_FADV_SEQUENTIAL
 * or _NORMAL, before or after the hook first saw it), or mapped with
 * MADV_RANDOM or MADV_SEQUENTIAL is never written again; if the model had
 * changed it, the file first gets its own readahead back.
 *
 * Context and locking.  The probes sit at the functions' entry on their
 * ftrace call (kprobes through ftrace on x86-64, ftrace callbacks of the
 * module's own on arm64, see "probes" below: preemption off, never NMI;
 * the module refuses to load where a function has none).  The caller of
 * each probed function holds a reference to the file.  Each set has a
 * raw_spinlock_t (no sleeping lock under disabled preemption on
 * PREEMPT_RT), held with interrupts off for O(KML_RA_WAYS) work: finding
 * the file's way and one window step.  Counters are per CPU.  The model
 * runs after the lock is dropped, on a copy of the window's features: a
 * fixed-point model inline (kml_decide(), interrupts off for its run), a
 * float model in a work item (process context, FPU section), whose class
 * applies when it returns.  A decision is written to the file under its
 * set's lock, only while the file is still in the table.
 *
 * Guards (kml_guard.h, docs/hooks.md): each class the model picks passes
 * them with the file's own readahead as the default, under the guards'
 * raw spinlock (nested in the set's); the window a decision ran under
 * reports its cost, the time per page the reader consumed (kml_ra_step()),
 * with the generation of the weight set that made the decision.
 *
 * Tracing: the kml_ra_miss and kml_ra_decision events (kml_ra_trace.h),
 * kml_guard (kml_guard_trace.h).  debugfs (root only): stats (with the
 * guards' counters), files.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/backing-dev.h>
#include <linux/fs.h>
#include <linux/ftrace.h>
#ifdef KML_HAVE_FILELOCK_H
#include <linux/filelock.h>		/* locks_remove_file() from 6.3 on (Kbuild) */
#endif
#include <linux/hash.h>
#include <linux/kprobes.h>
#include <linux/ktime.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pagemap.h>
#include <linux/percpu.h>
#include <linux/ptrace.h>
#include <linux/rcupdate.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include "kml_hook.h"

#define CREATE_TRACE_POINTS
#include "kml_ra_trace.h"

#define KML_RA_SET_BITS 6
#define KML_RA_SETS BIT(KML_RA_SET_BITS)
#define KML_RA_WAYS 16
#define KML_RA_CAPACITY (KML_RA_SETS * KML_RA_WAYS)	/* 1024 files */

static unsigned int window_events = KML_RA_WINDOW_EVENTS;
static struct kml_uint_param kml_window_events = { &window_events, 1, 2, KML_RA_MAX_EVENTS };
module_param_cb(window_events, &kml_uint_param_ops, &kml_window_events, 0644);
MODULE_PARM_DESC(window_events, "misses per window, 2..1024 (default "
		 KML_RA_WINDOW_EVENTS_DOC ")");

static unsigned int window_ms = KML_RA_WINDOW_MS;
static struct kml_uint_param kml_window_ms = { &window_ms, 1, 1, 60000 };
module_param_cb(window_ms, &kml_uint_param_ops, &kml_window_ms, 0644);
MODULE_PARM_DESC(window_ms, "longest window in ms, 1..60000 (default "
		 KML_RA_WINDOW_MS_DOC "; KML: 1000)");

static unsigned int ra_pages[KML_MODEL_OUTPUTS] = KML_RA_RA_PAGES;
static struct kml_uint_param kml_ra_pages = { ra_pages, KML_MODEL_OUTPUTS, 0, 8192 };
module_param_cb(ra_pages, &kml_uint_param_ops, &kml_ra_pages, 0644);
MODULE_PARM_DESC(ra_pages, "readahead in pages per class, 0..8192 each: " KML_CLASSES
		 " (default " KML_RA_RA_PAGES_DOC ")");

/* ---- files ------------------------------------------------------------------------- */

struct kml_ra_file {
	struct file *file;	/* NULL: a free way; else alive (see locks_remove_file) */
	u64 id;			/* in the trace; never reused */
	u64 seq;		/* misses seen: the order of the file's trace events */
	u64 used;		/* the set's clock at the file's last miss */
	struct kml_ra_window w;
	u32 orig;		/* ra_pages when the hook first saw the file */
	u32 set_to;		/* ra_pages the hook last wrote, if changed */
	s32 cls;		/* the model's last class, -1 none (the guards may apply another) */
	u32 arm;		/* the A/B arm of the decision in force (kml_guard.h) */
	u64 gen;		/* and the generation of the weight set that made it */
	struct kml_guard_key gk;
	bool changed;		/* the hook wrote set_to into the file */
	bool hands_off;		/* an explicit choice: never written */
#if !KML_MODEL_FIXED
	bool pending;		/* features f of the window miss pending_seq closed */
	u64 pending_seq;
	s32 f[KML_RA_FEATURES];
#endif
};

struct kml_ra_set {
	raw_spinlock_t lock;	/* the ways, and the files' ra_pages as the hook writes them */
	u64 clock;
	struct kml_ra_file way[KML_RA_WAYS];
};

static struct kml_ra_set *kml_sets;
static atomic64_t kml_ids;

/*
 * The guards, one for every file: nested inside a set's lock, held for a
 * guard's step (kml_guarded_decide(), kml_guarded_cost()).
 */
static DEFINE_RAW_SPINLOCK(kml_guard_lock);
static struct kml_guarded kml_guard;

struct kml_ra_stats {
	u64 misses, faults, windows, inferences, infer_errors, infer_ns;
	u64 per_class[KML_MODEL_OUTPUTS];
	u64 files, evictions, released, hands_off, changes, restores;
};

static DEFINE_PER_CPU(struct kml_ra_stats, kml_counts);

static struct kml_ra_set *kml_set_of(const struct file *file)
{
	return &kml_sets[hash_ptr(file, KML_RA_SET_BITS)];
}

static struct kml_ra_file *kml_ra_find(struct kml_ra_set *set, const struct file *file)
{
	int i;

	for (i = 0; i < KML_RA_WAYS; i++)
		if (set->way[i].file == file)
			return &set->way[i];
	return NULL;
}

/* Gives the file its own readahead back if it still has the hook's (set lock held). */
static void kml_ra_restore(struct kml_ra_file *e)
{
	struct file_ra_state *ra = &e->file->f_ra;

	if (e->changed && READ_ONCE(ra->ra_pages) == e->set_to) {
		WRITE_ONCE(ra->ra_pages, e->orig);
		this_cpu_inc(kml_counts.restores);
	}
	e->changed = false;
}

static void kml_ra_let_go(struct kml_ra_file *e)
{
	kml_ra_restore(e);
	e->hands_off = true;
	this_cpu_inc(kml_counts.hands_off);
}

/* Whether the file carries a choice that is not the hook's (set lock held). */
static bool kml_ra_explicit(const struct kml_ra_file *e, u32 cur)
{
	if (READ_ONCE(e->file->f_mode) & FMODE_RANDOM)
		return true;		/* POSIX_FADV_RANDOM */
	return cur != (e->changed ? e->set_to : e->orig);
}

/*
 * The file's way in set, taken if the file has none: a free way, else the
 * least recently used file's, which gets its own readahead back.  Set lock
 * held; the caller holds a reference to file.
 */
static struct kml_ra_file *kml_ra_get(struct kml_ra_set *set, struct file *file)
{
	struct kml_ra_file *e = kml_ra_find(set, file), *victim = &set->way[0];
	int i;
	u32 cur;

	if (e)
		return e;
	for (i = 0; i < KML_RA_WAYS && victim->file; i++)
		if (!set->way[i].file || set->way[i].used < victim->used)
			victim = &set->way[i];
	if (victim->file) {
		kml_ra_restore(victim);
		this_cpu_inc(kml_counts.evictions);
	}
	cur = READ_ONCE(file->f_ra.ra_pages);
	*victim = (struct kml_ra_file){ .file = file, .id = atomic64_inc_return(&kml_ids),
					.orig = cur, .cls = -1, .arm = KML_GUARD_ARM_NONE };
	kml_ra_reset(&victim->w);
	/*
	 * Not the readahead open() gave the file (file_ra_state_init(): the
	 * device's): fadvise() set it before the hook came.
	 */
	if (cur != READ_ONCE(inode_to_bdi(file->f_mapping->host)->ra_pages) ||
	    (READ_ONCE(file->f_mode) & FMODE_RANDOM))
		kml_ra_let_go(victim);
	this_cpu_inc(kml_counts.files);
	return victim;
}

/*
 * Sets the file's readahead from class cls, or gives the file its own
 * back for KML_GUARD_KERNEL (set lock held, the file in the table); the
 * readahead it has afterwards.
 */
static u32 kml_ra_apply(struct kml_ra_file *e, int cls)
{
	struct file_ra_state *ra = &e->file->f_ra;
	u32 cur = READ_ONCE(ra->ra_pages), want;

	if (e->hands_off)
		return cur;
	if (kml_ra_explicit(e, cur)) {
		kml_ra_let_go(e);
		return READ_ONCE(ra->ra_pages);
	}
	if (cls == KML_GUARD_KERNEL) {
		kml_ra_restore(e);
		return READ_ONCE(ra->ra_pages);
	}
	want = READ_ONCE(ra_pages[cls]);
	if (want != cur) {
		WRITE_ONCE(ra->ra_pages, want);
		this_cpu_inc(kml_counts.changes);
	}
	e->set_to = want;
	e->changed = true;
	return want;
}

/* ---- the model ---------------------------------------------------------------------- */

/*
 * The model's class cls for the window miss seq of file closed, with
 * features f, by the weight set of generation gen: the guards decide what
 * applies (the class, or the file's own readahead), and it applies while
 * the file is in the table.
 */
static void kml_ra_decided(struct file *file, u64 id, u64 seq, int cls, u64 gen, u64 ns,
			   const s32 *f)
{
	struct kml_ra_set *set = kml_set_of(file);
	struct kml_ra_file *e;
	unsigned long flags;
	u32 pages = 0;
	int d;

	if (cls < 0) {
		if (cls != -ENODEV)
			this_cpu_inc(kml_counts.infer_errors);
		return;
	}
	raw_spin_lock_irqsave(&set->lock, flags);
	e = kml_ra_find(set, file);
	if (e && e->id == id) {
		e->cls = cls;
		d = cls;
		if (!e->hands_off) {
			raw_spin_lock(&kml_guard_lock);
			d = kml_guarded_decide(&kml_guard, &e->gk, id, cls, KML_GUARD_KERNEL, f,
					       gen, &e->arm);
			raw_spin_unlock(&kml_guard_lock);
			e->gen = gen;
		}
		pages = kml_ra_apply(e, d);
	}
	raw_spin_unlock_irqrestore(&set->lock, flags);
	this_cpu_inc(kml_counts.inferences);
	this_cpu_add(kml_counts.infer_ns, ns);
	this_cpu_inc(kml_counts.per_class[cls]);
	trace_kml_ra_decision(id, seq, cls, pages);
}

#if !KML_MODEL_FIXED
/* The work item's buffer: a work item never runs twice at once. */
static struct kml_model_buf kml_work_buf;

/* Float models run here, in process context, for every window waiting. */
static void kml_work_fn(struct work_struct *work)
{
	s32 f[KML_RA_FEATURES];
	struct file *file;
	unsigned long flags;
	int s, i, cls;
	u64 id, seq, t0;

	for (s = 0; s < KML_RA_SETS; s++) {
		for (i = 0; i < KML_RA_WAYS; i++) {
			struct kml_ra_set *set = &kml_sets[s];
			struct kml_ra_file *e = &set->way[i];

			raw_spin_lock_irqsave(&set->lock, flags);
			file = e->pending ? e->file : NULL;
			if (file) {
				memcpy(f, e->f, sizeof(f));
				id = e->id;
				seq = e->pending_seq;
				e->pending = false;
			}
			raw_spin_unlock_irqrestore(&set->lock, flags);
			if (!file)
				continue;
			/* a detach waits for the decision and its effect */
			rcu_read_lock();
			t0 = ktime_get_ns();
			cls = kml_decide_with(f, &kml_work_buf);
			kml_ra_decided(file, id, seq, cls, kml_work_buf.gen,
				       ktime_get_ns() - t0, f);
			rcu_read_unlock();
		}
	}
}

static DECLARE_WORK(kml_work, kml_work_fn);
#endif

#if KML_MODEL_FIXED
/* The fixed-point model, inline: decided and applied now. */
static void kml_ra_model(struct file *file, u64 id, u64 seq, const s32 *f)
{
	u64 ns = 0, gen = 0;
	int cls = kml_decide(f, &ns, &gen);

	kml_ra_decided(file, id, seq, cls, gen, ns, f);
}
#else
/* The float model, in process context: the work item finds the window pending. */
static void kml_ra_model(struct file *file, u64 id, u64 seq, const s32 *f)
{
	schedule_work(&kml_work);
}
#endif

/* ---- the event --------------------------------------------------------------------- */

/*
 * A miss of file at page index; kind 0 (a read) or KML_RA_FAULT.  Context:
 * a probe at the function's entry, preemption off; the caller holds a
 * reference to file.
 */
static void kml_ra_miss(struct file *file, u64 index, u32 kind)
{
	u64 window_ns = (u64)READ_ONCE(window_ms) * NSEC_PER_MSEC, id, seq;
	u32 events = READ_ONCE(window_events), flags = kind, cur;
	struct kml_ra_set *set = kml_set_of(file);
	s32 f[KML_RA_FEATURES] = { 0 };
	bool closes, attached;
	u64 cost = 0;
	struct kml_ra_file *e;
	unsigned long irq;

	this_cpu_inc(kml_counts.misses);
	if (kind)
		this_cpu_inc(kml_counts.faults);
	attached = kml_attached();
	raw_spin_lock_irqsave(&set->lock, irq);
	e = kml_ra_get(set, file);
	e->used = ++set->clock;
	cur = READ_ONCE(file->f_ra.ra_pages);
	if (!e->hands_off && kml_ra_explicit(e, cur))
		kml_ra_let_go(e);
	if (e->hands_off) {
		raw_spin_unlock_irqrestore(&set->lock, irq);
		return;
	}
	id = e->id;
	seq = e->seq++;
	if (!e->w.n)
		flags |= KML_RA_NEW;
	closes = kml_ra_step(&e->w, ktime_get_ns(), index, cur, events, window_ns,
			     kml_model_frac(), f, &cost);
	if (closes)
		flags |= KML_RA_CLOSES;
	if (closes && e->arm != KML_GUARD_ARM_NONE) {
		/* the window ran under the decision of the one before: its cost */
		raw_spin_lock(&kml_guard_lock);
		kml_guarded_cost(&kml_guard, id, e->arm, e->gen, cost);
		raw_spin_unlock(&kml_guard_lock);
		e->arm = KML_GUARD_ARM_NONE;
	}
#if !KML_MODEL_FIXED
	if (closes && attached) {
		memcpy(e->f, f, sizeof(f));
		e->pending = true;
		e->pending_seq = seq;
	}
#endif
	raw_spin_unlock_irqrestore(&set->lock, irq);
	trace_kml_ra_miss(id, seq, index, cur, flags, f);
	if (!closes)
		return;
	this_cpu_inc(kml_counts.windows);
	if (attached)
		kml_ra_model(file, id, seq, f);
}

/* An madvise() hint on a mapping of the file: the application chose. */
static void kml_ra_madvised(struct file *file)
{
	struct kml_ra_set *set = kml_set_of(file);
	struct kml_ra_file *e;
	unsigned long irq;

	raw_spin_lock_irqsave(&set->lock, irq);
	e = kml_ra_get(set, file);
	if (!e->hands_off)
		kml_ra_let_go(e);
	raw_spin_unlock_irqrestore(&set->lock, irq);
}

/* ---- probes ---------------------------------------------------------------------------- */

KML_CHECK_PROTO(page_cache_sync_ra, void (*)(struct readahead_control *, unsigned long));
KML_CHECK_PROTO(page_cache_async_ra,
		void (*)(struct readahead_control *, struct folio *, unsigned long));
KML_CHECK_PROTO(filemap_fault, vm_fault_t (*)(struct vm_fault *));
KML_CHECK_PROTO(locks_remove_file, void (*)(struct file *));

/*
 * page_cache_sync_ra(ractl, ...) and page_cache_async_ra(ractl, ...): a
 * file's own readahead state only (ractl->ra is a filesystem's private
 * state when the readahead is not for an open file).
 */
static void kml_ra_pre(struct pt_regs *regs)
{
	struct readahead_control *ractl = (void *)regs_get_kernel_argument(regs, 0);
	struct file *file = ractl->file;

	if (file && ractl->ra == &file->f_ra)
		kml_ra_miss(file, readahead_index(ractl), 0);
}

/*
 * filemap_fault(vmf): a fault on a page that is not cached goes on to
 * do_sync_mmap_readahead(), which reads ra_pages around it.  Not
 * decisions of their own: a fault on a cached page (a marked one reaches
 * page_cache_async_ra()) and a retry (FAULT_FLAG_TRIED).
 */
static void kml_fault_pre(struct pt_regs *regs)
{
	struct vm_fault *vmf = (void *)regs_get_kernel_argument(regs, 0);
	struct file *file = vmf->vma->vm_file;
	void *entry;

	if (!file || (vmf->flags & FAULT_FLAG_TRIED))
		return;
	if (vmf->vma->vm_flags & (VM_RAND_READ | VM_SEQ_READ)) {
		kml_ra_madvised(file);
		return;
	}
	entry = xa_load(&file->f_mapping->i_pages, vmf->pgoff);
	if (entry && !xa_is_value(entry))	/* cached; shadow entries are not */
		return;
	kml_ra_miss(file, vmf->pgoff, KML_RA_FAULT);
}

/*
 * locks_remove_file(file): __fput() releases the file, and frees it after
 * this returns; nobody else holds a reference.  Process context.
 */
static void kml_release_pre(struct pt_regs *regs)
{
	struct file *file = (void *)regs_get_kernel_argument(regs, 0);
	struct kml_ra_set *set = kml_set_of(file);
	struct kml_ra_file *e;
	unsigned long irq;

	raw_spin_lock_irqsave(&set->lock, irq);
	e = kml_ra_find(set, file);
	if (e) {
		e->file = NULL;
		this_cpu_inc(kml_counts.released);
	}
	raw_spin_unlock_irqrestore(&set->lock, irq);
}

/*
 * Two probes: the misses (three functions) and the release, which must
 * outlive them (see kml_hook_exit()).  Each handler runs at its
 * function's entry, on the function's ftrace call, with the registers
 * saved (the arguments still in theirs), with preemption off, never in NMI
 * context: never an int3 or BRK probe, whose handler would run in NMI or
 * debug-exception context, where the hook's locks may not be taken.
 *
 * Where the kernel has kprobes through ftrace (x86-64), they are used:
 * they share the core kernel's ftrace_ops, so a module's load and unload
 * cost no grace period of RCU tasks.  Elsewhere (arm64 has none in 6.1)
 * each probe is an ftrace_ops of the module's own, whose removal waits
 * for one (kernel/trace/ftrace.c, ftrace_shutdown()): so two, not one per
 * function.  Both need DYNAMIC_FTRACE_WITH_REGS (the Kbuild checks it).
 */
#ifdef CONFIG_KPROBES_ON_FTRACE

struct kml_probe {
	struct kprobe kp[3];
	unsigned int n;
};

static int kml_kp_ra(struct kprobe *p, struct pt_regs *regs)
{
	kml_ra_pre(regs);
	return 0;
}

static int kml_kp_fault(struct kprobe *p, struct pt_regs *regs)
{
	kml_fault_pre(regs);
	return 0;
}

static int kml_kp_release(struct kprobe *p, struct pt_regs *regs)
{
	kml_release_pre(regs);
	return 0;
}

static struct kml_probe kml_release_probe = {
	.kp = { { .symbol_name = "locks_remove_file", .pre_handler = kml_kp_release } },
	.n = 1,
};

static struct kml_probe kml_miss_probe = {
	.kp = { { .symbol_name = "page_cache_sync_ra", .pre_handler = kml_kp_ra },
		{ .symbol_name = "page_cache_async_ra", .pre_handler = kml_kp_ra },
		{ .symbol_name = "filemap_fault", .pre_handler = kml_kp_fault } },
	.n = 3,
};

/* Attach p: a kprobe on each function's ftrace call, or none. */
static int kml_probe(struct kml_probe *p)
{
	unsigned int i;
	int ret;

	for (i = 0; i < p->n; i++) {
		struct kprobe *kp = &p->kp[i];

		ret = register_kprobe(kp);
		if (ret) {
			pr_err("cannot probe %s on Linux %s (%d); not loading\n", kp->symbol_name,
			       kml_release(), ret);
			goto undo;
		}
		if (!kprobe_ftrace(kp)) {
			unregister_kprobe(kp);
			pr_err("%s has no ftrace call at its entry on Linux %s; not loading\n",
			       kp->symbol_name, kml_release());
			ret = -EOPNOTSUPP;
			goto undo;
		}
	}
	return 0;
undo:
	while (i--)
		unregister_kprobe(&p->kp[i]);
	return ret;
}

/* Detach p: no handler of it runs once this returns. */
static void kml_unprobe(struct kml_probe *p)
{
	unsigned int i;

	for (i = 0; i < p->n; i++)
		unregister_kprobe(&p->kp[i]);
}

#else /* !CONFIG_KPROBES_ON_FTRACE: an ftrace_ops per probe */

/* The names are writable: ftrace_set_filter() parses them in place. */
struct kml_probe {
	char name[3][24];
	void (*pre)(unsigned long ip, struct pt_regs *regs);
	struct ftrace_ops ops;
};

/*
 * Every probe's ftrace callback.  Context (kernel/trace/ftrace.c,
 * include/linux/trace_recursion.h): called from the traced function's
 * ftrace call, in whatever context that function runs (here process
 * context, and never NMI: none of the four runs there); a successful
 * ftrace_test_recursion_trylock() disables preemption until the unlock, and
 * refuses a callback nested in one of the same context (a probed function
 * reached from a handler).  unregister_ftrace_function() returns only
 * after every running callback has returned.
 */
static void notrace kml_probe_call(unsigned long ip, unsigned long parent_ip,
				   struct ftrace_ops *ops, struct ftrace_regs *fregs)
{
	struct kml_probe *p = container_of(ops, struct kml_probe, ops);
	struct pt_regs *regs = ftrace_get_regs(fregs);
	int bit;

	bit = ftrace_test_recursion_trylock(ip, parent_ip);
	if (bit < 0)
		return;
	if (regs)			/* always, with FTRACE_OPS_FL_SAVE_REGS */
		p->pre(ip, regs);
	ftrace_test_recursion_unlock(bit);
}

/*
 * A miss: ip, the ftrace call site of one of the three functions, is
 * filemap_fault()'s when it lies in its first instructions (at its entry,
 * or after an endbr64, or after arm64's first patchable NOP and a BTI);
 * the other two share a handler.
 */
static void kml_miss_pre(unsigned long ip, struct pt_regs *regs)
{
	if (ip - (unsigned long)filemap_fault < 16)
		kml_fault_pre(regs);
	else
		kml_ra_pre(regs);
}

static void kml_release_call(unsigned long ip, struct pt_regs *regs)
{
	kml_release_pre(regs);
}

static struct kml_probe kml_release_probe = {
	.name = { "locks_remove_file" }, .pre = kml_release_call,
};

static struct kml_probe kml_miss_probe = {
	.name = { "page_cache_sync_ra", "page_cache_async_ra", "filemap_fault" },
	.pre = kml_miss_pre,
};

/* Attach p: each of its functions must have an ftrace call (be in available_filter_functions). */
static int kml_probe(struct kml_probe *p)
{
	int i, ret = 0;

	p->ops.func = kml_probe_call;
	p->ops.flags = FTRACE_OPS_FL_SAVE_REGS;
	for (i = 0; i < ARRAY_SIZE(p->name) && p->name[i][0] && !ret; i++) {
		ret = ftrace_set_filter(&p->ops, p->name[i], strlen(p->name[i]), !i);
		if (ret)
			pr_err("cannot probe %s through ftrace on Linux %s (%d); not loading\n",
			       p->name[i], kml_release(), ret);
	}
	if (!ret) {
		ret = register_ftrace_function(&p->ops);
		if (ret)
			pr_err("cannot register the probe on %s on Linux %s (%d); not loading\n",
			       p->name[0], kml_release(), ret);
	}
	if (ret)
		ftrace_free_filter(&p->ops);
	return ret;
}

/* Detach p: no callback of it runs once this returns. */
static void kml_unprobe(struct kml_probe *p)
{
	unregister_ftrace_function(&p->ops);
	ftrace_free_filter(&p->ops);
}

#endif /* CONFIG_KPROBES_ON_FTRACE */

/* ---- detach and unload ------------------------------------------------------------- */

/* Every file the hook changed gets its own readahead back; forget: empty the table. */
static void kml_ra_walk(bool forget)
{
	unsigned long irq;
	int s, i;

	for (s = 0; s < KML_RA_SETS; s++) {
		struct kml_ra_set *set = &kml_sets[s];

		for (i = 0; i < KML_RA_WAYS; i++) {
			struct kml_ra_file *e = &set->way[i];

			raw_spin_lock_irqsave(&set->lock, irq);
			if (e->file) {
				kml_ra_restore(e);
				e->cls = -1;
				e->arm = KML_GUARD_ARM_NONE;
#if !KML_MODEL_FIXED
				e->pending = false;
#endif
				if (forget)
					e->file = NULL;
			}
			raw_spin_unlock_irqrestore(&set->lock, irq);
		}
	}
}

void kml_hook_detached(void)
{
	kml_ra_walk(false);
}

/* ---- debugfs ----------------------------------------------------------------------- */

static int kml_stats_show(struct seq_file *m, void *p)
{
	struct kml_ra_stats t = { 0 };
	struct kml_guard_counts g;
	unsigned long irq;
	int cpu, i, s, tracked = 0;

	for_each_possible_cpu(cpu)
		kml_sum_u64(&t, per_cpu_ptr(&kml_counts, cpu), sizeof(t));
	for (s = 0; s < KML_RA_SETS; s++) {
		raw_spin_lock_irqsave(&kml_sets[s].lock, irq);
		for (i = 0; i < KML_RA_WAYS; i++)
			tracked += !!kml_sets[s].way[i].file;
		raw_spin_unlock_irqrestore(&kml_sets[s].lock, irq);
	}
	seq_printf(m, "misses %llu\nfaults %llu\nwindows %llu\ninferences %llu\n",
		   t.misses, t.faults, t.windows, t.inferences);
	seq_printf(m, "infer_errors %llu\ninfer_ns %llu\nper_class", t.infer_errors, t.infer_ns);
	for (i = 0; i < KML_MODEL_OUTPUTS; i++)
		seq_printf(m, " %llu", t.per_class[i]);
	seq_printf(m, "\nfiles %llu\nevictions %llu\nreleased %llu\nhands_off %llu\n",
		   t.files, t.evictions, t.released, t.hands_off);
	seq_printf(m, "changes %llu\nrestores %llu\ntracked %d\ncapacity %d\n", t.changes,
		   t.restores, tracked, (int)KML_RA_CAPACITY);
	raw_spin_lock_irqsave(&kml_guard_lock, irq);
	kml_guard_counts(&kml_guard.g, &g);
	raw_spin_unlock_irqrestore(&kml_guard_lock, irq);
	kml_guard_show(m, &g);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(kml_stats);

/* One line per tracked file: "id ino class ra_pages orig changed hands_off". */
static int kml_files_show(struct seq_file *m, void *p)
{
	struct kml_ra_file e;
	unsigned long irq;
	unsigned long ino;
	int s, i;

	for (s = 0; s < KML_RA_SETS; s++) {
		for (i = 0; i < KML_RA_WAYS; i++) {
			struct kml_ra_set *set = &kml_sets[s];

			raw_spin_lock_irqsave(&set->lock, irq);
			e = set->way[i];
			ino = e.file ? file_inode(e.file)->i_ino : 0;
			raw_spin_unlock_irqrestore(&set->lock, irq);
			if (e.file)
				seq_printf(m, "%llu %lu %d %u %u %d %d\n", e.id, ino, e.cls,
					   e.changed ? e.set_to : e.orig, e.orig, e.changed,
					   e.hands_off);
		}
	}
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(kml_files);

/* ---- init and exit ------------------------------------------------------------------ */

int kml_hook_init(void)
{
	int i, ret;

	kml_sets = kvcalloc(KML_RA_SETS, sizeof(*kml_sets), GFP_KERNEL);
	if (!kml_sets)
		return -ENOMEM;
	for (i = 0; i < KML_RA_SETS; i++)
		raw_spin_lock_init(&kml_sets[i].lock);
	ret = kml_probe(&kml_release_probe);	/* first: entries are live files */
	if (ret)
		goto free;
	kml_model_init();
	ret = kml_probe(&kml_miss_probe);
	if (ret)
		goto unprobe;
	kml_debugfs_file("stats", &kml_stats_fops);
	kml_debugfs_file("files", &kml_files_fops);
	kml_debugfs_saturated();
	pr_info("attached to page_cache_sync_ra, page_cache_async_ra and filemap_fault\n");
	return 0;

unprobe:
	kml_model_exit();
	synchronize_rcu();
	kml_ra_walk(true);
	kml_unprobe(&kml_release_probe);
free:
	kvfree(kml_sets);
	return ret;
}

void kml_hook_exit(void)
{
	kml_unprobe(&kml_miss_probe);		/* waits for running handlers */
	kml_model_exit();
	synchronize_rcu();
#if !KML_MODEL_FIXED
	cancel_work_sync(&kml_work);
#endif
	kml_ra_walk(true);			/* the files get their own readahead back */
	kml_unprobe(&kml_release_probe);
	kml_debugfs_remove();
	kvfree(kml_sets);
}
