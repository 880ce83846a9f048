"""Builds kept between runs: kernel modules (Kbuild's own incremental
build, in a directory named by what is built) and twins (a library or
program named by its preprocessed sources, as ccache's preprocessor mode).

``kmlc build`` (and every command that builds a module) runs Kbuild in
``~/.cache/kmlc/modules/<module>-<key>/`` rather than in OUTDIR/kernel,
then copies what Kbuild made (the .ko, the objects, the .cmd files) and
its log back into OUTDIR/kernel, with the build directory's path in the
log and the .cmd files rewritten to OUTDIR/kernel's.  The key is a hash
of every source file's name and bytes, the make command, the kernel
build directory (its path, and the size and time of its .config,
Module.symvers and Makefile), the variables Kbuild reads from the
environment (KCFLAGS and the like) and the compilers on PATH (what their
``--version`` says).  The same sources built for the same kernel again
therefore find their objects from before, and Kbuild decides, as it does
in a kernel tree, whether anything is out of date: its .cmd files hold
every object's command line and the headers it read.

What this guarantees:
- a build that is reused is one Kbuild found up to date; when Kbuild
  rebuilds anything in a kept directory (a header or compiler changed
  underneath), the directory is emptied and the module built from
  scratch, so that the log is always that of one whole build;
- a build that fails or warns is never kept: its directory is removed, so
  the next attempt compiles again and shows the same diagnostics;
- concurrent builds of the same key wait for each other (a lock per
  directory); different keys do not;
- at most ``KEEP`` directories are kept, the least recently used removed
  first.

A twin (``user.build_twin``, ``user.build_runner``) is kept in
``~/.cache/kmlc/twins/<key>`` where the key hashes the compiler (its
``--version``), the command with its output left out, and the
preprocessor's output for every source with the same flags: every header
the sources read, system ones included, is in it, so any change to what
would be compiled is a new key.  Only a build that printed nothing (no
warning) is kept; at most ``KEEP_TWINS`` are kept, the least recently
used removed first.  The compilers are deterministic, so a twin taken
from there is the bytes the command would write.

``KMLC_BUILD_CACHE=0`` turns both off: modules build in OUTDIR/kernel as
Kbuild is usually run, twins are compiled every time.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

KEEP = 400            # module build directories (1-5 MB each, with debug information)
KEEP_TWINS = 3000     # twins (20-100 KB each)
_FORMAT = b"kmlc-module-build-1"
_OUTPUT_SUFFIXES = (".o", ".ko", ".mod", ".mod.c", ".symvers", ".order", ".log", ".signing",
                    ".dwo", ".a", ".su", ".ci", ".i", ".s", ".lst")
# What Kbuild reads from the environment besides the command line
# (Documentation/kbuild/kbuild.rst); PATH is not, the compilers' --version is
_MAKE_ENV = ("CC", "LD", "AR", "NM", "OBJCOPY", "LLVM", "LLVM_IAS", "ARCH", "SRCARCH",
             "CROSS_COMPILE", "W", "C", "V", "MAKEFLAGS", "INSTALL_MOD_PATH")
_LOG = ".kmlc-build.log"        # the whole build's output: written once it succeeded
_COMPILERS = ("gcc", "cc", "clang", "ld", "ld.lld", "aarch64-linux-gnu-gcc",
              "aarch64-linux-gnu-ld")


def enabled() -> bool:
    return os.environ.get("KMLC_BUILD_CACHE", "1") not in ("0", "off", "no")


def sources(moddir: Path) -> list[Path]:
    """The files of a module directory that are not Kbuild's outputs."""
    return sorted(p for p in moddir.iterdir() if p.is_file() and not p.name.startswith(".")
                  and not p.name.endswith(_OUTPUT_SUFFIXES))


def _stat_id(p: Path) -> bytes:
    try:
        st = p.stat()
    except OSError:
        return b"-"
    return f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()


