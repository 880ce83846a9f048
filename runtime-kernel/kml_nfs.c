// SPDX-License-Identifier: GPL-2.0
/*
 * Learned NFS read size: a kmlc model sets each NFS mount's rsize (KML)
 *
 * Per NFS mount, events are grouped in windows of window_ms milliseconds;
 * each window's eight features (kml_features.h) go through the model, and
 * the class it picks sets the mount's read size, NFS_SERVER(inode)->rsize,
 * from the rsize parameter (one value per class), smoothed by a majority
 * vote over the last `vote` predictions and clamped by kml_nfs_decide(): a
 * power of two in 4 KiB .. 256 KiB, never above the rsize the mount
 * negotiated with its server.  A new value applies from the next READ the
 * client builds.
 *
 * Events come from four tracepoints, with typed arguments:
 *   nfs_initiate_read, nfs_readpage_done	(nfs.ko; NFSv3 and v4, RPCs and
 *					 6.12's local I/O alike)
 *   mm_filemap_add_to_page_cache		(page-cache adds, NFS files kept)
 *   mm_vmscan_lru_shrink_inactive		(reclaim scans, system-wide)
 * for_each_kernel_tracepoint() finds the kernel's own; a module's are not
 * in that list, so a tracepoint module notifier attaches to nfs.ko's when
 * it loads, before or after this module, and detaches when it goes.  The
 * kernel's two are checked against their declarations at compile time;
 * nfs.ko's are declared in fs/nfs/nfstrace.h, which the installed headers
 * lack: their prototypes here are those of Linux 6.1 to 6.12 (kmlc's tests
 * hold them against both kernels' source) and Kbuild refuses other
 * versions.
 *
 * Mounts.  A table of KML_MOUNTS mounts; further ones are counted as
 * untracked.  A mount is found without a lock (its key), then locked: its
 * raw_spinlock_t guards its window, votes and READs in flight, held for
 * O(1) work per event (O(KML_INFLIGHT) to pair a READ with its done at
 * worst).  Only a new mount takes the table's lock.  Reclaim totals are
 * atomic counters; each event records the totals it saw.  The model runs
 * after the mount's lock is dropped, on a copy of the window's features: a
 * fixed-point model inline (kml_decide()), a float model in a work item
 * (process context, FPU section).
 *
 * Tracepoint probes run with preemption off, never in NMI context.  The
 * hook writes a mount's rsize only while the event's inode keeps the mount
 * alive, or from iterate_supers_type(), which visits live superblocks
 * only.  Detaching (enabled=0) and unloading give every tracked mount its
 * negotiated rsize back.
 *
 * Guards (kml_guard.h, docs/hooks.md): each voted rsize passes them with
 * the negotiated rsize as the default, under the guards' raw spinlock
 * (nested in the mount's); no benefit guard (the hook measures no cost).
 *
 * Tracing: the kml_nfs_event, kml_nfs_decision and kml_guard events.
 * debugfs (root only): stats (with the guards' counters), mounts.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/fs.h>
#include <linux/hash.h>
#include <linux/ktime.h>
#include <linux/magic.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/nfs_fs.h>
#include <linux/nfs_fs_sb.h>
#include <linux/nfs_xdr.h>
#include <linux/notifier.h>
#include <linux/pagemap.h>
#include <linux/percpu.h>
#include <linux/rcupdate.h>
#include <linux/seq_file.h>
#include <linux/spinlock.h>
#include <linux/tracepoint.h>
#include <linux/workqueue.h>
#include <trace/events/filemap.h>
#include <trace/events/vmscan.h>
#include "kml_hook.h"

#define CREATE_TRACE_POINTS
#include "kml_nfs_trace.h"

#define KML_MOUNTS 16			/* NFS mounts tracked at once */
#define KML_INFLIGHT 64			/* READs per mount whose send time is kept */

