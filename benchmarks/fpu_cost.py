"""When does a fixed-point model's SIMD path pay for its FPU section?

    .venv/bin/python benchmarks/fpu_cost.py [--out benchmarks/results/fpu_cost.md]

1. c/fpu_cost.c times, in user space, what kernel_fpu_begin/end cost a
   kernel caller (see its comment, from arch/x86/kernel/fpu/core.c of
   6.1): the first section after a return to user space saves the task's
   registers and the return restores them (XSAVE or XSAVEOPT, XRSTOR, over
   every component XCR0 enables); later sections cost a few instructions.
2. The twin of the Heimdall-shaped example (examples/models/heimdall.onnx,
   fixed point, int8) and of a LinnOS-shaped model (31-256-2) run on each
   path the CPU has; per-call nanoseconds, the median of 7 batches of
   20,000 calls through infer_batch.
3. The break-even model size: the FPU section's cost divided by what one
   multiply-add saves on the SIMD path against the scalar one.  The
   default of simd_min_macs (kml_simd.h) must not be below the break-even
   of the first call on the slowest SIMD path measured here.

Timings move with the machine's load: rerun on a quiet machine for numbers
to publish.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "examples" / "models"))
sys.path.insert(0, str(HERE))


def fpu_costs(work: Path) -> dict:
    exe = work / "fpu_cost"
    subprocess.run(["gcc", "-O2", "-o", exe, HERE / "c" / "fpu_cost.c"], check=True)
    out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    return {k: (v if k == "xcr0" else float(v)) for k, v in (ln.split() for ln in out.splitlines())}


def per_call_ns(twin, raw: np.ndarray) -> dict:
    res = {}
    for p in twin.paths:
        twin.set_path(p)
        twin.run_raw(raw[:1000])
        ts = []
        for _ in range(7):
            t0 = time.perf_counter()
            twin.run_raw(raw)
            ts.append((time.perf_counter() - t0) / len(raw) * 1e9)
        res[p] = float(np.median(ts))
    twin.set_path(None)
    return res


def models(work: Path):
    import bench_models
    import kmlc
    import seed_models

    cal = seed_models.sample_inputs("heimdall", 2000, seed=21)
    rows = seed_models.sample_inputs("heimdall", 20000, seed=22)
    kmlc.compile(ROOT / "examples" / "models" / "heimdall.onnx", work / "heimdall",
                 numerics="fixed", calibration=cal, targets="user")
    yield "Heimdall 11-128-16-1", kmlc.load(work / "heimdall"), rows
    spec = bench_models.spec("linnos")
    onnx_path = spec.onnx_path or spec.write_onnx(work / "linnos.onnx")
    kmlc.compile(onnx_path, work / "linnos", numerics="fixed", calibration=spec.rows(2000, seed=31),
                 targets="user")
    yield "LinnOS " + "-".join(map(str, spec.sizes)), kmlc.load(work / "linnos"), \
        spec.rows(20000, seed=32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "fpu_cost.md")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        c = fpu_costs(work)
        save = max(c["xsave_ns"], c.get("xsaveopt_ns", 0))
        first = save + c["xrstor_ns"]
        repeat = 10.0   # preempt_disable/enable, a per-CPU write, a flag test, LDMXCSR
        lines = ["# What an FPU section costs, and when SIMD pays", "",
                 f"`.venv/bin/python benchmarks/fpu_cost.py` on {cpu_name()}.", "",
                 f"XSAVE area {int(c['xsave_bytes'])} B (XCR0 {c['xcr0']}): XSAVE "
                 f"{c['xsave_ns']:.0f} ns, XSAVEOPT {c.get('xsaveopt_ns', float('nan')):.0f} ns, "
                 f"XRSTOR {c['xrstor_ns']:.0f} ns.  A first call's section: about "
                 f"{first:.0f} ns (the larger save, plus the restore on the way back to user "
                 f"space); a repeated call's: about {repeat:.0f} ns (estimated from the "
                 "source: a handful of instructions and LDMXCSR).", "",
                 "| model | MACs on SIMD paths | path | ns per call | ns saved per MAC | "
                 "break-even MACs, first call | repeated call |",
                 "|---|---|---|---|---|---|---|"]
        worst = 0.0
        for title, twin, rows in models(work):
            raw = twin.encode(rows)
            ns = per_call_ns(twin, raw)
            macs = twin.meta["simd_macs"]
            for p, t in ns.items():
                if p == "scalar":
                    lines.append(f"| {title} | {macs} | scalar | {t:.0f} | | | |")
                    continue
                per_mac = (ns["scalar"] - t) / macs
                be_first, be_rep = first / per_mac, repeat / per_mac
                worst = max(worst, be_first)
                lines.append(f"| {title} | {macs} | {p} | {t:.0f} | {per_mac:.3f} | "
                             f"{be_first:.0f} | {be_rep:.0f} |")
        lines += ["", f"Largest first-call break-even: {worst:.0f} multiply-adds; "
                  "kml_simd.h's KML_SIMD_MIN_MACS is 512."]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def cpu_name() -> str:
    for ln in Path("/proc/cpuinfo").read_text().splitlines():
        if ln.startswith("model name"):
            return ln.split(":", 1)[1].strip()
    return "this machine"


if __name__ == "__main__":
    sys.exit(main())
