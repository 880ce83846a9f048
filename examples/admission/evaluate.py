"""Every policy on one trace seed (``run_seed``, one worker process per
core), and the statistics over the seed sweep (``aggregate``)."""
from __future__ import annotations

import numpy as np

from . import sim, traces

POLICIES = ("baseline", "random", "hedging", "c3", "linnos_block", "linnos", "heimdall",
            "lgbm", "heimdall_gc", "oracle")
PCTS = (50, 90, 99, 99.9)
HEDGE_PCT = 98

_models: dict = {}


def linnos_slow(twin):
    """A LinnOS-like twin as ``model(row) -> bool`` (slow): its two outputs
    compared, ties admit."""
    def is_slow(row):
        y = twin.run_raw(np.array([row], np.float32))[0]
        return y[1] > y[0]
    return is_slow


def hooked(outdir) -> dict:
    """The compiled admission hook in ``outdir`` as ``sim.heimdall``'s
    arguments: the twin's decisions, the hook's fraction bits, the
    module's compiled-in history (``--hook-param history_writes``) and,
    compiled with ``--guard``, its guards."""
    import kmlc

    tw = kmlc.load(outdir)
    out = {"decide": lambda f, decide=tw.decide: decide(f)[0], "frac": tw.hook_frac,
           "history_writes": tw.meta.get("hook_params", {}).get("history_writes", True)}
    cfg = tw.meta.get("guard")
    if cfg and (cfg["benefit_every"] or cfg["envelope_pct"] or cfg["rate_ms"] or cfg["shadow"]):
        # compiled with --guard: the module's guard (one for all mirrors), its own C
        out["guard"] = tw.guard_session
        out["envelope"] = tw.meta.get("guard_envelope")
    return out


def _policies(models: dict):
    """The compiled models, loaded once per process: the learned policy and
    its diagnostic twin, and the LightGBM policy, are the admission hook's
    own features, history and decisions (``hooked``); the LinnOS-like
    models run on their float twins."""
    key = tuple(sorted((k, str(v)) for k, v in models.items()))
    if key not in _models:
        import kmlc

        _models[key] = (hooked(models["heimdall"]), hooked(models["heimdall_gc"]),
                        linnos_slow(kmlc.load(models["linnos"])),
                        linnos_slow(kmlc.load(models["linnos_block"])),
                        hooked(models["lgbm"]))
    return _models[key]


def run_seed(seed: int, cfg: traces.Config, models: dict, probe_every: int = 64) -> dict:
    """{policy: (summary, latencies in us as float32)} for one trace.
    ``models``: the kmlc output directories of "heimdall", "heimdall_gc",
    "linnos", "linnos_block" and "lgbm"."""
    learned, diagnostic, linnos_slow, block_slow, lgbm = _policies(models)
    tr = traces.generate(seed, cfg)
    base = sim.simulate(tr, sim.Policy())
    nreads = len(base.latency_ns)
    hedge_after = [int(np.percentile(base.latency_ns[base.client == c], HEDGE_PCT))
                   for c in (0, 1)]
    runs = {"baseline": base,
            "random": sim.simulate(tr, sim.Random(seed, nreads)),
            "hedging": sim.simulate(tr, sim.Hedging(hedge_after)),
            "c3": sim.simulate(tr, sim.C3()),
            "linnos_block": sim.simulate(tr, sim.LinnOSBlock(tr.size, block_slow)),
            "linnos": sim.simulate(tr, sim.linnos(tr.size, linnos_slow, probe_every)),
            "heimdall": sim.simulate(tr, sim.heimdall(tr.size, probe_every=probe_every,
                                                       **learned)),
            "lgbm": sim.simulate(tr, sim.heimdall(tr.size, probe_every=probe_every, **lgbm)),
            "heimdall_gc": sim.simulate(tr, sim.heimdall(tr.size, probe_every=probe_every,
                                                          **diagnostic)),
            "oracle": sim.simulate(tr, sim.Oracle(tr))}
    # reads that arrive while their primary collects garbage (the same for every policy)
    W = tr.write
    in_gc = np.array([tr.gc_episode(c, t) >= 0
                      for t, c, w in zip(tr.t, tr.client, W) if not w])
    out = {}
    for name, res in runs.items():
        lat = res.latency_ns / 1000.0
        moved = res.hedged if name == "hedging" else res.rerouted
        s = {"reads": nreads, "avg": float(lat.mean()),
             **{f"p{p:g}": float(np.percentile(lat, p)) for p in PCTS},
             "reroute": float(res.rerouted.mean()), "hedged": float(res.hedged.mean()),
             "moved_in_gc": float(moved[in_gc].mean()) if in_gc.any() else 0.0,
             "moved_outside_gc": float(moved[~in_gc].mean()),
             **{k: int(v) for k, v in res.counters.items()}}
        out[name] = (s, lat.astype(np.float32))
    out["trace"] = ({"seed": seed, "ios": tr.n, "reads": nreads,
                     "read_iops": [round(x) for x in tr.read_iops],
                     "write_frac": [round(x, 3) for x in tr.write_frac],
                     "reads_in_gc": float(in_gc.mean()),
                     "written_mb_per_s": sum(sz for sz, w in zip(tr.size, W) if w)
                     / cfg.duration_s / 1e6,
                     "gc_episodes": [len(d.gc_start) for d in tr.dev],
                     "gc_time": [round(sum(e - s for s, e in zip(d.gc_start, d.gc_end))
                                       / (cfg.duration_s * 1e9), 4) for d in tr.dev],
                     "hedge_after_us": [h / 1000 for h in hedge_after]}, None)
    return out


