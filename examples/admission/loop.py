"""Trace, retrain in userspace, pack, swap: the admission hook on replicas
whose garbage collection changes part-way through a run.

    .venv/bin/python examples/admission/loop.py            # 10 seeds, about 2 minutes
    .venv/bin/python examples/admission/loop.py --quick    # a small run (CI)

The shift: each replica first collects garbage in short, frequent episodes
(BEFORE: 1-4 ms every 8 MiB written, +-50%), and from ``shift_s`` on in
the long ones of the example's device (AFTER, traces.Config(): 15-80 ms
every 128 MiB).  Everything else stays (the workload, the chance that a
read waits during an episode, the erase time), and so, roughly, does the
share of time in GC: only the pattern changes (``traces.generate(...,
shift=)``).

1. v1: trained as run.py trains the learned model (train.collect, the
   period labels with the constants of run.py's search, read from
   results/results.json; 11 -> 128 -> 16 -> 1) on training seeds 1000..
   of the BEFORE pattern only; compiled once, as run.py compiles it (fixed
   point, ``--hooks admission --hook-param history_writes=0``), and once
   more with ``--guard benefit``;
2. pass 1, per evaluation seed: the shifting trace with v1, never swapped,
   keeping what the hook traced until ``swap_s`` (every read's features,
   the latency of each read it sent to its primary; ``Loop``);
3. v2: retrained in userspace from that trace alone: the reads v1 sent to
   the primary after the shift that had completed by the swap, labeled
   and trained as v1 was; ``kmlc.pack(like=v1)`` makes it a weight
   set of v1's compiled model (version 2, its formats pinned);
4. pass 2: the same trace, v1 until ``swap_s``, then
   ``twin.load_weights(v2)`` (the module's check, as writing its
   ``weights`` file runs it) and v2's decisions; the simulator is
   deterministic, so up to the swap pass 2 is pass 1;
5. the average read latency per segment of the run and per part (before
   the shift, between the shift and the swap, after the swap): the
   baseline (every read to its primary), v1 never swapped, v1 guarded
   never swapped, v1 then v2, and the oracle (declines exactly the reads
   that arrive during their primary's GC; not a policy).

Writes OUT/loop.json and OUT/loop.md (OUT: examples/admission/results) and,
under BUILD (examples/admission/build/loop), v1's compiled model and each
seed's v2 weight set (``v2_seed<N>.kmlw``).
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from admission import evaluate, labeling, search, sim, traces, train  # noqa: E402
from kml_common.pipeline import (Fail, Parser, kmlc, run_record, script,  # noqa: E402
                                 write_results)

BEFORE = traces.Config(gc_mib=8.0, gc_ms=(1.0, 4.0))
AFTER = traces.Config()
TRAIN_SEEDS = 1000
POLICIES = ("baseline", "v1", "v1_guarded", "swapped", "oracle")
LABELS = {"baseline": "baseline", "v1": "v1, never swapped",
          "v1_guarded": "v1 guarded, never swapped", "swapped": "**v1, then v2**",
          "oracle": "oracle (not a policy)"}
PARTS = ("before_shift", "shifted", "after_swap")


def settings(quick: bool) -> dict:
    """The run's timeline (seconds) and training sizes."""
    if quick:
        return {"train_seeds": 3, "train_s": 1.0, "epochs": 12, "duration_s": 3.0,
                "shift_s": 1.0, "swap_s": 2.0, "segments": 6}
    return {"train_seeds": 8, "train_s": 2.0, "epochs": 12, "duration_s": 5.0,
            "shift_s": 1.5, "swap_s": 3.0, "segments": 10}


def shifting_trace(seed: int, S: dict) -> traces.Trace:
    """Evaluation seed ``seed``: BEFORE's GC until shift_s, AFTER's from then on."""
    cfg = dataclasses.replace(BEFORE, duration_s=S["duration_s"])
    return traces.generate(seed, cfg, shift=(S["shift_s"], AFTER))


def label_constants() -> tuple[str, labeling.Params]:
    """What the period labeling runs over and its constants: run.py's
    choice (results/results.json)."""
    lab = json.loads((HERE / "results" / "results.json").read_text())["settings"]["labels"]
    return lab["label_on"], search.params_of(lab)


