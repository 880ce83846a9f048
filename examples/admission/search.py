"""The learned policy's variants in the closed loop, and the search for its
labels on the training traces (run.py and ablation.py).

A variant is the model trained on some features and labels, compiled as
run.py compiles it (fixed point, ``--hooks admission``, the history it was
trained with as the module's compiled-in ``--hook-param history_writes``),
and run in the simulator through ``evaluate.hooked``: the compiled twin's
decisions with the module's own history.

The label search: the period labeling's constants (``labeling.Params``:
throughput drop, fast I/Os that end a period, noise runs) and what the
labeling runs over (every I/O on the primary, or the reads) on a grid;
each point is trained, compiled and scored by the closed-loop average
read latency on the *training* seeds (Heimdall searches its thresholds per
data set, §3.1).  No evaluation seed is seen.  Ties go to the first point
in grid order.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from . import evaluate, labeling, sim, train, traces

GRID = {"drop": (1.7, 5.0), "future": (2, 3), "short": (3, 10), "label_on": ("all", "reads")}
QUICK_GRID = {"drop": (1.7,), "future": (2, 3), "short": (3,), "label_on": ("all",)}
# Heimdall's artifact: its constants over every I/O
ARTIFACT_POINT = {**labeling.ARTIFACT._asdict(), "label_on": "all"}


def features_of(data: train.Data, history_writes: bool) -> np.ndarray:
    """The features of every read with the history as chosen, from data
    collected with every completion in the history (``train.collect``'s
    default): write completions dropped for a reads-only history (the
    module's ``history_writes=0``)."""
    from kmlc import features

    if history_writes:
        return data.x
    return np.concatenate([features.admission(ev[ev[:, 0] != sim.WRITE_DONE]).values
                           for ev in data.events])


def labels_of(data: train.Data, label_on: str, params: labeling.Params):
    """(labels, keep) of every read, the period labeling with ``params``
    over every I/O on the primary (``label_on="all"``) or the reads."""
    ys = [train.read_labels(log, label_on, params=params) for log in data.logs]
    return np.concatenate([y for y, _ in ys]), np.concatenate([k for _, k in ys])


# Fixed point, as the hook runs it in map().  The held-out halves' latencies
# reach beyond the training halves' (on 2 x 1 s traces, 1.5% of the rows):
# kmlc computes every int32 input exactly, so no margin is needed.
FIXED = ["--numerics", "fixed"]


def compile_cmd(onnx, out, cal, history_writes: bool, *extra) -> list:
    """kmlc's command line for the learned model (run.py's too)."""
    return ["compile", onnx, "-o", out, *FIXED, "--calibration", cal, "--hooks", "admission",
            "--hook-param", f"history_writes={int(history_writes)}", *extra]


def compiled(x, y, keep, data: train.Data, epochs: int, work: Path, tag: str,
             history_writes: bool) -> str:
    """Trains the model on the training halves and compiles it (twin and
    module sources), as run.py does; returns the output directory."""
    from kml_common.pipeline import kmlc

    model = train.train_heimdall(train.Data(x, y, keep, data.train), epochs=epochs)
    onnx, cal, out = work / f"{tag}.onnx", work / f"{tag}_cal.npy", work / tag
    train.export(model, 11, onnx)
    np.save(cal, train.calibration_rows(x[data.train]))
    kmlc(*compile_cmd(onnx, out, cal, history_writes, "--target", "kernel", "--target", "user",
                      "--name", "abl"))
    return str(out)


def run_seed(seed: int, cfg: traces.Config, variants: dict, linnos_dir: str | None) -> dict:
    """Average read latency (us) and reroute rate of each variant
    ({name: output directory}) on one trace; with ``linnos_dir``, also of
    the baseline, C3 and LinnOS-like behind the hook."""
    import kmlc as api

    tr = traces.generate(seed, cfg)
    out = {}

    def record(name, res):
        out[name] = (float(res.latency_ns.mean() / 1000), float(res.rerouted.mean()))

    for name, d in variants.items():
        record(name, sim.simulate(tr, sim.heimdall(tr.size, **evaluate.hooked(d))))
    if linnos_dir:
        slow = evaluate.linnos_slow(api.load(linnos_dir))
        record("baseline", sim.simulate(tr, sim.Policy()))
        record("c3", sim.simulate(tr, sim.C3()))
        record("linnos", sim.simulate(tr, sim.linnos(tr.size, slow)))
    return out


def sweep(pmap, seeds, cfg, variants, linnos_dir=None) -> dict:
    """{name: (mean avg us, mean reroute, per-seed avgs)} over ``seeds``,
    one seed per call of ``run_seed`` through ``pmap`` (a process pool's
    map, or the builtin)."""
    runs = list(pmap(run_seed, seeds, [cfg] * len(seeds), [variants] * len(seeds),
                       [linnos_dir] * len(seeds)))
    return {k: (float(np.mean([r[k][0] for r in runs])), float(np.mean([r[k][1] for r in runs])),
                [r[k][0] for r in runs]) for k in runs[0]}


def search(pmap, data: train.Data, x, seeds, cfg, grid: dict, epochs: int, work: Path,
           history_writes: bool = False, log=print) -> tuple[list[dict], dict]:
    """Every grid point with its share of slow reads and its average read
    latency on ``seeds`` (the training traces), and the best point."""
    points = []
    for i, vals in enumerate(itertools.product(*grid.values())):
        g = dict(zip(grid, vals))
        y, keep = labels_of(data, g["label_on"], params_of(g))
        d = compiled(x, y, keep, data, epochs, work, f"s{i}", history_writes)
        avg = sweep(pmap, seeds, cfg, {"v": d})["v"][0]
        points.append({**g, "slow": float(y.mean()), "avg": avg, "dir": d})
        log(f"labels {g}: {avg:.1f} us on the training seeds")
    return points, min(points, key=lambda g: g["avg"])


def params_of(point: dict) -> labeling.Params:
    return labeling.Params(point["drop"], point["future"], point["short"])
