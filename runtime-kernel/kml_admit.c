// SPDX-License-Identifier: GPL-2.0
/*
 * Learned read balancing on a device-mapper mirror (Heimdall's admission)
 *
 *   dmsetup create NAME --table \
 *	"0 SECTORS kml_<model> LEG0 LEG1 [<#features> <feature>...]"
 *
 * Two legs that hold the same data, mapped from their sector 0 (each at
 * least SECTORS long).  Writes, FUA writes, flushes, discards and write
 * zeroes go to both legs and complete when both have completed them.
 * Each read goes to one leg: the model predicts, from Heimdall's features
 * of the primary (leg 0; kml_features.h), whether the primary will be
 * slow for it; if so the read is declined and goes to leg 1.  As md
 * raid1's read_balance() and dm-raid1 do, with the model choosing:
 *
 *  - A leg that fails a write, flush, discard or read is marked failed:
 *    it gets no more I/O, reads go to the other leg, the target raises a
 *    dm event, and the status and table lines say so ("failed <leg>", so
 *    that a saved table reloads with the leg still out).  A write
 *    completes without error while one leg has it; with neither, it fails.
 *  - A read that fails is sent again to the other leg (not readahead: it
 *    may fail); the filesystem sees the error only when both legs fail.
 *  - A read of a region (KML_REGION_SECTORS; no bio crosses one) with a
 *    write in flight, or issued while a discard or write zeroes is in
 *    flight, goes to the primary, as dm-raid1 reads a region with writes
 *    pending from its default mirror: reads issued during a write all see
 *    one leg's copy, which only moves forward.
 *  - Feature "replicated_elsewhere" (Heimdall's setting): writes,
 *    flushes and discards go to the primary only, and keeping leg 1 in
 *    sync is someone else's job.  Reads sent to leg 1 then return what it
 *    holds, which may be older than what was written.  Never the default.
 *
 * The features describe the primary as Heimdall sees its device: the
 * queue length counts the reads and writes this target has in flight on
 * it, and each one it completes there without error enters the history of
 * the last three completions (writes only with history_writes=1).  Every
 * probe_every-th declined read goes to the primary anyway, so that the
 * history stays current while the model declines every read.
 *
 * Context and locking.  map() runs where bios are submitted (process
 * context, may not sleep for long), end_io() where they complete (any
 * context but NMI, hard interrupts included).  Each mirror's history and
 * queue length are guarded by a raw_spinlock_t held for O(1) work: one
 * feature vector, one completion.  The model runs after the lock is
 * dropped (kml_decide(): per-CPU buffer, interrupts off, integer only).
 * Counters are per CPU; leg health is an atomic bitmap; a failed read is
 * resubmitted from a work item; the dm event is raised from another.
 *
 * Guards (kml_guard.h, docs/hooks.md): one for the module, as the other
 * hooks have, each mirror a key of it: every mirror runs the same weight
 * set, and a verdict pooled over all of them is reached sooner and applies
 * to all at once (mirrors judged apart can disagree, one sending its reads
 * to a leg the other's verdict keeps busy).  Each decision passes them
 * with the primary as the default, under kml_guard_lock; a read decided
 * on an A/B arm reports its latency, on whichever leg served it, from
 * end_io(), with the generation of the weight set that decided it (kept
 * in the bio's data), so that a cost counts for the set its decision ran
 * on.
 *
 * Tracing: the kml_admit_read, kml_admit_done and kml_guard events.
 * dmsetup status: leg health, counters, the module's guard counters.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/bio.h>
#include <linux/blk-integrity.h>
#include <linux/blkdev.h>
#include <linux/device-mapper.h>
#include <linux/hash.h>
#include <linux/kstrtox.h>
#include <linux/ktime.h>
#include <linux/module.h>
#include <linux/percpu.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include "kml_hook.h"

#define CREATE_TRACE_POINTS
#include "kml_admit_trace.h"

#define KML_LEGS 2
#define KML_BOTH_FAILED (BIT(0) | BIT(1))
#define KML_REGION_SECTORS 1024		/* 512 KiB */
#define KML_WRITING_BITS 12		/* region counters of writes in flight */

static unsigned int probe_every = KML_ADMIT_PROBE_EVERY;
module_param(probe_every, uint, 0644);
MODULE_PARM_DESC(probe_every, "send every Nth declined read to the primary anyway (0: never; default "
		 KML_ADMIT_PROBE_EVERY_DOC ")");