class Loop(sim.Admission):
    """The learned policy as sim.heimdall runs it (the compiled hook's
    features, reads-only history and decision), tracing, on a twin of its
    own.  At the first read arriving at or after ``at`` (ns) it keeps what
    each hook traced so far (``snapshot``: its events, its decisions and a
    copy of its log, in which reads still in flight have no latency) and,
    given ``blob``, swaps the twin's weight set to it
    (``twin.load_weights``: the module's own check, kml_weights.h, as
    writing the module's weights file runs it).  Every decision before
    ``at`` is the compiled set's either way."""

    def __init__(self, tr, outdir, at: int, blob: bytes | None = None):
        import kmlc as api

        self.twin = api.load(outdir)
        assert self.twin.meta["hook_params"]["history_writes"] is False
        frac = self.twin.hook_frac
        super().__init__("heimdall", tr.size, lambda: sim.HeimdallView(frac, False),
                         self.decide, trace=True)
        self.at, self.blob, self.snapshot = at, blob, None
        self.versions = [self.twin.weights_version, None]

    def decide(self, f) -> int:
        """The hook's decision (the module's kml_model_decide) on the running
        set: after the swap, the loaded one."""
        return int(self.twin.decide(f)[0])

    def route(self, c, i, t):
        if self.snapshot is None and t >= self.at:
            self.snapshot = [(list(h.events), list(h.decisions), [list(x) for x in h.log])
                             for h in self.hooks]
            if self.blob is not None:
                self.twin.load_weights(self.blob)
            self.versions[1] = self.twin.weights_version
        return super().route(c, i, t)


SLOW_US = (200, 500, 1000, 2000, 3000)


def on_slow_reads(outdir, blob: bytes | None = None) -> dict:
    """What the model (v1, or with ``blob`` the set in it) makes of slow
    reads: its decision (1 declines) for a 4 KiB read with one I/O in
    flight after three 4 KiB reads completed with none queued ahead, the
    last of them in L us and the two before in 90 us ("last"), or all
    three in L us ("all three"), for L in SLOW_US; the features are the
    module's own (``kmlc.features.admission`` of those events)."""
    import kmlc as api
    from kmlc import features

    tw = api.load(outdir, weights=blob)
    out = {}
    for name, lats in (("last", lambda L: (90, 90, L)), ("all three", lambda L: (L, L, L))):
        rows = np.array([features.admission(np.array(
            [(sim.READ_DONE, 0, us * 1000, 4096) for us in lats(L)] + [(0, 4096, 1, 0)],
            np.int64), frac=tw.hook_frac).raw[0] for L in SLOW_US])
        out[name] = np.asarray(tw.decide(rows)).astype(int).tolist()
    return out


def to_primary(decisions, probe_every: int = 64) -> np.ndarray:
    """Which reads the hook sent to its primary, from the model's
    decisions: the admitted ones and every ``probe_every``-th decline
    (sim.AdmissionHook.map)."""
    d = np.asarray(decisions, np.int64)
    return (d == 0) | (np.cumsum(d) % probe_every == 0)


def retraining_rows(tr, pol: Loop, since: int, label_on: str, params: labeling.Params):
    """v2's training data from pass 1's trace up to the swap, and nothing
    later: per hook, the features of the reads it sent to its primary
    that arrived at or after ``since`` (ns) and had completed by the
    swap, with their period labels over the primary's log from the first
    of them to the swap (I/Os still in flight left out).  (x, y, keep)."""
    from kmlc import features

    rtime = np.array(tr.t)[~np.array(tr.write)]
    rclient = np.array(tr.client)[~np.array(tr.write)]
    X, Y, K = [], [], []
    for c, (events, decisions, log) in enumerate(pol.snapshot):
        f = features.admission(np.array(events, np.int64)).values
        sent = np.flatnonzero(to_primary(decisions))          # read index of each log read
        log = np.array([[k, b, -1 if lat is None else lat] for k, b, lat in log], np.int64)
        reads = np.flatnonzero(log[:, 0] == sim.READ_DONE)
        assert len(f) == len(decisions) and len(reads) == len(sent)
        late = rtime[rclient == c][sent] >= since
        if not late.any():
            continue
        window = log[reads[np.argmax(late)]:]                 # from the first late read on
        done = window[:, 2] >= 0
        y, keep = train.read_labels(window[done], label_on, params=params)
        wreads = window[:, 0] == sim.READ_DONE
        rows = sent[late][done[wreads]]
        X.append(f[rows])
        Y.append(y)
        K.append(keep)
    return np.concatenate(X), np.concatenate(Y), np.concatenate(K)


