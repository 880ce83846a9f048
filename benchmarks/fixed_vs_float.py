"""Fixed point against float: speed and size of the seed-shape models.

    .venv/bin/python benchmarks/fixed_vs_float.py [--calls 200000]

For each seed model (examples/models) this compiles the float and the
fixed-point twin, then times kml_<name>_infer() from C in one process per
build, cycling over 256 realistic input rows, with two sets of flags:

  kernel  the kernel's code generation: -O2, no SSE/MMX/x87 for the
          integer files (fixed point runs scalar, as in the kernel); SSE2
          and -ffp-contract=off for the float math file
  native  -O3 -march=native, for comparison (not what the kernel runs)

It reports the median over 31 runs of the mean ns per call, the static
weight bytes and the workspace bytes, writes the table to
benchmarks/results/fixed_vs_float.md, and prints it.  Absolute times
depend on the machine; compare rows from the same run.
"""
from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "models"))

import seed_models  # noqa: E402

NO_FPU = ["-mno-sse", "-mno-sse2", "-mno-mmx", "-mno-3dnow", "-mno-avx", "-mno-80387",
          "-mno-red-zone"]
COMMON = ["-std=gnu11", "-fno-strict-aliasing", "-ffp-contract=off", "-fno-fast-math"]
FLAGS = {
    "kernel": {"int": ["-O2", *NO_FPU], "fp": ["-O2", "-msse2", "-mno-avx"]},
    "native": {"int": ["-O3", "-march=native"], "fp": ["-O3", "-march=native"]},
}

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "{name}.h"

#define ROWS 256
#define RUNS 31

static double now_ns(void)
{{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}}

static int cmp(const void *a, const void *b)
{{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}}

int main(int argc, char **argv)
{{
	static {io} in[ROWS][KML_{NAME}_IN_ELEMS], out[KML_{NAME}_OUT_ELEMS];
	static unsigned long long ws[KML_{NAME}_WORKSPACE_BYTES / 8 + 1];
	long calls = atol(argv[2]), i;
	double runs[RUNS], sink = 0;
	FILE *f = fopen(argv[1], "rb");
	int r;

	if (fread(in, sizeof(in), 1, f) != 1)
		return 2;
	for (r = 0; r < RUNS; r++) {{
		double t0 = now_ns();

		for (i = 0; i < calls; i++)
			kml_{name}_infer(in[i % ROWS], out, ws);
		runs[r] = (now_ns() - t0) / calls;
		sink += out[0];
	}}
	qsort(runs, RUNS, sizeof(double), cmp);
	printf("%.2f %g\n", runs[RUNS / 2], sink);
	return 0;
}}
"""


def build_and_time(outdir: Path, name: str, fixed: bool, flags: str, rows: np.ndarray,
                   calls: int) -> float:
    user = outdir / "user"
    core = user / f"{name}_{'fx' if fixed else 'fp'}.c"
    work = Path(tempfile.mkdtemp(dir=outdir))
    io = "s32" if fixed else "float"
    (work / "bench.c").write_text(HARNESS.format(name=name, NAME=name.upper(), io=io))
    f = FLAGS[flags]
    objs = []
    for src, kind in ((core, "int" if fixed else "fp"), (user / f"{name}.c", "int" if fixed
                                                         else "host")):
        obj = work / (src.stem + ".o")
        extra = f[kind] if kind != "host" else ["-O2"]
        subprocess.run(["gcc", *COMMON, *extra, f"-I{user}", "-c", "-o", obj, src], check=True)
        objs.append(obj)
    exe = work / "bench"
    subprocess.run(["gcc", "-O2", f"-I{user}", "-o", exe, work / "bench.c", *objs], check=True)
    rows.tofile(work / "rows.bin")
    out = subprocess.run([exe, work / "rows.bin", str(calls)], capture_output=True, text=True,
                         check=True).stdout
    return float(out.split()[0])


def main(argv=None) -> int:
    import kmlc

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000)
    args = ap.parse_args(argv)
    lines = [f"Machine: {platform.machine()}, {platform.processor() or 'unknown CPU'}, "
             f"{subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores; "
             f"gcc {subprocess.run(['gcc', '-dumpfullversion'], capture_output=True, text=True).stdout.strip()}",
             f"Command: python benchmarks/fixed_vs_float.py --calls {args.calls}", "",
             "| model | numerics | ns/inference, kernel flags | ns/inference, -O3 -march=native "
             "| weights B | workspace B |", "|---|---|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as d:
        for name in ("readahead", "nfs_rsize", "heimdall"):
            cal = seed_models.sample_inputs(name, 2000, seed=31)
            rows = seed_models.sample_inputs(name, 256, seed=32)
            for numerics in ("float", "fixed"):
                out = Path(d) / f"{name}_{numerics}"
                res = kmlc.compile(EXAMPLES / f"{name}.onnx", out, targets="user",
                                   numerics=numerics,
                                   calibration=cal if numerics == "fixed" else None)
                twin = kmlc.load(out)
                raw = twin.encode(rows)
                t = {fl: build_and_time(out, name, numerics == "fixed", fl, raw, args.calls)
                     for fl in FLAGS}
                m = res.manifest
                lines.append(f"| {name} | {numerics} | {t['kernel']:.1f} | {t['native']:.1f} "
                             f"| {m['weight_bytes']} | {m['workspace_bytes']} |")
    text = "\n".join(lines) + "\n"
    res_dir = ROOT / "benchmarks" / "results"
    res_dir.mkdir(parents=True, exist_ok=True)
    (res_dir / "fixed_vs_float.md").write_text(text)
    print(text)
    return 0


EXAMPLES = ROOT / "examples" / "models"

if __name__ == "__main__":
    sys.exit(main())
