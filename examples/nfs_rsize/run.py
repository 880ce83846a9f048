#!/usr/bin/env python3
"""The KML NFS rsize example, end to end, in one command:

    .venv/bin/python examples/nfs_rsize/run.py [--quick] [--jobs N]

 1. training traces: db_bench-like workloads read over NFS in the simulator,
    the nfs-rsize hook's windows of its tracepoints, three network presets;
 2. 10-fold cross-validation of KML's 8 -> 25 -> 10 -> 5 -> 4 sigmoid model;
 3. the model trained on all rows, exported to nfs_rsize.onnx (and the
    rows saved as calibration.npy, the fixed-point calibration);
 4. kmlc compile --hooks nfs-rsize, fixed point and float, and kmlc build
    (when kernel headers are installed);
 5. fixed vs float: decisions on held-out windows of all five workloads;
 6. every workload on both networks under the negotiated rsize (no hook),
    fixed 4 KiB and 256 KiB mounts, and the learned policy (the compiled
    twins, with and without majority vote); then fixed mounts under Linux
    4.19's NFS readahead, KML's kernel;
 7. results/results.{json,md} and results/nfs_rsize.png, and the README's
    results section.

Everything is seeded: the same command gives the same numbers (wall-clock
times aside).  --quick runs a small database and little training, writes
only under --workdir, and is what the test suite runs.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))            # examples/: nfs_rsize, readahead, kml_common

import numpy as np  # noqa: E402

from kml_common.pipeline import (Steps, agreement, compile_both, example_main,  # noqa: E402
                                 classes_chosen, example_paths, publish_run, report_head,
                                 train_and_export,
                                 workers)
from readahead.workloads import CLASSES, WORKLOADS, Db  # noqa: E402

SEED = 1
VOTE = 5
LEARNED = {"learned-fixed": ("fixed", 1), "learned-float": ("float", 1),
           f"learned-fixed-v{VOTE}": ("fixed", VOTE), f"learned-float-v{VOTE}": ("float", VOTE)}
POLICIES = ("default", "fixed-4k", "fixed-256k", *LEARNED)
NETS = ("lan", "wan")                                # evaluated
TRAIN_NETS = ("lan", "wan", "far")                   # traced for training
OLD = ("default", "fixed-4k", "fixed-256k")          # mounts under Linux 4.19's readahead
# The readahead example's database at half the size (four 32 MiB files, a
# 64 MiB page cache): the run stays within minutes on two shared cores.
FULL = dict(db=Db(file_pages=8192, cache_pages=16384), per_class=600, epochs=100,
            eval_seed=11, heldout_seed=21, heldout_windows=30,
            old_workloads=("readseq", "readrandom"))
QUICK = dict(db=Db(files=2, file_pages=2048, cache_pages=2048, scan_cap_keys=256),
             per_class=60, epochs=100, eval_seed=11, heldout_seed=21, heldout_windows=10,
             old_workloads=("readrandom",))


def _eval_job(args):
    from nfs_rsize.experiment import ra_419, policy_rsize, run
    from readahead.experiment import measured_ops

    workload, net, policy, db, seed, quick, outdirs, old = args
    warm, measure = measured_ops(workload, db, quick)
    if policy in LEARNED:
        numerics, vote = LEARNED[policy]
        out = run(workload, net, "learned", db, seed=seed, warm=warm, measure=measure,
                  outdir=outdirs[numerics], vote=vote)
    else:
        ra = ra_419(policy_rsize(policy)) if old else 32
        out = run(workload, net, policy, db, seed=seed, warm=warm, measure=measure, ra_pages=ra)
    return (old, net, workload, policy), out


def _heldout_job(args):
    """The event trace of one workload on one network under the explore policy."""
    from nfs_rsize.train import explore_trace

    workload, net, db, seed, windows = args
    trace: list = []
    explore_trace(workload, net, seed, db, windows, trace=trace)
    return (net, workload), np.array(trace, dtype=np.int64).reshape(-1, 5)


def twin_agreement(outdirs: dict, model, traces: dict) -> dict:
    """Fixed twin vs float twin vs PyTorch on the held-out traces."""
    from kmlc import features
    from nfs_rsize.experiment import WINDOW_MS
    from nfs_rsize.train import predict

    def windows(ev, frac):
        return features.nfs(ev, window_ms=WINDOW_MS, frac=frac)

    return agreement(outdirs, traces, windows, lambda v: predict(model, v))


def main(argv=None) -> int:
    return example_main(argv, __doc__, HERE, pipeline)


def pipeline(args) -> int:
    cfg = QUICK if args.quick else FULL
    db: Db = cfg["db"]
    work, out, onnx_path, cal_path = example_paths(args, HERE)
    steps = Steps()
    with workers(args.jobs) as pmap:
        from nfs_rsize import train

        x, y = train.collect(db, TRAIN_NETS, SEED, cfg["per_class"], pmap=pmap)
        model, training = train_and_export(train, x, y, CLASSES, SEED, cfg["epochs"], work,
                                           cal_path, onnx_path, steps)

        outdirs, compiled, built = compile_both(onnx_path, cal_path, "nfs-rsize", work,
                                                not args.no_build and not args.quick)
        steps.done("kmlc compile" + (" + build" if built else ""))

        jobs = [(w, n, db, cfg["heldout_seed"], cfg["heldout_windows"])
                for n in NETS for w in WORKLOADS]
        traces = dict(pmap(_heldout_job, jobs))
        agree = twin_agreement(outdirs, model, traces)
        del traces
        steps.done("fixed vs float agreement")

        jobs = [(w, n, p, db, cfg["eval_seed"], args.quick, outdirs, False)
                for n in NETS for w in WORKLOADS for p in POLICIES]
        jobs += [(w, n, p, db, cfg["eval_seed"], args.quick, outdirs, True)
                 for n in NETS for w in cfg["old_workloads"] for p in OLD]
        res: dict = {}
        old: dict = {}
        for (o, n, w, p), r in pmap(_eval_job, jobs):
            (old if o else res).setdefault(n, {}).setdefault(w, {})[p] = r
        steps.done("simulations")
    timing = steps.total()

    from nfs_rsize.experiment import WINDOW_MS
    from nfs_rsize.nfs import NETS as PRESETS, RpcCosts

    results = {
        "command": "python examples/nfs_rsize/run.py" + (" --quick" if args.quick else ""),
        "config": {"db": db.__dict__, "seed": SEED, "window_ms": WINDOW_MS, "vote": VOTE,
                   **{k: v for k, v in cfg.items() if k != "db"},
                   "policies": POLICIES, "nets": {n: PRESETS[n].__dict__ for n in TRAIN_NETS},
                   "rpc_costs": RpcCosts().__dict__},
        "training": training,
        "compile": compiled, "build": built,
        "agreement": agree,
        "results": res,
        "linux_4_19_readahead": old,
        "summary": summary(res),
    }
    return publish_run(out, HERE, args, results, timing, report, plot, "nfs_rsize.png")


def summary(res: dict) -> dict:
    """Per network and learned variant: throughput relative to the default,
    worst and best workload."""
    out = {}
    for n, per_w in res.items():
        for p in LEARNED:
            ratio = {w: r[p]["throughput_mb_s"] / r["default"]["throughput_mb_s"]
                     for w, r in per_w.items()}
            out[f"{n}/{p}"] = {"ratio": ratio, "worst": min(ratio.values()),
                               "best": max(ratio.values())}
    return out


def report(r: dict, timing: dict) -> str:
    from nfs_rsize.experiment import policy_rsize, ra_419

    lines = report_head(r, timing, training=", ".join(TRAIN_NETS) + "; four classes",
                        paper_cv=98.6, tuned="rsize", axis="net",
                        caption="**Throughput relative to the negotiated rsize** "
                        "(default: 1 MiB, no hook):", digits=2, classes=CLASSES,
                        policies=POLICIES)
    lines += ["", "**Per policy**: READs = READ RPCs; MB over NFS = data the READs carried; "
              "wasted = pages read ahead and evicted unread; latency = mean time in pread(); "
              "link busy = share of the time the server-to-client link was sending.",
              "", "| net | workload | policy | MB/s | READs | MB over NFS | wasted MB "
              "| latency us | link busy | rsize at end |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for n, per_w in r["results"].items():
        for w, per_p in per_w.items():
            for p in POLICIES:
                m = per_p[p]
                lines.append(f"| {n} | {w} | {p} | {m['throughput_mb_s']:.2f} | "
                             f"{m['read_rpcs']} | {m['mb_read_over_nfs']:.1f} | "
                             f"{m['wasted_mb']:.1f} | {m['mean_read_us']:.0f} | "
                             f"{m['downlink_busy']:.3f} | {m['rsize_end'] // 1024}K |")
    lines += ["", *classes_chosen(r, "fixed-point, no vote")]
    lines += ["**Linux 4.19's NFS readahead** (KML's kernel: ra_pages = 15 x rpages, fixed "
              "when the file system is mounted), MB/s (wasted MB):", "",
              "| net | workload | " + " | ".join(
                  f"{p} (ra {ra_419(policy_rsize(p)) * 4} KiB)" for p in OLD) + " |",
              "|---|---|" + "---|" * len(OLD)]
    for n, per_w in r["linux_4_19_readahead"].items():
        for w, per_p in per_w.items():
            lines.append(f"| {n} | {w} | " + " | ".join(
                f"{per_p[p]['throughput_mb_s']:.2f} ({per_p[p]['wasted_mb']:.1f})"
                for p in OLD) + " |")
    s = r["summary"]
    lines += ["", "**Learned vs default**, worst and best workload: " + "; ".join(
        f"{k} {v['worst']:.3f} .. {v['best']:.3f}" for k, v in s.items()) + ".", ""]
    lines += ["Time per step (s): " + ", ".join(f"{k} {v}" for k, v in timing.items()) + "."]
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(res), figsize=(6.5 * len(res), 7), squeeze=False)
    width = 0.84 / len(POLICIES)
    for col, (n, per_w) in enumerate(res.items()):
        ws = list(per_w)
        xs = np.arange(len(ws))
        for i, p in enumerate(POLICIES):
            off = (i - (len(POLICIES) - 1) / 2) * width
            rel = [per_w[w][p]["throughput_mb_s"] / per_w[w]["default"]["throughput_mb_s"]
                   for w in ws]
            axes[0, col].bar(xs + off, rel, width, label=p)
            axes[1, col].bar(xs + off, [per_w[w][p]["read_rpcs"] for w in ws], width, label=p)
        axes[0, col].axhline(1.0, color="k", lw=0.8)
        axes[0, col].set_title(f"{n.upper()}: throughput relative to the negotiated rsize")
        axes[1, col].set_title(f"{n.upper()}: READ RPCs")
        axes[1, col].set_yscale("log")
        for ax in axes[:, col]:
            ax.set_xticks(xs, ws, rotation=15, fontsize=8)
        vals = [per_w[w][p]["throughput_mb_s"] / per_w[w]["default"]["throughput_mb_s"]
                for w in ws for p in POLICIES]
        axes[0, col].set_ylim(min(0.8, min(vals) - 0.02), max(1.2, max(vals) + 0.02))
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