def train_v1(S: dict, build: Path, label_on, params) -> dict:
    """v1, trained on the BEFORE pattern and compiled plain and guarded:
    {"v1": outdir, "v1_guarded": outdir, "rows": training rows,
    "compile": the command}."""
    cfg = dataclasses.replace(BEFORE, duration_s=S["train_s"])
    seeds = list(range(TRAIN_SEEDS, TRAIN_SEEDS + S["train_seeds"]))
    heim, *_ = train.collect(seeds, cfg, False)
    heim.y, heim.keep = search.labels_of(heim, label_on, params)
    model = train.train_heimdall(heim, epochs=S["epochs"])
    onnx, cal = build / "v1.onnx", build / "v1_cal.npy"
    train.export(model, 11, onnx)
    np.save(cal, train.calibration_rows(heim.x[heim.train]))
    out = {"rows": int((heim.train & heim.keep).sum())}
    for name, extra in (("v1", []), ("v1_guarded", ["--guard", "benefit"])):
        out[name] = build / name
        r = kmlc(*search.compile_cmd(onnx, out[name], cal, False, "--target", "kernel",
                                     "--target", "user", "--name", "loop", *extra))
        out.setdefault("compile", r["command"])
    return out


def retrain_and_pack(x, y, keep, epochs: int, v1: Path, out: Path) -> dict:
    """v2 trained on (x, y, keep) as v1 was (the same model, loss, seed and
    epochs), exported and packed against v1's compiled model as version 2
    (``kmlc.pack``: fixed point, v1's formats pinned; refused unless its
    structure is v1's): the pack's summary."""
    from kmlc.api import pack
    from kmlc.errors import KmlcError

    model = train.train_heimdall(train.Data(x, y, keep, np.ones(len(y), bool)), epochs=epochs)
    onnx = out.with_suffix(".onnx")
    train.export(model, 11, onnx)
    try:
        return pack(onnx, like=v1, out=out, calibration=train.calibration_rows(x), version=2)
    except KmlcError as e:
        raise Fail(f"kmlc pack: {e}") from None


def segment_avgs(lat_ns, rtime, edges) -> list:
    """Average read latency (us) of the reads arriving in each [edges[k],
    edges[k+1])."""
    return [float(lat_ns[(rtime >= a) & (rtime < b)].mean() / 1e3)
            for a, b in zip(edges[:-1], edges[1:])]