static bool history_writes = KML_ADMIT_HISTORY_WRITES;
module_param(history_writes, bool, 0644);
MODULE_PARM_DESC(history_writes, "Y: completed writes enter the history too; N: reads only (default "
		 KML_ADMIT_HISTORY_WRITES_DOC ")");

struct kml_leg_stats {
	u64 reads, writes, flushes, fua, discards, errors;
};

struct kml_mirror_stats {
	u64 reads, declined, probes, overlaps, unavailable, failovers;
	u64 inferences, infer_errors, infer_ns;
	struct kml_leg_stats leg[KML_LEGS];
};

struct kml_mirror {
	struct dm_target *ti;
	struct dm_dev *leg[KML_LEGS];
	unsigned long failed;		/* bit i: leg i failed (set only, atomic bitops) */
	bool elsewhere;			/* replicated_elsewhere: writes to leg 0 only */
	u64 id;				/* in the trace */
	raw_spinlock_t lock;		/* state, inflight, seq */
	struct kml_admit_state state;
	struct kml_guard_key gkey;	/* under kml_guard_lock */
	u32 inflight;			/* reads and writes in flight on the primary */
	u64 seq;
	atomic64_t declined;
	atomic_t *writing;		/* writes in flight, by region hash */
	atomic_t wholesale;		/* discards and write zeroes in flight */
	struct kml_mirror_stats __percpu *stats;
	struct bio_set bs;		/* leg 1's copies of writes */
	struct work_struct event_work;	/* dm_table_event() after a leg failed */
	struct work_struct retry_work;	/* failed reads, sent to the other leg */
	spinlock_t retry_lock;		/* retries (process and interrupt context) */
	struct bio_list retries;
};

enum { KML_IO_READ = 1, KML_IO_WRITE, KML_IO_DUP };

/* Per bio (dm's per-bio data). */
struct kml_io {
	u64 start_ns, bytes;
	u64 gen;			/* read: the weight set's generation that decided it */
	u32 qlen;			/* its place in the primary's queue */
	u32 region;
	u8 kind;
	u8 leg;				/* where the bio itself went */
	u8 legs;			/* write: bit i, leg i has a copy */
	u8 arm;				/* read: its A/B arm (kml_guard.h), or none */
	bool history;			/* in the primary's queue: its completion is recorded */
	bool done;			/* end_io has seen the bio's own completion */
	bool retried;
	bool skipped;			/* a duplicate for a failed leg, completed at once */
	bool wholesale;
	atomic_t pending;		/* write: legs still writing */
	blk_status_t status[KML_LEGS];
	struct bvec_iter iter;		/* read: where it was, for a retry */
	unsigned short flags;
};

static atomic64_t kml_ids;

/*
 * The module's guards, every mirror a key (its gkey, its id in the trace):
 * kml_guard_lock serializes their steps, and is taken with interrupts off
 * (end_io() may run in hard interrupt context), never with a mirror's
 * lock held, for O(features) work; the guard's id in the trace is 0.
 */
static DEFINE_RAW_SPINLOCK(kml_guard_lock);
static struct kml_guarded kml_guard;

static struct kml_io *kml_io_of(struct bio *bio)
{
	return dm_per_bio_data(bio, sizeof(struct kml_io));
}

static u32 kml_region(const struct bio *bio)
{
	return hash_64(bio->bi_iter.bi_sector / KML_REGION_SECTORS, KML_WRITING_BITS);
}

static bool kml_failed(struct kml_mirror *m, int leg)
{
	return test_bit(leg, &m->failed);
}

/* Marks leg failed; its first failure is logged and raises a dm event. */
static void kml_fail(struct kml_mirror *m, int leg)
{
	this_cpu_inc(m->stats->leg[leg].errors);
	if (test_and_set_bit(leg, &m->failed))
		return;
	pr_err("leg %d (%s) failed: no more I/O goes to it\n", leg, m->leg[leg]->name);
	schedule_work(&m->event_work);
}

static void kml_event_fn(struct work_struct *work)
{
	struct kml_mirror *m = container_of(work, struct kml_mirror, event_work);

	dm_table_event(m->ti->table);
}

