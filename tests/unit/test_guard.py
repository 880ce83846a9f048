"""The guards (runtime-kernel/kml_guard.h), run through the twin: the
module's own C.  Oracles: cases computed by hand from the rules in
docs/hooks.md, and ``Oracle``, a separate Python reading of those rules,
on random sequences (weight-set swaps among them) and random parameters."""
from __future__ import annotations

import numpy as np
import pytest

import kmlc
from kmlc.errors import KmlcError
from kmlc.hooks import guard as G

from conftest import EXAMPLES, kmlc_cli

MODEL, CONTROL, SHADOW, ENVELOPE, DEMOTED, PROBE, RATE = (G.WHY.index(w) for w in (
    "model", "control", "shadow", "envelope", "demoted", "probe", "rate"))
MS = 1_000_000


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    out = tmp_path_factory.mktemp("guard") / "ra"
    kmlc.compile(EXAMPLES / "readahead.onnx", out, targets="kernel,user", hooks=["readahead"])
    return kmlc.load(out)


def cfg(**kw):
    c = G.defaults()
    c.update(kw)
    return c


class Oracle:
    """The guards as docs/hooks.md states them, in plain Python."""

    def __init__(self, c):
        self.c, self.decisions, self.differ, self.block, self.outs = c, 0, 0, 0, 0
        self.tripped = self.demoted = self.judged = False
        self.costs, self.window, self.keys, self.gen = [[], []], [], {}, 0
        self.count = dict(periods=0, demotions=0, promotions=0, envelope_trips=0,
                          envelope_clears=0, resets=0, **{w: 0 for w in G.WHY})

    def decide(self, key, model, dflt, outside, now, shadow=False, gen=0):
        c = self.c
        # a decision by a later weight set than the one the benefit guard
        # judges: judged afresh, as a model just loaded (the guard's first
        # decision's set is its own; an earlier set's decision changes nothing)
        if gen > self.gen:
            if self.decisions:
                self.differ, self.demoted, self.judged = 0, False, False
                self.costs, self.window = [[], []], []
                self.count["resets"] += 1
            self.gen = gen
        self.decisions += 1
        if c["envelope_pct"]:
            self.block += 1
            self.outs += bool(outside)
            if self.block >= c["envelope_events"]:
                share = 100 * self.outs / self.block
                if not self.tripped and share > c["envelope_pct"]:
                    self.tripped = True
                    self.count["envelope_trips"] += 1
                elif self.tripped and share <= c["envelope_pct"] / 2:
                    self.tripped = False
                    self.count["envelope_clears"] += 1
                self.block = self.outs = 0
        else:
            self.block = self.outs = 0
            self.tripped = False
        d, why, arm = model, "model", 2
        if c["shadow"] or shadow:
            d, why = dflt, "shadow"
        elif self.tripped:
            d, why = dflt, "envelope"
        elif c["benefit_every"] and model != dflt:
            # on trial (before the first verdict) one in 2 each way; demoted,
            # one in probe_every to the model; trusted, one in every to the default
            trial = c["benefit_trial"] and not self.judged
            held = trial or self.demoted
            every = 2 if trial else \
                c["benefit_probe_every"] if self.demoted else c["benefit_every"]
            self.differ += 1
            minority = self.differ % every == 0
            if minority != held:
                d, arm, why = dflt, 1, "demoted" if self.demoted else "control"
            else:
                arm, why = 0, "probe" if held else "model"
        last = self.keys.get(key)
        if c["rate_ms"] and last is not None and d != last[0] and \
                0 <= now - last[1] < c["rate_ms"] * MS:
            d, arm, why = last[0], 2, "rate"
        elif last is None or d != last[0]:
            self.keys[key] = (d, now)
        self.count[why] += 1
        return d, G.WHY.index(why), arm

    def cost(self, arm, cost, gen=0):
        c = self.c
        n = max(c["benefit_samples"], 1)
        # a cost counts for the set its decision was made with, if still judged
        if not c["benefit_every"] or arm > 1 or gen != self.gen or len(self.costs[arm]) >= 2**26:
            return False
        self.costs[arm].append(min(cost, 2**32 - 1))
        if min(map(len, self.costs)) < n:
            return False
        # a period ends; the window: the last periods since the trust changed
        self.window = (self.window + [[(sum(x), len(x)) for x in self.costs]])[-16:]
        self.costs = [[], []]
        self.count["periods"] += 1
        p = max(c["benefit_periods"], 1)
        if len(self.window) < p:
            return True
        last = self.window[-p:]
        m, d = (sum(w[a][0] for w in last) // sum(w[a][1] for w in last) for a in (0, 1))
        margin = 100 + c["benefit_margin_pct"]
        # on trial or demoted: trusted when better by the margin; trusted:
        # kept unless worse by it; the first verdict always counts
        trial = c["benefit_trial"] and not self.judged
        trust = m * margin <= 100 * d if trial or self.demoted else 100 * m <= d * margin
        self.judged = True
        if trial or trust == self.demoted:
            self.demoted = not trust
            self.count["promotions" if trust else "demotions"] += 1
            self.window = []
        return True

    def state(self):
        return int(self.demoted) | 2 * int(self.tripped)


def decide(g, *steps):
    """(model, dflt, outside, now) steps on key 0: (applied, why, arm) each."""
    return [g.decide(m, d, outside=o, now=t) for m, d, o, t in steps]


def test_shadow_applies_the_default_and_reports_no_cost(twin):
    g = twin.guard_session(cfg(shadow=1, benefit_every=2, benefit_samples=1))
    assert decide(g, (3, -1, False, 0), (2, -1, True, 1)) == [(-1, SHADOW, 2), (-1, SHADOW, 2)]
    assert not g.cost(2, 5)
    assert g.counters["shadow"] == 2 and g.counters["periods"] == 0


def test_envelope_trips_above_the_share_and_clears_at_half(twin):
    g = twin.guard_session(cfg(envelope_pct=50, envelope_events=4))
    # block 1: 3 of 4 outside (75% > 50%): the 4th decision already falls back
    got = decide(g, (1, 0, True, 0), (1, 0, True, 0), (1, 0, False, 0), (1, 0, True, 0))
    assert [w for _, w, _ in got] == [MODEL, MODEL, MODEL, ENVELOPE]
    assert g.state == 2 and g.counters["envelope_trips"] == 1
    # block 2: 2 of 4 (50%, above half of 50%): stays tripped
    got = decide(g, (1, 0, True, 0), (1, 0, True, 0), (1, 0, False, 0), (1, 0, False, 0))
    assert [d for d, _, _ in got] == [0, 0, 0, 0] and g.state == 2
    # block 3: 1 of 4 (25% <= 25%): clears at its last decision
    got = decide(g, (1, 0, True, 0), (1, 0, False, 0), (1, 0, False, 0), (1, 0, False, 0))
    assert [d for d, _, _ in got] == [0, 0, 0, 1] and g.state == 0
    assert g.counters["envelope_clears"] == 1


def test_benefit_demotes_a_worse_model_and_trusts_a_better_one_again(twin):
    g = twin.guard_session(cfg(benefit_every=2, benefit_samples=2, benefit_periods=1,
                               benefit_margin_pct=10, benefit_probe_every=3))
    # where model and default agree there is nothing to compare: no arm, no count
    assert decide(g, (0, 0, False, 0), (0, 0, False, 0)) == [(0, MODEL, 2), (0, MODEL, 2)]
    # on trial: of the decisions that differ, odd ones the default's (arm 1),
    # even ones the model's (arm 0)
    assert decide(g, (7, 0, False, 0), (7, 0, False, 0)) == [(0, CONTROL, 1), (7, PROBE, 0)]
    # the trial's verdict: 90 against 100 (90 * 1.10 <= 100): trusted
    assert [g.cost(0, 90), g.cost(1, 100), g.cost(0, 90), g.cost(1, 100)] == \
        [False, False, False, True]
    assert g.state == 0 and g.counters["promotions"] == 1
    # trusted: the 3rd differing decision the model's, the 4th the control's
    assert decide(g, (7, 0, False, 0), (7, 0, False, 0)) == [(7, MODEL, 0), (0, CONTROL, 1)]
    # the model costs 110 against 100: within the 10% margin, no change
    for a, c in ((0, 110), (1, 100), (0, 110), (1, 100)):
        g.cost(a, c)
    assert g.state == 0
    # 111 against 100: beyond the margin, demoted after the one period
    for a, c in ((0, 111), (1, 100), (0, 111), (1, 100)):
        g.cost(a, c)
    assert g.state == 1 and g.counters["demotions"] == 1
    # demoted: the model only on one differing decision in 3 (the 6th), as a probe
    assert decide(g, (7, 0, False, 0), (7, 0, False, 0), (7, 0, False, 0), (7, 0, False, 0)) \
        == [(0, DEMOTED, 1), (7, PROBE, 0), (0, DEMOTED, 1), (0, DEMOTED, 1)]
    # the model 9% better than the default (within the band): still demoted
    for a, c in ((0, 91), (1, 100), (0, 91), (1, 100)):
        g.cost(a, c)
    assert g.state == 1
    # 90 against 100: trusted again
    for a, c in ((0, 90), (1, 100), (0, 90), (1, 100)):
        g.cost(a, c)
    assert g.state == 0 and g.counters["promotions"] == 2


def test_without_a_trial_the_model_starts_trusted(twin):
    """benefit_trial=0: the model applies from the first decision, one
    differing decision in benefit_every going to the control, and a first
    verdict within the margin changes nothing and counts nothing."""
    g = twin.guard_session(cfg(benefit_every=2, benefit_samples=2, benefit_periods=1,
                               benefit_margin_pct=10, benefit_trial=0))
    assert decide(g, (7, 0, False, 0), (7, 0, False, 0)) == [(7, MODEL, 0), (0, CONTROL, 1)]
    for a, c in ((0, 105), (1, 100), (0, 105), (1, 100)):
        g.cost(a, c)
    assert g.state == 0 and g.counters["promotions"] == g.counters["demotions"] == 0
    for a, c in ((0, 111), (1, 100), (0, 111), (1, 100)):
        g.cost(a, c)
    assert g.state == 1 and g.counters["demotions"] == 1


def test_a_model_on_trial_must_win_by_the_margin(twin):
    """The first verdict holds the model to the promotion rule: one that is
    no better than the default by the margin (here 5% better, margin 10%)
    is demoted at once, though a trusted model that good would be kept."""
    g = twin.guard_session(cfg(benefit_every=4, benefit_samples=2, benefit_periods=1,
                               benefit_margin_pct=10))
    got = decide(g, *[(5, 1, False, 0)] * 4)
    assert [w for _, w, _ in got] == [CONTROL, PROBE, CONTROL, PROBE]
    for a, c in ((0, 95), (1, 100), (0, 95), (1, 100)):
        g.cost(a, c)
    assert g.state == 1 and g.counters["demotions"] == 1 and g.counters["promotions"] == 0
    assert g.counters["control"] == 2 and g.counters["probe"] == 2


def test_benefit_pools_the_last_periods(twin):
    g = twin.guard_session(cfg(benefit_every=2, benefit_samples=1, benefit_periods=3,
                               benefit_margin_pct=0))

    def period(m, d):
        assert not g.cost(0, m)
        assert g.cost(1, d)
    period(200, 100)
    period(200, 100)
    assert g.state == 0                   # the window of 3 periods is not full yet
    period(50, 100)                       # pooled (200 + 200 + 50) / 3 = 150 > 100
    assert g.state == 1
    period(50, 100)
    period(50, 100)
    assert g.state == 1                   # a new window since the demotion: 2 of 3
    period(200, 100)                      # pooled 300 / 3 = 100 <= 100: trusted again
    assert g.state == 0
    for _ in range(3):                    # the window slides: 100 against 100, kept
        period(100, 100)
    assert g.state == 0
    period(400, 100)                      # the last 3: (100 + 100 + 400) / 3 = 200 > 100
    assert g.state == 1 and g.counters["demotions"] == 2


def test_arms_cover_the_same_span_and_costs_saturate(twin):
    g = twin.guard_session(cfg(benefit_every=2, benefit_samples=2, benefit_periods=1,
                               benefit_margin_pct=0))
    g.cost(0, 2**64 - 1)
    g.cost(0, 2**64 - 1)
    for _ in range(998):                  # the majority arm keeps every cost of the span
        g.cost(0, 1)
    assert g.counters["periods"] == 0
    assert not g.cost(1, 2**32 - 2)
    # the model's mean over its 1000 costs, (2 * (2^32-1) + 998) // 1000, is far below
    assert g.cost(1, 2**32 - 2) and g.state == 0
    h = twin.guard_session(cfg(benefit_every=2, benefit_samples=1, benefit_periods=1,
                               benefit_margin_pct=0))
    h.cost(0, 2**64 - 1)                  # saturated to 2^32-1 > 2^32-2: demoted
    assert h.cost(1, 2**32 - 2) and h.state == 1


def test_a_swapped_set_is_judged_afresh(twin):
    """A model demoted under weight-set generation 1: the first decision
    under generation 2 resets the benefit state (one reset, no promotion),
    so the new set goes on trial as a model just loaded, not as a probe of
    a demoted one; a cost of a generation-1 decision no longer counts, and
    a decision of generation 1 arriving late changes nothing."""
    g = twin.guard_session(cfg(benefit_every=2, benefit_samples=2, benefit_periods=1,
                               benefit_margin_pct=10, benefit_probe_every=4))
    assert [g.decide(7, 0, gen=1) for _ in range(2)] == [(0, CONTROL, 1), (7, PROBE, 0)]
    # generation 1 on trial: 120 against 100, no better by the margin: demoted
    for a, c in ((0, 120), (1, 100), (0, 120), (1, 100)):
        g.cost(a, c, gen=1)
    assert g.state == 1 and g.counters["demotions"] == 1 and g.counters["resets"] == 0
    assert g.decide(7, 0, gen=1) == (0, DEMOTED, 1)      # the 3rd of 4: not a probe
    # generation 2: on trial afresh, its 1st differing decision the control's,
    # the 2nd the model's (demoted, the 2nd would be the default's too)
    assert g.decide(7, 0, gen=2) == (0, CONTROL, 1) and g.state == 0
    assert g.counters["resets"] == 1 and g.counters["promotions"] == 0
    assert g.decide(7, 0, gen=2) == (7, PROBE, 0)
    # the demoted decision's cost (generation 1) arrives now: not counted
    assert not g.cost(1, 100, gen=1)
    # a generation-1 decision that reached the guard late: no reset
    assert g.decide(7, 0, gen=1) == (0, CONTROL, 1) and g.counters["resets"] == 1
    # generation 2's own costs: 90 against 100, its trial's verdict at the
    # 4th (the late cost above would have ended the period at the 3rd)
    assert [g.cost(a, c, gen=2) for a, c in ((0, 90), (1, 100), (0, 90), (1, 100))] == \
        [False, False, False, True]
    assert g.state == 0 and g.counters["promotions"] == 1 and g.counters["demotions"] == 1
    assert g.counters["resets"] == 1 and g.counters["periods"] == 2
    # trusted: one differing decision in 2 the control's
    assert [g.decide(7, 0, gen=2) for _ in range(2)] == [(0, CONTROL, 1), (7, MODEL, 0)]


def test_without_a_trial_a_swapped_set_starts_trusted(twin):
    """benefit_trial=0: a set demoted under generation 3 is replaced, and
    the new generation's first differing decision is the model's, trusted;
    the guard's first decision takes its generation without a reset."""
    g = twin.guard_session(cfg(benefit_every=2, benefit_samples=1, benefit_periods=1,
                               benefit_margin_pct=10, benefit_trial=0, benefit_probe_every=4))
    assert g.decide(7, 0, gen=3) == (7, MODEL, 0) and g.counters["resets"] == 0
    assert g.cost(0, 111, gen=3) is False and g.cost(1, 100, gen=3) is True
    assert g.state == 1 and g.counters["demotions"] == 1
    assert g.decide(7, 0, gen=3) == (0, DEMOTED, 1)
    assert g.decide(7, 0, gen=4) == (7, MODEL, 0)
    assert g.state == 0 and g.counters["resets"] == 1
    assert g.counters["promotions"] == 0 and g.counters["demotions"] == 1


def test_a_swap_leaves_the_other_guards_as_they_are(twin):
    """The envelope's block and trip and the rate guard's keys are about
    the inputs and the keys, not the weights: new generations keep them."""
    g = twin.guard_session(cfg(envelope_pct=50, envelope_events=2, rate_ms=2))
    assert g.decide(1, 0, outside=True, now=0, gen=1) == (1, MODEL, 2)
    assert g.decide(1, 0, outside=True, now=3 * MS, gen=1) == (0, ENVELOPE, 2)  # tripped
    # generation 2: still tripped, the block half full
    assert g.decide(1, 0, now=3 * MS, gen=2) == (0, ENVELOPE, 2)
    assert g.state == 2 and g.counters["resets"] == 1
    # generation 3: the block that began under 2 clears the envelope, and the
    # key changed 1 ms ago (under 1): kept
    assert g.decide(1, 0, now=4 * MS, gen=3) == (0, RATE, 2)
    assert g.state == 0 and g.counters["resets"] == 2 and g.counters["envelope_clears"] == 1


def test_rate_keeps_a_key_until_its_time_is_up(twin):
    g = twin.guard_session(cfg(rate_ms=2), nkeys=2)
    assert g.decide(1, 0, key=0, now=10 * MS)[0] == 1
    assert g.decide(2, 0, key=0, now=11 * MS) == (1, RATE, 2)     # 1 ms later: kept
    assert g.decide(2, 0, key=1, now=11 * MS)[0] == 2             # another key: free
    assert g.decide(2, 0, key=0, now=12 * MS) == (2, MODEL, 2)    # 2 ms later: changes
    assert g.decide(1, 0, key=0, now=12 * MS + 1)[1] == RATE
    assert g.decide(2, 0, key=0, now=12 * MS + 2) == (2, MODEL, 2)  # no change: not limited


# each guard at settings whose boundaries a random sequence reaches
CONFIGS = [
    dict(benefit_every=2, benefit_samples=2, benefit_periods=2, benefit_margin_pct=0,
         envelope_pct=50, envelope_events=4, benefit_probe_every=3),
    dict(benefit_every=3, benefit_samples=1, benefit_periods=3, benefit_margin_pct=5, rate_ms=1),
    dict(benefit_every=8, benefit_samples=3, benefit_periods=2, envelope_pct=30,
         envelope_events=10),
    dict(shadow=1, benefit_every=2, envelope_pct=20, envelope_events=5, rate_ms=2),
    dict(envelope_pct=100, envelope_events=1, rate_ms=5),
    dict(),
]


@pytest.mark.parametrize("seed", range(len(CONFIGS)))
def test_random_steps_match_the_rules(twin, seed):
    rng = np.random.default_rng(seed)
    c = cfg(**CONFIGS[seed])
    # the weight set's generation: the guard's first decision may come after
    # swaps; later ones now and then, and on SMP an inference that read the
    # set before a swap reaches the guard after it (an earlier generation)
    nkeys, rows, t, gen = 4, [], 0, int(rng.integers(0, 3))
    for i in range(3000):
        # steps of whole milliseconds too: the rate guard's boundary
        t += int(rng.choice([0, MS, 2 * MS, rng.integers(0, 2 * MS)]))
        if rng.random() < 0.004:
            gen += int(rng.integers(1, 3))
        step_gen = gen if rng.random() < 0.9 else max(0, gen - int(rng.integers(1, 3)))
        if rng.random() < 0.6:
            # phases of few and of many inputs outside the envelope
            outside = rng.random() < (0.6 if (i // 200) % 2 else 0.1)
            rows.append([0, int(rng.integers(nkeys)), int(rng.integers(0, 4)),
                         int(rng.integers(-1, 2)), int(outside), t, step_gen])
            continue
        # phases in which the model costs less than, more than, or about the default
        arm = int(rng.integers(0, 3))
        scale = (0.7, 1.5, 1.01)[(i // 300) % 3] if arm == 0 else 1.0
        cost = int(scale * rng.integers(900, 1100)) if rng.random() < 0.95 else \
            int(rng.integers(0, 2**62))
        rows.append([1, 0, 0, 0, arm, cost, step_gen])
    o = Oracle(c)
    want = []
    for kind, key, m, d, x, v, step_gen in rows:
        if kind == 0:
            a, w, arm = o.decide(key, m, d, x, v, gen=step_gen)
            want.append([a, w, arm, o.state()])
        else:
            want.append([int(o.cost(x, v, gen=step_gen)), 0, x, o.state()])
    g = twin.guard_session(c, nkeys=nkeys)
    got = g.steps(np.array(rows, dtype=np.int64))
    bad = np.flatnonzero(np.any(got != np.array(want), axis=1))
    assert not len(bad), f"row {bad[0]} {rows[bad[0]]}: twin {got[bad[0]]}, rules {want[bad[0]]}"
    assert g.counters == o.count and o.count["resets"] >= 5


def test_bad_steps_are_refused(twin):
    g = twin.guard_session(nkeys=2)
    for row in ([2, 0, 0, 0, 0, 0], [0, 2, 0, 0, 0, 0], [0, -1, 0, 0, 0, 0]):
        with pytest.raises(KmlcError, match="out of range"):
            g.steps([row])
    with pytest.raises(KmlcError, match="unknown guard parameters: bogus"):
        twin.guard_session({"bogus": 1})


def trace_line(gid, seq, key, kind, model, dflt, flags, value, applied, why, arm, state, gen):
    return (f"  kworker-1 [000] ..... 1.0: kml_guard: guard={gid} seq={seq} key={key} "
            f"kind={kind} model={model} dflt={dflt} flags={flags} value={value} "
            f"applied={applied} why={why} arm={arm} state={state} gen={gen}")


def test_a_trace_replays_and_a_wrong_step_shows(twin, monkeypatch):
    """A guard's trace replays through the twin bit for bit, across a
    weight-set swap (generation 3 to 4 at step 250, and a decision of
    generation 3 that reached the guard after it); a wrong step shows, and
    so does a replay that misses the swap."""
    c = cfg(benefit_every=2, benefit_samples=2, benefit_periods=1, rate_ms=1)
    o, lines, rng, t = Oracle(c), [], np.random.default_rng(5), 0
    for seq in range(400):
        t += int(rng.integers(0, MS))
        key = int(rng.integers(100, 103))
        gen = 3 if seq < 250 or seq == 253 else 4
        if seq % 3 == 2:
            arm, cost = int(rng.integers(0, 2)), int(rng.integers(0, 500))
            ended = o.cost(arm, cost, gen)
            lines.append(trace_line(7, seq, key, 1, 0, 0, 0, cost, int(ended), 0, arm, o.state(),
                                    gen))
        else:
            # shadow mode switched on for a while, as guard_shadow=1 would
            m, shadow = int(rng.integers(0, 4)), 150 <= seq < 200
            a, w, arm = o.decide(key, m, -1, False, t, shadow, gen)
            lines.append(trace_line(7, seq, key, 0, m, -1, 2 * shadow, t, a, w, arm,
                                    o.state(), gen))
    rng.shuffle(lines)                  # per-CPU buffers interleave: seq orders them
    rows = G.parse("\n".join(lines))[7]
    mod, got = G.replay(twin, rows, c)
    assert np.array_equal(mod, got) and o.count["periods"] > 5 and o.count["shadow"] > 20
    assert o.count["resets"] == 1
    monkeypatch.setitem(twin.meta, "guard", c)     # as if compiled with c
    verdict = G.replay_verdicts("kml_x", "t", "\n".join(lines), twin)
    assert verdict[0].startswith("kml_x-guard-t PASS 400 steps identical") and \
        "decisions of 2 weight-set generations" in verdict[0], verdict
    unswapped = rows.copy()
    unswapped[:, 12] = 3                # as if the set had never changed
    mod, got = G.replay(twin, unswapped, c)
    assert not np.array_equal(mod, got)
    rows[10, 8] += 1                    # the module applied another decision
    mod, got = G.replay(twin, rows, c)
    assert not np.array_equal(mod, got)


@pytest.mark.parametrize("spec,hook,msg", [
    (["bogus"], "readahead", "unknown guard or parameter 'bogus'"),
    (["envelope=101"], "readahead", "envelope_pct takes an integer in 0 or 1..100"),
    (["benefit=1"], "readahead", "benefit_every takes an integer in 0 or 2..1024"),
    (["rate_ms"], "readahead", "expected rate_ms=VALUE"),
    (["benefit"], "nfs-rsize", "the nfs-rsize hook measures no cost"),
    (["envelope"], "readahead", "this model has none"),
    (["shadow"], None, "compile with --hooks"),
])
def test_bad_guard_specs_are_refused_in_one_line(tmp_path, spec, hook, msg):
    model = "nfs_rsize.onnx" if hook == "nfs-rsize" else "readahead.onnx"
    args = ["compile", EXAMPLES / model, "-o", tmp_path / "out", "--target", "kernel",
            "--target", "user"]
    args += ["--hooks", hook] if hook else []
    for s in spec:
        args += ["--guard", s]
    res = kmlc_cli(*args)
    assert res.returncode == 1 and msg in res.stderr, res.stderr
    assert res.stderr.startswith("kmlc: error: ") and len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.stderr and not (tmp_path / "out").exists()


def test_the_envelope_is_the_calibrated_range_encoded(tmp_path):
    rows = np.random.default_rng(1).uniform([2, 0, 0, 0, 0], [1000, 3e4, 3e4, 6e4, 1],
                                            (500, 5)).astype(np.float32)
    out = tmp_path / "fx"
    r = kmlc.compile(EXAMPLES / "readahead.onnx", out, targets="kernel,user", hooks=["readahead"],
                     numerics="fixed", calibration=rows, guards=["envelope=5"])
    frac = np.array(r.manifest["fixed"]["frac_bits"])
    text = (out / "user" / "kml_binding.h").read_text()
    env = text.split("env[2][KML_MODEL_INPUTS] = {", 1)[1].split("};", 1)[0]
    lo, hi = (np.array([int(x) for x in ln.strip(" {},\n\t").split(",")])
              for ln in env.strip().splitlines())
    assert np.array_equal(lo, np.floor(rows.min(0).astype(np.float64) * 2.0**frac))
    assert np.array_equal(hi, np.ceil(rows.max(0).astype(np.float64) * 2.0**frac))
    assert "#define KML_GUARD_ENVELOPE_PCT 5" in text
    assert r.manifest["guard"]["envelope_pct"] == 5
