#!/usr/bin/env python3
"""The KML readahead example, end to end, in one command:

    .venv/bin/python examples/readahead/run.py [--quick] [--jobs N]

 1. the class table, as KML chose it: each training workload under every
    candidate readahead on NVMe, read with pread() and through mmap; each
    class gets the size with the best throughput;
 2. training traces: db_bench-like workloads in the page-cache simulator,
    the hook's windows of readahead calls and faults (NVMe only);
 3. 10-fold cross-validation of KML's 5 -> 15 -> 5 -> 4 sigmoid model;
 4. the model trained on all rows, exported to readahead.onnx;
 5. kmlc compile --hooks readahead --hook-param ra_pages=TABLE, fixed
    point and float, and kmlc build (when kernel headers are installed);
 6. fixed vs float: decisions on held-out windows of all five workloads;
 7. every workload, read through mmap and with pread, on both devices,
    under Linux's default, fixed small, fixed large and the learned policy
    (the compiled twins);
 8. results/results.{json,md} and results/readahead.png, and the README's
    results section.

Everything is seeded: the same command gives the same numbers (wall-clock
times aside).  --quick runs a small database and little training, writes
only under --workdir, and is what the test suite runs.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))            # examples/: the readahead package

import numpy as np  # noqa: E402

from kml_common.pipeline import (Steps, agreement, compile_both, example_main,  # noqa: E402
                                 classes_chosen, example_paths, publish_run, report_head,
                                 train_and_export,
                                 workers)
from readahead.workloads import CLASSES, WORKLOADS, Db  # noqa: E402

SEED = 1
POLICIES = ("default", "fixed-2", "fixed-256", "learned-fixed", "learned-float")
DEVICES = ("nvme", "sata")
ACCESS = ("mmap", "pread")
SETUPS = tuple(f"{a}/{d}" for a in ACCESS for d in DEVICES)   # results' outer key
FULL = dict(db=Db(), train_seeds=(1, 2), per_class=600, epochs=60, eval_seed=11,
            heldout_seed=21, heldout_windows=100)
QUICK = dict(db=Db(files=2, file_pages=2048, cache_pages=2048, scan_cap_keys=256),
             train_seeds=(1,), per_class=80, epochs=60, eval_seed=11, heldout_seed=21,
             heldout_windows=20)


def _eval_job(args):
    from readahead.experiment import measured_ops, run

    workload, setup, policy, db, seed, quick, outdirs = args
    access, device = setup.split("/")
    warm, measure = measured_ops(workload, db, quick)
    kind = "learned" if policy.startswith("learned") else policy
    out = run(workload, device, kind, db, seed=seed, warm=warm, measure=measure,
              outdir=outdirs.get(policy.removeprefix("learned-")), access=access)
    return (setup, workload, policy), out


def _heldout_job(args):
    """Explore-policy event traces of one workload in one setup."""
    from readahead.experiment import ExploreHook, run
    from readahead.train import _ops_for

    workload, setup, db, seed, windows, values = args
    access, device = setup.split("/")
    trace: list = []
    run(workload, device, "explore", db, seed=seed, warm=0,
        measure=_ops_for(workload if workload in CLASSES else "readrandom", db, windows, access),
        hook=ExploreHook(np.random.default_rng(seed), values=values), trace=trace, access=access)
    return (setup, workload), np.array(trace, dtype=np.int64).reshape(-1, 4)


def twin_agreement(outdirs: dict, model, traces: dict) -> dict:
    """Fixed twin vs float twin vs PyTorch on the held-out traces."""
    from kmlc import features
    from readahead.experiment import WINDOW_EVENTS, WINDOW_MS
    from readahead.train import predict

    def windows(ev, frac):
        return features.readahead(ev, window_events=WINDOW_EVENTS, window_ms=WINDOW_MS,
                                  frac=frac)

    return agreement(outdirs, traces, windows, lambda v: predict(model, v))


def main(argv=None) -> int:
    return example_main(argv, __doc__, HERE, pipeline)


def pipeline(args) -> int:
    cfg = QUICK if args.quick else FULL
    db: Db = cfg["db"]
    work, out, onnx_path, cal_path = example_paths(args, HERE)
    steps = Steps()
    with workers(args.jobs) as pmap:
        from readahead import train
        from readahead.experiment import DEFAULT_RA

        swept = train.sweep(db, cfg["train_seeds"][0], pmap)
        table = train.choose_table(swept)
        values = tuple(sorted(set(table) | {DEFAULT_RA}))
        steps.done("class table")

        x, y = train.collect(db, cfg["train_seeds"], cfg["per_class"], pmap=pmap, values=values)
        model, training = train_and_export(train, x, y, CLASSES, SEED, cfg["epochs"], work,
                                           cal_path, onnx_path, steps)

        outdirs, compiled, built = compile_both(
            onnx_path, cal_path, "readahead", work, not args.no_build and not args.quick,
            options=("--hook-param", "ra_pages=" + ",".join(map(str, table))))
        steps.done("kmlc compile" + (" + build" if built else ""))

        jobs = [(w, s, db, cfg["heldout_seed"], cfg["heldout_windows"], values)
                for s in SETUPS for w in WORKLOADS]
        traces = dict(pmap(_heldout_job, jobs))
        agree = twin_agreement(outdirs, model, traces)
        steps.done("fixed vs float agreement")

        jobs = [(w, s, p, db, cfg["eval_seed"], args.quick, outdirs)
                for s in SETUPS for w in WORKLOADS for p in POLICIES]
        res: dict = {}
        for (d, w, p), r in pmap(_eval_job, jobs):
            res.setdefault(d, {}).setdefault(w, {})[p] = r
        steps.done("simulations")
    timing = steps.total()

    results = {
        "command": "python examples/readahead/run.py" + (" --quick" if args.quick else ""),
        "config": {"db": db.__dict__, "seed": SEED, **{k: v for k, v in cfg.items() if k != "db"},
                   "policies": POLICIES, "setups": SETUPS},
        "class_table": {"candidates": train.CANDIDATES, "table": table,
                        "swept": {w: {a: {str(ra): v for ra, v in per.items()}
                                      for a, per in per_a.items()}
                                  for w, per_a in swept.items()}},
        "training": training,
        "compile": compiled, "build": built,
        "agreement": agree,
        "results": res,
        "acceptance": acceptance(res),
    }
    return publish_run(out, HERE, args, results, timing, report, plot, "readahead.png")


def acceptance(res: dict) -> dict:
    """KML's claim, per setup (access/device), for each learned variant:
    never more than 5% below Linux's default on any workload, above it on
    at least two."""
    out = {}
    for d, per_w in res.items():
        for p in ("learned-fixed", "learned-float"):
            ratio = {w: r[p]["throughput_mb_s"] / r["default"]["throughput_mb_s"]
                     for w, r in per_w.items()}
            out[f"{d}/{p}"] = {"ratio": ratio,
                               "worst": min(ratio.values()),
                               "wins": sum(v > 1.0 for v in ratio.values()),
                               "met": min(ratio.values()) >= 0.95 and
                               sum(v > 1.0 for v in ratio.values()) >= 2}
    return out


def report(r: dict, timing: dict) -> str:
    lines = report_head(r, timing, training="NVMe traces, four classes, pread and mmap",
                        paper_cv=95.5, tuned="readahead", axis="setup",
                        caption="**Throughput relative to Linux's default** (ra_pages 32), "
                        "per setup (access/device):",
                        digits=1, classes=CLASSES, policies=POLICIES)
    ct = r["class_table"]
    lines += ["", "**Class table** (step 1, KML's method: each training workload on NVMe under "
             "every candidate readahead, read both ways; each class gets the size with the "
             "best throughput relative to the default's, averaged over the two): "
             + ", ".join(f"{c} {v}" for c, v in zip(CLASSES, ct["table"]))
             + " pages (KML's own: 2, 2, 80, 120).", "",
             "| workload | access | " + " | ".join(map(str, ct["candidates"])) + " |",
             "|---|---|" + "---|" * len(ct["candidates"])]
    for w, per_a in ct["swept"].items():
        for acc, per_ra in per_a.items():
            lines.append(f"| {w} | {acc} | " + " | ".join(
                f"{per_ra[str(ra)]:.1f}" for ra in ct["candidates"]) + " |")
    lines += ["", "MB/s on NVMe, training seed, candidate readahead in pages.", ""]
    lines += ["**Per policy**: hit ratio = pages the application found in the page cache; "
              "prefetch accuracy = pages added by readahead that were read before eviction / "
              "pages added by readahead; wasted = pages added by readahead and evicted unread; "
              "I/O wait = share of the time the application waited for the device.", "",
              "| setup | workload | policy | MB/s | hit ratio | prefetch acc. | wasted pages "
              "| I/O wait |", "|---|---|---|---|---|---|---|---|"]
    for d, per_w in r["results"].items():
        for w, per_p in per_w.items():
            for p in POLICIES:
                m = per_p[p]
                lines.append(f"| {d} | {w} | {p} | {m['throughput_mb_s']:.1f} | "
                             f"{m['hit_ratio']:.3f} | {m['prefetch_accuracy']:.2f} | "
                             f"{m['wasted_pages']} | {m['io_wait']:.2f} |")
    lines += ["", *classes_chosen(r, "fixed-point")]
    for s in (k for k in r["results"] if k.endswith("/nvme")):
        lines += [f"**Event rates** under Linux's default, {s} (KML reports about 30K "
                  "add_to_page_cache events/s for readseq and 20K for mixgraph): "
                  + "; ".join(f"{w} {m['default']['pages_added_per_s'] / 1e3:.1f}K pages "
                              f"added/s, {m['default']['ra_calls_per_s'] / 1e3:.1f}K readahead "
                              "calls/s" for w, m in r["results"][s].items()) + ".", ""]
    acc = r["acceptance"]
    lines += ["**Acceptance** (learned never more than 5% below the default, above it on at "
              "least two workloads): " + "; ".join(
                  f"{k}: worst {v['worst']:.3f}, {v['wins']} wins, "
                  f"{'met' if v['met'] else 'NOT met'}" for k, v in acc.items()) + ".", ""]
    lines += ["Time per step (s): " + ", ".join(f"{k} {v}" for k, v in timing.items()) + "."]
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(res), figsize=(4.5 * len(res), 7), squeeze=False)
    width = 0.8 / len(POLICIES)
    for col, (d, per_w) in enumerate(res.items()):
        ws = list(per_w)
        xs = np.arange(len(ws))
        for i, p in enumerate(POLICIES):
            rel = [per_w[w][p]["throughput_mb_s"] / per_w[w]["default"]["throughput_mb_s"]
                   for w in ws]
            waste = [per_w[w][p]["wasted_pages"] for w in ws]
            axes[0, col].bar(xs + (i - 2) * width, rel, width, label=p)
            axes[1, col].bar(xs + (i - 2) * width, waste, width, label=p)
        axes[0, col].axhline(1.0, color="k", lw=0.8)
        axes[0, col].axhline(0.95, color="k", lw=0.5, ls=":")
        axes[0, col].set_title(f"{d}: throughput relative to the default", fontsize=10)
        axes[1, col].set_title(f"{d}: wasted pages (prefetched, evicted unread)", fontsize=10)
        for ax in axes[:, col]:
            ax.set_xticks(xs, ws, rotation=15, fontsize=8)
        lo = min(per_w[w][p]["throughput_mb_s"] / per_w[w]["default"]["throughput_mb_s"]
                 for w in ws for p in POLICIES)
        axes[0, col].set_ylim(min(0.8, lo - 0.02), None)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="lower center", ncol=len(POLICIES),
               fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
