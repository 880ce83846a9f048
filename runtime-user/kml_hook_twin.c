// SPDX-License-Identifier: GPL-2.0
/*
 * A hook's decision in the userspace twin: the same kml_model_decide() and
 * feature encoding (the generated kml_binding.h) as the hook module, for
 * simulators that feed features one window or one read at a time; and the
 * module's guards (kml_guard.h), for replaying their trace and for
 * simulators that evaluate a guarded policy.
 */
#include "kml_binding.h"
#include "kml_guard.h"

const unsigned long kml_twin_buf_size = sizeof(struct kml_model_buf);

int kml_twin_decide(const s32 *f, unsigned long n, s32 *decisions, void *buf);
const u8 *kml_twin_frac(void);

/*
 * The hook's decision for each of n rows of encoded features, with the
 * caller's buffer (kml_twin_buf_size bytes, 8-byte aligned).  Returns 0,
 * or the first negative errno.
 */
int kml_twin_decide(const s32 *f, unsigned long n, s32 *decisions, void *buf)
{
	unsigned long i;
	int d;

	for (i = 0; i < n; i++, f += KML_MODEL_INPUTS) {
		d = kml_model_decide(f, buf);
		if (d < 0)
			return d;
		decisions[i] = d;
	}
	return 0;
}

/* The fraction bits the hook encodes each feature with. */
const u8 *kml_twin_frac(void)
{
	return kml_model_frac();
}

u64 kml_twin_decided_gen(const void *buf);

/*
 * The generation of the weight set the last decision on buf ran on, as
 * kml_set_read_begin() read it with the set (the module's kml_decide()
 * hands the same to its guards).
 */
u64 kml_twin_decided_gen(const void *buf)
{
	return ((const struct kml_model_buf *)buf)->gen;
}

/* ---- the guards (kml_guard.h), as the module runs them ----------------------------- */

const unsigned long kml_twin_guard_size = sizeof(struct kml_guard);
const unsigned long kml_twin_guard_key_size = sizeof(struct kml_guard_key);

long kml_twin_guard(const s64 *rows, unsigned long n, const u32 *cfg, void *g, void *keys,
		    unsigned long nkeys, s64 *out);
void kml_twin_guard_counters(const void *g, u64 *out);
u32 kml_twin_guard_state(const void *g);

/*
 * n steps of one guard, as the module takes them (kml_guarded_decide(),
 * kml_guarded_cost()): rows {kind, key, model, dflt, x, value, gen}, kind
 * 0 a decision (x: bit 0 its features lie outside the envelope, bit 1
 * shadow mode is on whatever cfg says, as a trace records it; value: the
 * time, ns; gen: the generation of the weight set that made it), kind 1 a
 * cost (x: the arm; value: the cost; gen: its decision's generation); key
 * indexes keys.
 * cfg: the KML_GUARD_CFG_WORDS parameters in struct kml_guard_cfg's order.
 * g (kml_twin_guard_size bytes) and keys (nkeys of
 * kml_twin_guard_key_size) hold the guard's state from call to call: zero
 * them for a new guard.  out: {applied (kind 1: the cost ended a period),
 * why, arm, state} per row.  Returns 0, or -EINVAL at a bad row.
 */
long kml_twin_guard(const s64 *rows, unsigned long n, const u32 *cfg, void *g, void *keys,
		    unsigned long nkeys, s64 *out)
{
	struct kml_guard_cfg c = {
		.shadow = cfg[0], .envelope_pct = cfg[1], .envelope_events = cfg[2],
		.benefit_every = cfg[3], .benefit_samples = cfg[4],
		.benefit_margin_pct = cfg[5], .benefit_periods = cfg[6], .rate_ms = cfg[7],
		.benefit_probe_every = cfg[8], .benefit_trial = cfg[9],
	};
	struct kml_guard_key *k = keys;
	u32 arm, why, shadow = c.shadow;
	unsigned long i;

	for (i = 0; i < n; i++, rows += 7, out += 4) {
		if (rows[1] < 0 || (unsigned long)rows[1] >= nkeys || rows[0] < 0 || rows[0] > 1)
			return -EINVAL;
		if (rows[0] == 0) {
			c.shadow = shadow || (rows[4] & 2);
			out[0] = kml_guard_decide(g, &c, &k[rows[1]], (s32)rows[2], (s32)rows[3],
						  rows[4] & 1, (u64)rows[6], (u64)rows[5], &arm,
						  &why);
			out[1] = why;
			out[2] = arm;
		} else {
			out[0] = kml_guard_cost(g, &c, (u32)rows[4], (u64)rows[6], (u64)rows[5]);
			out[1] = 0;
			out[2] = rows[4];
		}
		out[3] = kml_guard_state(g);
	}
	return 0;
}

/*
 * The guard's counters: the decisions by what decided them
 * (KML_WHYS), then periods, demotions, promotions, envelope trips
 * and clears, and the benefit state's resets for a new weight set.
 */
void kml_twin_guard_counters(const void *g, u64 *out)
{
	struct kml_guard_counts s;
	int i;

	kml_guard_counts(g, &s);
	for (i = 0; i < KML_WHYS; i++)
		out[i] = s.why[i];
	out[i++] = s.periods;
	out[i++] = s.demotions;
	out[i++] = s.promotions;
	out[i++] = s.env_trips;
	out[i++] = s.env_clears;
	out[i] = s.resets;
}

/* The guard's state: kml_guard_state()'s bits. */
u32 kml_twin_guard_state(const void *g)
{
	return kml_guard_state(g);
}
