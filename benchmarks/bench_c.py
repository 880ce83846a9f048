"""C side of the benchmark: build timing programs, run them, read sizes.

Every C system is timed by ``c/timing.c``: per-call TSC samples around
single-sample calls, in its own process.  What differs is the code under
test and its flags:

  kernel  the kernel's own code generation.  The flags are read from the
          Kbuild command lines of a module kmlc just built (``.<obj>.o.cmd``
          files): ``<name>_fp.c`` gets the float TU's flags (SSE2, no AVX,
          -ffp-contract=off, ...), every integer file gets the integer ones
          (-mno-sse -mno-mmx -mno-sse2 -mno-80387 ..., so fixed point runs
          scalar), both with -O2, -mno-red-zone, -mcmodel=kernel, return
          thunks, -mharden-sls=all, -fstack-protector-strong,
          -ftrivial-auto-var-init=zero and the rest.  Three changes make the
          objects run in a process: the ftrace entry call is emitted as a
          NOP (-mnop-mcount: what ftrace patches it to when not tracing), the
          stack protector reads a global canary (-mstack-protector-guard=
          global) and the return thunk is a plain ``ret`` (c/kstubs.S; the
          kernel patches it per CPU).  The float entry point ``<name>.c``
          is the twin's (it pins MXCSR instead of kernel_fpu_begin/end, whose
          cost, an XSAVE on first use, is not in these numbers).
  native  -O3 -march=native, with the determinism flags (-ffp-contract=off).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CDIR = HERE / "c"
DETERMINISM = ["-std=gnu11", "-fno-strict-aliasing", "-ffp-contract=off", "-fno-fast-math"]
NATIVE = ["-O3", "-march=native", *DETERMINISM]
HARNESS = ["-O2", "-std=gnu11", "-Wall"]


class BenchError(RuntimeError):
    pass


def run(cmd, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if res.returncode:
        raise BenchError(f"{' '.join(map(str, cmd[:3]))} ... failed:\n{res.stderr[-2000:]}")
    return res


# --------------------------------------------------------------------------
# The kernel's flags, from Kbuild's saved command lines
# --------------------------------------------------------------------------

def kbuild_command(cmd_file: Path) -> list[str]:
    """The compiler command line Kbuild saved for one object."""
    text = cmd_file.read_text()
    m = re.search(r"^(?:saved)?cmd_\S+ := (.*)$", text, re.M)
    if not m:
        raise BenchError(f"no command line in {cmd_file}")
    toks = []
    for t in shlex.split(m.group(1)):
        if t == ";":
            break
        toks.append(t)
    return toks


def codegen_flags(cmd: list[str]) -> tuple[str, list[str]]:
    """(compiler, code-generation flags) of a Kbuild command, made runnable
    in a process (see the module docstring)."""
    keep = []
    for t in cmd[1:]:
        if t.startswith(("-fmacro-prefix-map", "-mstack-protector-guard")) \
                or t in STACK_KCFLAGS.split():
            continue
        if t == "-pg" or t.startswith(("-O", "-m", "-f", "-std=", "--param")):
            keep.append(t)
    if "-mfentry" in keep:
        keep.append("-mnop-mcount")
    if any(t.startswith("-fstack-protector") for t in keep):
        keep.append("-mstack-protector-guard=global")
    return cmd[0], keep


def kernel_flags(kernel_dir: Path, name: str) -> dict:
    """The integer and float flags of a built float model's kernel/ dir."""
    cc, int_flags = codegen_flags(kbuild_command(kernel_dir / f".{name}.o.cmd"))
    _, fp_flags = codegen_flags(kbuild_command(kernel_dir / f".{name}_fp.o.cmd"))
    return {"cc": cc, "int": int_flags, "fp": fp_flags}


# --------------------------------------------------------------------------
# Timing programs
# --------------------------------------------------------------------------

def target_header(first: str, io: str, in_elems: str, out_elems: str, ws: str,
                  fn: str) -> str:
    """bench_target.h: ``first`` (an #include or a declaration), then the
    macros c/timing.c expects."""
    return (f"{first}\n#define BENCH_T {io}\n#define BENCH_IN_ELEMS {in_elems}\n"
            f"#define BENCH_OUT_ELEMS {out_elems}\n#define BENCH_WS_BYTES {ws}\n"
            f"#define bench_infer {fn}\n")


def link(exe: Path, work: Path, objs: list[Path], header: str, incs: list[Path],
         libs=()) -> Path:
    (work / "bench_target.h").write_text(header)
    main = work / "timing.o"
    run(["gcc", *HARNESS, f"-I{work}", *[f"-I{i}" for i in incs], "-c", "-o", main,
         CDIR / "timing.c"])
    stubs = work / "kstubs.o"
    run(["gcc", "-c", "-o", stubs, CDIR / "kstubs.S"])
    run(["gcc", "-no-pie", "-o", exe, main, stubs, *objs, *libs])
    return exe