static void kml_count(struct kml_mirror *m, int leg, const struct bio *bio)
{
	struct kml_leg_stats __percpu *s = &m->stats->leg[leg];

	if (bio_op(bio) == REQ_OP_READ)
		this_cpu_inc(s->reads);
	else if (bio_op(bio) == REQ_OP_WRITE && bio_sectors(bio))
		this_cpu_inc(s->writes);
	else if (bio_op(bio) == REQ_OP_WRITE)
		this_cpu_inc(s->flushes);
	else
		this_cpu_inc(s->discards);
	if (bio->bi_opf & REQ_FUA)
		this_cpu_inc(s->fua);
}

/* ---- the primary's queue and history ---------------------------------------------- */

static void kml_primary_start(struct kml_mirror *m, struct kml_io *io)
{
	unsigned long flags;

	raw_spin_lock_irqsave(&m->lock, flags);
	io->qlen = m->inflight++;
	raw_spin_unlock_irqrestore(&m->lock, flags);
	io->history = true;
	io->start_ns = ktime_get_ns();
}

/* A read or write left the primary; without error, it enters the history. */
static void kml_primary_done(struct kml_mirror *m, struct kml_io *io, blk_status_t error)
{
	bool write = io->kind == KML_IO_WRITE;
	bool enter = !error && (!write || READ_ONCE(history_writes));
	u64 lat = ktime_get_ns() - io->start_ns, seq = 0;
	unsigned long flags;

	raw_spin_lock_irqsave(&m->lock, flags);
	m->inflight--;
	if (enter) {
		kml_admit_complete(&m->state, io->qlen, lat, io->bytes);
		seq = m->seq++;
	}
	raw_spin_unlock_irqrestore(&m->lock, flags);
	if (enter)
		trace_kml_admit_done(m->id, seq, write, io->qlen, lat, io->bytes);
}

/* ---- reads ------------------------------------------------------------------------- */

static int kml_map_read(struct kml_mirror *m, struct bio *bio, struct kml_io *io)
{
	unsigned long failed = READ_ONCE(m->failed);
	s32 f[KML_ADMIT_FEATURES];
	unsigned long flags;
	u32 qlen, every, arm = KML_GUARD_ARM_NONE;
	u64 seq, ns = 0, gen = 0;
	int d, leg = 0;

	if (failed == KML_BOTH_FAILED)
		return DM_MAPIO_KILL;
	io->kind = KML_IO_READ;
	io->bytes = bio->bi_iter.bi_size;
	raw_spin_lock_irqsave(&m->lock, flags);
	qlen = m->inflight;
	kml_admit_features(&m->state, io->bytes, qlen, kml_model_frac(), f);
	seq = m->seq++;
	raw_spin_unlock_irqrestore(&m->lock, flags);

	this_cpu_inc(m->stats->reads);
	d = kml_decide(f, &ns, &gen);
	if (d >= 0) {
		this_cpu_inc(m->stats->inferences);
		this_cpu_add(m->stats->infer_ns, ns);
		/* the guards: the default is what md raid1 does, the primary */
		raw_spin_lock_irqsave(&kml_guard_lock, flags);
		leg = kml_guarded_decide(&kml_guard, &m->gkey, m->id, d, 0, f, gen, &arm) > 0;
		raw_spin_unlock_irqrestore(&kml_guard_lock, flags);
	} else if (d != -ENODEV) {
		this_cpu_inc(m->stats->infer_errors);
	}
	if (leg) {
		this_cpu_inc(m->stats->declined);
		every = READ_ONCE(probe_every);
		if (every && atomic64_inc_return(&m->declined) % every == 0) {
			this_cpu_inc(m->stats->probes);
			leg = 0;
		}
	}
	if (leg && (atomic_read(&m->writing[kml_region(bio)]) || atomic_read(&m->wholesale))) {
		this_cpu_inc(m->stats->overlaps);
		leg = 0;
	}
	if (failed & BIT(leg)) {
		this_cpu_inc(m->stats->unavailable);
		leg = !leg;
	}
	io->leg = leg;
	io->arm = arm;
	io->gen = gen;
	if (!leg)
		kml_primary_start(m, io);
	else
		io->start_ns = ktime_get_ns();
	kml_count(m, leg, bio);
	bio_set_dev(bio, m->leg[leg]->bdev);
	io->iter = bio->bi_iter;
	io->flags = bio->bi_flags;
	trace_kml_admit_read(m->id, seq, io->bytes, qlen, d < 0 ? -1 : d, leg, f);
	return DM_MAPIO_REMAPPED;
}

