"""The readahead hook's guards, measured: the checked-in model, fixed point
and float, with and without ``--guard``, on every workload of run.py's
evaluation, read with pread and through mmap on both devices.

    .venv/bin/python examples/readahead/guards.py             # about 3 minutes on 2 cores
    .venv/bin/python examples/readahead/guards.py --quick     # a small database (CI)

The model is run.py's ``readahead.onnx`` with its class table (from
``results/results.json``), compiled as run.py compiles it, and again with
``GUARDS``.  In the simulator the guarded hook is the module's own guard
C (``twin.guard_session()``: kml_guard.h), fed each window's cost, the
time per page the reader consumed (``kml_ra_step()``), as the module is.

Writes OUT/guards.json and OUT/guards.md (OUT: examples/readahead/results;
with --quick, --workdir).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kml_common.pipeline import (kmlc, run_record, script, script_dirs,  # noqa: E402
                                 script_parser, workers, write_results)
from readahead.workloads import WORKLOADS  # noqa: E402

GUARDS = ["--guard", "benefit"]
POLICIES = ("default", "learned-fixed", "guarded-fixed", "learned-float", "guarded-float")
SETUPS = ("mmap/nvme", "mmap/sata", "pread/nvme", "pread/sata")
RANDOM = ("readrandom", "readrandomwriterandom", "mixgraph")


def _job(args):
    from readahead.experiment import measured_ops, run

    workload, setup, policy, db, seed, quick, dirs = args
    access, device = setup.split("/")
    warm, measure = measured_ops(workload, db, quick)
    kind = policy.split("-")[0]
    out = run(workload, device, kind, db, seed=seed, warm=warm, measure=measure,
              outdir=dirs.get(policy), access=access)
    return (setup, workload, policy), out


def summary(res: dict) -> dict:
    out = {}
    for setup, per_w in res.items():
        for p in POLICIES[1:]:
            ratio = {w: r[p]["throughput_mb_s"] / r["default"]["throughput_mb_s"]
                     for w, r in per_w.items()}
            out[f"{setup}/{p}"] = {"worst": min(ratio.values()),
                                   "random_min": min(ratio[w] for w in RANDOM if w in ratio),
                                   "ratio": ratio}
    return out


def acceptance(summ: dict) -> dict:
    """Per guarded policy: its worst workload over every setup (must be at
    least 0.995 of the default's), and its lowest random workload through
    mmap (at least 1.25)."""
    out = {}
    for p in POLICIES[1:]:
        if p.startswith("guarded"):
            rows = {k.rsplit("/", 1)[0]: v for k, v in summ.items() if k.endswith("/" + p)}
            worst = min(v["worst"] for v in rows.values())
            mmap = min(v["random_min"] for k, v in rows.items() if k.startswith("mmap/"))
            out[p] = {"worst": worst, "mmap_random_min": mmap,
                      "met": worst >= 0.995 and mmap >= 1.25}
    return out


def verdict(g: dict) -> str:
    """The guard's verdicts: "on trial" before the first, else the
    promotions and demotions."""
    if not g.get("promotions") and not g.get("demotions"):
        return "on trial"
    return f"{g['promotions']} up, {g['demotions']} down"


def markdown(r: dict) -> str:
    L = [f"# The readahead hook's guards\n",
         f"`{r['command']}` on {r['run']['machine']}, {r['run']['seconds']} s.  Guards: "
         f"`{' '.join(r['guards'])}` (docs/hooks.md, \"Guards\").  Throughput relative to "
         "Linux's default (ra_pages 32), per setup (access/device); a guarded window's "
         "A/B cost is the next window's time per page consumed.\n",
         "| setup | workload | default MB/s | learned-fixed | guarded-fixed | learned-float "
         "| guarded-float | guarded-fixed: verdict, control / model / probe windows |",
         "|---|---|---:|---:|---:|---:|---:|---|"]
    for setup, per_w in r["results"].items():
        for w, per_p in per_w.items():
            base = per_p["default"]["throughput_mb_s"]
            g = per_p["guarded-fixed"].get("guard", {})
            L.append(f"| {setup} | {w} | {base:.1f} | " + " | ".join(
                f"{per_p[p]['throughput_mb_s'] / base:.3f}" for p in POLICIES[1:]) +
                f" | {verdict(g)}, {g.get('control', 0)} / {g.get('model', 0)} / "
                f"{g.get('probe', 0)} |")
    L.append("")
    L.append("| setup | policy | worst workload | random workloads, lowest |")
    L.append("|---|---|---:|---:|")
    for k, v in r["summary"].items():
        setup, p = k.rsplit("/", 1)
        L.append(f"| {setup} | {p} | {v['worst']:.3f} | {v['random_min']:.3f} |")
    L += ["", "**Acceptance** (guarded: no setup more than 0.5% below the default on any "
          "workload; through mmap, every random workload at least 25% above it): " + "; ".join(
              f"{p}: worst {v['worst']:.4f}, mmap random lowest {v['mmap_random_min']:.3f}, "
              f"{'met' if v['met'] else 'NOT met'}"
              for p, v in acceptance(r["summary"]).items()) + ".", ""]
    return "\n".join(L)


def main(argv=None) -> int:
    from readahead.run import FULL, QUICK

    from readahead.experiment import checked_in_table, hook_options

    p = script_parser(__doc__, HERE, "guards")
    p.add_argument("--guard", action="append", help="a --guard SPEC instead of GUARDS's")
    a = p.parse_args(argv)
    guards = [x for g in a.guard for x in ("--guard", g)] if a.guard else GUARDS
    cfg = QUICK if a.quick else FULL
    t0 = time.perf_counter()
    work, out = script_dirs(a, HERE)
    table = checked_in_table()
    onnx, cal = HERE / "readahead.onnx", HERE / "calibration.npy"
    opts = (*hook_options(table), "--target", "kernel", "--target", "user")
    dirs = {}
    for p_ in POLICIES[1:]:
        kind, numerics = p_.split("-")
        dirs[p_] = work / p_
        fixed = ("--numerics", "fixed", "--calibration", cal) if numerics == "fixed" else ()
        kmlc("compile", onnx, "-o", dirs[p_], *fixed, *opts,
             *(guards if kind == "guarded" else ()))
    jobs = [(w, s, p_, cfg["db"], cfg["eval_seed"], a.quick, dirs)
            for s in SETUPS for w in WORKLOADS for p_ in POLICIES]
    res: dict = {}
    with workers(a.jobs) as pmap:
        for (s, w, p_), r in pmap(_job, jobs):
            res.setdefault(s, {}).setdefault(w, {})[p_] = r
    r = {"command": " ".join(["python", "examples/readahead/guards.py", *(argv or sys.argv[1:])]),
         "guards": guards, "class_table": table, "results": res, "summary": summary(res),
         "run": run_record(t0)}
    write_results(out, "guards", r, markdown(r))
    return 0


if __name__ == "__main__":
    script(main)
