"""kmlc against TVM, onnxruntime, PyTorch, a naive C loop and the roofline.

    make bench                       # = .venv/bin/python benchmarks/bench.py
    .venv/bin/python benchmarks/bench.py [--rounds 7] [--samples 4000]
        [--models readahead,nfs_rsize,heimdall,linnos,mlp_large]
        [--sweep 16,32,64,128,256,512,1024] [--out benchmarks/results]

One run measures everything, so that ratios between systems are meaningful
on a noisy machine:

 1. compile every model with ``kmlc compile`` (float and fixed; timed), build
    its kernel modules with ``kmlc build`` (.ko sizes, and the peak stack from
    the build's own -fstack-usage), build the C timing programs (kmlc's twins
    with the kernel's flags and with -O3 -march=native, the naive C loop),
    and prepare the peers (TVM, onnxruntime, PyTorch eager, torch.compile);
    check every system's output against a float64 evaluation of the model;
 2. time single-sample calls in ``--rounds`` rounds; each round visits every
    model and, per model, every system in a rotated order, taking
    ``--samples`` per-call samples;
 3. the hidden-width sweep (32-H-H-8, float and fixed, kernel flags and
    native), timed the same way;
 4. the hooks' readahead and NFS feature steps, per event, through the
    twin's feature library (c/features.c);
 5. write benchmarks/results/benchmarks.md, the plots and results.json.

Medians and p99 pool every round's samples; a ratio is the median, over
rounds, of the two systems' medians in that round.  Cycles are core
cycles: TSC ticks times the core/TSC clock ratio that c/peak.c measures
(the VM exposes no cycle counter to perf).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_c  # noqa: E402
import bench_models  # noqa: E402
import bench_peers  # noqa: E402  (sets the single-thread environment first)
import report  # noqa: E402

DEFAULT_MODELS = [*bench_models.SEEDS, bench_models.LARGE]
DEFAULT_SWEEP = [16, 32, 64, 128, 256, 512, 1024]
from report import KMLC, PEERS, ROOF  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(*cmd) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def machine() -> dict:
    cpu = re.search(r"Model name:\s*(.*)", sh("lscpu"))
    hyp = re.search(r"Hypervisor vendor:\s*(.*)", sh("lscpu"))
    return {"cpu": cpu.group(1).strip() if cpu else platform.processor(),
            "hypervisor": hyp.group(1).strip() if hyp else "none",
            "cores": os.cpu_count(), "kernel": platform.release(),
            "os": sh("sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"),
            "gcc": sh("gcc", "-dumpfullversion"), "python": platform.python_version()}


# --------------------------------------------------------------------------
# Phase 1: compile, build, prepare
# --------------------------------------------------------------------------

def kmlc_compile(onnx_path: Path, out: Path, numerics: str, cal: np.ndarray | None,
                 work: Path, targets: str = "all") -> float:
    """``kmlc compile`` as a user runs it; returns wall seconds."""
    cmd = [Path(sys.executable).with_name("kmlc"), "compile", onnx_path, "-o", out,
           "--target", targets, "--max-weight-bytes", str(64 << 20)]
    if numerics == "fixed":
        np.save(work / "cal.npy", cal)
        cmd += ["--numerics", "fixed", "--calibration", work / "cal.npy"]
    t0 = time.perf_counter()
    bench_c.run(cmd)
    return time.perf_counter() - t0


class CSystem:
    """A C timing program: per-call TSC samples, timer cost subtracted."""

    timer = "tsc"

    def __init__(self, exe: Path, rows: np.ndarray, work: Path, args):
        self.exe, self.rows, self.work = exe, rows, work
        self.warmup, self.tsc_hz = args.warmup, args.tsc_hz
        self.clocks: list[float] = []   # core cycles per TSC tick, per burst

    def samples(self, n: int) -> np.ndarray:
        t, ovh, clock = bench_c.time_calls(self.exe, self.rows, n, self.warmup, self.work)
        self.clocks.append(clock)
        return (t - ovh) / self.tsc_hz * 1e9


def prepare_model(name: str, work: Path, args, kflags_box: dict) -> dict:
    import kmlc

    spec = bench_models.spec(name)
    mw = work / name
    shutil.rmtree(mw, ignore_errors=True)
    mw.mkdir(parents=True)
    onnx_path = spec.onnx_path or spec.write_onnx(mw / f"{name}.onnx")
    rows = spec.rows(256, seed=32)
    cal = spec.rows(2000, seed=31)
    ref = spec.forward(rows[:16])
    m = {"spec": spec, "systems": {}, "unavailable": {}, "sizes": {}, "check": {},
         "macs": spec.macs, "shape": spec.shape, "title": spec.title}
    for numerics in ("float", "fixed"):
        out = mw / f"kmlc_{numerics}"
        secs = kmlc_compile(onnx_path, out, numerics, cal, mw)
        meta = json.loads((out / "kmlc.json").read_text())
        size = {"compile_s": secs, "weights": meta["weight_bytes"],
                "workspace": meta["workspace_bytes"]}
        if args.no_ko:
            size["ko"] = "skipped (--no-ko)"
        else:
            try:
                ko = bench_c.build_module(out)
                size["ko"] = bench_c.ko_sizes(ko)
                size["stack"] = bench_c.peak_stack(out / "kernel", name)
                if numerics == "float" and "cc" not in kflags_box:
                    kflags_box.update(bench_c.kernel_flags(out / "kernel", name))
            except bench_c.BenchError as e:
                size["ko"] = f"no module: {str(e).splitlines()[0]}"
        m["sizes"][numerics] = size
        twin = kmlc.load(out)
        m["check"][(numerics, "twin")] = float(np.max(np.abs(twin.run(rows[:16]) - ref)))
        raw = twin.encode(rows)
        for numerics_, flags in KMLC:
            if numerics_ != numerics:
                continue
            if flags.startswith("kernel-") and flags[7:] not in twin.paths:
                m["unavailable"][(numerics, flags)] = (f"no {flags[7:]} path (the model has none, "
                                                      "or the CPU lacks it)")
                continue
            if flags.startswith("kernel") and "cc" not in kflags_box:
                m["unavailable"][(numerics, flags)] = ("the kernel's flags are unknown: no "
                                                      "module was built (kernel headers?)")
                continue
            wdir = mw / f"c_{numerics}_{flags}"
            exe = bench_c.build_kmlc(out, name, numerics, flags, kflags_box, wdir)
            m["systems"][(numerics, flags)] = CSystem(exe, raw, wdir, args)
            # every build of the model's C computes the twin's bits
            same = np.array_equal(bench_c.outputs(exe, raw[:16], wdir),
                                  twin.run_raw(raw[:16]).astype(np.float64))
            m["check"][(numerics, flags)] = 0.0 if same else float("nan")
            if not same:
                raise bench_c.BenchError(f"{name}: the {numerics} build with {flags} flags "
                                         "does not compute the twin's outputs")
    wdir = mw / "c_naive"
    exe = bench_c.build_naive(spec, wdir)
    m["systems"]["naive C"] = CSystem(exe, rows, wdir, args)
    m["check"]["naive C"] = float(np.max(np.abs(bench_c.outputs(exe, rows[:16], wdir) - ref)))
    for peer in bench_peers.PEERS:
        if peer in args.skip:
            m["unavailable"][peer] = "skipped (--skip)"
            continue
        try:
            p = bench_peers.prepare(peer, spec, onnx_path, rows)
        except bench_peers.Unavailable as e:
            m["unavailable"][peer] = str(e)
            continue
        m["systems"][peer] = p
        m["check"][peer] = float(np.max(np.abs(
            np.stack([p.run(r) for r in rows[:16]]) - ref)))
        if hasattr(p, "compile_s"):
            m["sizes"].setdefault("peer_compile_s", {})[peer] = p.compile_s
        m.setdefault("versions", {})[peer] = getattr(p, "version", "")
    return m


# --------------------------------------------------------------------------
# Phase 2: interleaved timing
# --------------------------------------------------------------------------

def timing_rounds(models: list[dict], rounds: int, samples: int, py_timer: float) -> None:
    for m in models:
        m["samples"] = {k: [] for k in m["systems"]}
    for r in range(rounds):
        for m in models:
            keys = list(m["systems"])
            shift = r % len(keys)
            for k in keys[shift:] + keys[:shift]:
                sysm = m["systems"][k]
                n = samples if sysm.timer == "tsc" else max(samples // 4, 50)
                s = sysm.samples(n)
                if sysm.timer == "python":
                    s = s - py_timer
                m["samples"][k].append(s)
        log(f"round {r + 1}/{rounds} done")


def summarize(m: dict, peaks: dict) -> None:
    """Medians, p99, cycles per MAC and ratios.  Cycles use the core clock
    each C program measured before its samples (the clock moves with the
    host's load); Python-timed peers get the median of the model's C
    bursts, which ran interleaved with them."""
    clocks = [c for s in m["systems"].values() for c in getattr(s, "clocks", [])]
    m["clocks"] = clocks
    model_cpt = float(np.median(clocks)) if clocks else peaks["core_per_tsc"]
    m["stats"] = {}
    for k, runs in m["samples"].items():
        own = getattr(m["systems"][k], "clocks", None)
        core_hz = peaks["tsc_hz"] * (float(np.median(own)) if own else model_cpt)
        allv = np.concatenate(runs)
        per_round = [float(np.median(x)) for x in runs]
        st = {"median": float(np.median(allv)), "p99": float(np.percentile(allv, 99)),
              "round_min": min(per_round), "round_max": max(per_round),
              "per_round": per_round, "n": int(allv.size)}
        st["cycles_per_mac"] = st["median"] * 1e-9 * core_hz / m["macs"]
        st["core_ghz"] = core_hz / 1e9
        roof = ROOF.get(k)
        if roof and roof in peaks:
            st["roof"] = roof
            st["pct_roof"] = 100.0 / (st["cycles_per_mac"] * peaks[roof])
        m["stats"][k] = st
    m["ratios"] = {}
    for base in [k for k in KMLC if k[1].startswith("kernel")]:
        if base not in m["stats"]:
            continue
        b = m["stats"][base]["per_round"]
        for peer in PEERS + [k for k in KMLC if k != base]:
            if peer in m["stats"]:
                rs = [p / q for p, q in zip(m["stats"][peer]["per_round"], b)]
                m["ratios"][(base, peer)] = {"median": float(np.median(rs)),
                                             "min": min(rs), "max": max(rs)}


# --------------------------------------------------------------------------
# Phase 3: the sweep
# --------------------------------------------------------------------------

def sweep(widths, work: Path, args, kflags: dict, peaks: dict) -> list[dict]:
    pts = []
    for h in widths:
        name = f"sweep_{h}"
        spec = bench_models.spec(name)
        mw = work / name
        shutil.rmtree(mw, ignore_errors=True)
        mw.mkdir(parents=True)
        onnx_path = spec.write_onnx(mw / f"{name}.onnx")
        rows, cal = spec.rows(256, seed=32), spec.rows(1000, seed=31)
        pt = {"h": h, "macs": spec.macs, "shape": spec.shape, "spec": spec, "systems": {},
              "unavailable": {}, "sizes": {}}
        import kmlc

        for numerics in ("float", "fixed"):
            out = mw / f"kmlc_{numerics}"
            pt["sizes"][numerics] = {"compile_s": kmlc_compile(onnx_path, out, numerics, cal,
                                                               mw, targets="user")}
            meta = json.loads((out / "kmlc.json").read_text())
            pt["sizes"][numerics].update(weights=meta["weight_bytes"],
                                         workspace=meta["workspace_bytes"])
            raw = kmlc.load(out).encode(rows)
            for flags in ("kernel", "native"):
                if flags == "kernel" and "cc" not in kflags:
                    continue
                wdir = mw / f"c_{numerics}_{flags}"
                exe = bench_c.build_kmlc(out, name, numerics, flags, kflags, wdir)
                pt["systems"][(numerics, flags)] = CSystem(exe, raw, wdir, args)
        pts.append(pt)
    log(f"sweep: {len(pts)} widths built; timing")
    n = max(args.samples // 4, 200)
    timing_rounds(pts, max(args.rounds // 2, 1), n, 0.0)
    for pt in pts:
        summarize(pt, peaks)
    return pts


# --------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--sweep", default=",".join(map(str, DEFAULT_SWEEP)),
                    help="hidden widths, or 'none'")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--samples", type=int, default=4000,
                    help="per-call samples per system per round (C); Python peers take 1/4")
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--skip", default="", help="peers to leave out, comma-separated")
    ap.add_argument("--no-ko", action="store_true", help="do not build the kernel modules")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "bench")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    args.skip = [s for s in args.skip.split(",") if s]
    models = [m for m in args.models.split(",") if m]
    widths = [] if args.sweep in ("", "none") else [int(w) for w in args.sweep.split(",")]
    t_start = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)

    info = machine()
    peaks = bench_c.machine_peaks(bench_c.build_peak(args.work / "peak"))
    args.tsc_hz = peaks["tsc_hz"]
    core = args.tsc_hz * peaks["core_per_tsc"] / 1e9
    log(f"{info['cpu']}: TSC {args.tsc_hz / 1e9:.3f} GHz, core {core:.2f} GHz; MAC/cycle "
        f"int {peaks['int_mac']:.2f}, sse2 {peaks['sse2_mac']:.2f}")
    kflags: dict = {}
    prepared = []
    for name in models:
        log(f"{name}: compiling, building, preparing peers")
        prepared.append(prepare_model(name, args.work, args, kflags))
    py_timer = bench_peers.python_timer_ns()
    log(f"timing {len(models)} models, {args.rounds} rounds")
    timing_rounds(prepared, args.rounds, args.samples, py_timer)
    for m in prepared:
        summarize(m, peaks)
    pts = sweep(widths, args.work, args, kflags, peaks) if widths else []
    log("hook feature steps, through the twin")
    steps = bench_c.feature_steps(args.work / "features")
    elapsed = time.perf_counter() - t_start
    cmd = os.environ.get("KMLC_BENCH_COMMAND") or \
        "python benchmarks/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    res = report.write(args.out, prepared, pts, peaks, info, kflags, cmd.strip(), elapsed,
                       py_timer, plots=not args.no_plots, steps=steps)
    log(f"done in {elapsed:.0f} s: {', '.join(str(p) for p in res)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
