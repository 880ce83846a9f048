"""KUnit target: runs generated golden-vector suites in three kernels.

The kernel tree comes from Debian's ``linux-source-6.1`` tarball, unpacked
once to ``~/.cache/kmlc/linux-source-6.1``.

UML (gcc) and arm64 (clang, ``LLVM=1``, under qemu-system-aarch64) run
under kunit.py, in build directories at ``~/.cache/kmlc/kunit-build/<arch>``.
Both paths are fixed, which is what makes a cached build reusable (Kbuild
records absolute paths): the first build takes minutes, later runs
seconds.  Suites are hooked into the tree once, the way in-tree tests are:
``lib/kmlc`` is a symlink to ``~/.cache/kmlc/kunit-stage``, sourced from
``lib/Kconfig`` and built from ``lib/Makefile``.  Each run stages the
requested models' ``kunit/`` directories there (rewriting only files whose
bytes changed, so make rebuilds only what changed) and runs kunit.py with
a .kunitconfig that enables exactly those suites.  UML turns
kernel_fpu_begin() into a no-op.

x86_64 runs the suites as modules of the debug kernel (``kernels.py``:
gcc, lockdep, KASAN, UBSAN, KFENCE, KUnit built in), which loading a
module runs the suites of, as the kernel runs any module's: each suite is
built out of tree against the debug kernel's build directory, signed with
its key, and loaded under qemu with every instruction set TCG emulates
(AVX2 included: each SIMD path of a fixed-point model runs), where the FPU
section is the real one.  One kernel build serves the debug scenarios and
x86_64 KUnit.

So every suite proves both compilers' kernel builds bit-identical to the
twin: gcc's in UML and on x86_64 (and gcc's arm64 modules are built
against Debian's arm64 headers), clang's on arm64.  ``kmlc build --llvm``
builds against Debian's configuration prepared for clang
(``kernel.clang_tree``), not against these kernels.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from ..errors import KmlcError
from . import progress

TREE_NAME = "linux-source-6.1"
TARBALL_DIR = Path("/usr/src")
ARCHES = ("um", "x86_64", "arm64")
# Defaults that no kernel kmlc builds from source uses (the debug kernel,
# kernels.DEBUG_CONFIG, and arm64's KUnit kernel): io_uring, the VT and input
# layers; EXPERT makes them optional.
UNUSED_DEFAULTS = ("CONFIG_EXPERT=y\n# CONFIG_IO_URING is not set\n# CONFIG_VT is not set\n"
                   "# CONFIG_INPUT is not set\n")
# Per kunit.py arch: build directory name, make options, configuration beyond
# the suites and kunit.py's own per-arch configuration (the console, the qemu
# machine).  LLVM=1 module builds use Debian's configuration prepared for
# clang (kernel.clang_tree), not these kernels' trees, so the arm64 kernel
# also turns off UEFI (qemu boots the Image directly) and the block layer.
ARCH_BUILD = {
    "um": ("um", [], ""),
    # booted by kunit.py's own arm64 qemu configuration (-machine virt -cpu
    # cortex-a57: NEON, so float suites run inside a real
    # kernel_neon_begin/end section)
    "arm64": ("arm64-llvm", ["LLVM=1"],
              UNUSED_DEFAULTS + "# CONFIG_EFI is not set\n# CONFIG_BLOCK is not set\n"),
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


def manifests(outdirs: list[Path]) -> list[dict]:
    """Each model's kmlc.json, with "dir" its OUTDIR; refuses a directory
    without a KUnit suite, and two suites of one name."""
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
    return models


def stage_models(outdirs: list[Path]) -> list[dict]:
    """Copy each model's kunit/ into the stage; returns their manifests."""
    models = manifests(outdirs)
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
    from .kernel import CLANG_TOOLS, KBUILD_TOOLS, require  # kernel.py imports this module
    from .qemu import QEMU

    # x86_64's suites are modules of the debug kernel, which gcc builds
    require(list(KBUILD_TOOLS) + ([QEMU[arch][:2]] if arch in QEMU else []) +
            (list(CLANG_TOOLS) if "LLVM=1" in ARCH_BUILD.get(arch, ("", [], ""))[1] else []))
    if arch == "x86_64":
        return _run_as_modules(outdirs, jobs=jobs, out=out)
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


_DMESG_TIME = re.compile(r"^\[\s*\d+\.\d+\] ")


