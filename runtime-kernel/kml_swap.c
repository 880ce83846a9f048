// SPDX-License-Identifier: GPL-2.0
/*
 * Weight hot-swap for a kmlc module (docs/weights.md)
 *
 * Three files in the module's sysfs directory, /sys/module/<module>/:
 *   weights          root-only, write-only, binary: a .kmlw blob from
 *                    kmlc pack.  The blob is taken when its last byte
 *                    arrives: kml_set_check() (kml_weights.h) validates it,
 *                    re-proving every layer's bounds from its values, and
 *                    only then is it published; a bad blob is refused with
 *                    -EINVAL and one line in the kernel log, and the running
 *                    set stays.  A write shorter than a page that leaves
 *                    the blob incomplete ends it (refused as truncated), so
 *                    write the blob at once (cat, cp, dd bs=64k).
 *   weights_version  the running set's version (0: the compiled one).
 *   rollback         writing 1 restores the set before the running one
 *                    (once: -ENOENT when there is none).
 *
 * Inference reads the current set through one RCU-protected pointer and
 * holds RCU-sched for the whole call (kml_set_read_begin), so every
 * inference uses exactly one set.  Writers serialize on kml_swap_lock,
 * publish with rcu_assign_pointer() and wait with synchronize_rcu() before
 * freeing the set they replaced, so a set is freed only once no inference
 * can hold it.  The set before the running one is kept for rollback.
 *
 * Each publish, a new set or a rollback, is a new generation (a counter,
 * not the blob's version: a rollback brings back an old version as a new
 * generation).  The pointer inferences read is a struct kml_set_ref, the
 * set and its generation together, so a decision knows which publish it
 * ran on and a hook's benefit guard judges each generation afresh
 * (kml_guard.h).  The two refs below alternate, so publishing allocates
 * nothing beyond the set itself (a rollback, nothing at all).  All
 * of this runs in process context (sysfs writes and module init/exit),
 * where kvmalloc(GFP_KERNEL), mutex_lock() and synchronize_rcu() may sleep.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kobject.h>
#include <linux/module.h>
#include <linux/mm.h>
#include <linux/mutex.h>
#include <linux/printk.h>
#include <linux/rcupdate.h>
#include <linux/string.h>
#include <linux/sysfs.h>
#include "kml_swap.h"

static const struct kml_set_desc *kml_desc;
static const struct kml_set_ref __rcu **kml_current;

static DEFINE_MUTEX(kml_swap_lock);	/* everything below */
static u8 *kml_stage;			/* the blob being written */
static size_t kml_staged;		/* its bytes so far */
static void *kml_cur, *kml_prev;	/* the running set and the one before (NULL: compiled) */
static u32 kml_cur_version, kml_prev_version;
static bool kml_have_prev;
static u64 kml_generation;		/* the last publish's (0: none, the compiled set) */
static struct kml_set_ref kml_refs[2];	/* what is published: they alternate */

/*
 * Makes set the one inferences read, as a new generation, and waits until
 * none reads the ref before.  The ref filled here was last published two
 * publishes ago (or never): the synchronize_rcu() of the publish since
 * has waited out every reader that could still hold it.
 */
static void kml_publish(void *set)
{
	struct kml_set_ref *r = &kml_refs[++kml_generation & 1];

	r->set = set;
	r->gen = kml_generation;
	rcu_assign_pointer(*kml_current, r);
	synchronize_rcu();
}

/* Validates a whole blob and publishes its set; the caller holds kml_swap_lock. */
static int kml_take(const u8 *blob, size_t len)
{
	const char *why, *layer;
	u32 version;
	void *set;

	set = kvmalloc(kml_desc->bytes, GFP_KERNEL);	/* aligned for any member */
	if (!set)
		return -ENOMEM;
	if (kml_set_check(kml_desc, blob, len, set, &version, &why, &layer)) {
		pr_warn("weights refused: %s%s%s\n", why, layer ? "; layer " : "", layer ?: "");
		kvfree(set);
		return -EINVAL;
	}
	/* the set before the previous one: a grace period has passed since it ran */
	kvfree(kml_prev);
	kml_prev = kml_cur;
	kml_prev_version = kml_cur_version;
	kml_have_prev = true;
	kml_cur = set;
	kml_cur_version = version;
	kml_publish(set);
	pr_info("weights: version %u in use, generation %llu (rollback restores %u)\n", version,
		kml_generation, kml_prev_version);
	return 0;
}

