// SPDX-License-Identifier: GPL-2.0
/*
 * The guards of a kmlc hook module: their module parameters, the
 * envelope's check, the kml_guard trace event and the counters.  The
 * logic is kml_guard.h's, shared with the userspace twin; docs/hooks.md
 * ("Guards") says what each guard does and how to tune it.
 *
 * Context: a hook calls kml_guarded_decide() and kml_guarded_cost() from
 * its event handlers (probes through ftrace, tracepoint probes,
 * device-mapper map and end_io: any context but NMI), under the raw
 * spinlock that serializes the guard, for O(features) work.
 * ktime_get_ns() is safe there; the parameters are read once per step
 * with READ_ONCE(), so a write to them takes effect at the next step.
 *
 * Weight sets: a decision comes with the generation of the set its
 * inference ran on, which kml_set_read_begin() read from the same
 * published struct kml_set_ref as the set itself, under the inference's
 * RCU-sched read side; the hook hands it over by value (the per-CPU
 * buffer, read with interrupts still off, or the work item's buffer) and
 * keeps it beside the decision's arm for its cost.  kml_guard_decide()
 * compares it with the guard's own generation, and resets the benefit
 * state for a later one, under the same raw spinlock as every other step
 * of the guard: struct kml_guard is only ever touched under that lock, and
 * the writer (kml_swap.c) never touches it, so nothing else can race with
 * the check or the reset and no new lock is needed.  The reset is
 * O(KML_GUARD_MAX_PERIODS) stores: no sleeping, no allocation, fine in a
 * kprobe, a tracepoint probe or an I/O completion.  Decisions reach the
 * guard in lock order, not in the order their inferences read the set: a
 * generation below the guard's is a decision that read the set before a
 * publish, and changes nothing (kml_guard.h).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/ktime.h>
#include <linux/module.h>
#include <linux/seq_file.h>
#include "kml_hook.h"

#define CREATE_TRACE_POINTS
#include "kml_guard_trace.h"

static struct kml_guard_cfg kml_cfg = {
	.shadow = KML_GUARD_SHADOW,
	.envelope_pct = KML_GUARD_ENVELOPE_PCT,
	.envelope_events = KML_GUARD_ENVELOPE_EVENTS,
	.benefit_every = KML_GUARD_BENEFIT_EVERY,
	.benefit_samples = KML_GUARD_BENEFIT_SAMPLES,
	.benefit_margin_pct = KML_GUARD_BENEFIT_MARGIN_PCT,
	.benefit_periods = KML_GUARD_BENEFIT_PERIODS,
	.rate_ms = KML_GUARD_RATE_MS,
	.benefit_probe_every = KML_GUARD_BENEFIT_PROBE_EVERY,
	.benefit_trial = KML_GUARD_BENEFIT_TRIAL,
};

#define KML_GUARD_PARAM(name, NAME, lo, hi, zero, desc)					\
	static struct kml_uint_param kml_p_##name = { &kml_cfg.name, 1, lo, hi, zero };	\
	module_param_cb(guard_##name, &kml_uint_param_ops, &kml_p_##name, 0644);	\
	MODULE_PARM_DESC(guard_##name, desc " (default " KML_GUARD_##NAME##_DOC ")")

KML_GUARD_PARAM(shadow, SHADOW, 0, 1, false, "1: apply the kernel's decision, trace the model's");
/* the envelope guard only where the model has a calibrated envelope */
KML_GUARD_PARAM(envelope_pct, ENVELOPE_PCT, 1, KML_GUARD_HAVE_ENVELOPE ? 100 : 0, true,
		"fall back while over this percent of a block's inputs leave the envelope, 0 off");
KML_GUARD_PARAM(envelope_events, ENVELOPE_EVENTS, 1, KML_GUARD_MAX_EVENTS, false,
		"decisions per envelope block");
KML_GUARD_PARAM(benefit_every, BENEFIT_EVERY, 2, KML_GUARD_MAX_EVERY, true,
		"A/B: one decision in this many takes the other arm, 0 off");
KML_GUARD_PARAM(benefit_samples, BENEFIT_SAMPLES, 1, KML_GUARD_MAX_SAMPLES, false,
		"costs per arm in an A/B period");
