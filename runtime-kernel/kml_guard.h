/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Guards on a hook's learned decisions (docs/hooks.md, "Guards")
 *
 * One definition, compiled into the hook module (kml_guard.c) and into the
 * userspace twin (kml_twin_guard()), so that the guard's steps replayed
 * from a trace, or driven by a simulator, give the module's guarded
 * decisions bit for bit.  Integer arithmetic only, no division by zero,
 * no sum that can wrap.  The caller serializes the steps of one guard
 * (in the module: the hook's lock) and keeps one kml_guard_key per thing
 * a decision is made for (a file, a mirror, a mount).
 *
 * Each decision of the model passes kml_guard_decide() with the decision
 * the kernel would make without the model (the default); the one it
 * returns is applied.  The first guard that applies decides:
 *
 *   shadow    the default, always: the model's decision is only traced.
 *   envelope  the default while tripped.  Decisions are counted in blocks
 *             of envelope_events; a block in which more than envelope_pct
 *             percent of the decisions had a feature outside the
 *             calibrated envelope trips the guard, and a block with at
 *             most half that clears it.
 *   benefit   an A/B test of model against default, on the decisions
 *             where they differ (where they agree, either arm would do the
 *             same).  With benefit_trial the model starts on trial: until
 *             the first verdict those decisions alternate between default
 *             and model, and the verdict trusts the model only when it
 *             wins by the margin; without, it starts trusted.
 *             While the model is trusted, one in benefit_every takes the
 *             default (the control arm); while it is demoted, one in
 *             benefit_probe_every takes the model (its probe arm).  The
 *             hook reports what each decision cost (kml_guard_cost(),
 *             lower is better).  When both arms hold benefit_samples
 *             costs a period ends; both arms' costs come from the same
 *             span of decisions (the majority arm keeps every cost until
 *             the minority has its samples, at most KML_GUARD_ARM_MAX).
 *             At the end of each period, once the last benefit_periods
 *             periods (the window) all came after the trust last changed,
 *             the arms' mean costs over the window compare: the model is
 *             demoted when its mean exceeds the default's by more than
 *             benefit_margin_pct percent, and trusted (again, or after its
 *             trial) when the default's exceeds its own by at least that
 *             much (the band between is the hysteresis).
 *   rate      per key: the applied decision changes at most once in
 *             rate_ms; a change sooner keeps the key's decision.  A
 *             decision the rate guard overrides reports no cost.
 *
 * A parameter of 0 turns its guard off (benefit_every, envelope_pct,
 * rate_ms, shadow).
 *
 * Weight sets.  A verdict is about one weight set.  Each decision carries
 * the generation of the set it ran on (kml_weights.h: every publish of a
 * set, a rollback included, has a later one), and each cost the generation
 * of its decision.  The guard takes its first decision's generation; a
 * decision under a later one first resets the benefit state (trust,
 * trial, the arms' costs, the window, the alternation) to a freshly loaded
 * model's, so that with benefit_trial the new set goes on trial, and counts
 * the reset (resets; neither a promotion nor a demotion).  A cost of
 * another generation is not counted, nor is a decision under an earlier
 * one taken as a change of set: on SMP, an inference that read the set
 * just before a publish can reach the guard just after a decision on the
 * new set, and its cost then counts for neither set.  The shadow,
 * envelope and rate guards judge the inputs and the keys, not the
 * weights: a new set leaves their state as it is.
 */
#ifndef KML_GUARD_H
#define KML_GUARD_H

#include "kml_types.h"

/* A hook's default, where the default is "what the kernel has" (a file's readahead). */
#define KML_GUARD_KERNEL (-1)

/* What decided a decision: kml_guard.why[] counts each. */
enum kml_guard_why {
	KML_WHY_MODEL,		/* the model's, applied */
	KML_WHY_SHADOW,		/* the default: shadow mode */
	KML_WHY_ENVELOPE,	/* the default: inputs outside the envelope */
	KML_WHY_CONTROL,	/* the default: the A/B control arm */
	KML_WHY_DEMOTED,	/* the default: the model is demoted */
	KML_WHY_PROBE,		/* the model's, applied while it is demoted: its A/B arm */
	KML_WHY_RATE,		/* the key's last decision: too soon to change */
	KML_WHYS
};

/* A decision's A/B arm: whose cost it reports. */
#define KML_GUARD_ARM_MODEL 0
#define KML_GUARD_ARM_DEFAULT 1
#define KML_GUARD_ARM_NONE 2

/* kml_guard_state() bits */
#define KML_GUARD_DEMOTED_BIT 1
#define KML_GUARD_TRIPPED_BIT 2

/* Parameter ranges (module parameters, kmlc compile --guard). */
#define KML_GUARD_MAX_EVENTS 65536
#define KML_GUARD_MAX_EVERY 1024
#define KML_GUARD_MAX_SAMPLES 65536
#define KML_GUARD_MAX_PERIODS 16
#define KML_GUARD_MAX_RATE_MS 3600000
#define KML_GUARD_TRIAL_EVERY 2U		/* on trial: the model takes one in this many */
#define KML_GUARD_COST_MAX 0xffffffffULL	/* a cost is saturated to this */
#define KML_GUARD_ARM_MAX 0x4000000U		/* costs an arm holds: sums < 2^58 */

struct kml_guard_cfg {
	u32 shadow;			/* 1: apply the default, trace the model */
	u32 envelope_pct;		/* 0: off */
	u32 envelope_events;		/* 1..KML_GUARD_MAX_EVENTS */
	u32 benefit_every;		/* 0: off, else 2..KML_GUARD_MAX_EVERY */
	u32 benefit_samples;		/* 1..KML_GUARD_MAX_SAMPLES */
	u32 benefit_margin_pct;		/* 0..100 */
	u32 benefit_periods;		/* 1..KML_GUARD_MAX_PERIODS */
	u32 rate_ms;			/* 0: off */
	u32 benefit_probe_every;	/* 2..KML_GUARD_MAX_SAMPLES */
	u32 benefit_trial;		/* 1: the model starts on trial, 0: trusted */
};

/* The configuration as a u32 array (module parameters, the twin): in this order. */
#define KML_GUARD_CFG_WORDS 10

struct kml_guard {
	u64 decisions;			/* kml_guard_decide() calls */
	u64 differ;			/* those in which model and default differed (benefit on) */
	u64 cost[2];			/* this period's costs, per arm (< 2^58) */
	u32 n[2];			/* their number, at most KML_GUARD_ARM_MAX */
	u32 env_n, env_out;		/* this block: decisions, and those outside */
	u32 env_tripped, demoted;
	u32 judged;			/* the model has had its first verdict */
	/* the last periods since the trust last changed: costs and counts per arm */
	u64 win_cost[KML_GUARD_MAX_PERIODS][2];
	u32 win_n[KML_GUARD_MAX_PERIODS][2];
	u32 win_head, win_len;
	u64 gen;			/* the weight set's generation the benefit state is about */
	u64 why[KML_WHYS];
	u64 periods, demotions, promotions, env_trips, env_clears;
	u64 resets;			/* the benefit state reset for a later generation */
};

/* Per key (file, mirror, mount), for the rate guard. */
struct kml_guard_key {
	s32 last;			/* the decision applied last */
	u32 set;			/* last is valid */
	u64 changed;			/* when it last changed, ns */
};

/* What the guards counted, copied out under the guard's lock (debugfs, dmsetup status). */
struct kml_guard_counts {
	u64 decisions, why[KML_WHYS];
	u64 periods, demotions, promotions, env_trips, env_clears, resets;
	u32 demoted, tripped;
};

static inline void kml_guard_counts(const struct kml_guard *g, struct kml_guard_counts *n)
{
	int i;

	n->decisions = g->decisions;
	for (i = 0; i < KML_WHYS; i++)
		n->why[i] = g->why[i];
	n->periods = g->periods;
	n->demotions = g->demotions;
	n->promotions = g->promotions;
	n->env_trips = g->env_trips;
	n->env_clears = g->env_clears;
	n->resets = g->resets;
	n->demoted = g->demoted;
	n->tripped = g->env_tripped;
}

static inline u32 kml_guard_state(const struct kml_guard *g)
{
	return (g->demoted ? KML_GUARD_DEMOTED_BIT : 0) |
	       (g->env_tripped ? KML_GUARD_TRIPPED_BIT : 0);
}

/* Whether the model is on trial: benefit_trial, and no verdict yet. */
static inline bool kml_guard_on_trial(const struct kml_guard *g, const struct kml_guard_cfg *c)
{
	return c->benefit_trial && !g->judged;
}

/* Whether any of the n encoded features f lies outside [lo[i], hi[i]]. */
static inline bool kml_guard_outside(const s32 *f, const s32 *lo, const s32 *hi, int n)
{
	int i;

	for (i = 0; i < n; i++)
		if (f[i] < lo[i] || f[i] > hi[i])
			return true;
	return false;
}

/* Counts a decision in the envelope's block; at the block's end, trips or clears. */
static inline void kml_guard_envelope(struct kml_guard *g, const struct kml_guard_cfg *c,
				      bool outside)
{
	u64 out100, lim;

	if (!c->envelope_pct) {
		g->env_n = 0;
		g->env_out = 0;
		g->env_tripped = 0;
		return;
	}
	g->env_n++;
	g->env_out += outside;
	if (g->env_n < c->envelope_events)
		return;
	out100 = (u64)g->env_out * 100;
	lim = (u64)c->envelope_pct * g->env_n;
	if (!g->env_tripped && out100 > lim) {
		g->env_tripped = 1;
		g->env_trips++;
	} else if (g->env_tripped && 2 * out100 <= lim) {
		g->env_tripped = 0;
		g->env_clears++;
	}
	g->env_n = 0;
	g->env_out = 0;
}

/*
 * The benefit state as a freshly loaded model has it, for a weight set of
 * a later generation; counted.  O(KML_GUARD_MAX_PERIODS): it clears the
 * window.
 */
static inline void kml_guard_renew(struct kml_guard *g)
{
	g->differ = 0;
	g->cost[0] = 0;
	g->cost[1] = 0;
	g->n[0] = 0;
	g->n[1] = 0;
	g->demoted = 0;
	g->judged = 0;
	__builtin_memset(g->win_cost, 0, sizeof(g->win_cost));
	__builtin_memset(g->win_n, 0, sizeof(g->win_n));
	g->win_head = 0;
	g->win_len = 0;
	g->resets++;
}

/*
 * The decision to apply for the model's decision model (dflt: the
 * kernel's own) at time now (ns), for key k (NULL: no rate guard); outside:
 * the decision's features lie outside the envelope; gen: the generation of
 * the weight set the model decided with.  *arm: whose cost the decision
 * reports (KML_GUARD_ARM_*), with gen; *why: what decided it.
 */
static inline s32 kml_guard_decide(struct kml_guard *g, const struct kml_guard_cfg *c,
				   struct kml_guard_key *k, s32 model, s32 dflt, bool outside,
				   u64 gen, u64 now, u32 *arm, u32 *why)
{
	u64 rate_ns = (u64)c->rate_ms * 1000000;
	u32 a = KML_GUARD_ARM_NONE, w = KML_WHY_MODEL, every;
	s32 d = model;
	bool minority, held, trial;

	/*
	 * A later set than the one the benefit state is about: judged afresh.
	 * The generation came with the decision, read with its set; the
	 * caller's lock, which serializes the guard's steps, covers the
	 * check and the reset (kml_guard.c).
	 */
	if (gen > g->gen) {
		if (g->decisions)	/* the first decision's set is the guard's own */
			kml_guard_renew(g);
		g->gen = gen;
	}
	g->decisions++;
	kml_guard_envelope(g, c, outside);
	if (c->shadow) {
		d = dflt;
		w = KML_WHY_SHADOW;
	} else if (g->env_tripped) {
		d = dflt;
		w = KML_WHY_ENVELOPE;
	} else if (c->benefit_every && model != dflt) {
		/* the default holds the majority: the model is on trial or demoted */
		trial = kml_guard_on_trial(g, c);
		held = trial || g->demoted;
		if (trial)
			every = KML_GUARD_TRIAL_EVERY;
		else if (g->demoted && c->benefit_probe_every)
			every = c->benefit_probe_every;
		else
			every = c->benefit_every;
		minority = ++g->differ % every == 0;
		if (minority != held) {
			d = dflt;
			a = KML_GUARD_ARM_DEFAULT;
			w = g->demoted ? KML_WHY_DEMOTED : KML_WHY_CONTROL;
		} else {
			a = KML_GUARD_ARM_MODEL;
			w = held ? KML_WHY_PROBE : KML_WHY_MODEL;
		}
	}
	if (k && rate_ns) {
		if (k->set && d != k->last && now >= k->changed && now - k->changed < rate_ns) {
			d = k->last;
			a = KML_GUARD_ARM_NONE;
			w = KML_WHY_RATE;
		} else if (!k->set || d != k->last) {
			k->last = d;
			k->set = 1;
			k->changed = now;
		}
	} else if (k) {
		k->last = d;
		k->set = 1;
	}
	g->why[w]++;
	*arm = a;
	*why = w;
	return d;
}

/*
 * The cost of a decision made on arm under generation gen (lower is
 * better; saturated to KML_GUARD_COST_MAX); one of another generation
 * than the benefit state's is not counted.  Returns true when the cost
 * ended a period (and the model may have been demoted or trusted again).
 */
static inline bool kml_guard_cost(struct kml_guard *g, const struct kml_guard_cfg *c, u32 arm,
				  u64 gen, u64 cost)
{
	u32 samples = c->benefit_samples ? c->benefit_samples : 1;
	u32 periods = c->benefit_periods ? c->benefit_periods : 1;
	u64 sum[2] = { 0, 0 }, mean_m, mean_d, margin = 100 + (u64)c->benefit_margin_pct;
	u32 n[2] = { 0, 0 }, i, k, a;
	bool trust, trial;

	if (!c->benefit_every || arm > KML_GUARD_ARM_DEFAULT || gen != g->gen ||
	    g->n[arm] >= KML_GUARD_ARM_MAX)
		return false;
	g->cost[arm] += cost < KML_GUARD_COST_MAX ? cost : KML_GUARD_COST_MAX;
	g->n[arm]++;
	if (g->n[KML_GUARD_ARM_MODEL] < samples || g->n[KML_GUARD_ARM_DEFAULT] < samples)
		return false;
	/* the period ends: into the window, which holds the last periods since a change */
	i = g->win_head;
	for (a = 0; a < 2; a++) {
		g->win_cost[i][a] = g->cost[a];
		g->win_n[i][a] = g->n[a];
		g->cost[a] = 0;
		g->n[a] = 0;
	}
	g->win_head = (i + 1) % KML_GUARD_MAX_PERIODS;
	if (g->win_len < KML_GUARD_MAX_PERIODS)
		g->win_len++;
	g->periods++;
	if (periods > KML_GUARD_MAX_PERIODS || g->win_len < periods)
		return true;
	for (k = 0; k < periods; k++) {
		i = (g->win_head + KML_GUARD_MAX_PERIODS - 1 - k) % KML_GUARD_MAX_PERIODS;
		for (a = 0; a < 2; a++) {
			sum[a] += g->win_cost[i][a];
			n[a] += g->win_n[i][a];
		}
	}
	mean_m = sum[KML_GUARD_ARM_MODEL] / n[KML_GUARD_ARM_MODEL];
	mean_d = sum[KML_GUARD_ARM_DEFAULT] / n[KML_GUARD_ARM_DEFAULT];
	/* on trial or demoted: trusted if better by the margin; trusted: kept unless worse by it */
	trial = kml_guard_on_trial(g, c);
	if (trial || g->demoted)
		trust = mean_m * margin <= mean_d * 100;
	else
		trust = mean_m * 100 <= mean_d * margin;
	g->judged = 1;
	if (trial || trust == !!g->demoted) {
		g->win_len = 0;
		g->demoted = !trust;
		if (trust)
			g->promotions++;
		else
			g->demotions++;
	}
	return true;
}

#endif /* KML_GUARD_H */