static unsigned int window_ms = KML_NFS_WINDOW_MS;
static struct kml_uint_param kml_window_ms = { &window_ms, 1, 1, 60000 };
module_param_cb(window_ms, &kml_uint_param_ops, &kml_window_ms, 0644);
MODULE_PARM_DESC(window_ms, "window length in ms, 1..60000 (default " KML_NFS_WINDOW_MS_DOC
		 "; KML: 1000)");

static unsigned int vote = KML_NFS_VOTE;
static struct kml_uint_param kml_vote = { &vote, 1, 1, KML_NFS_VOTES };
module_param_cb(vote, &kml_uint_param_ops, &kml_vote, 0644);
MODULE_PARM_DESC(vote, "majority vote over the last N predictions, 1..16 (default "
		 KML_NFS_VOTE_DOC "; 1: off)");

static unsigned int rsize[KML_MODEL_OUTPUTS] = KML_NFS_RSIZE;
static struct kml_uint_param kml_rsize = { rsize, KML_MODEL_OUTPUTS, KML_NFS_RSIZE_MIN, 1048576 };
module_param_cb(rsize, &kml_uint_param_ops, &kml_rsize, 0644);
MODULE_PARM_DESC(rsize, "rsize in bytes per class, 4096..1048576 each: " KML_CLASSES
		 " (default " KML_NFS_RSIZE_DOC ")");

static char dev[16];
module_param_string(dev, dev, sizeof(dev), 0444);
MODULE_PARM_DESC(dev, "only the NFS mount MAJOR:MINOR (mountinfo); default: all NFS mounts");

/* ---- mounts ------------------------------------------------------------------------- */

struct kml_mount {
	raw_spinlock_t lock;		/* everything below */
	const struct nfs_server *key;	/* identity; NULL: free.  Written under both locks */
	unsigned long mount_time;	/* with key and dev: a new mount at the same address */
	dev_t dev;
	struct file_system_type *type;	/* to find the mount again among live superblocks */
	u64 born;			/* kml_walks when the entry was made */
	bool seen;			/* found alive by the current walk */
	u32 id;				/* in the trace; a mount started afresh gets a new one */
	u64 seq;			/* events and decisions so far: their order */
	u32 orig, orig_pages;		/* rsize and rpages the mount negotiated */
	u32 rsize;			/* rsize the guards let through, 0 before */
	struct kml_guard_key gk;
	int cls;			/* class of the last decision, -1 before */
	struct kml_nfs_window w;
	struct kml_nfs_votes votes;
	struct {
		const void *hdr;	/* identity only */
		u64 t;
	} inflight[KML_INFLIGHT];
#if !KML_MODEL_FIXED
	u64 pending;			/* window whose features await the model, 0 none */
	s32 f[KML_NFS_FEATURES];
#endif
};

static struct kml_mount kml_mounts[KML_MOUNTS];
static DEFINE_RAW_SPINLOCK(kml_mounts_lock);	/* taking a free entry; under it, a mount's */
static atomic_t kml_ids;
static atomic64_t kml_windows;
static atomic64_t kml_scans, kml_reclaimed;	/* the system's reclaim scans, pages */
static u64 kml_t0;				/* module load, ns */
static u64 kml_walks;				/* under kml_walk_lock */
static DEFINE_MUTEX(kml_walk_lock);		/* one walk at a time: they share `seen` */
static unsigned long kml_reap_at;		/* jiffies of the last reap asked for */
static dev_t kml_dev;				/* from dev=, 0: every mount */

struct kml_nfs_stats {
	u64 count[KML_NFS_RECLAIM + 1];	/* reads, dones, page adds, reclaim scans */
	u64 untracked, windows, inferences, infer_errors, infer_ns;
	u64 per_class[KML_MODEL_OUTPUTS];
	u64 changes, restores;
};

static DEFINE_PER_CPU(struct kml_nfs_stats, kml_counts);