KML_GUARD_PARAM(benefit_margin_pct, BENEFIT_MARGIN_PCT, 0, 100, false,
		"a period goes against the model: its mean cost over this % above the default's");
KML_GUARD_PARAM(benefit_probe_every, BENEFIT_PROBE_EVERY, 2, KML_GUARD_MAX_SAMPLES, false,
		"A/B: while the model is demoted, one decision in this many is its");
KML_GUARD_PARAM(benefit_trial, BENEFIT_TRIAL, 0, 1, false,
		"A/B: 1: the model starts on trial, trusted only once it wins by the margin");
KML_GUARD_PARAM(benefit_periods, BENEFIT_PERIODS, 1, KML_GUARD_MAX_PERIODS, false,
		"periods in a row that demote the model, or trust it again");
KML_GUARD_PARAM(rate_ms, RATE_MS, 1, KML_GUARD_MAX_RATE_MS, true,
		"a file's, mirror's or mount's decision changes at most once in this, 0 off");

static void kml_guard_cfg_read(struct kml_guard_cfg *c)
{
	c->shadow = READ_ONCE(kml_cfg.shadow);
	c->envelope_pct = READ_ONCE(kml_cfg.envelope_pct);
	c->envelope_events = READ_ONCE(kml_cfg.envelope_events);
	c->benefit_every = READ_ONCE(kml_cfg.benefit_every);
	c->benefit_samples = READ_ONCE(kml_cfg.benefit_samples);
	c->benefit_margin_pct = READ_ONCE(kml_cfg.benefit_margin_pct);
	c->benefit_periods = READ_ONCE(kml_cfg.benefit_periods);
	c->rate_ms = READ_ONCE(kml_cfg.rate_ms);
	c->benefit_probe_every = READ_ONCE(kml_cfg.benefit_probe_every);
	c->benefit_trial = READ_ONCE(kml_cfg.benefit_trial);
}

s32 kml_guarded_decide(struct kml_guarded *gd, struct kml_guard_key *k, u64 key, s32 model,
		       s32 dflt, const s32 *f, u64 gen, u32 *arm)
{
	struct kml_guard_cfg c;
	u64 now = ktime_get_ns();
	bool outside = false;
	u32 why;
	s32 d;

	kml_guard_cfg_read(&c);
	if (c.envelope_pct)
		outside = kml_guard_outside(f, kml_model_envelope(0), kml_model_envelope(1),
					    KML_MODEL_INPUTS);
	d = kml_guard_decide(&gd->g, &c, k, model, dflt, outside, gen, now, arm, &why);
	/* kind 0, flags: bit 0 outside, bit 1 shadow (kml_guard_trace.h) */
	trace_kml_guard(gd->id, gd->seq++, key, gen, (outside | (c.shadow ? 2 : 0)) << 1, model,
			dflt, now, d, why, *arm, kml_guard_state(&gd->g));
	return d;
}

void kml_guarded_cost(struct kml_guarded *gd, u64 key, u32 arm, u64 gen, u64 cost)
{
	struct kml_guard_cfg c;
	bool ended;

	kml_guard_cfg_read(&c);
	ended = kml_guard_cost(&gd->g, &c, arm, gen, cost);
	trace_kml_guard(gd->id, gd->seq++, key, gen, 1, 0, 0, cost, ended, 0, arm,
			kml_guard_state(&gd->g));
}

static const char * const kml_why[KML_WHYS] = {
	"model", "shadow", "envelope", "control", "demoted", "probe", "rate",
};

void kml_guard_show(struct seq_file *m, const struct kml_guard_counts *g)
{
	int i;

	seq_printf(m, "guard_decisions %llu\n", g->decisions);
	for (i = 0; i < KML_WHYS; i++)
		seq_printf(m, "guard_%s %llu\n", kml_why[i], g->why[i]);
	seq_printf(m, "guard_periods %llu\nguard_demotions %llu\nguard_promotions %llu\n",
		   g->periods, g->demotions, g->promotions);
	seq_printf(m, "guard_envelope_trips %llu\nguard_envelope_clears %llu\n", g->env_trips,
		   g->env_clears);
	seq_printf(m, "guard_resets %llu\n", g->resets);
	seq_printf(m, "guard_demoted %u\nguard_tripped %u\n", g->demoted, g->tripped);
}