def run_seed(seed: int, S: dict, v1: dict, build: Path, label_on, params) -> dict:
    """Every policy on evaluation seed ``seed``'s shifting trace, v2
    retrained from pass 1 and swapped in by pass 2: per policy, the
    average read latency per segment and per part of the run (before the
    shift, between the shift and the swap, after the swap), and the
    reroute rate after the swap."""
    tr = shifting_trace(seed, S)
    shift, swap = int(S["shift_s"] * 1e9), int(S["swap_s"] * 1e9)
    rtime = np.array(tr.t)[~np.array(tr.write)]
    p1 = Loop(tr, v1["v1"], swap)
    res = {"baseline": sim.simulate(tr, sim.Policy()), "v1": sim.simulate(tr, p1),
           "v1_guarded": sim.simulate(tr, sim.heimdall(tr.size,
                                                       **evaluate.hooked(v1["v1_guarded"])))}
    x, y, keep = retraining_rows(tr, p1, shift, label_on, params)
    blob = build / f"v2_seed{seed}.kmlw"
    packed = retrain_and_pack(x, y, keep, S["epochs"], v1["v1"], blob)
    p2 = Loop(tr, v1["v1"], swap, blob.read_bytes())
    res["swapped"] = sim.simulate(tr, p2)
    res["oracle"] = sim.simulate(tr, sim.Oracle(tr))
    T = int(S["duration_s"] * 1e9)
    edges = np.linspace(0, T, S["segments"] + 1).astype(np.int64)
    edges[-1] = T + 1
    after = rtime >= swap
    out = {"seed": seed, "reads": int(len(rtime)),
           "v2": {"rows": int(len(y)), "slow": float(y.mean()), "kept": int(keep.sum()),
                  "bytes": packed["bytes"], "weights_version": p2.versions,
                  "slow_reads": on_slow_reads(v1["v1"], blob.read_bytes())},
           "gc_episodes": [len(d.gc_start) for d in tr.dev]}
    for name in POLICIES:
        lat = res[name].latency_ns
        out[name] = {"segments": segment_avgs(lat, rtime, edges),
                     **dict(zip(PARTS, segment_avgs(lat, rtime, [0, shift, swap, T + 1]))),
                     "reroute_after_swap": float(res[name].rerouted[after].mean())}
    out["v1_guarded"]["demotions"] = int(res["v1_guarded"].counters["guard_demotions"])
    return out


def summary(per_seed: list[dict]) -> dict:
    """Per policy, the mean over seeds of each seed's averages (per
    segment and per part of the run), their standard deviation over seeds
    and the mean per-seed ratio to the baseline's, per part; on how many
    seeds v1 then v2 had the lower average after the swap than v1 never
    swapped, the guard demoted v1, and each v2 declined each of
    ``on_slow_reads``'s reads."""
    out = {}
    for name in POLICIES:
        s = [r[name] for r in per_seed]
        out[name] = {"segments": np.mean([x["segments"] for x in s], axis=0).tolist(),
                     "reroute_after_swap": float(np.mean([x["reroute_after_swap"] for x in s]))}
        for part in PARTS:
            a = np.array([x[part] for x in s])
            base = np.array([r["baseline"][part] for r in per_seed])
            out[name][part] = {"avg": float(a.mean()),
                               "sd": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
                               "ratio": float(np.mean(a / base))}
    out["v1_guarded"]["demoted_seeds"] = int(sum(r["v1_guarded"]["demotions"] > 0
                                                 for r in per_seed))
    out["v2_slow_reads_declines"] = {
        k: np.sum([r["v2"]["slow_reads"][k] for r in per_seed], axis=0).tolist()
        for k in per_seed[0]["v2"]["slow_reads"]}
    out["swapped_lower_after_swap"] = int(sum(r["swapped"]["after_swap"] < r["v1"]["after_swap"]
                                              for r in per_seed))
    return out