/* Failed reads, sent again to the other leg from process context. */
static void kml_retry_fn(struct work_struct *work)
{
	struct kml_mirror *m = container_of(work, struct kml_mirror, retry_work);
	struct bio_list list;
	struct bio *bio;

	spin_lock_irq(&m->retry_lock);
	list = m->retries;
	bio_list_init(&m->retries);
	spin_unlock_irq(&m->retry_lock);
	while ((bio = bio_list_pop(&list))) {
		struct kml_io *io = kml_io_of(bio);

		bio_set_dev(bio, m->leg[io->leg]->bdev);
		submit_bio_noacct(bio);
	}
}

static int kml_read_done(struct kml_mirror *m, struct bio *bio, struct kml_io *io,
			 blk_status_t *error)
{
	unsigned long flags;

	if (io->history && !io->retried)
		kml_primary_done(m, io, *error);
	if (io->arm != KML_GUARD_ARM_NONE && !*error && !io->retried) {
		/* the benefit guard's cost: the read's latency, on whichever leg */
		raw_spin_lock_irqsave(&kml_guard_lock, flags);
		kml_guarded_cost(&kml_guard, m->id, io->arm, io->gen,
				 ktime_get_ns() - io->start_ns);
		raw_spin_unlock_irqrestore(&kml_guard_lock, flags);
	}
	if (!*error || io->retried || (bio->bi_opf & REQ_RAHEAD) || *error == BLK_STS_NOTSUPP)
		return DM_ENDIO_DONE;
	kml_fail(m, io->leg);
	if (kml_failed(m, !io->leg))
		return DM_ENDIO_DONE;
	/* the other leg has the data: read it there */
	this_cpu_inc(m->stats->failovers);
	io->retried = true;
	io->leg = !io->leg;
	kml_count(m, io->leg, bio);
	bio->bi_iter = io->iter;
	bio->bi_flags = io->flags;
	bio->bi_status = BLK_STS_OK;
	spin_lock_irqsave(&m->retry_lock, flags);
	bio_list_add(&m->retries, bio);
	spin_unlock_irqrestore(&m->retry_lock, flags);
	queue_work(system_unbound_wq, &m->retry_work);
	return DM_ENDIO_INCOMPLETE;
}

/* ---- writes ------------------------------------------------------------------------ */

static void kml_mirror_endio(struct bio *copy)
{
	struct bio *bio = copy->bi_private;
	struct kml_io *io = kml_io_of(bio);

	io->status[1] = copy->bi_status;
	bio_put(copy);
	if (!atomic_dec_and_test(&io->pending))
		return;
	/*
	 * Both legs are done: complete the bio again, as dm-raid1 does a
	 * retried read, with the flags it had before its leg saw it (block
	 * layer accounting already done).  end_io then ends it.
	 */
	bio->bi_flags = io->flags;
	bio_endio(bio);
}

static int kml_map_write(struct kml_mirror *m, struct bio *bio, struct kml_io *io)
{
	unsigned long failed = READ_ONCE(m->failed);
	int leg = failed & BIT(0) ? 1 : 0;
	struct bio *copy;

	if (failed == KML_BOTH_FAILED || (m->elsewhere && leg))
		return DM_MAPIO_KILL;
	io->kind = KML_IO_WRITE;
	io->bytes = bio->bi_iter.bi_size;
	io->region = kml_region(bio);
	io->leg = leg;
	io->legs = BIT(leg);
	atomic_set(&io->pending, 1);
	atomic_inc(&m->writing[io->region]);
	smp_mb__after_atomic();		/* counted before any leg can have the write */
	if (!leg)
		kml_primary_start(m, io);
	if (!leg && !m->elsewhere && !(failed & BIT(1))) {
		copy = bio_alloc_clone(m->leg[1]->bdev, bio, GFP_NOIO, &m->bs);
		copy->bi_end_io = kml_mirror_endio;
		copy->bi_private = bio;
		io->legs |= BIT(1);
		atomic_set(&io->pending, 2);
		kml_count(m, 1, bio);
		submit_bio_noacct(copy);
	}
	kml_count(m, leg, bio);
	bio_set_dev(bio, m->leg[leg]->bdev);
	io->flags = bio->bi_flags;
	return DM_MAPIO_REMAPPED;
}