def probe_ablation(seeds, cfg: traces.Config, models: dict, values=(64, 16, 8, 4)) -> dict:
    """The hook's probe_every, on the training traces: for the learned and
    the LinnOS-like model behind the hook, the mean over seeds of the
    average read latency relative to the baseline's, and the reroute rate."""
    learned, _, linnos_slow, _, _ = _policies(models)
    rows = {v: [] for v in values}
    for seed in seeds:
        tr = traces.generate(seed, cfg)
        base = sim.simulate(tr, sim.Policy()).latency_ns.mean()
        for v in values:
            h = sim.simulate(tr, sim.heimdall(tr.size, probe_every=v, **learned))
            lin = sim.simulate(tr, sim.linnos(tr.size, linnos_slow, v))
            rows[v].append((h.latency_ns.mean() / base, lin.latency_ns.mean() / base,
                            h.rerouted.mean(), lin.rerouted.mean()))
    keys = ("heimdall_vs_baseline", "linnos_vs_baseline", "heimdall_reroute", "linnos_reroute")
    return {str(v): dict(zip(keys, map(float, np.mean(r, axis=0)))) for v, r in rows.items()}


def history_mix(seeds, cfg: traces.Config, models: dict) -> dict:
    """What the hook's history holds when a read arrives, on the training
    traces: the share of write completions among the last three entries
    (the features' history; empty slots not counted), for reads arriving
    during their primary's GC and outside, under the baseline (the hook
    admits everything: the training data) and under the learned policy;
    and the learned policy's decline rate in and outside GC."""
    learned = _policies(models)[0]
    out = {}
    for name, dec in (("baseline", lambda f: 0), ("learned", learned["decide"])):
        w = {True: [0, 0], False: [0, 0]}             # in GC: [write entries, entries]
        dl = {True: [0, 0], False: [0, 0]}            # in GC: [declined, reads]
        for seed in seeds:
            tr = traces.generate(seed, cfg)
            pol = sim.heimdall(tr.size, trace=True, **{**learned, "decide": dec})
            sim.simulate(tr, pol)
            for c, hook in enumerate(pol.hooks):
                arrivals = iter([t for t, cl, wr in zip(tr.t, tr.client, tr.write)
                                 if cl == c and not wr])
                decisions = iter(hook.decisions)
                last = []
                for ev in hook.events:
                    if ev[0] != 0:
                        last = [ev[0]] + last[:2]
                        continue
                    g = tr.gc_episode(c, next(arrivals)) >= 0
                    w[g][0] += sum(k == sim.WRITE_DONE for k in last)
                    w[g][1] += len(last)
                    dl[g][0] += next(decisions)
                    dl[g][1] += 1
        out[name] = {"writes_in_history_in_gc": w[True][0] / max(1, w[True][1]),
                     "writes_in_history_outside_gc": w[False][0] / max(1, w[False][1]),
                     "declined_in_gc": dl[True][0] / max(1, dl[True][1]),
                     "declined_outside_gc": dl[False][0] / max(1, dl[False][1])}
    return out


def aggregate(per_seed: list[dict]) -> dict:
    """Per policy: the mean over seeds of each seed's average and
    percentiles (Heimdall §6.1 reports "the average percentile" over its
    experiments), the standard deviation over seeds of the average, the
    pooled percentiles of all reads, the reroute rate, and against the
    learned policy: on how many seeds it had the lower average, and the
    mean per-seed ratio of averages."""
    keys = ["avg", *[f"p{p:g}" for p in PCTS]]
    out = {}
    for name in POLICIES:
        S = [r[name][0] for r in per_seed]
        pooled = np.concatenate([r[name][1] for r in per_seed]).astype(np.float64)
        a = {k: float(np.mean([s[k] for s in S])) for k in keys}
        a["avg_sd"] = float(np.std([s["avg"] for s in S], ddof=1)) if len(S) > 1 else 0.0
        a["pooled"] = {"avg": float(pooled.mean()),
                       **{f"p{p:g}": float(np.percentile(pooled, p)) for p in PCTS}}
        a["reroute"] = float(np.mean([s["reroute"] for s in S]))
        a["moved_in_gc"] = float(np.mean([s["moved_in_gc"] for s in S]))
        a["moved_outside_gc"] = float(np.mean([s["moved_outside_gc"] for s in S]))
        a["hedged"] = float(np.mean([s["hedged"] for s in S]))
        if name != "heimdall":
            h = [r["heimdall"][0]["avg"] for r in per_seed]
            o = [s["avg"] for s in S]
            a["heimdall_lower_on"] = int(sum(x < y for x, y in zip(h, o)))
            a["heimdall_ratio"] = float(np.mean([x / y for x, y in zip(h, o)]))
        if name in ("heimdall", "linnos"):
            a["probes"] = int(sum(s.get("probes", 0) for s in S))
            a["declined"] = int(sum(s.get("declined", 0) for s in S))
        out[name] = a
    return out


def rounded(x, digits: int = 4):
    """Numbers rounded for the JSON (so reruns compare equal as text)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if x == x else None
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v, digits) for v in x]
    return x