static ssize_t weights_write(struct file *file, struct kobject *kobj,
			     struct bin_attribute *attr, char *buf, loff_t off, size_t count)
{
	size_t total = attr->size;	/* sysfs clips writes to it */
	ssize_t ret = count;

	mutex_lock(&kml_swap_lock);
	if (off == 0) {
		kvfree(kml_stage);
		kml_staged = 0;
		kml_stage = kvmalloc(total, GFP_KERNEL);
		if (!kml_stage) {
			ret = -ENOMEM;
			goto unlock;
		}
	} else if (!kml_stage || off != kml_staged) {
		pr_warn("weights refused: written out of order\n");
		ret = -EINVAL;
		goto drop;
	}
	memcpy(kml_stage + off, buf, count);
	kml_staged += count;
	if (kml_staged == total) {
		ret = kml_take(kml_stage, total);
		if (!ret)
			ret = count;
	} else if (count < PAGE_SIZE) {
		pr_warn("weights refused: %zu of %zu bytes (truncated, or for another model)\n",
			kml_staged, total);
		ret = -EINVAL;
	} else {
		goto unlock;	/* more to come */
	}
drop:
	kvfree(kml_stage);
	kml_stage = NULL;
	kml_staged = 0;
unlock:
	mutex_unlock(&kml_swap_lock);
	return ret;
}

static BIN_ATTR_WO(weights, 0);	/* its size: the model's blob, set at init */

static ssize_t weights_version_show(struct kobject *kobj, struct kobj_attribute *attr,
				    char *buf)
{
	u32 v;

	mutex_lock(&kml_swap_lock);
	v = kml_cur_version;
	mutex_unlock(&kml_swap_lock);
	return sysfs_emit(buf, "%u\n", v);
}

static struct kobj_attribute kml_version_attr = __ATTR_RO_MODE(weights_version, 0444);

static ssize_t rollback_store(struct kobject *kobj, struct kobj_attribute *attr,
			      const char *buf, size_t count)
{
	void *gone;
	bool yes;

	if (kstrtobool(buf, &yes) || !yes)
		return -EINVAL;
	mutex_lock(&kml_swap_lock);
	if (!kml_have_prev) {
		mutex_unlock(&kml_swap_lock);
		return -ENOENT;
	}
	gone = kml_cur;
	kml_cur = kml_prev;
	kml_cur_version = kml_prev_version;
	kml_prev = NULL;
	kml_have_prev = false;
	kml_publish(kml_cur);
	kvfree(gone);
	pr_info("weights: rolled back to version %u, generation %llu\n", kml_cur_version,
		kml_generation);
	mutex_unlock(&kml_swap_lock);
	return count;
}

static struct kobj_attribute kml_rollback_attr = __ATTR_WO(rollback);

static struct attribute *kml_swap_attrs[] = {
	&kml_version_attr.attr,
	&kml_rollback_attr.attr,
	NULL
};

static struct bin_attribute *kml_swap_bin_attrs[] = {
	&bin_attr_weights,
	NULL
};

static const struct attribute_group kml_swap_group = {
	.attrs = kml_swap_attrs,
	.bin_attrs = kml_swap_bin_attrs,
};

int kml_swap_init(const struct kml_set_desc *desc, const struct kml_set_ref __rcu **cur)
{
	kml_desc = desc;
	kml_current = cur;
	bin_attr_weights.size = kml_set_blob_bytes(desc);
	return sysfs_create_group(&THIS_MODULE->mkobj.kobj, &kml_swap_group);
}

void kml_swap_exit(void)
{
	/* waits for writers in progress; none can start after */
	sysfs_remove_group(&THIS_MODULE->mkobj.kobj, &kml_swap_group);
	RCU_INIT_POINTER(*kml_current, NULL);
	synchronize_rcu();
	kvfree(kml_cur);
	kvfree(kml_prev);
	kvfree(kml_stage);
}