/* The guards, one for every mount: nested inside a mount's lock. */
static DEFINE_RAW_SPINLOCK(kml_guard_lock);
static struct kml_guarded kml_guard;

static void kml_walk(bool restore);

static void kml_reap_fn(struct work_struct *work)
{
	kml_walk(false);
}

static DECLARE_WORK(kml_reap_work, kml_reap_fn);

/* Starts a mount afresh: new trace id, empty window and votes, no decision (its lock held). */
static void kml_mount_reset(struct kml_mount *m)
{
	m->id = atomic_inc_return(&kml_ids);
	m->seq = 0;
	m->rsize = 0;
	m->gk = (struct kml_guard_key){ .set = 0 };
	m->cls = -1;
	m->w = (struct kml_nfs_window){ .n = 0 };
	m->votes = (struct kml_nfs_votes){ .head = 0 };
	memset(m->inflight, 0, sizeof(m->inflight));
#if !KML_MODEL_FIXED
	m->pending = 0;
#endif
}

static bool kml_is(const struct kml_mount *m, struct super_block *sb,
		   const struct nfs_server *server)
{
	return m->key == server && m->mount_time == server->mount_time && m->dev == sb->s_dev;
}

/*
 * The inode's mount, made on first sight, locked; NULL when the table is
 * full (a reap of the mounts that have gone is then asked for).
 */
static struct kml_mount *kml_lookup(struct super_block *sb, struct nfs_server *server,
				    unsigned long *flags)
{
	struct kml_mount *m, *end = kml_mounts + KML_MOUNTS;

	for (m = kml_mounts; m < end; m++) {
		if (READ_ONCE(m->key) != server)
			continue;
		raw_spin_lock_irqsave(&m->lock, *flags);
		if (kml_is(m, sb, server))
			return m;
		raw_spin_unlock_irqrestore(&m->lock, *flags);
	}
	/* first sight: this mount's entry (another CPU may have just made it), else a free one */
	raw_spin_lock_irqsave(&kml_mounts_lock, *flags);
	for (m = kml_mounts; m < end && m->key != server; m++)
		;
	if (m == end)
		for (m = kml_mounts; m < end && m->key; m++)
			;
	if (m < end) {
		raw_spin_lock(&m->lock);
		if (!kml_is(m, sb, server)) {	/* free, or a gone mount's nfs_server reused */
			WRITE_ONCE(m->key, server);
			m->mount_time = server->mount_time;
			m->dev = sb->s_dev;
			m->type = sb->s_type;
			m->born = READ_ONCE(kml_walks);
			m->seen = false;
			m->orig = READ_ONCE(server->rsize);
			m->orig_pages = READ_ONCE(server->rpages);
			kml_mount_reset(m);
		}
	}
	raw_spin_unlock(&kml_mounts_lock);
	if (m < end)
		return m;
	local_irq_restore(*flags);
	if (time_after(jiffies, READ_ONCE(kml_reap_at) + HZ)) {	/* at most once a second */
		WRITE_ONCE(kml_reap_at, jiffies);
		schedule_work(&kml_reap_work);	/* forget the mounts that have gone */
	}
	return NULL;
}

/* ---- the model ---------------------------------------------------------------------- */

/*
 * The model's class cls for the mount's window, on features f, by the
 * weight set of generation gen: votes, clamps, and the guards decide the
 * mount's rsize from now on (the voted one or the negotiated one); its
 * lock held, the mount alive.
 */
static void kml_nfs_decided(struct kml_mount *m, u64 window, int cls, u64 gen, u64 ns,
			    const s32 *f)
{
	u32 want = READ_ONCE(rsize[cls]), k = READ_ONCE(vote), voted, arm;

	m->cls = cls;
	voted = kml_nfs_decide(&m->votes, want, k, m->orig);
	raw_spin_lock(&kml_guard_lock);
	m->rsize = kml_guarded_decide(&kml_guard, &m->gk, m->id, voted, m->orig, f, gen, &arm);
	raw_spin_unlock(&kml_guard_lock);
	this_cpu_inc(kml_counts.inferences);
	this_cpu_add(kml_counts.infer_ns, ns);
	this_cpu_inc(kml_counts.per_class[cls]);
	trace_kml_nfs_decision(m->id, m->seq++, window, cls, want, k, m->orig, voted);
}

