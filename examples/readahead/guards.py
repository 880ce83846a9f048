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

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kml_common.pipeline import Fail, Parser, kmlc, machine, workers  # noqa: E402
from readahead.workloads import WORKLOADS  # noqa: E402

GUARDS = ["--guard", "benefit", "--guard", "benefit_margin_pct=1",
          "--guard", "benefit_samples=32"]
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


def markdown(r: dict) -> str:
    L = [f"# The readahead hook's guards\n",
         f"`{r['command']}` on {r['run']['machine']}, {r['run']['seconds']} s.  Guards: "
         f"`{' '.join(r['guards'])}` (docs/hooks.md, \"Guards\").  Throughput relative to "
         "Linux's default (ra_pages 32), per setup (access/device); a guarded window's "
         "A/B cost is the next window's time per page consumed.\n",
         "| setup | workload | default MB/s | learned-fixed | guarded-fixed | learned-float "
         "| guarded-float | guarded-fixed: demotions, control / model windows |",
         "|---|---|---:|---:|---:|---:|---:|---|"]
    for setup, per_w in r["results"].items():
        for w, per_p in per_w.items():
            base = per_p["default"]["throughput_mb_s"]
            g = per_p["guarded-fixed"].get("guard", {})
            L.append(f"| {setup} | {w} | {base:.1f} | " + " | ".join(
                f"{per_p[p]['throughput_mb_s'] / base:.3f}" for p in POLICIES[1:]) +
                f" | {g.get('demotions', 0)}, {g.get('control', 0)} / {g.get('model', 0)} |")
    L.append("")
    L.append("| setup | policy | worst workload | random workloads, lowest |")
    L.append("|---|---|---:|---:|")
    for k, v in r["summary"].items():
        setup, p = k.rsplit("/", 1)
        L.append(f"| {setup} | {p} | {v['worst']:.3f} | {v['random_min']:.3f} |")
    L.append("")
    return "\n".join(L)


def main(argv=None) -> int:
    from readahead.run import FULL, QUICK

    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--workdir", type=Path, default=HERE / "build" / "guards")
    p.add_argument("--out", type=Path)
    p.add_argument("--guard", action="append", help="a --guard SPEC instead of GUARDS's")
    a = p.parse_args(argv)
    guards = [x for g in a.guard for x in ("--guard", g)] if a.guard else GUARDS
    cfg = QUICK if a.quick else FULL
    t0 = time.perf_counter()
    work = a.workdir.resolve()
    out = (a.out or (work if a.quick else HERE / "results")).resolve()
    for d in (work, out):
        d.mkdir(parents=True, exist_ok=True)
    table = json.loads((HERE / "results" / "results.json").read_text())["class_table"]["table"]
    onnx, cal = HERE / "readahead.onnx", HERE / "calibration.npy"
    opts = ("--hooks", "readahead", "--hook-param", "ra_pages=" + ",".join(map(str, table)),
            "--target", "kernel", "--target", "user")
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
         "run": {"machine": machine(), "seconds": round(time.perf_counter() - t0, 1)}}
    (out / "guards.json").write_text(json.dumps(r, indent=1) + "\n")
    (out / "guards.md").write_text(markdown(r))
    print(markdown(r))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Fail as e:
        print(f"guards.py: {e}", file=sys.stderr)
        sys.exit(1)