static int kml_write_done(struct kml_mirror *m, struct bio *bio, struct kml_io *io,
			  blk_status_t *error)
{
	bool written = false;
	int i;

	if (!io->done) {
		io->done = true;
		io->status[io->leg] = *error;
		if (io->history)
			kml_primary_done(m, io, *error);
		if (!atomic_dec_and_test(&io->pending))
			return DM_ENDIO_INCOMPLETE;	/* kml_mirror_endio() ends it */
	}
	for (i = 0; i < KML_LEGS; i++) {
		if (!(io->legs & BIT(i)))
			continue;
		if (io->status[i])
			kml_fail(m, i);
		else
			written = true;
	}
	if (written)
		*error = BLK_STS_OK;
	else if (!*error)
		*error = io->status[0] ? io->status[0] : io->status[1];
	atomic_dec(&m->writing[io->region]);
	return DM_ENDIO_DONE;
}

/*
 * Flushes, discards and write zeroes: device-mapper sends one copy per leg
 * (num_*_bios), bio number i to leg i.  A failed leg's copy completes at once.
 */
static int kml_map_dup(struct kml_mirror *m, struct bio *bio, struct kml_io *io)
{
	int leg = dm_bio_get_target_bio_nr(bio);

	io->kind = KML_IO_DUP;
	io->leg = leg;
	if (kml_failed(m, leg)) {
		io->skipped = true;
		bio_endio(bio);
		return DM_MAPIO_SUBMITTED;
	}
	if (bio_op(bio) != REQ_OP_WRITE) {
		io->wholesale = true;
		atomic_inc(&m->wholesale);
		smp_mb__after_atomic();	/* counted before the leg can have it */
	}
	kml_count(m, leg, bio);
	bio_set_dev(bio, m->leg[leg]->bdev);
	return DM_MAPIO_REMAPPED;
}

static int kml_dup_done(struct kml_mirror *m, struct kml_io *io, blk_status_t *error)
{
	if (io->skipped)
		return DM_ENDIO_DONE;
	if (io->wholesale)
		atomic_dec(&m->wholesale);
	if (!*error || *error == BLK_STS_NOTSUPP)
		return DM_ENDIO_DONE;
	kml_fail(m, io->leg);
	if (!m->elsewhere && !kml_failed(m, !io->leg))
		*error = BLK_STS_OK;	/* the other leg has it */
	return DM_ENDIO_DONE;
}

/* ---- the target ---------------------------------------------------------------------- */

static int kml_map(struct dm_target *ti, struct bio *bio)
{
	struct kml_mirror *m = ti->private;
	struct kml_io *io = kml_io_of(bio);

	memset(io, 0, sizeof(*io));
	if (bio_sectors(bio))
		bio->bi_iter.bi_sector = dm_target_offset(ti, bio->bi_iter.bi_sector);
	switch (bio_op(bio)) {
	case REQ_OP_READ:
		return kml_map_read(m, bio, io);
	case REQ_OP_WRITE:
		return bio_sectors(bio) ? kml_map_write(m, bio, io) : kml_map_dup(m, bio, io);
	case REQ_OP_DISCARD:
	case REQ_OP_WRITE_ZEROES:
		return kml_map_dup(m, bio, io);
	default:
		return DM_MAPIO_KILL;
	}
}

static int kml_end_io(struct dm_target *ti, struct bio *bio, blk_status_t *error)
{
	struct kml_mirror *m = ti->private;
	struct kml_io *io = kml_io_of(bio);

	switch (io->kind) {
	case KML_IO_READ:
		return kml_read_done(m, bio, io, error);
	case KML_IO_WRITE:
		return kml_write_done(m, bio, io, error);
	case KML_IO_DUP:
		return kml_dup_done(m, io, error);
	default:
		return DM_ENDIO_DONE;
	}
}

static int kml_iterate_devices(struct dm_target *ti, iterate_devices_callout_fn fn, void *data)
{
	struct kml_mirror *m = ti->private;
	int i, ret = 0;

	for (i = 0; !ret && i < KML_LEGS; i++)
		ret = fn(ti, m->leg[i], 0, ti->len, data);
	return ret;
}