@functools.lru_cache(maxsize=None)
def _version(path: str, stat: bytes) -> bytes:
    try:
        return subprocess.run([path, "--version"], capture_output=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return b"?"


def _tool_id(tool: str) -> bytes:
    """What a compiler says it is (``--version``: the Debian revision
    included), as ccache's compiler_check; asked again if the file changes."""
    found = shutil.which(tool)
    return _version(found, _stat_id(Path(found))) if found else b"-"


def key(moddir: Path, kdir: Path, make_args: list[str]) -> str:
    h = hashlib.sha256(_FORMAT)
    for part in make_args:
        h.update(part.encode() + b"\0")
    h.update(str(Path(kdir).resolve()).encode() + b"\0")
    for name in (".config", "Module.symvers", "Makefile"):
        h.update(_stat_id(Path(kdir) / name) + b"\0")
    for tool in _COMPILERS:
        h.update(_tool_id(tool) + b"\0")
    for k, v in sorted(os.environ.items()):
        if k in _MAKE_ENV or k.startswith(("KBUILD_", "KCFLAGS", "KCPPFLAGS", "KAFLAGS")):
            h.update(f"{k}={v}\0".encode())
    for p in sources(moddir):
        data = p.read_bytes()
        h.update(f"{p.name}\0{len(data)}\0".encode() + data)
    return h.hexdigest()[:24]


def root() -> Path:
    from .kunit import cache_dir

    return cache_dir() / "modules"


@contextmanager
def _lock(path: Path, blocking: bool = True):
    """An exclusive lock on ``path`` (yields False if not ``blocking`` and
    it is held); one that ``prune`` unlinked meanwhile is taken afresh."""
    while True:
        with open(path, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                same = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                yield True
                return


def _quiet(log: str) -> bool:
    """Kbuild's output when nothing was out of date: make's own lines only."""
    return all(ln.startswith("make") or not ln.strip() for ln in log.splitlines())


def build(moddir: Path, kdir: Path, make_cmd, name: str):
    """Run ``make_cmd(builddir)`` (the make command for a module directory)
    in the kept directory for ``moddir``'s sources; returns (returncode,
    log) with paths as if Kbuild had run in ``moddir``, whose outputs are
    then those of the build.  A cache that cannot be written, or a module
    directory with subdirectories (which the kept directory would not
    have), means a build in ``moddir`` itself."""
    moddir = moddir.resolve()
    if enabled() and not any(p.is_dir() for p in moddir.iterdir()):
        try:
            return _build_kept(moddir, kdir, make_cmd, name)
        except OSError:
            pass
    res = _make(make_cmd(moddir))
    return res.returncode, res.stdout + res.stderr


def _build_kept(moddir: Path, kdir: Path, make_cmd, name: str):
    base = root()
    base.mkdir(parents=True, exist_ok=True)
    stage = base / f"{name}-{key(moddir, kdir, make_cmd(base / '_'))}"
    with _lock(base / f"{stage.name}.lock"):
        reused = False
        if (stage / _LOG).is_file():
            res = _make(make_cmd(stage))
            reused = res.returncode == 0 and _quiet(res.stdout + res.stderr)
        if reused:
            rc, log = 0, (stage / _LOG).read_text()
        else:                           # new, or stale: built from scratch
            shutil.rmtree(stage, ignore_errors=True)
            stage.mkdir()
            for p in sources(moddir):
                shutil.copy2(p, stage / p.name)
            res = _make(make_cmd(stage))
            rc, log = res.returncode, res.stdout + res.stderr
            if rc == 0 and "warning:" not in log:
                (stage / _LOG).write_text(log)
        kept = (stage / _LOG).is_file()
        if kept:
            _copy_outputs(stage, moddir)
            os.utime(stage)
        else:
            shutil.rmtree(stage, ignore_errors=True)
    if not kept or sum(1 for d in base.iterdir() if d.is_dir()) > KEEP:
        prune(base)
    return rc, log.replace(str(stage), str(moddir))


def _make(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def _copy_outputs(stage: Path, moddir: Path) -> None:
    """Every file Kbuild made in ``stage`` into ``moddir``: the .cmd files
    with ``stage``'s path as ``moddir``'s; a file ``moddir`` already has is
    left as it is (as Kbuild leaves an up-to-date target), and so is a
    module there that is this one signed (``kmlc build --sign``)."""
    from .kernel import SIG_MAGIC

    keep = {p.name for p in sources(stage)} | {_LOG}
    old, new = str(stage).encode(), str(moddir).encode()
    for p in stage.iterdir():
        if p.name in keep or not p.is_file():
            continue
        data = p.read_bytes()
        if p.name.endswith(".cmd"):
            data = data.replace(old, new)
        dst = moddir / p.name
        have = dst.read_bytes() if dst.is_file() else None
        if have is not None and (have == data or (
                p.suffix == ".ko" and have.startswith(data) and have.endswith(SIG_MAGIC))):
            continue
        _write(dst, data)


def prune(base: Path | None = None) -> None:
    """Remove the least recently used build directories beyond ``KEEP``,
    and any left without a finished build (one in use is skipped); and the
    lock files of directories gone for a day."""
    base = base or root()
    dirs = sorted((d for d in base.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime,
                  reverse=True)
    for i, d in enumerate(dirs):
        if i < KEEP and (d / _LOG).is_file():
            continue
        with _lock(base / f"{d.name}.lock", blocking=False) as mine:
            if mine and (i >= KEEP or not (d / _LOG).is_file()):
                shutil.rmtree(d, ignore_errors=True)
    day = time.time() - 86400
    for lock in base.glob("*.lock"):
        if not lock.with_suffix("").exists() and lock.stat().st_mtime < day:
            with _lock(lock, blocking=False) as mine:
                if mine:
                    lock.unlink(missing_ok=True)


# ---- twins ------------------------------------------------------------------------

def compile_twin(cmd: list[str], cwd: Path, run) -> tuple[int, str]:
    """``cmd`` (a compiler command with one ``-o OUT``) run by ``run(cmd)``
    (returning a CompletedProcess), or OUT taken from the twins kept
    before; returns (returncode, stderr).  A cache that cannot be read or
    written, or an entry whose checksum fails, only means a compile."""
    i = cmd.index("-o")
    out = Path(cwd, cmd[i + 1])
    kept = _twin_key(cmd, cwd, i) if enabled() else None
    if kept is not None:
        try:
            data = kept.read_bytes()
            if hashlib.sha256(data[32:]).digest() == data[:32]:
                _write(out, data[32:])
                os.chmod(out, 0o755)
                os.utime(kept)
                return 0, ""
        except OSError:
            pass
    res = run(cmd)
    if kept is not None and res.returncode == 0 and not res.stderr.strip():
        try:
            data = out.read_bytes()
            kept.parent.mkdir(parents=True, exist_ok=True)
            _write(kept, hashlib.sha256(data).digest() + data)
            files = list(kept.parent.iterdir())
            if len(files) > KEEP_TWINS:
                files.sort(key=lambda p: p.stat().st_mtime)
                for p in files[:len(files) - KEEP_TWINS]:
                    p.unlink(missing_ok=True)
        except OSError:
            pass
    return res.returncode, res.stderr


def _twin_key(cmd: list[str], cwd: Path, i: int) -> Path | None:
    """Where the output of ``cmd`` (``-o`` at ``i``) is kept, or None if the
    sources do not preprocess (the compile will say why)."""
    pre = [a for a in cmd[:i] + cmd[i + 2:] if a not in ("-shared", "-static")] + ["-E"]
    try:
        res = subprocess.run(pre, cwd=cwd, capture_output=True)
    except OSError:
        return None
    if res.returncode:
        return None
    h = hashlib.sha256(_FORMAT + b"-twin\0")
    h.update(_tool_id(cmd[0]) + b"\0")
    for part in cmd[:i] + ["-o", Path(cmd[i + 1]).suffix] + cmd[i + 2:]:
        h.update(part.encode() + b"\0")
    h.update(res.stdout)
    return root().with_name("twins") / h.hexdigest()[:32]


def _write(dst: Path, data: bytes) -> None:
    """Write ``dst`` whole (another process sees the old file or the new)."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