/* The mount takes the rsize the model chose (its lock held; the mount alive). */
static void kml_nfs_apply(struct kml_mount *m, struct nfs_server *server)
{
	if (m->rsize && m->rsize != READ_ONCE(server->rsize) && kml_attached()) {
		WRITE_ONCE(server->rsize, m->rsize);
		WRITE_ONCE(server->rpages, (m->rsize + PAGE_SIZE - 1) >> PAGE_SHIFT);
		this_cpu_inc(kml_counts.changes);
	}
}

#if !KML_MODEL_FIXED
/* The work item's buffer: a work item never runs twice at once. */
static struct kml_model_buf kml_work_buf;

/* Float models run here, in process context, for every mount waiting. */
static void kml_work_fn(struct work_struct *work)
{
	s32 f[KML_NFS_FEATURES];
	unsigned long flags;
	u64 window, t0;
	int i, cls;
	u32 id;

	for (i = 0; i < KML_MOUNTS; i++) {
		struct kml_mount *m = &kml_mounts[i];

		raw_spin_lock_irqsave(&m->lock, flags);
		window = m->key ? m->pending : 0;
		memcpy(f, m->f, sizeof(f));
		id = m->id;
		m->pending = 0;
		raw_spin_unlock_irqrestore(&m->lock, flags);
		if (!window)
			continue;
		rcu_read_lock();	/* a detach waits for the decision and its effect */
		t0 = ktime_get_ns();
		cls = kml_decide_with(f, &kml_work_buf);
		raw_spin_lock_irqsave(&m->lock, flags);
		if (cls >= 0 && m->key && m->id == id)
			kml_nfs_decided(m, window, cls, kml_work_buf.gen, ktime_get_ns() - t0, f);
		else if (cls < 0 && cls != -ENODEV)
			this_cpu_inc(kml_counts.infer_errors);
		raw_spin_unlock_irqrestore(&m->lock, flags);
		rcu_read_unlock();
	}
}

static DECLARE_WORK(kml_work, kml_work_fn);
#endif

#if KML_MODEL_FIXED
/* The fixed-point model, inline: decided and applied now (the inode keeps the mount). */
static void kml_nfs_model(struct kml_mount *m, struct super_block *sb, u32 id, u64 window,
			  const s32 *f)
{
	struct nfs_server *server = NFS_SB(sb);
	unsigned long irq;
	u64 ns = 0, gen = 0;
	int cls = kml_decide(f, &ns, &gen);

	if (cls < 0) {
		if (cls != -ENODEV)
			this_cpu_inc(kml_counts.infer_errors);
		return;
	}
	raw_spin_lock_irqsave(&m->lock, irq);
	if (kml_is(m, sb, server) && m->id == id) {
		kml_nfs_decided(m, window, cls, gen, ns, f);
		kml_nfs_apply(m, server);
	}
	raw_spin_unlock_irqrestore(&m->lock, irq);
}
#else
/* The float model, in process context: the work item finds the window pending. */
static void kml_nfs_model(struct kml_mount *m, struct super_block *sb, u32 id, u64 window,
			  const s32 *f)
{
	schedule_work(&kml_work);
}
#endif

/* ---- the event --------------------------------------------------------------------- */

/*
 * An event of the mount of inode: kind KML_NFS_READ (a: offset), _DONE or
 * _PAGE (a: page index); hdr pairs a READ with its done.  Context: a
 * tracepoint probe, preemption off; the inode keeps its mount alive.
 */