/*
 * The module's guard counters for the status line (a frame of its own: the
 * counters' copy and kml_status()'s would add up under KASAN).
 */
static noinline_for_stack void kml_guard_status(char *result, unsigned int maxlen,
						unsigned int *psz)
{
	struct kml_guard_counts g;
	unsigned int sz = *psz;
	unsigned long flags;

	raw_spin_lock_irqsave(&kml_guard_lock, flags);
	kml_guard_counts(&kml_guard.g, &g);
	raw_spin_unlock_irqrestore(&kml_guard_lock, flags);
	DMEMIT(" guard=%llu,%llu,%llu,%llu,%llu,%llu,%llu", g.why[KML_WHY_MODEL],
	       g.why[KML_WHY_SHADOW], g.why[KML_WHY_ENVELOPE], g.why[KML_WHY_CONTROL],
	       g.why[KML_WHY_DEMOTED], g.why[KML_WHY_PROBE], g.why[KML_WHY_RATE]);
	DMEMIT(" periods=%llu demotions=%llu promotions=%llu", g.periods, g.demotions,
	       g.promotions);
	DMEMIT(" envelope_trips=%llu demoted=%u resets=%llu", g.env_trips, g.demoted, g.resets);
	*psz = sz;
}

/*
 * Table: "<leg0> <leg1>" and the features, with "failed <leg>" for each
 * failed leg.  Info: leg health (A alive, D failed) and counters.
 */
static void kml_status(struct dm_target *ti, status_type_t type, unsigned int status_flags,
		       char *result, unsigned int maxlen)
{
	struct kml_mirror *m = ti->private;
	unsigned long failed = READ_ONCE(m->failed);
	struct kml_mirror_stats t = { 0 };
	unsigned int sz = 0, nfeat;
	int cpu, i;

	switch (type) {
	case STATUSTYPE_INFO:
		for_each_possible_cpu(cpu)
			kml_sum_u64(&t, per_cpu_ptr(m->stats, cpu), sizeof(t));
		DMEMIT("%c%c reads=%llu declined=%llu probes=%llu overlaps=%llu",
		       failed & BIT(0) ? 'D' : 'A', failed & BIT(1) ? 'D' : 'A', t.reads,
		       t.declined, t.probes, t.overlaps);
		DMEMIT(" unavailable=%llu failovers=%llu inferences=%llu infer_errors=%llu",
		       t.unavailable, t.failovers, t.inferences, t.infer_errors);
		DMEMIT(" infer_ns=%llu", t.infer_ns);
		for (i = 0; i < KML_LEGS; i++)
			DMEMIT(" leg%d=%llu,%llu,%llu,%llu,%llu,%llu", i, t.leg[i].reads,
			       t.leg[i].writes, t.leg[i].flushes, t.leg[i].fua, t.leg[i].discards,
			       t.leg[i].errors);
		kml_guard_status(result, maxlen, &sz);
		break;
	case STATUSTYPE_TABLE:
		DMEMIT("%s %s", m->leg[0]->name, m->leg[1]->name);
		nfeat = m->elsewhere + 2 * hweight_long(failed);
		if (nfeat)
			DMEMIT(" %u", nfeat);
		if (m->elsewhere)
			DMEMIT(" replicated_elsewhere");
		for (i = 0; i < KML_LEGS; i++)
			if (failed & BIT(i))
				DMEMIT(" failed %d", i);
		break;
	default:
		*result = '\0';
		break;
	}
}

static int kml_features(struct kml_mirror *m, struct dm_arg_set *as, char **error)
{
	static const struct dm_arg arg = { 0, 5, "invalid number of features" };
	unsigned int n, leg;
	const char *name;
	int ret;

	if (!as->argc)
		return 0;
	ret = dm_read_arg_group(&arg, as, &n, error);

	while (!ret && n--) {
		name = dm_shift_arg(as);
		if (!strcasecmp(name, "replicated_elsewhere")) {
			m->elsewhere = true;
		} else if (!strcasecmp(name, "failed") && n &&
			   !kstrtouint(dm_shift_arg(as), 10, &leg) && leg < KML_LEGS) {
			n--;
			set_bit(leg, &m->failed);
		} else {
			*error = "unknown feature (replicated_elsewhere, failed <leg>)";
			ret = -EINVAL;
		}
	}
	return ret;
}

