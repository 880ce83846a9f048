"""llvm-mca's estimate of the scalar fixed-point path on cores this machine is not.

Cycles per MAC are the core's (docs/performance.md): the scalar path's
dense loops are integer code whose speed depends on how many ALUs and
multipliers a core has, and a guest has only the one core it runs on.
This script builds a benchmark model's fixed-point C as ``make bench``
does (the same calibration rows, the kernel's integer flags read from the
module kmlc builds), finds every loop of the scalar forward function that
multiplies (a backward branch over a body with ``imul``), and runs
``llvm-mca`` on each for several CPU models: cycles per iteration in a
steady state, an estimate of the core's throughput, not a measurement.

    .venv/bin/python benchmarks/mca.py [--models heimdall,linnos]
                                       [--cpus znver2,znver3,icelake-server,skylake]
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_c  # noqa: E402
import bench_models  # noqa: E402

CPUS = "znver2,znver3,icelake-server,skylake"
LINE = re.compile(r"^\s+([0-9a-f]+):\t(.*)$")


def build(name: str, work: Path) -> Path:
    """The scalar object of ``name``'s fixed-point C, with the kernel's flags."""
    spec = bench_models.spec(name)
    onnx_path = spec.onnx_path or spec.write_onnx(work / f"{name}.onnx")
    np.save(work / "cal.npy", spec.rows(2000, seed=31))      # bench.py's calibration rows
    out = work / "out"
    kmlc = Path(sys.executable).with_name("kmlc")
    bench_c.run([kmlc, "compile", onnx_path, "-o", out, "--target", "kernel,user",
                 "--numerics", "fixed", "--calibration", work / "cal.npy",
                 "--max-weight-bytes", str(64 << 20)])
    bench_c.run([kmlc, "build", out])
    cc, flags = bench_c.codegen_flags(bench_c.kbuild_command(out / "kernel" / f".{name}_fx.o.cmd"))
    obj = work / f"{name}_fx.o"
    bench_c.run([cc, *flags, f"-I{out / 'user'}", "-c", "-o", obj, out / "user" / f"{name}_fx.c"])
    return obj


def loops(obj: Path) -> list[tuple[str, list[str]]]:
    """The innermost multiplying loops of the scalar path's functions in
    ``obj`` (those of the SIMD paths left out): (function, the body's
    instructions, branches dropped)."""
    text = bench_c.run(["objdump", "-d", "--no-show-raw-insn", obj]).stdout
    out = []
    for fn, body in re.findall(r"<([\w.]+)>:\n(.*?)(?:\n\n|\Z)", text, re.S):
        if re.search(r"_(sse2|avx2)(_|$)", fn):
            continue
        ins = [(int(m.group(1), 16), re.sub(r"\s*<.*>", "", m.group(2)).strip())
               for m in map(LINE.match, body.splitlines()) if m]
        found = []
        for addr, op in ins:
            jump = re.match(r"j\w+\s+([0-9a-f]+)$", op)
            if not jump or op.startswith("jmp") or int(jump.group(1), 16) >= addr:
                continue
            start = int(jump.group(1), 16)
            found.append((start, addr, [o for a, o in ins if start <= a < addr
                                        and not o.startswith("j")]))
        # innermost: no other multiplying loop inside it
        for s0, e0, body0 in found:
            inner = any(s0 <= s1 and e1 <= e0 and (s1, e1) != (s0, e0) for s1, e1, _ in found)
            if not inner and any(o.startswith("imul") for o in body0):
                out.append((fn, body0))
    return out


def mca(loop: list[str], cpu: str, mca_bin: str) -> float:
    res = bench_c.run([mca_bin, f"-mcpu={cpu}", "-iterations=200"], input="\n".join(loop) + "\n")
    return int(re.search(r"Total Cycles:\s+(\d+)", res.stdout).group(1)) / 200


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="heimdall,linnos")
    ap.add_argument("--cpus", default=CPUS)
    args = ap.parse_args()
    mca_bin = shutil.which("llvm-mca") or shutil.which("llvm-mca-14")
    if not mca_bin:
        print("benchmarks/mca.py: no llvm-mca on the PATH (Debian's llvm package)", file=sys.stderr)
        return 1
    cpus = args.cpus.split(",")
    print(f"llvm-mca: {mca_bin}; cycles per loop iteration, steady state (an estimate)\n")
    print("| model | function | instructions | multiplies | " + " | ".join(cpus) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(cpus))
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            obj = build(name, Path(tmp))
            for fn, lp in loops(obj):
                cyc = [mca(lp, c, mca_bin) for c in cpus]
                muls = sum(o.startswith("imul") for o in lp)
                print(f"| {name} | {fn} | {len(lp)} | {muls} | " +
                      " | ".join(f"{c:.2f}" for c in cyc) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