static void kml_event(struct inode *inode, u32 kind, u64 a, const void *hdr)
{
	u64 window_ns = (u64)READ_ONCE(window_ms) * NSEC_PER_MSEC, now, seq, window = 0;
	struct super_block *sb = inode->i_sb;
	struct nfs_server *server = NFS_SB(sb);
	s32 f[KML_NFS_FEATURES] = { 0 };
	struct kml_nfs_reclaim r;
	struct kml_mount *m;
	u32 cur, flags = 0, id, orig;
	unsigned long irq;
	bool closes;
	int i;

	if (kml_dev && sb->s_dev != kml_dev)
		return;
	this_cpu_inc(kml_counts.count[kind]);
	m = kml_lookup(sb, server, &irq);
	if (!m) {
		this_cpu_inc(kml_counts.untracked);
		return;
	}
	now = ktime_get_ns() - kml_t0;	/* under the lock: the mount's events in time order */
	if (hdr) {
		i = hash_ptr(hdr, ilog2(KML_INFLIGHT));
		if (kind == KML_NFS_READ) {
			m->inflight[i].hdr = hdr;
			m->inflight[i].t = now;
		} else {
			a = m->inflight[i].hdr == hdr ? now - m->inflight[i].t : KML_NFS_NO_LATENCY;
			m->inflight[i].hdr = NULL;
		}
	}
	r.scans = atomic64_read(&kml_scans);
	r.pages = atomic64_read(&kml_reclaimed);
	cur = READ_ONCE(server->rsize);
	if (!m->w.n)
		flags |= KML_NFS_OPENS;
	closes = kml_nfs_step(&m->w, &r, kind, now, a, cur, window_ns, kml_model_frac(), f);
	if (closes) {
		flags |= KML_NFS_CLOSES | KML_NFS_OPENS;
		window = atomic64_inc_return(&kml_windows);
#if !KML_MODEL_FIXED
		if (kml_attached()) {
			memcpy(m->f, f, sizeof(f));
			m->pending = window;
		}
#endif
	}
	kml_nfs_apply(m, server);
	id = m->id;
	seq = m->seq++;
	orig = m->orig;
	raw_spin_unlock_irqrestore(&m->lock, irq);
	trace_kml_nfs_event(id, seq, kind, now, a, cur, orig, &r, flags, window, f);
	if (!closes)
		return;
	this_cpu_inc(kml_counts.windows);
	kml_nfs_model(m, sb, id, window, f);
}

/* ---- tracepoint probes ------------------------------------------------------------ */

/* nfs.ko's, fs/nfs/nfstrace.h of Linux 6.1 to 6.12 */
static void kml_tp_read(void *data, const struct nfs_pgio_header *hdr)
{
	kml_event(hdr->inode, KML_NFS_READ, (u64)hdr->args.offset, hdr);
}

static void kml_tp_done(void *data, const struct rpc_task *task,
			const struct nfs_pgio_header *hdr)
{
	kml_event(hdr->inode, KML_NFS_DONE, 0, hdr);
}

static void kml_tp_page(void *data, struct folio *folio)
{
	struct address_space *mapping = folio->mapping;
	struct inode *inode = mapping ? mapping->host : NULL;

	/* regular files of NFS mounts only (not directories' readdir caches) */
	if (inode && S_ISREG(inode->i_mode) && inode->i_sb->s_magic == NFS_SUPER_MAGIC)
		kml_event(inode, KML_NFS_PAGE, folio->index, NULL);
}

static void kml_tp_reclaim(void *data, int nid, unsigned long nr_scanned,
			   unsigned long nr_reclaimed, struct reclaim_stat *stat, int priority,
			   int file)
{
	this_cpu_inc(kml_counts.count[KML_NFS_RECLAIM]);
	atomic64_add(nr_reclaimed, &kml_reclaimed);
	atomic64_inc(&kml_scans);
}

