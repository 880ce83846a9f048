// SPDX-License-Identifier: GPL-2.0
/*
 * What kmlc's kernel hooks share: the model attached with RCU, checked
 * module parameters, debugfs (see kml_hook.h)
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/irqflags.h>
#include <linux/kernel.h>
#include <linux/kstrtox.h>
#include <linux/ktime.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/percpu.h>
#include <linux/rcupdate.h>
#include <linux/seq_file.h>
#include <linux/string.h>
#include <linux/sysfs.h>
#include <linux/utsname.h>
#include "kml_hook.h"

/* ---- the model, attached with RCU ---------------------------------------------- */

struct kml_model {
	int (*decide)(const s32 *f, struct kml_model_buf *buf);
};

static const struct kml_model kml_the_model = { .decide = kml_model_decide };
static const struct kml_model __rcu *kml_model;
static DEFINE_MUTEX(kml_attach_lock);	/* enabled, kml_dying, and attaching */
static bool kml_dying;			/* module exit has begun */

/*
 * The buffers inline decisions run on, one per CPU, used with interrupts
 * off so that nothing else on the CPU can use the same one meanwhile.
 */
static DEFINE_PER_CPU(struct kml_model_buf, kml_bufs);

/* Values the model saturated, over every decision (debugfs "saturated"). */
static DEFINE_PER_CPU(u64, kml_saturated);

bool kml_attached(void)
{
	return rcu_access_pointer(kml_model);
}

int kml_decide(const s32 *f, u64 *ns, u64 *gen)
{
	const struct kml_model *m;
	unsigned long flags;
	int ret = -ENODEV;
	u64 t0;

	rcu_read_lock();
	m = rcu_dereference(kml_model);
	if (m) {
		local_irq_save(flags);
		t0 = ktime_get_ns();
		ret = m->decide(f, this_cpu_ptr(&kml_bufs));
		*ns = ktime_get_ns() - t0;
		/* interrupts are off: this CPU's buffer and counter are ours */
		if (ret >= 0) {
			this_cpu_add(kml_saturated, this_cpu_ptr(&kml_bufs)->saturated);
			*gen = this_cpu_ptr(&kml_bufs)->gen;
		}
		local_irq_restore(flags);
	}
	rcu_read_unlock();
	return ret;
}

int kml_decide_with(const s32 *f, struct kml_model_buf *buf)
{
	const struct kml_model *m = rcu_dereference(kml_model);
	int ret = m ? m->decide(f, buf) : -ENODEV;

	/* process context, preemptible: this_cpu_add() is one preempt-safe update */
	if (ret >= 0)
		this_cpu_add(kml_saturated, buf->saturated);
	return ret;
}

static bool enabled = true;

static int kml_set_enabled(const char *val, const struct kernel_param *kp)
{
	bool on;
	int ret = kstrtobool(val, &on);

	if (ret)
		return ret;
	mutex_lock(&kml_attach_lock);
	if (kml_dying) {
		ret = -ENODEV;		/* the event sources are going away */
	} else if (on) {
		rcu_assign_pointer(kml_model, &kml_the_model);
	} else if (rcu_access_pointer(kml_model)) {
		RCU_INIT_POINTER(kml_model, NULL);
		synchronize_rcu();	/* no handler still runs the model or applies it */
		kml_hook_detached();
	}
	if (!ret)
		enabled = on;
	mutex_unlock(&kml_attach_lock);
	return ret;
}

static const struct kernel_param_ops kml_enabled_ops = {
	.set = kml_set_enabled,
	.get = param_get_bool,
};

module_param_cb(enabled, &kml_enabled_ops, &enabled, 0644);
MODULE_PARM_DESC(enabled, "1: decide with the model; 0: leave every decision to the kernel");

void kml_model_init(void)
{
	mutex_lock(&kml_attach_lock);
	if (enabled)
		rcu_assign_pointer(kml_model, &kml_the_model);
	mutex_unlock(&kml_attach_lock);
}

/*
 * No enabled= write attaches the model again (sysfs keeps the parameter
 * until module exit returns).  The caller waits for the grace period once
 * its event sources are gone.
 */
void kml_model_exit(void)
{
	mutex_lock(&kml_attach_lock);
	kml_dying = true;
	RCU_INIT_POINTER(kml_model, NULL);
	mutex_unlock(&kml_attach_lock);
}

/* ---- checked parameters ---------------------------------------------------------- */

static int kml_uint_param_set(const char *val, const struct kernel_param *kp)
{
	const struct kml_uint_param *p = kp->arg;
	unsigned int v[16], i = 0;
	char buf[192], *s = buf, *tok;

	if (p->n > ARRAY_SIZE(v) || strscpy(buf, val, sizeof(buf)) < 0)
		return -EINVAL;
	while ((tok = strsep(&s, ",")) != NULL) {
		if (i == p->n || kstrtouint(strim(tok), 0, &v[i]) ||
		    (v[i] < p->lo && (v[i] || !p->zero)) || v[i] > p->hi)
			return -EINVAL;
		i++;
	}
	if (i != p->n)
		return -EINVAL;
	for (i = 0; i < p->n; i++)
		WRITE_ONCE(p->v[i], v[i]);
	return 0;
}

static int kml_uint_param_get(char *buf, const struct kernel_param *kp)
{
	const struct kml_uint_param *p = kp->arg;
	int len = 0;
	unsigned int i;

	for (i = 0; i < p->n; i++)
		len += scnprintf(buf + len, PAGE_SIZE - len, "%s%u", i ? "," : "",
				 READ_ONCE(p->v[i]));
	return len + scnprintf(buf + len, PAGE_SIZE - len, "\n");
}

const struct kernel_param_ops kml_uint_param_ops = {
	.set = kml_uint_param_set,
	.get = kml_uint_param_get,
};

/* ---- debugfs ---------------------------------------------------------------------- */

static struct dentry *kml_dir;

struct dentry *kml_debugfs_dir(void)
{
	if (!kml_dir)
		kml_dir = debugfs_create_dir(KBUILD_MODNAME, NULL);
	return kml_dir;
}

void kml_debugfs_file(const char *name, const struct file_operations *fops)
{
	debugfs_create_file(name, 0400, kml_debugfs_dir(), NULL, fops);
}

static int kml_saturated_show(struct seq_file *m, void *unused)
{
	u64 n = 0;
	int cpu;

	for_each_possible_cpu(cpu)
		n += per_cpu(kml_saturated, cpu);
	seq_printf(m, "%llu\n", n);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(kml_saturated);

/* debugfs "saturated": values the model saturated, summed over every CPU. */
void kml_debugfs_saturated(void)
{
	kml_debugfs_file("saturated", &kml_saturated_fops);
}

void kml_debugfs_remove(void)
{
	debugfs_remove_recursive(kml_dir);
	kml_dir = NULL;
}

const char *kml_release(void)
{
	return init_utsname()->release;
}
