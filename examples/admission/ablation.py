"""What holds the learned admission policy back in this simulator: the
hook's history or the labels?

    .venv/bin/python examples/admission/ablation.py            # 4 minutes on 2 cores
    .venv/bin/python examples/admission/ablation.py --quick    # a small run (tests)

Variants of the learned pipeline of run.py (same traces, features,
11 -> 128 -> 16 -> 1 model, training and fixed-point compile:
search.compiled), along two axes:

  history  what the hook's history of the last three completions holds:
           every read and write completed on the primary (the module's
           default, as Heimdall's kernel integration records every bio),
           or the reads only, writes still counted in the queue length (as
           LinnOS's block-layer history): compiled in with
           ``--hook-param history_writes=0``, as run.py does
  labels   Heimdall's period labels with its artifact's constants (drop
           1.7, 3 fast I/Os end a period, runs of 3 are noise); with the
           constants run.py's grid search picks by the closed-loop average
           read latency on the *training* traces (search.search; the
           paper searches its thresholds per data set, §3.1); or the
           simulator's GC state, which no real system has (an upper bound
           for the labels)

Each variant is trained on the training seeds (1000..) and evaluated in
the closed loop on evaluation seeds 0..N-1, next to the baseline, C3 and
the LinnOS-like model behind the hook (its run.py model, retrained here
identically).  Selection never sees an evaluation seed.  Writes
OUT/ablation.md and OUT/ablation.json (OUT: examples/admission/results).
"""
from __future__ import annotations

import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from admission import evaluate, report, search, traces, train  # noqa: E402
from kml_common.pipeline import (Fail, Parser, kmlc, machine, missing_packages,  # noqa: E402
                                 script, write_results)

TRAIN_SEEDS = 1000


def settings(quick: bool, seeds: int | None) -> dict:
    if quick:
        return {"train_seeds": 3, "eval_seeds": seeds or 2, "epochs": 8,
                "cfg": traces.Config(duration_s=2.0), "grid": search.QUICK_GRID}
    return {"train_seeds": 8, "eval_seeds": seeds or 50, "epochs": 12,
            "cfg": traces.Config(duration_s=2.0), "grid": search.GRID}


def markdown(res: dict, run: dict) -> str:
    ev, rows = res["eval"], res["rows"]
    lin = ev["linnos"][2]
    lines = [
        "# Admission ablation: the hook's history and the labels",
        "",
        f"Command: `{res['command']}`, {run['timing_s']['total']:.0f} s on {run['machine']}.  "
        f"Training seeds {res['train_seeds'][0]}-{res['train_seeds'][-1]}, evaluation seeds "
        f"0-{res['eval_seeds'] - 1}; average read latency in us, mean over seeds of each "
        "seed's average.  See ablation.py's docstring for the variants.",
        "",
        "| policy | history | labels | avg (us), evaluation seeds | reroute rate "
        "| lower avg than LinnOS-like on | avg (us), training seeds |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name, label in (("baseline", "baseline (always primary)"), ("c3", "C3"),
                        ("linnos", "LinnOS-like, behind the kmlc hook")):
        lines.append(f"| {label} | | | {ev[name][0]:.1f} | {100 * ev[name][1]:.1f}% | "
                     f"| {res['train'].get(name, (float('nan'),))[0]:.1f} |")
    for r in rows:
        avg, rr, per = ev[r["name"]]
        wins = sum(a < b for a, b in zip(per, lin))
        lines.append(f"| learned | {r['history']} | {r['labels']} | {avg:.1f} | {100 * rr:.1f}% "
                     f"| {wins}/{len(per)} | {res['train'][r['name']][0]:.1f} |")
    lines += ["", "Label search on the training traces (reads-only history; closed-loop "
              "average read latency, us, mean over the training seeds):", "",
              report.search_table({"grid": res["search"]})]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a small run (tests)")
    p.add_argument("--seeds", type=int, help="evaluation seeds (default 50; --quick: 2)")
    p.add_argument("--out", type=Path, default=HERE / "results",
                   help="where ablation.md and ablation.json go (default: results/)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    a = p.parse_args(argv)
    if a.seeds is not None and a.seeds < 1:
        p.error("--seeds must be at least 1")
    if a.jobs < 1:
        p.error("--jobs must be at least 1")
    if (msg := missing_packages()):
        raise Fail(msg)
    S = settings(a.quick, a.seeds)
    t_start = time.perf_counter()
    seeds = list(range(TRAIN_SEEDS, TRAIN_SEEDS + S["train_seeds"]))
    eval_seeds = list(range(S["eval_seeds"]))
    data, lin, _, _ = train.collect(seeds, S["cfg"])
    x_ro = search.features_of(data, False)
    gc = data.gc.astype(np.int64), np.ones(len(data.gc), bool)
    with tempfile.TemporaryDirectory() as tmp, \
            ProcessPoolExecutor(a.jobs, mp_context=get_context("spawn")) as ex:
        work = Path(tmp)
        onnx = work / "linnos.onnx"
        train.export(train.train_linnos(lin), 31, onnx)
        kmlc("compile", onnx, "-o", work / "linnos", "--target", "user")
        # the label search: reads-only history, training seeds only
        points, best = search.search(ex.map, data, x_ro, seeds, S["cfg"], S["grid"],
                                     S["epochs"], work, history_writes=False,
                                     log=lambda m: print(m, flush=True))
        art = data.y, data.keep         # collect's labels: the artifact's, over every I/O
        rows = [("all_artifact", "every I/O", "period, artifact's constants", data.x, art, True),
                ("all_gc", "every I/O", "GC state", data.x, gc, True),
                ("reads_artifact", "reads", "period, artifact's constants", x_ro, art, False),
                ("reads_gc", "reads", "GC state", x_ro, gc, False)]
        variants = {name: search.compiled(x, y, k, data, S["epochs"], work, name, hw)
                    for name, _, _, x, (y, k), hw in rows}
        variants["reads_searched"] = best["dir"]
        rows.insert(3, ("reads_searched", "reads",
                        "period, searched: drop {drop}, future {future}, short {short}, over "
                        "{label_on}".format(**best), None, None, False))
        lin_dir = str(work / "linnos")
        train_res = search.sweep(ex.map, seeds, S["cfg"], variants, lin_dir)
        eval_res = search.sweep(ex.map, eval_seeds, S["cfg"], variants, lin_dir)
    res = evaluate.rounded({
        "command": " ".join(["python", "examples/admission/ablation.py", *(argv or sys.argv[1:])]),
        "train_seeds": seeds, "eval_seeds": len(eval_seeds),
        "rows": [{"name": r[0], "history": r[1], "labels": r[2]} for r in rows],
        "search": [{k: v for k, v in g.items() if k != "dir"} for g in points],
        "train": train_res, "eval": eval_res}, 5)
    run = {"machine": machine(), "timing_s": {"total": round(time.perf_counter() - t_start, 1)}}
    write_results(a.out, "ablation", {**res, "run": run}, markdown(res, run))
    return 0


if __name__ == "__main__":
    script(main)
