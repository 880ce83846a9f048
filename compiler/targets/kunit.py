"""KUnit target: runs generated golden-vector suites under kunit.py.

The kernel tree comes from Debian's ``linux-source-6.1`` tarball, unpacked
once to ``~/.cache/kmlc/linux-source-6.1``; kunit.py's build directories live
at ``~/.cache/kmlc/kunit-build/<arch>``.  Both paths are fixed, which is what
makes a cached build reusable (Kbuild records absolute paths): the first
UML build takes minutes, later runs seconds.

Suites are hooked into the tree once, the way in-tree tests are: ``lib/kmlc``
is a symlink to ``~/.cache/kmlc/kunit-stage``, sourced from ``lib/Kconfig``
and built from ``lib/Makefile``.  Each run stages the requested models'
``kunit/`` directories there (rewriting only files whose bytes changed, so
make rebuilds only what changed) and runs kunit.py with a .kunitconfig that
enables exactly those suites.  UML turns kernel_fpu_begin() into a no-op;
``--arch x86_64`` boots a real x86_64 kernel under qemu, where the FPU
section is the real one.

The kernels use both compilers: UML is built with gcc, the x86_64 and
arm64 kernels with clang (``LLVM=1``; arm64's under qemu-system-aarch64),
so every suite proves both compilers' kernel builds bit-identical to the
twin (and gcc's arm64 modules are built against Debian's arm64 headers).
The x86_64 and arm64 kernels also have modules, kprobes, debugfs,
device-mapper and the NFS client enabled: their build directories
(``llvm_kdir(arch)``) are clang-configured kernel trees that ``kmlc build
--llvm [--arch arm64]`` builds out-of-tree modules of every hook against
(Debian's headers are configured for gcc).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from ..errors import KmlcError
from . import progress

TREE_NAME = "linux-source-6.1"
TARBALL_DIR = Path("/usr/src")
ARCHES = ("um", "x86_64", "arm64")
# Per arch: build directory name, make options, configuration beyond the suites.
# What a kernel needs to build and load every hook's module against its build
# directory (kmlc build --llvm): modules, kprobes through ftrace, debugfs,
# device-mapper and the NFS client.
_MODULES = ("CONFIG_MODULES=y\nCONFIG_MODULE_UNLOAD=y\nCONFIG_KPROBES=y\n"
            "CONFIG_FTRACE=y\nCONFIG_FUNCTION_TRACER=y\nCONFIG_DYNAMIC_FTRACE=y\n"
            "CONFIG_DEBUG_FS=y\nCONFIG_MD=y\nCONFIG_BLK_DEV_DM=y\nCONFIG_FILE_LOCKING=y\n"
            "CONFIG_NET=y\nCONFIG_INET=y\nCONFIG_NETWORK_FILESYSTEMS=y\nCONFIG_NFS_FS=m\n")
ARCH_BUILD = {
    "um": ("um", [], ""),
    "x86_64": ("x86_64-llvm", ["LLVM=1"], _MODULES),
    # booted by kunit.py's own arm64 qemu configuration (-machine virt -cpu
    # cortex-a57: NEON, so float suites run inside a real
    # kernel_neon_begin/end section)
    "arm64": ("arm64-llvm", ["LLVM=1"], _MODULES),
}


def cache_dir() -> Path:
    return Path(os.environ.get("KMLC_CACHE") or Path.home() / ".cache" / "kmlc")


@contextmanager
def locked(name: str):
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _tarball() -> Path:
    found = sorted(TARBALL_DIR.glob(f"{TREE_NAME}.tar.*"))
    if not found:
        raise KmlcError(f"{TARBALL_DIR}/{TREE_NAME}.tar.xz not found: install Debian's "
                        f"{TREE_NAME} package (the README's setup does)")
    return found[-1]


def source_tree(log=print) -> Path:
    """The unpacked kernel tree, unpacking it first if the tarball changed."""
    tar = _tarball()
    tree, stamp = cache_dir() / TREE_NAME, cache_dir() / f"{TREE_NAME}.stamp"
    st = tar.stat()
    ident = f"{tar} {st.st_size} {int(st.st_mtime)}\n"
    with locked("tree"):
        if tree.is_dir() and stamp.is_file() and stamp.read_text() == ident:
            return tree
        log(f"kmlc: unpacking {tar} into {tree} (once)")
        tmp = cache_dir() / f".{TREE_NAME}.unpack"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        subprocess.run(["tar", "-xf", str(tar), "-C", str(tmp)], check=True)
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(cache_dir() / "kunit-build", ignore_errors=True)  # built from the old tree
        (tmp / TREE_NAME).rename(tree)
        tmp.rmdir()
        stamp.write_text(ident)
        return tree


def _append_once(path: Path, line: str) -> None:
    text = path.read_text()
    if line not in text.splitlines():
        path.write_text(text.rstrip("\n") + "\n" + line + "\n")


def _write_if_changed(path: Path, data: bytes) -> None:
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)


def build_dir(arch: str) -> Path:
    return cache_dir() / "kunit-build" / ARCH_BUILD[arch][0]


def llvm_kdir(arch: str = "x86_64") -> Path | None:
    """The clang-built x86_64 or arm64 KUnit kernel's build directory, once
    a ``kmlc kunit --arch ARCH`` run has built it."""
    k = build_dir(arch)
    return k if (k / "Module.symvers").is_file() else None


def stage_dir() -> Path:
    return cache_dir() / "kunit-stage"


def hook_tree(tree: Path) -> None:
    stage = stage_dir()
    stage.mkdir(parents=True, exist_ok=True)
    for f in ("Kconfig", "Makefile"):
        if not (stage / f).exists():
            (stage / f).write_text("")
    link = tree / "lib" / "kmlc"
    if not link.is_symlink() or os.readlink(link) != str(stage):
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(stage)
    _append_once(tree / "lib" / "Kconfig", 'source "lib/kmlc/Kconfig"')
    _append_once(tree / "lib" / "Makefile", "obj-$(CONFIG_KUNIT) += kmlc/")


def cases(meta: dict | Path) -> int:
    """The KUnit cases of a model's suite (its kmlc.json, or its OUTDIR):
    one per golden vector, the bad-arguments case, for a model with SIMD
    paths (kml_simd.h) the every-path case, and the weight-set cases: a
    valid blob, every truncation, corruptions, one per forgery."""
    if not isinstance(meta, dict):
        meta = json.loads((Path(meta) / "kmlc.json").read_text())
    return meta["golden_vectors"] + 1 + bool(meta.get("simd_macs")) + 3 + \
        meta["set_forgeries"]


def stage_models(outdirs: list[Path]) -> list[dict]:
    """Copy each model's kunit/ into the stage; returns their manifests."""
    models = []
    for d in outdirs:
        d = Path(d)
        man = d / "kmlc.json"
        if not man.is_file():
            raise KmlcError("not a kmlc output directory (no kmlc.json)", where=str(d))
        meta = json.loads(man.read_text())
        if not (d / "kunit" / "Kconfig").is_file():
            raise KmlcError("no KUnit suite here; compile with --target kunit (or all)",
                            where=str(d))
        if any(m["name"] == meta["name"] for m in models):
            raise KmlcError(f"two models named '{meta['name']}'; KUnit suites need distinct "
                            "names (compile with --name)")
        meta["dir"] = d
        models.append(meta)
    stage = stage_dir()
    names = {m["name"] for m in models}
    for old in stage.iterdir():
        if old.is_dir() and old.name not in names:
            shutil.rmtree(old)
    for m in models:
        dst = stage / m["name"]
        dst.mkdir(exist_ok=True)
        src_files = {p.name: p for p in (m["dir"] / "kunit").iterdir() if p.is_file()}
        for p in dst.iterdir():
            if p.is_file() and p.name not in src_files and not p.name.startswith("."):
                p.unlink()
        for n, p in src_files.items():
            _write_if_changed(dst / n, p.read_bytes())
    kconfig = "".join(f'source "lib/kmlc/{m["name"]}/Kconfig"\n' for m in models)
    make = "".join(f"obj-$(CONFIG_KMLC_{m['name'].upper()}_KUNIT_TEST) += {m['name']}/\n"
                   for m in models)
    _write_if_changed(stage / "Kconfig", kconfig.encode())
    _write_if_changed(stage / "Makefile", make.encode())
    return models