# in[] and out[] element types (kmlc.json's in_dtype, out_dtype) in C
C_TYPES = {"f32": "float", "i32": "int", "i64": "long long", "bool": "unsigned char"}


def build_kmlc(outdir: Path, name: str, numerics: str, mode: str, kflags: dict | None,
               work: Path) -> Path:
    """A timing program for kml_<name>_infer from OUTDIR/user, with the
    kernel's flags (mode "kernel", or "kernel-sse2"/"kernel-avx2": a
    fixed-point model's SIMD path, forced; "kernel" alone forces the
    scalar path of a model that has SIMD paths) or -O3 -march=native."""
    path = mode.split("-")[1] if "-" in mode else "scalar"
    mode = mode.split("-")[0]
    user = outdir / "user"
    work.mkdir(parents=True, exist_ok=True)
    fixed = numerics == "fixed"
    core = user / f"{name}_{'fx' if fixed else 'fp'}.c"
    entry = user / f"{name}.c"
    objs = []
    for src, kind in ((core, "int" if fixed else "fp"), (entry, "int" if fixed else "twin")):
        obj = work / (src.stem + ".o")
        if mode == "native":
            cc, flags = "gcc", NATIVE
        elif kind == "twin":
            cc, flags = "gcc", ["-O2", *DETERMINISM]
        else:
            cc, flags = kflags["cc"], kflags[kind]
        run([cc, *flags, f"-I{user}", "-c", "-o", obj, src])
        objs.append(obj)
    N = name.upper()
    meta = json.loads((outdir / "kmlc.json").read_text())
    hdr = target_header(f'#include "{name}.h"', C_TYPES[meta["in_dtype"]], f"KML_{N}_IN_ELEMS",
                        f"KML_{N}_OUT_ELEMS", f"KML_{N}_WORKSPACE_BYTES", f"kml_{name}_infer")
    if meta["out_dtype"] != meta["in_dtype"]:
        hdr += f"#define BENCH_OUT_T {C_TYPES[meta['out_dtype']]}\n"
    if mode == "kernel" and f"kml_{name}_set_path" in (user / f"{name}.h").read_text():
        from kmlc.targets.user import Twin

        hdr += (f"#define BENCH_SETUP() do {{ if (kml_{name}_set_path({Twin.PATHS.index(path)})) "
                "exit(5); } while (0)\n")
    return link(work / "timing", work, objs, hdr, [user])


