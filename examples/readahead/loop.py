"""Trace, retrain, pack, swap: the readahead hook under a workload that
shifts mid-run, with a model that never saw the new workload.

    .venv/bin/python examples/readahead/loop.py            # about 2 minutes on 2 cores
    .venv/bin/python examples/readahead/loop.py --quick    # a small database (CI)

 1. v1: KML's model trained (as run.py trains it) on three of its four
    workloads, without readreverse, compiled in fixed point with
    ``--hooks readahead`` and run.py's class table; and again with
    ``--guard benefit``.
 2. One run through mmap on NVMe: readrandom (a warm-up, then measured),
    then, from operation SHIFT on, readreverse.  v1 takes the reverse scan
    for one of the workloads it knows.
 3. Trace: the hook's windows (its features, as the module's trace event
    gives them) from the shift to the swap point, a quarter of the way into
    the reverse scan, labelled with the workload that ran (KML's labels).
 4. Retrain in userspace on v1's rows and the traced ones; ``kmlc pack``
    the new weights against v1's build (``--like``), as version 2.
 5. Swap: the same run again (the simulator is deterministic, so it is the
    same run up to the swap point), and at the swap point the twin takes
    the blob (``Twin.load_weights``, what writing it to
    /sys/module/kml_<name>/weights does in the module).

Policies, each on the same operations: Linux's default, v1 never swapping,
v1 guarded never swapping, v1 swapped to v2.  Throughput per segment of
the run, relative to the default's in the same segment.

Writes OUT/loop.json and OUT/loop.md (OUT: examples/readahead/results;
with --quick, --workdir).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from kml_common.pipeline import (kmlc, run_record, script, script_dirs,  # noqa: E402
                                 script_parser, workers, write_results)
from readahead.workloads import CLASSES  # noqa: E402

SEED = 1
NEW = CLASSES.index("readreverse")           # the workload v1 never saw
POLICIES = ("default", "v1", "v1-guarded", "v1-swapped")
SEGMENTS_BEFORE, SEGMENTS_AFTER = 2, 8       # measured segments before / after the shift
SWAP_AT = 0.25                               # of the new workload's operations
PASSES = 4                                   # readreverse passes over the database


class Timeline:
    """Bytes delivered and simulated time at each segment boundary, and the
    run's named points (``points``: {name: operation}, in the run's order):
    ``until()`` for experiment.replay (called every 64 operations), which
    never ends the run.  At the first call at or past a point,
    ``at_point(name)`` runs once and what it returns is kept in
    ``seen[name]``."""

    def __init__(self, sim, bounds: list[int], points: dict[str, int] | None = None,
                 at_point=None):
        self.sim, self.bounds, self.points, self.at_point = sim, bounds, points or {}, at_point
        self.marks: list[tuple[int, int]] = []
        self.seen: dict = {}

    def __call__(self) -> bool:
        s = self.sim.stats
        if not self.sim.measuring:
            return False
        for name, at in self.points.items():
            if name not in self.seen and s.ops >= at:
                self.seen[name] = self.at_point(name) if self.at_point else None
        if len(self.marks) < len(self.bounds) and s.ops >= self.bounds[len(self.marks)]:
            self.marks.append((self.sim.now, s.bytes))
        return False

    def segments(self) -> list[float]:
        """MB/s of each segment between consecutive marks."""
        m = self.marks
        return [(b1 - b0) / 1e6 / ((t1 - t0) / 1e9) for (t0, b0), (t1, b1) in zip(m, m[1:])]


def plan(db, quick: bool) -> dict:
    """The run's operations: readrandom (warm-up, then measured), then one
    pass of readreverse over the database; the segment boundaries and the
    swap point, in measured operations."""
    from readahead.experiment import measured_ops

    warm, before = measured_ops("readrandom", db, quick)
    after = PASSES * db.files * db.blocks_per_file
    shift = before
    bounds = [round(before * i / SEGMENTS_BEFORE) for i in range(SEGMENTS_BEFORE)] + \
        [shift + round(after * i / SEGMENTS_AFTER) for i in range(SEGMENTS_AFTER + 1)]
    bounds[-1] -= 64                  # marks land every 64 operations: end inside the run
    return {"warm": warm, "before": before, "after": after, "shift": shift, "bounds": bounds,
            "swap": shift + round(after * SWAP_AT)}


def ops_of(db, p: dict, seed: int) -> list:
    from readahead.workloads import generate

    return np.concatenate([generate("readrandom", db, p["warm"] + p["before"], seed),
                           generate("readreverse", db, p["after"], seed + 1)]).tolist()


def simulate(db, p: dict, seed: int, policy: str, dirs: dict, blob: bytes | None = None,
             record: bool = False) -> dict:
    """One run of the shifting workload under ``policy``: MB/s per segment,
    the whole run's, the windows the hook saw between the shift and the
    swap point (``record``), and the decisions per class after the swap
    point."""
    from readahead.experiment import DEFAULT_RA, GuardedHook, LearnedHook, replay
    from readahead.sim import DEVICES, Sim

    hook = None
    if policy == "v1-guarded":
        hook = GuardedHook(dirs[policy])
    elif policy != "default":
        hook = LearnedHook(dirs[policy], record=record)
    sim = Sim(DEVICES["nvme"], db.cache_pages, hook=hook)

    def at_point(name: str):
        """The hook's windows and decisions so far; at the swap point, then
        the swap itself (``blob``)."""
        if hook is None:
            return None
        seen = (len(hook.windows) if hook.windows is not None else 0, hook.decisions.copy())
        if name == "swap" and blob is not None:
            hook.twin.load_weights(blob)
        return seen

    tl = Timeline(sim, p["bounds"], {"shift": p["shift"], "swap": p["swap"]}, at_point)
    replay(sim, db, DEFAULT_RA, ops_of(db, p, seed), p["warm"], until=tl, access="mmap")
    marks = tl.seen
    out = {"segments": tl.segments(), "throughput_mb_s": sim.result()["throughput_mb_s"]}
    if hook is not None:
        out["after_swap"] = (hook.decisions - marks["swap"][1]).tolist()
        if record:
            out["windows"] = [w for w, _ in hook.windows[marks["shift"][0]:marks["swap"][0]]]
        if isinstance(hook, GuardedHook):
            out["guard"] = hook.guard.counters
        out["weights_version"] = hook.twin.weights_version
    return out


def _job(args):
    return args[3], simulate(*args)


def main(argv=None) -> int:
    from readahead import train
    from readahead.run import FULL, QUICK

    from readahead.experiment import checked_in_table, hook_options

    a = script_parser(__doc__, HERE, "loop").parse_args(argv)
    cfg = QUICK if a.quick else FULL
    db, t0 = cfg["db"], time.perf_counter()
    work, out = script_dirs(a, HERE)
    table = checked_in_table()
    opts = ("--numerics", "fixed", *hook_options(table))
    p = plan(db, a.quick)
    with workers(a.jobs) as pmap:
        from readahead.experiment import DEFAULT_RA

        values = tuple(sorted(set(table) | {DEFAULT_RA}))
        x, y = train.collect(db, cfg["train_seeds"], cfg["per_class"], pmap=pmap, values=values)
        old = y != NEW
        x1, y1 = x[old], y[old]
        np.save(work / "v1_calibration.npy", x1)
        train.export(train.fit(x1, y1, SEED, cfg["epochs"]), work / "v1.onnx")
        dirs = {"v1": work / "v1", "v1-guarded": work / "v1-guarded", "v1-swapped": work / "v1"}
        kmlc("compile", work / "v1.onnx", "-o", dirs["v1"], "--calibration",
             work / "v1_calibration.npy", *opts)
        kmlc("compile", work / "v1.onnx", "-o", dirs["v1-guarded"], "--calibration",
             work / "v1_calibration.npy", *opts, "--guard", "benefit")

        # trace: v1's run, the windows between the shift and the swap point
        seed = cfg["eval_seed"]
        traced = simulate(db, p, seed, "v1", dirs, record=True)
        import kmlc as k

        frac = np.exp2(k.load(dirs["v1"]).hook_frac.astype(np.float64))
        xn = (np.array(traced["windows"], np.float64) / frac).astype(np.float32)
        # retrain on v1's rows and the traced ones, the new class drawn up to
        # the others' size (as train.collect balances classes); pack as version 2
        each = len(y1) // len(np.unique(y1))
        take = np.random.default_rng(SEED).choice(len(xn), each) if len(xn) else []
        x2, y2 = np.concatenate([x1, xn[take]]), np.concatenate([y1, np.full(len(take), NEW)])
        np.save(work / "v2_calibration.npy", x2)
        train.export(train.fit(x2, y2, SEED, cfg["epochs"]), work / "v2.onnx")
        packed = kmlc("pack", work / "v2.onnx", "--like", dirs["v1"], "-o", work / "v2.kmlw",
                      "--calibration", work / "v2_calibration.npy", "--version", "2")
        blob = (work / "v2.kmlw").read_bytes()

        jobs = [(db, p, seed, pol, dirs, blob if pol == "v1-swapped" else None)
                for pol in POLICIES]
        res = dict(pmap(_job, jobs))
    res["v1"].pop("windows", None)
    r = {"command": " ".join(["python", "examples/readahead/loop.py", *(argv or sys.argv[1:])]),
         "plan": p, "class_table": table, "traced_windows": len(xn),
         "train_rows": {"v1": len(x1), "v2": len(x2)}, "pack": packed["command"],
         "results": res, "summary": summary(res, p),
         "run": run_record(t0)}
    write_results(out, "loop", r, markdown(r))
    return 0


def summary(res: dict, p: dict) -> dict:
    """Per policy: MB/s relative to the default's over the segments before
    the shift, between the shift and the swap, and after the swap."""
    cut = SEGMENTS_BEFORE + round(SEGMENTS_AFTER * SWAP_AT)
    spans = {"before shift": slice(0, SEGMENTS_BEFORE), "shift to swap":
             slice(SEGMENTS_BEFORE, cut), "after swap": slice(cut, None)}
    d = res["default"]["segments"]
    out = {}
    for pol in POLICIES[1:]:
        s = res[pol]["segments"]
        out[pol] = {k: sum(s[i] for i in range(len(s))[sl]) / sum(d[i] for i in range(len(d))[sl])
                    for k, sl in spans.items()}
    return out


def markdown(r: dict) -> str:
    res, p = r["results"], r["plan"]
    n = len(res["default"]["segments"])
    L = ["# Trace, retrain, pack, swap: readahead\n",
         f"`{r['command']}` on {r['run']['machine']}, {r['run']['seconds']} s.  mmap on NVMe: "
         f"readrandom, then from operation {p['shift']} on (after {p['warm']} of warm-up) "
         f"{PASSES} readreverse passes, {p['after']} operations.  v1 trained on "
         f"{r['train_rows']['v1']} windows of readrandom, readrandomwriterandom and readseq; "
         f"v2 on those and the {r['traced_windows']} windows the hook traced under v1 from the "
         f"shift to the swap at operation {p['swap']} (drawn up to the other classes' size), "
         f"packed with `{r['pack']}` and swapped into the running twin at that point "
         "(`Twin.load_weights`).  Throughput per segment relative to Linux's default "
         "(ra_pages 32) in the same segment; segments "
         f"1-{SEGMENTS_BEFORE} are readrandom.\n",
         "| policy | " + " | ".join(str(i + 1) for i in range(n)) + " |",
         "|---|" + "---:|" * n,
         "| default MB/s | " + " | ".join(f"{v:.1f}" for v in res["default"]["segments"]) + " |"]
    for pol in POLICIES[1:]:
        d = res["default"]["segments"]
        L.append(f"| {pol} | " + " | ".join(
            f"{v / b:.3f}" for v, b in zip(res[pol]["segments"], d)) + " |")
    L += ["", "| policy | before shift | shift to swap | after swap | classes after the swap "
          "(" + ", ".join(CLASSES) + ") |", "|---|---:|---:|---:|---|"]
    for pol, v in r["summary"].items():
        L.append(f"| {pol} | {v['before shift']:.3f} | {v['shift to swap']:.3f} | "
                 f"{v['after swap']:.3f} | {', '.join(map(str, res[pol]['after_swap']))} |")
    g = res["v1-guarded"].get("guard", {})
    L += ["", f"v1 guarded (`--guard benefit`): {g.get('promotions', 0)} promotions, "
          f"{g.get('demotions', 0)} demotions.", ""]
    return "\n".join(L)


if __name__ == "__main__":
    script(main)