def run(outdirs: list[Path], *, arch: str = "um", jobs: int | None = None,
        out=sys.stdout) -> dict:
    """Build and boot KUnit with the given models' suites.

    Returns {"ok": bool, "summary": str, "suites": {suite: {"passed": n,
    "failed": n, "skipped": n}}} counting individual test cases, param
    vectors included; raises KmlcError when the tooling itself fails.
    """
    if arch not in ARCHES:
        raise KmlcError(f"unknown --arch {arch}; choose from {', '.join(ARCHES)}")
    from .qemu import QEMU      # qemu.py imports this module: not at the top

    needs = [QEMU[arch][:2]] if arch in QEMU else []
    if "LLVM=1" in ARCH_BUILD[arch][1]:
        needs += [("clang", "clang"), ("ld.lld", "lld"), ("llvm-objcopy", "llvm")]
    for tool, package in needs:
        if not shutil.which(tool):
            raise KmlcError(f"{tool} is not installed (package {package}); the README's "
                            "setup installs it")
    for tool in ("make", "gcc", "flex", "bison"):
        if not shutil.which(tool):
            raise KmlcError(f"{tool} is not installed; run the README's setup command")
    tree = source_tree(log=lambda s: print(s, file=out, flush=True))
    with locked("kunit"):
        hook_tree(tree)
        models = stage_models(outdirs)
        build = build_dir(arch)
        build.mkdir(parents=True, exist_ok=True)
        _, make_options, extra = ARCH_BUILD[arch]
        cfg = build.with_suffix(".kunitconfig")
        cfg.write_text("CONFIG_KUNIT=y\n" + extra + "".join(
            f"CONFIG_KMLC_{m['name'].upper()}_KUNIT_TEST=y\n" for m in models))
        cmd = [sys.executable, str(tree / "tools/testing/kunit/kunit.py"), "run",
               f"--arch={arch}", f"--build_dir={build}", f"--kunitconfig={cfg}",
               f"--jobs={jobs or os.cpu_count() or 1}", "--raw_output=kunit"]
        if make_options:
            cmd += ["--make_options", *make_options]
        if arch == "x86_64":
            # every instruction set TCG emulates (AVX2 included): KUnit runs
            # each SIMD path of fixed-point models
            cmd += ["--qemu_args", "-cpu max,la57=off"]
        proc = subprocess.Popen(cmd, cwd=tree, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        lines = []
        with progress.watch(build, f"kmlc kunit: building the {arch} kernel",
                            progress.EXPECTED.get(f"kunit-{arch}"),
                            lambda s: print(s, file=out, flush=True)) as building:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("["):  # kunit.py's own progress lines
                    print(line.rstrip("\n"), file=out, flush=True)
                    if "Starting KUnit Kernel" in line:
                        building.set()
            proc.wait()
    return _summarize(lines, proc.returncode, models, out)


_RESULT = re.compile(r"^(\s*)(ok|not ok) \d+ (?:- )?(.+?)(?: # (SKIP).*)?$")
_SUBTEST = re.compile(r"^(\s*)# Subtest: (\S+)")
_PASSING_VECTOR = re.compile(r"^\s+ok \d+ (?:- )?vector \d+$")


def _summarize(lines: list[str], rc: int, models: list[dict], out) -> dict:
    """Count leaf test results (golden vectors and plain cases) per kmlc
    suite from kunit.py's raw KTAP, and print the KTAP without the passing
    vectors' lines."""
    suite_names = {m["module"] for m in models}
    suites: dict[str, dict] = {}
    stack: list[tuple[str, int]] = []  # open subtests: (name, indent of their result line)
    for ln in lines:
        s = ln.rstrip("\n")
        sub = _SUBTEST.match(s)
        if sub:
            stack.append((sub.group(2), len(sub.group(1)) - 4))
            if sub.group(2) in suite_names:
                suites[sub.group(2)] = {"passed": 0, "failed": 0, "skipped": 0}
            continue
        r = _RESULT.match(s)
        if not r:
            continue
        indent, name = len(r.group(1)), r.group(3)
        if stack and stack[-1] == (name, indent):
            stack.pop()  # a test with subtests: its line only summarizes them
            continue
        suite = next((n for n, _ in stack if n in suite_names), None)
        if suite:
            key = "skipped" if r.group(4) else ("passed" if r.group(2) == "ok" else "failed")
            suites[suite][key] += 1
    for s in lines:
        s = s.rstrip("\n")
        if (_SUBTEST.match(s) or _RESULT.match(s) or s.lstrip().startswith("#")) \
                and not _PASSING_VECTOR.match(s):
            print(s, file=out)
    missing = suite_names - set(suites)
    if rc != 0 and not suites:
        tail = "".join(lines[-30:])
        raise KmlcError(f"kunit.py failed (exit {rc}) before running any kmlc suite",
                        details=tail)
    expected = {m["module"]: cases(m) for m in models}
    short = [n for n, v in suites.items() if sum(v.values()) != expected[n]]
    ok = rc == 0 and not missing and not short and all(v["failed"] == 0 for v in suites.values())
    parts = [f"{n}: {v['passed']} passed, {v['failed']} failed, {v['skipped']} skipped"
             + (f" (expected {expected[n]} cases)" if n in short else "")
             for n, v in suites.items()]
    if missing:
        parts.append("no results from " + ", ".join(sorted(missing)))
    summary = ("PASS" if ok else "FAIL") + " - " + "; ".join(parts)
    print(f"kmlc kunit: {summary}", file=out)
    return {"ok": ok, "summary": summary, "suites": suites}