def build_naive(spec, work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    (work / "naive_model.h").write_text(spec.naive_header())
    obj = work / "naive.o"
    run(["gcc", "-O2", "-std=gnu11", f"-I{work}", "-c", "-o", obj, CDIR / "naive.c"])
    hdr = target_header("int naive_infer(const float *in, float *out, void *ws);", "float",
                        str(spec.sizes[0]), str(spec.sizes[-1]), "0", "naive_infer")
    return link(work / "timing", work, [obj], hdr, [], libs=["-lm"])


def build_peak(work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    exe = work / "peak"
    run(["gcc", "-O2", "-o", exe, CDIR / "peak.c"])
    return exe


def machine_peaks(exe: Path) -> dict:
    out = run([exe]).stdout
    peaks = {k: (v if k == "native_isa" else float(v))
             for k, v in (ln.split() for ln in out.splitlines())}
    # Paired fixed-point outputs (kml_fixed.h) do two MACs per multiply.
    peaks["pair_mac"] = 2 * peaks["int_mac"]
    return peaks


def time_calls(exe: Path, rows: np.ndarray, samples: int, warmup: int, work: Path
               ) -> tuple[np.ndarray, float, float]:
    """(per-call TSC ticks, median ticks of the empty timed region, core
    cycles per TSC tick just before the samples)."""
    rows_file = work / "rows.bin"
    if not rows_file.exists():
        np.ascontiguousarray(rows).tofile(rows_file)
    out = work / "samples.bin"
    res = run([exe, rows_file, len(rows), samples, warmup, out])
    ovh, clock = (float(v) for v in res.stdout.split()[:2])
    return np.fromfile(out, dtype=np.uint32).astype(np.float64), ovh, clock


def compare_and_time(exes: dict, inputs: dict, decide, ref: np.ndarray, work: Path,
                     peak: dict, rounds: int, samples: int) -> tuple[dict, dict]:
    """Each timing program's decisions against ``ref`` (``decide(name,
    outputs)`` turns a program's raw outputs into decisions), then
    ``rounds`` rounds of ``samples`` timed calls of every program in turn:
    ({name: agreement}, {name: [median ns per call of each round]})."""
    agree, per = {}, {k: [] for k in exes}
    for i, (k, e) in enumerate(exes.items()):
        (work / f"t{i}").mkdir()
        agree[k] = float(np.mean(decide(k, outputs(e, inputs[k], work / f"t{i}")) == ref))
        (work / f"t{i}" / "check.bin").unlink(missing_ok=True)
    for _ in range(rounds):
        for i, (k, e) in enumerate(exes.items()):
            ticks, ovh, _ = time_calls(e, inputs[k], samples, 1000, work / f"t{i}")
            per[k].append(float(np.median(ticks - ovh)) / peak["tsc_hz"] * 1e9)
    return agree, per


def outputs(exe: Path, rows: np.ndarray, work: Path) -> np.ndarray:
    """The raw outputs of a timing program's function on ``rows``."""
    f = work / "check.bin"
    np.ascontiguousarray(rows).tofile(f)
    out = run([exe, f, len(rows), 0, 0, "-"]).stdout
    return np.array([[float(v) for v in ln.split()] for ln in out.splitlines()])


# --------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------

def ko_sizes(ko: Path) -> dict:
    """``size`` of the module: text, data, bss (bytes)."""
    ln = run(["size", ko]).stdout.splitlines()[1].split()
    return {"text": int(ln[0]), "data": int(ln[1]), "bss": int(ln[2])}


def peak_stack(kernel_dir: Path, name: str) -> int:
    """Deepest stack of kml_<name>_infer through the model's own functions,
    from the module build's -fstack-usage (.su) and -fcallgraph-info (.ci).
    Kernel functions it calls (kernel_fpu_begin, ...) count 0."""
    frames, succ = {}, {}
    for su in kernel_dir.glob("*.su"):
        for ln in su.read_text().splitlines():
            loc, size, _ = ln.rsplit("\t", 2)
            frames[loc.rsplit(":", 1)[-1]] = int(size)
    for ci in kernel_dir.glob("*.ci"):
        for a, b in re.findall(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)"',
                               ci.read_text()):
            succ.setdefault(a, set()).add(b)

    def depth(fn, seen=()):
        if fn in seen:
            raise BenchError(f"recursion through {fn}")
        return frames.get(fn, 0) + max((depth(g, seen + (fn,)) for g in succ.get(fn, ())),
                                       default=0)
    root = f"kml_{name}_infer"
    if root not in frames:
        raise BenchError(f"no stack usage for {root} in {kernel_dir}")
    return depth(root)


STACK_KCFLAGS = "-fstack-usage -fcallgraph-info=su"


def build_module(outdir: Path) -> Path:
    """``kmlc build OUTDIR`` with stack-usage output (Kbuild reads KCFLAGS)."""
    import sys

    env = dict(os.environ, KCFLAGS=STACK_KCFLAGS)
    kmlc = Path(sys.executable).with_name("kmlc")
    run([kmlc, "build", outdir], env=env)
    kos = sorted((outdir / "kernel").glob("*.ko"))
    if not kos:
        raise BenchError(f"kmlc build {outdir} made no .ko")
    return kos[0]


# --------------------------------------------------------------------------
# The hooks' feature steps, through the twin's feature library
# --------------------------------------------------------------------------

def feature_steps(work: Path, events: int = 2_000_000, rounds: int = 5) -> dict:
    """Per-event cost of the readahead and NFS feature steps and of a
    guarded decision, guards on and off (c/features.c over
    runtime-user/kml_features_twin.c and kml_guard.h, built with the
    twin's flags):
    ns per event (median over rounds) and, when valgrind is there,
    instructions per event (callgrind: repeatable on a noisy machine)."""
    import shutil

    from kmlc import runtime_kernel, runtime_user
    from kmlc.targets.user import CFLAGS

    work.mkdir(parents=True, exist_ok=True)
    exe = work / "features"
    run(["gcc", *[f for f in CFLAGS if f not in ("-fPIC",)], f"-I{runtime_kernel.DIR}", "-o", exe,
         CDIR / "features.c", runtime_user.DIR / "kml_features_twin.c"])
    out = {}
    for step, kind, fn in (("readahead", "ra", "kml_ra_step_miss"),
                           ("nfs", "nfs", "kml_nfs_step_event"),
                           ("guards on", "guard", "kml_bench_guard_step"),
                           ("guards off", "noguard", "kml_bench_guard_step")):
        lines = run([exe, kind, events, rounds]).stdout.split()
        ns = [float(x) for x in lines[0::2]]
        r = {"ns_per_event": float(np.median(ns)), "ns_per_round": ns, "events": events,
             "command": f"{exe.name} {kind} {events} {rounds}"}
        if shutil.which("valgrind"):
            n = 200_000
            cg = work / f"callgrind.{kind}"
            run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg}", exe, kind, n, 1])
            ann = run(["callgrind_annotate", "--inclusive=yes", cg]).stdout
            m = re.search(r"^\s*([\d,]+) \([^)]*\)\s+\S*:" + fn + r"\b", ann, re.M)
            # NFS: every 16th event is a reclaim scan, counted apart
            stepped = n - n // 16 if kind == "nfs" else n
            if m:
                r["instructions_per_event"] = int(m.group(1).replace(",", "")) / stepped
        out[step] = r
    return out