/* The kernel's tracepoints: the probes' prototypes checked against the headers. */
static inline void kml_tp_check(void)
{
	check_trace_callback_type_mm_filemap_add_to_page_cache(kml_tp_page);
	check_trace_callback_type_mm_vmscan_lru_shrink_inactive(kml_tp_reclaim);
}

enum { KML_TP_PAGE, KML_TP_RECLAIM, KML_TP_READ, KML_TP_DONE };

static struct kml_tp {
	const char *name;
	void *probe;
	struct tracepoint *tp;		/* where the probe is registered, or NULL */
	struct module *owner;		/* the tracepoint's module, NULL: the kernel */
} kml_tps[] = {
	[KML_TP_PAGE] = { "mm_filemap_add_to_page_cache", kml_tp_page },
	[KML_TP_RECLAIM] = { "mm_vmscan_lru_shrink_inactive", kml_tp_reclaim },
	[KML_TP_READ] = { "nfs_initiate_read", kml_tp_read },
	[KML_TP_DONE] = { "nfs_readpage_done", kml_tp_done },
};

static DEFINE_MUTEX(kml_tp_lock);	/* kml_tps */

/* Registers our probe on tp if it is one of ours (under kml_tp_lock). */
static void kml_tp_found(struct tracepoint *tp, void *owner)
{
	int i, ret;

	for (i = 0; i < ARRAY_SIZE(kml_tps); i++) {
		if (kml_tps[i].tp || strcmp(tp->name, kml_tps[i].name))
			continue;
		ret = tracepoint_probe_register(tp, kml_tps[i].probe, NULL);
		if (ret) {
			pr_warn("cannot attach to %s on Linux %s (%d)\n", kml_tps[i].name,
				kml_release(), ret);
			continue;
		}
		kml_tps[i].tp = tp;
		kml_tps[i].owner = owner;
	}
}

/* Unregisters the probes on owner's tracepoints (under kml_tp_lock). */
static void kml_tp_lost(struct module *owner)
{
	int i;

	for (i = 0; i < ARRAY_SIZE(kml_tps); i++) {
		if (!kml_tps[i].tp || kml_tps[i].owner != owner)
			continue;
		tracepoint_probe_unregister(kml_tps[i].tp, kml_tps[i].probe, NULL);
		kml_tps[i].tp = NULL;
	}
}

/*
 * A module with tracepoints comes or goes (also called for every loaded
 * one when the notifier is registered and unregistered).  Process context.
 */
static int kml_tp_notify(struct notifier_block *nb, unsigned long state, void *data)
{
	struct module *mod = ((struct tp_module *)data)->mod;
	unsigned long irq;
	int i;

	mutex_lock(&kml_tp_lock);
	if (state == MODULE_STATE_COMING) {
		for (i = 0; i < mod->num_tracepoints; i++)
			kml_tp_found(tracepoint_ptr_deref(&mod->tracepoints_ptrs[i]), mod);
	} else if (state == MODULE_STATE_GOING) {
		kml_tp_lost(mod);
		if (mod->state == MODULE_STATE_GOING) {	/* really unloading: its mounts are gone */
			for (i = 0; i < KML_MOUNTS; i++) {
				struct kml_mount *m = &kml_mounts[i];

				raw_spin_lock_irqsave(&kml_mounts_lock, irq);
				raw_spin_lock(&m->lock);
				if (m->key && m->type->owner == mod)
					WRITE_ONCE(m->key, NULL);
				raw_spin_unlock(&m->lock);
				raw_spin_unlock_irqrestore(&kml_mounts_lock, irq);
			}
		}
	}
	mutex_unlock(&kml_tp_lock);
	return NOTIFY_OK;
}

static struct notifier_block kml_tp_nb = { .notifier_call = kml_tp_notify };

/* ---- restoring the negotiated rsize ------------------------------------------------ */

