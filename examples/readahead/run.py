#!/usr/bin/env python3
"""The KML readahead example, end to end, in one command:

    .venv/bin/python examples/readahead/run.py [--quick] [--jobs N]

 1. training traces: db_bench-like workloads in the page-cache simulator,
    the hook's windows of page_cache_sync_ra/async_ra calls (NVMe only);
 2. 10-fold cross-validation of KML's 5 -> 15 -> 5 -> 4 sigmoid model;
 3. the model trained on all rows, exported to readahead.onnx;
 4. kmlc compile --hooks readahead, fixed point and float, and kmlc build
    (when kernel headers are installed);
 5. fixed vs float: decisions on held-out windows of all five workloads;
 6. every workload on both devices under Linux's default, fixed small,
    fixed large and the learned policy (the compiled twins);
 7. results/results.{json,md} and results/readahead.png, and the README's
    results section.

Everything is seeded: the same command gives the same numbers (wall-clock
times aside).  --quick runs a small database and little training, writes
only under --workdir, and is what the test suite runs.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))            # examples/: the readahead package

import numpy as np  # noqa: E402

from kml_common.pipeline import (Steps, agreement, compile_both, example_main,  # noqa: E402
                                 classes_chosen, example_paths, machine, report_head,
                                 train_and_export,
                                 update_readme, workers)
from readahead.workloads import CLASSES, WORKLOADS, Db  # noqa: E402

SEED = 1
POLICIES = ("default", "fixed-2", "fixed-256", "learned-fixed", "learned-float")
DEVICES = ("nvme", "sata")
FULL = dict(db=Db(), train_seeds=(1, 2), per_class=600, epochs=60, eval_seed=11,
            heldout_seed=21, heldout_windows=100)
QUICK = dict(db=Db(files=2, file_pages=2048, cache_pages=2048, scan_cap_keys=256),
             train_seeds=(1,), per_class=80, epochs=60, eval_seed=11, heldout_seed=21,
             heldout_windows=20)


def _eval_job(args):
    from readahead.experiment import measured_ops, run

    workload, device, policy, db, seed, quick, outdirs = args
    warm, measure = measured_ops(workload, db, quick)
    kind = "learned" if policy.startswith("learned") else policy
    out = run(workload, device, kind, db, seed=seed, warm=warm, measure=measure,
              outdir=outdirs.get(policy.removeprefix("learned-")))
    return (device, workload, policy), out


def _heldout_job(args):
    """Explore-policy event traces of one workload on one device."""
    from readahead.experiment import ExploreHook, run
    from readahead.train import _ops_for

    workload, device, db, seed, windows = args
    trace: list = []
    run(workload, device, "explore", db, seed=seed, warm=0,
        measure=_ops_for(workload if workload in CLASSES else "readrandom", db, windows),
        hook=ExploreHook(np.random.default_rng(seed)), trace=trace)
    return (device, workload), np.array(trace, dtype=np.int64).reshape(-1, 4)


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

        x, y = train.collect(db, cfg["train_seeds"], cfg["per_class"], pmap=pmap)
        model, training = train_and_export(train, x, y, CLASSES, SEED, cfg["epochs"], work,
                                           cal_path, onnx_path, steps)

        outdirs, compiled, built = compile_both(onnx_path, cal_path, "readahead", work,
                                                not args.no_build and not args.quick)
        steps.done("kmlc compile" + (" + build" if built else ""))

        jobs = [(w, d, db, cfg["heldout_seed"], cfg["heldout_windows"])
                for d in DEVICES for w in WORKLOADS]
        traces = dict(pmap(_heldout_job, jobs))
        agree = twin_agreement(outdirs, model, traces)
        steps.done("fixed vs float agreement")

        jobs = [(w, d, p, db, cfg["eval_seed"], args.quick, outdirs)
                for d in DEVICES for w in WORKLOADS for p in POLICIES]
        res: dict = {}
        for (d, w, p), r in pmap(_eval_job, jobs):
            res.setdefault(d, {}).setdefault(w, {})[p] = r
        steps.done("simulations")
    timing = steps.total()

    results = {
        "command": "python examples/readahead/run.py" + (" --quick" if args.quick else ""),
        "config": {"db": db.__dict__, "seed": SEED, **{k: v for k, v in cfg.items() if k != "db"},
                   "policies": POLICIES, "devices": DEVICES},
        "training": training,
        "compile": compiled, "build": built,
        "agreement": agree,
        "results": res,
        "acceptance": acceptance(res),
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "timing.json").write_text(json.dumps({"machine": machine(), "seconds": timing},
                                                indent=1) + "\n")
    md = report(results, timing)
    (out / "results.md").write_text(md)
    plot(res, out / "readahead.png")
    if not args.quick and args.out is None:
        update_readme(HERE / "README.md", md)
    print(f"results: {out}/results.md ({timing['total']:.0f} s)")
    return 0


def acceptance(res: dict) -> dict:
    """KML's claim, per device, for each learned variant: never more than 5%
    below Linux's default on any workload, above it on at least two."""
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
    lines = report_head(r, timing, training="NVMe traces, four classes", paper_cv=95.5,
                        tuned="readahead", axis=("device", "devices"),
                        caption="**Throughput relative to Linux's default** (ra_pages 32):",
                        digits=1, classes=CLASSES, policies=POLICIES)
    lines += ["", "**Per policy**: hit ratio = pages the application found in the page cache; "
              "prefetch accuracy = pages added by readahead that were read before eviction / "
              "pages added by readahead; wasted = pages added by readahead and evicted unread; "
              "I/O wait = share of the time the application waited for the device.", "",
              "| device | workload | policy | MB/s | hit ratio | prefetch acc. | wasted pages "
              "| I/O wait |", "|---|---|---|---|---|---|---|---|"]
    for d, per_w in r["results"].items():
        for w, per_p in per_w.items():
            for p in POLICIES:
                m = per_p[p]
                lines.append(f"| {d} | {w} | {p} | {m['throughput_mb_s']:.1f} | "
                             f"{m['hit_ratio']:.3f} | {m['prefetch_accuracy']:.2f} | "
                             f"{m['wasted_pages']} | {m['io_wait']:.2f} |")
    lines += ["", *classes_chosen(r, "fixed-point")]
    lines += ["**Event rates** under Linux's default on NVMe (KML reports about 30K "
              "add_to_page_cache events/s for readseq and 20K for mixgraph): "
              + "; ".join(f"{w} {m['default']['pages_added_per_s'] / 1e3:.1f}K pages added/s, "
                          f"{m['default']['ra_calls_per_s'] / 1e3:.1f}K readahead calls/s"
                          for w, m in r["results"]["nvme"].items()) + ".", ""]
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

    fig, axes = plt.subplots(2, len(res), figsize=(6 * len(res), 7), squeeze=False)
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
        axes[0, col].set_title(f"{d.upper()}: throughput relative to Linux's default")
        axes[1, col].set_title(f"{d.upper()}: wasted pages (prefetched, evicted unread)")
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