def _run_as_modules(outdirs: list[Path], *, jobs: int | None, out) -> dict:
    """x86_64: build each suite as a module of the debug kernel, sign it
    with the kernel's key, load them all in one qemu boot, and read the
    suites' KTAP from the kernel log.  A lockdep, KASAN, UBSAN or KFENCE
    report (or a warning) in that log fails the run, as does a suite
    whose module does not build without warnings or does not load."""
    from . import buildcache, qemu
    from .kernel import make_command, sign_module
    from .kernels import debug_kernel, signing_key

    def log(s):
        print(s, file=out, flush=True)
    models = manifests(outdirs)
    k = debug_kernel(log=log)
    key = signing_key(k.kdir)
    scenarios = []
    with tempfile.TemporaryDirectory(prefix="kmlc-kunit-") as tmp:
        for m in models:
            d = Path(tmp) / m["name"]
            shutil.copytree(Path(m["dir"]) / "kunit", d)
            option = f"CONFIG_KMLC_{m['name'].upper()}_KUNIT_TEST=m"
            rc, text = buildcache.build(    # kept between runs, as model modules are
                d, k.kdir, lambda x: make_command(k.kdir, x, jobs=jobs)
                + [option, "modules"], f"{m['module']}_kunit")
            bad = [ln for ln in text.splitlines() if "warning:" in ln or "error:" in ln]
            kos = sorted(d.glob("*.ko"))
            if rc or bad or not kos:
                raise KmlcError(f"the KUnit suite of {m['name']} did not build cleanly against "
                                f"{k.kdir}: " + (bad or text.splitlines()[-1:] or ["no output"])[0],
                                details="\n".join((bad or text.splitlines())[-15:]))
            if key is not None:
                sign_module(kos[0], *key, k.kdir)
            # loading the module runs its suites
            load = f"insmod /lib/kmlc/{kos[0].name} || echo 'KMLC-RESULT {m['module']} FAIL insmod'"
            scenarios.append(qemu.Scenario(m["module"], kos[0], script=load))
        init = qemu.init_script(scenarios, [], debug=True)
        initramfs = qemu.build_initramfs(k.root, scenarios, init, [])
    log(f"[kmlc] booting the debug kernel {k.release} with {len(scenarios)} suite module(s)")
    timeout = 600 + sum(cases(m) for m in models)       # KASAN under TCG: about 0.1 s a case
    # the large CPU (the debug scenarios keep qemu's default): a fixed-point
    # model's suite runs each SIMD path
    console = qemu.boot(initramfs, k, timeout=timeout, cpu=qemu.MAX_CPU)
    lines, reports, rc = kernel_log(console)
    for r in reports[:20]:
        log(f"kmlc kunit: {r}")
    return _summarize(lines, rc, models, out, reports)


def kernel_log(console: str) -> tuple[list[str], list[str], int]:
    """From the console of a boot that loaded suite modules: the kernel
    log's lines (its timestamps taken off, so the KTAP is as kunit.py
    reads it), the reports that fail the run whatever the suites say (a
    warning, lockdep, KASAN, UBSAN, KFENCE; a module that did not load),
    and 0 if the boot finished, else 1 (all the console's lines then)."""
    from .qemu import BAD_LOG, RESULT

    if "KMLC-DONE" not in console:
        return console.splitlines(True), [], 1
    dmesg = console.split("KMLC-DMESG-BEGIN", 1)[-1].split("KMLC-DMESG-END", 1)[0]
    lines = [_DMESG_TIME.sub("", ln) + "\n" for ln in dmesg.strip("\n").splitlines()]
    reports = [ln.strip() for ln in lines if BAD_LOG.search(ln)]
    reports += [" ".join(r).strip() for r in RESULT.findall(console)]
    return lines, reports, 0


_RESULT = re.compile(r"^(\s*)(ok|not ok) \d+ (?:- )?(.+?)(?: # (SKIP).*)?$")
_SUBTEST = re.compile(r"^(\s*)# Subtest: (\S+)")
_PASSING_VECTOR = re.compile(r"^\s+ok \d+ (?:- )?vector \d+$")


def _summarize(lines: list[str], rc: int, models: list[dict], out,
               reports: list[str] = ()) -> dict:
    """Count leaf test results (golden vectors and plain cases) per kmlc
    suite from the suites' KTAP, and print the KTAP without the passing
    vectors' lines; ``reports``: what else in the kernel log fails the run."""
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
        raise KmlcError(f"the KUnit kernel failed (exit {rc}) before running any kmlc suite",
                        details=tail)
    expected = {m["module"]: cases(m) for m in models}
    short = [n for n, v in suites.items() if sum(v.values()) != expected[n]]
    ok = rc == 0 and not missing and not short and not reports and \
        all(v["failed"] == 0 for v in suites.values())
    parts = [f"{n}: {v['passed']} passed, {v['failed']} failed, {v['skipped']} skipped"
             + (f" (expected {expected[n]} cases)" if n in short else "")
             for n, v in suites.items()]
    if missing:
        parts.append("no results from " + ", ".join(sorted(missing)))
    if reports:
        parts.append(f"{len(reports)} report(s) in the kernel log, the first: {reports[0]}")
    summary = ("PASS" if ok else "FAIL") + " - " + "; ".join(parts)
    print(f"kmlc kunit: {summary}", file=out)
    return {"ok": ok, "summary": summary, "suites": suites}