static void kml_walk_sb(struct super_block *sb, void *arg)
{
	struct nfs_server *server = NFS_SB(sb);
	bool restore = *(bool *)arg;
	unsigned long irq;
	int i;

	for (i = 0; i < KML_MOUNTS; i++) {
		struct kml_mount *m = &kml_mounts[i];

		raw_spin_lock_irqsave(&m->lock, irq);
		if (kml_is(m, sb, server)) {
			m->seen = true;
			if (restore && READ_ONCE(server->rsize) != m->orig) {
				WRITE_ONCE(server->rsize, m->orig);
				WRITE_ONCE(server->rpages, m->orig_pages);
				this_cpu_inc(kml_counts.restores);
			}
			if (restore)
				kml_mount_reset(m);
		}
		raw_spin_unlock_irqrestore(&m->lock, irq);
	}
}

/*
 * Visits the live superblocks of the filesystem types we track (process
 * context): with restore, gives every tracked mount its negotiated rsize
 * back and starts it afresh; always forgets the mounts that have gone.
 * Superblocks are only touched from iterate_supers_type(), which holds
 * them alive, and the filesystem's module is held meanwhile.
 */
static void kml_walk(bool restore)
{
	struct file_system_type *types[4];
	int i, j, ntypes = 0;
	unsigned long irq;
	u64 walk;

	mutex_lock(&kml_walk_lock);
	walk = ++kml_walks;
	for (i = 0; i < KML_MOUNTS; i++) {
		struct kml_mount *m = &kml_mounts[i];

		raw_spin_lock_irqsave(&m->lock, irq);
		m->seen = false;
		for (j = 0; m->key && j < ntypes && types[j] != m->type; j++)
			;
		if (m->key && j == ntypes && ntypes < ARRAY_SIZE(types) &&
		    try_module_get(m->type->owner))
			types[ntypes++] = m->type;
		raw_spin_unlock_irqrestore(&m->lock, irq);
	}
	for (j = 0; j < ntypes; j++) {
		iterate_supers_type(types[j], kml_walk_sb, &restore);
		module_put(types[j]->owner);
	}
	for (i = 0; i < KML_MOUNTS; i++) {	/* not found alive, and older than the walk */
		struct kml_mount *m = &kml_mounts[i];

		raw_spin_lock_irqsave(&kml_mounts_lock, irq);
		raw_spin_lock(&m->lock);
		if (m->key && !m->seen && m->born < walk)
			WRITE_ONCE(m->key, NULL);
		raw_spin_unlock(&m->lock);
		raw_spin_unlock_irqrestore(&kml_mounts_lock, irq);
	}
	mutex_unlock(&kml_walk_lock);
}

void kml_hook_detached(void)
{
	kml_walk(true);		/* every mount gets its own rsize back */
}

/* ---- debugfs ----------------------------------------------------------------------- */