def markdown(res: dict) -> str:
    s, S, n = res["summary"], res["settings"], len(res["seeds"])
    T, k, shift, swap = S["duration_s"], S["segments"], S["shift_s"], S["swap_s"]
    L = [f"# Trace, retrain, pack, swap: the admission hook on {n} seed{'s' * (n != 1)}\n",
         f"`{res['command']}` on {res['run']['machine']}, {res['run']['seconds']} s.  "
         f"The replicas' GC: 1-4 ms episodes every 8 MiB written until {shift:g} s, "
         "then 15-80 ms every 128 MiB (the example's device).  v1 was trained on the first "
         f"pattern only ({S['train_seeds']} training traces of {S['train_s']:g} s); v2, per "
         f"seed, on the trace of the reads v1 sent to the primary between the shift and the "
         f"swap at {swap:g} s ({res['v2_rows']} rows on average), packed against v1's "
         "compiled model and loaded into the running twin.  Read latency in us: the mean "
         "over seeds of each seed's average over the reads arriving in the segment; ratio: "
         "the mean over seeds of the ratio to the baseline's average on the same seed.  The "
         "oracle declines exactly the reads arriving during their primary's GC (it is not "
         "a policy: what there is to gain).\n",
         "| seconds | GC | " + " | ".join(LABELS[p] for p in POLICIES) + " |",
         "|---|---|" + "---:|" * len(POLICIES)]
    for j in range(k):
        a, b = T * j / k, T * (j + 1) / k
        L.append(f"| {a:.1f}-{b:.1f}{' (v2)' if a >= swap else ''} | "
                 f"{'short' if b <= shift else 'long'} | "
                 + " | ".join(f"{s[p]['segments'][j]:.1f}" for p in POLICIES) + " |")
    for part, span, gc in (("before_shift", f"0-{shift:g}", "short"),
                           ("shifted", f"{shift:g}-{swap:g}", "long"),
                           ("after_swap", f"{swap:g}-{T:g} (v2)", "long")):
        L.append(f"| {span}: mean ± sd | {gc} | " + " | ".join(
            f"{s[p][part]['avg']:.1f} ± {s[p][part]['sd']:.1f}" for p in POLICIES) + " |")
        L.append(f"| {span}: ratio to baseline | {gc} | " + " | ".join(
            f"{s[p][part]['ratio']:.3f}" for p in POLICIES) + " |")
    L.append(f"| {swap:g}-{T:g} (v2): reroute rate | long | " + " | ".join(
        f"{100 * s[p]['reroute_after_swap']:.1f}%" for p in POLICIES) + " |")
    L.append(f"\nAfter the swap, v1 then v2 has the lower average than v1 never swapped on "
             f"{s['swapped_lower_after_swap']}/{n} seeds.  The guard demoted v1 on "
             f"{s['v1_guarded']['demoted_seeds']}/{n} seeds.\n")
    L.append("What the models make of slow reads: a 4 KiB read with one I/O in flight, after "
             "three 4 KiB reads completed, the last of them in L us and the two before in "
             "90 us, or all three in L us (`loop.on_slow_reads`); v1's decision, and on how "
             "many seeds v2 declines:\n")
    L.append("| history | model | " + " | ".join(f"L = {u}" for u in SLOW_US) + " |")
    L.append("|---|---|" + "---:|" * len(SLOW_US))
    for k, v in res["v1_slow_reads"].items():
        L.append(f"| {k} slow | v1 | " + " | ".join("declines" if d else "admits" for d in v)
                 + " |")
        L.append(f"| {k} slow | v2 | " + " | ".join(
            f"{d}/{n}" for d in s["v2_slow_reads_declines"][k]) + " |")
    L.append("")
    return "\n".join(L)


def main(argv=None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=10, help="evaluation seeds (default 10)")
    p.add_argument("--quick", action="store_true",
                   help="small run: 3 short training traces, 3 s evaluation traces")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--build", type=Path, default=HERE / "build" / "loop")
    a = p.parse_args(argv)
    if a.seeds < 1:
        p.error("--seeds must be at least 1")
    t0 = time.perf_counter()
    S = settings(a.quick)
    build = a.build.resolve()
    build.mkdir(parents=True, exist_ok=True)
    label_on, params = label_constants()
    v1 = train_v1(S, build, label_on, params)
    per_seed = []
    for seed in range(a.seeds):
        per_seed.append(run_seed(seed, S, v1, build, label_on, params))
        print(f"seed {seed}: after the swap " + ", ".join(
            f"{p} {per_seed[-1][p]['after_swap']:.1f}" for p in POLICIES), flush=True)
    res = {"command": " ".join(["python", "examples/admission/loop.py", *(argv or sys.argv[1:])]),
           "settings": {**S, "seeds": [0, a.seeds - 1], "before": vars(BEFORE),
                        "after": vars(AFTER), "labels": {"label_on": label_on,
                                                         **params._asdict()},
                        "v1": {k: v1[k] for k in ("compile", "rows")}},
           "v2_rows": int(np.mean([r["v2"]["rows"] for r in per_seed])),
           "v1_slow_reads": on_slow_reads(v1["v1"]),
           "summary": evaluate.rounded(summary(per_seed), 5),
           "seeds": [evaluate.rounded(r, 5) for r in per_seed],
           "run": run_record(t0)}
    write_results(a.out, "loop", res, markdown(res))
    return 0


if __name__ == "__main__":
    script(main)