static void kml_dtr(struct dm_target *ti)
{
	struct kml_mirror *m = ti->private;
	int i;

	cancel_work_sync(&m->event_work);
	flush_work(&m->retry_work);
	for (i = 0; i < KML_LEGS; i++)
		if (m->leg[i])
			dm_put_device(ti, m->leg[i]);
	bioset_exit(&m->bs);
	free_percpu(m->stats);
	kvfree(m->writing);
	kfree(m);
}

/* Arguments: <leg0> <leg1> [<#features> <feature>...] */
static int kml_ctr(struct dm_target *ti, unsigned int argc, char **argv)
{
	struct dm_arg_set as;
	unsigned int i, copies;
	bool discards = true, zeroes = true;
	struct kml_mirror *m;
	int ret;

	if (argc < 2) {
		ti->error = "expects <leg0> <leg1> [<#features> <feature>...]";
		return -EINVAL;
	}
	as.argc = argc - 2;
	as.argv = argv + 2;
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return -ENOMEM;
	ti->private = m;
	m->ti = ti;
	m->id = atomic64_inc_return(&kml_ids);
	raw_spin_lock_init(&m->lock);
	spin_lock_init(&m->retry_lock);
	bio_list_init(&m->retries);
	INIT_WORK(&m->event_work, kml_event_fn);
	INIT_WORK(&m->retry_work, kml_retry_fn);
	ret = -ENOMEM;
	m->writing = kvcalloc(BIT(KML_WRITING_BITS), sizeof(*m->writing), GFP_KERNEL);
	m->stats = alloc_percpu(struct kml_mirror_stats);
	if (!m->writing || !m->stats || bioset_init(&m->bs, BIO_POOL_SIZE, 0, BIOSET_NEED_RESCUER))
		goto bad;
	for (i = 0; i < KML_LEGS; i++) {
		struct block_device *bdev;

		ret = dm_get_device(ti, argv[i], dm_table_get_mode(ti->table), &m->leg[i]);
		if (ret) {
			ti->error = i ? "cannot open leg 1" : "cannot open leg 0";
			goto bad;
		}
		bdev = m->leg[i]->bdev;
		ret = -EINVAL;
		if (bdev_nr_sectors(bdev) < ti->len) {
			ti->error = "a leg is smaller than the target";
			goto bad;
		}
		if (bdev_is_zoned(bdev) || blk_get_integrity(bdev->bd_disk)) {
			ti->error = "zoned legs and legs with integrity data are not supported";
			goto bad;
		}
		discards &= bdev_max_discard_sectors(bdev) > 0;
		zeroes &= bdev_write_zeroes_sectors(bdev) > 0;
	}
	ret = kml_features(m, &as, &ti->error);
	if (!ret && m->failed == KML_BOTH_FAILED) {
		ti->error = "both legs failed";
		ret = -EINVAL;
	}
	if (!ret)
		ret = dm_set_target_max_io_len(ti, KML_REGION_SECTORS);
	if (ret)
		goto bad;
	copies = m->elsewhere ? 1 : KML_LEGS;
	ti->num_flush_bios = copies;
	ti->num_discard_bios = discards ? copies : 0;
	ti->num_write_zeroes_bios = zeroes ? copies : 0;
	ti->per_io_data_size = sizeof(struct kml_io);
	return 0;

bad:
	kml_dtr(ti);
	return ret;
}

static struct target_type kml_target = {
	.name = KBUILD_MODNAME,
	.version = {2, 0, 0},
	.module = THIS_MODULE,
	.ctr = kml_ctr,
	.dtr = kml_dtr,
	.map = kml_map,
	.end_io = kml_end_io,
	.status = kml_status,
	.iterate_devices = kml_iterate_devices,
};

void kml_hook_detached(void)
{
	/* reads go to the primary from now on: nothing to undo */
}

int kml_hook_init(void)
{
	int ret;

	kml_model_init();
	kml_debugfs_saturated();
	ret = dm_register_target(&kml_target);
	if (ret) {
		kml_model_exit();
		kml_debugfs_remove();
		return ret;
	}
	pr_info("device-mapper target %s ready\n", kml_target.name);
	return 0;
}

void kml_hook_exit(void)
{
	/* device-mapper holds a module reference while any table uses the target */
	dm_unregister_target(&kml_target);
	kml_model_exit();
	synchronize_rcu();
	kml_debugfs_remove();
}