static int kml_stats_show(struct seq_file *m, void *p)
{
	struct kml_nfs_stats t = { 0 };
	struct kml_guard_counts g;
	unsigned long irq;
	int cpu, i;

	for_each_possible_cpu(cpu)
		kml_sum_u64(&t, per_cpu_ptr(&kml_counts, cpu), sizeof(t));
	seq_printf(m, "reads %llu\ndones %llu\npage_adds %llu\nreclaim_scans %llu\n",
		   t.count[KML_NFS_READ], t.count[KML_NFS_DONE], t.count[KML_NFS_PAGE],
		   t.count[KML_NFS_RECLAIM]);
	seq_printf(m, "untracked %llu\nwindows %llu\ninferences %llu\ninfer_errors %llu\n",
		   t.untracked, t.windows, t.inferences, t.infer_errors);
	seq_printf(m, "infer_ns %llu\nrsize_changes %llu\nrestores %llu\nper_class",
		   t.infer_ns, t.changes, t.restores);
	for (i = 0; i < KML_MODEL_OUTPUTS; i++)
		seq_printf(m, " %llu", t.per_class[i]);
	seq_puts(m, "\n");
	raw_spin_lock_irqsave(&kml_guard_lock, irq);
	kml_guard_counts(&kml_guard.g, &g);
	raw_spin_unlock_irqrestore(&kml_guard_lock, irq);
	kml_guard_show(m, &g);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(kml_stats);

/* One line per tracked mount: "id major:minor negotiated_rsize chosen_rsize class" */
static int kml_mounts_show(struct seq_file *s, void *p)
{
	u32 id, orig, chosen;
	unsigned long irq;
	bool used;
	dev_t dev;
	int i, cls;

	for (i = 0; i < KML_MOUNTS; i++) {
		struct kml_mount *m = &kml_mounts[i];

		raw_spin_lock_irqsave(&m->lock, irq);
		used = m->key;
		id = m->id;
		dev = m->dev;
		orig = m->orig;
		chosen = m->rsize;
		cls = m->cls;
		raw_spin_unlock_irqrestore(&m->lock, irq);
		if (used)
			seq_printf(s, "%u %u:%u %u %u %d\n", id, MAJOR(dev), MINOR(dev), orig,
				   chosen, cls);
	}
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(kml_mounts);

/* ---- attach and detach ------------------------------------------------------------ */

static void kml_detach_probes(void)
{
	unregister_tracepoint_module_notifier(&kml_tp_nb);	/* detaches from nfs.ko */
	mutex_lock(&kml_tp_lock);
	kml_tp_lost(NULL);
	mutex_unlock(&kml_tp_lock);
	tracepoint_synchronize_unregister();	/* no probe runs any more */
}

int kml_hook_init(void)
{
	unsigned int major, minor;
	bool attached;
	int i, ret;

	if (*dev) {
		if (sscanf(dev, "%u:%u", &major, &minor) != 2 || !MKDEV(major, minor)) {
			pr_err("dev=%s: expected MAJOR:MINOR\n", dev);
			return -EINVAL;
		}
		kml_dev = MKDEV(major, minor);
	}
	for (i = 0; i < KML_MOUNTS; i++)
		raw_spin_lock_init(&kml_mounts[i].lock);
	kml_t0 = ktime_get_ns();
	kml_reap_at = jiffies - HZ;
	kml_model_init();
	mutex_lock(&kml_tp_lock);
	for_each_kernel_tracepoint(kml_tp_found, NULL);	/* nfs too, if built in */
	ret = kml_tps[KML_TP_PAGE].tp && kml_tps[KML_TP_RECLAIM].tp ? 0 : -ENOENT;
	mutex_unlock(&kml_tp_lock);
	if (!ret)
		ret = register_tracepoint_module_notifier(&kml_tp_nb);
	if (ret) {
		pr_err("cannot attach to the page cache and reclaim tracepoints on Linux %s (%d)\n",
		       kml_release(), ret);
		mutex_lock(&kml_tp_lock);
		kml_tp_lost(NULL);
		mutex_unlock(&kml_tp_lock);
		tracepoint_synchronize_unregister();
		kml_model_exit();
		return ret;
	}
	kml_debugfs_file("stats", &kml_stats_fops);
	kml_debugfs_file("mounts", &kml_mounts_fops);
	kml_debugfs_saturated();
	mutex_lock(&kml_tp_lock);
	attached = kml_tps[KML_TP_READ].tp && kml_tps[KML_TP_DONE].tp;
	mutex_unlock(&kml_tp_lock);
	pr_info("attached to the page cache and reclaim tracepoints; NFS reads: %s\n",
		attached ? "attached" : "when nfs.ko loads");
	return 0;
}

void kml_hook_exit(void)
{
	kml_model_exit();
	kml_detach_probes();		/* and its grace period: no probe sees the model */
#if !KML_MODEL_FIXED
	cancel_work_sync(&kml_work);
#endif
	cancel_work_sync(&kml_reap_work);
	kml_walk(true);			/* every mount gets its own rsize back */
	kml_debugfs_remove();
}
