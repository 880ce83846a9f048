"""Kernel target: builds the generated module with Kbuild.

``find_kdir`` picks the kernel build directory: the one given, else the
running kernel's ``/lib/modules/$(uname -r)/build``, else the newest
``/usr/src/linux-headers-*`` tree Debian's ``linux-headers-amd64`` installed.
``build_module`` runs ``make M=... W=1 modules`` there and treats any
compiler warning as a failure: generated code must build cleanly.  It
runs in a directory kept under ``~/.cache/kmlc/modules`` and named by the
sources, the kernel and the command (``buildcache``), so that the same
module built for the same kernel again costs only Kbuild's check that
nothing is out of date.

``--arch arm64`` cross-builds with ``aarch64-linux-gnu-gcc`` against
Debian's own arm64 headers for the same kernel (``arm64_kdir``): the
``linux-headers-<release>-arm64`` package, unpacked under
``~/.cache/kmlc/arm64/``, whose ``scripts`` are this machine's
``linux-kbuild`` (the host tools: fixdep, modpost) and whose configuration,
generated headers and Module.symvers are Debian's arm64 kernel's, so that
the module loads in that kernel.  ``--llvm`` builds with clang against a
clang-configured tree (``llvm_kdir``): Debian's own kernel's configuration
for the arch, re-evaluated for clang over the cached 6.1 source
(``clang_tree``).  A module
built against a tree configured with clang is always built with clang,
and is for a kernel built with clang: in a gcc-built one (Debian's) ftrace
refuses its call sites at load, since objtool writes them as NOPs where
gcc's kernel expects calls to __fentry__.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import KmlcError
from . import buildcache

HEADERS_GLOB = "linux-headers-*"
ARCHES = ("x86_64", "arm64")


def _version_key(p: Path):
    return [int(x) if x.isdigit() else x for x in re.split(r"[.-]", p.name)]


def find_kdir(kdir: str | os.PathLike | None = None) -> Path:
    if kdir:
        k = Path(kdir)
        if not (k / "Makefile").is_file():
            raise KmlcError("not a kernel build directory (no Makefile)", where=str(k))
        return k
    running = Path("/lib/modules") / os.uname().release / "build"
    if (running / "Makefile").is_file():
        return running
    cands = installed_headers()
    if not cands:
        raise KmlcError(f"no kernel build directory: {running} does not exist and no "
                        "/usr/src/linux-headers-* tree is installed; install linux-headers-amd64 "
                        "(the README's setup does) or pass --kdir")
    default = _metapackage_headers()
    return default if default in cands else max(cands, key=_version_key)


def installed_headers() -> list[Path]:
    """Every installed Debian kernel build directory, oldest first."""
    return sorted((p for p in Path("/usr/src").glob(HEADERS_GLOB)
                   if (p / "Makefile").is_file() and (p / "Module.symvers").is_file()),
                  key=_version_key)


def _metapackage_headers() -> Path | None:
    """The headers Debian's linux-headers-amd64 points at (the distribution's
    kernel), which is the default even when newer ones are installed."""
    try:
        dep = subprocess.run(["dpkg-query", "-W", "-f=${Depends}", "linux-headers-amd64"],
                             capture_output=True, text=True).stdout
    except OSError:
        return None
    m = re.search(r"(linux-headers-[^\s,(]+)", dep)
    return Path("/usr/src") / m.group(1) if m else None


def llvm_kdir(kdir=None, arch: str = "x86_64") -> Path:
    """The kernel tree an LLVM=1 build for ``arch`` uses: ``kdir`` if
    given, else (Debian's headers are configured for gcc) Debian's
    kernel's configuration prepared for clang (``clang_tree``).  Either
    must be configured for clang."""
    k = find_kdir(kdir) if kdir else clang_tree(arch)
    if kernel_config(k).get("CONFIG_CC_IS_CLANG") != "y":
        raise KmlcError(f"{k} was not configured with clang (no CONFIG_CC_IS_CLANG=y), so "
                        "LLVM=1 cannot build against it; pass --kdir with a clang-configured tree")
    return k


# what building a kernel from source needs, what LLVM=1 builds add, and the
# Debian packages that have them (``require``)
KBUILD_TOOLS = (("make", "make"), ("gcc", "gcc"), ("flex", "flex"), ("bison", "bison"))
CLANG_TOOLS = (("clang", "clang"), ("ld.lld", "lld"), ("llvm-objcopy", "llvm"))


def require(tools) -> None:
    """Each (program, Debian package) of ``tools`` is installed, else one
    line naming both."""
    for tool, package in tools:
        if not shutil.which(tool):
            raise KmlcError(f"{tool} is not installed (package {package}); the README's setup "
                            "installs it")


def clang_tree(arch: str = "x86_64", headers: Path | None = None, log=print) -> Path:
    """A tree for building modules of Debian's kernel of ``arch`` with clang.

    ``headers`` (default: Debian's default kernel's, ``find_kdir``, or
    their arm64 twin, ``arm64_kdir``) are configured for gcc, and Kbuild
    builds a module with the compiler its tree was configured with.  So
    their configuration is re-evaluated for clang (``make LLVM=1
    olddefconfig``: what depends on the compiler's abilities follows
    clang's) over the cached linux-source of the same version, and the
    tree is prepared for out-of-tree modules (``make modules_prepare``:
    generated headers, host tools; under a minute, once), and Debian's
    Module.symvers copied in (modpost checks every symbol a module uses
    against it).  Kept under ``~/.cache/kmlc/kernel-build/llvm-<release>``
    and rebuilt when the headers or the source change."""
    import hashlib

    from .kunit import TREE_NAME, cache_dir, locked, source_tree

    if arch not in ARCHES:
        raise KmlcError(f"unknown --arch {arch}; choose from {', '.join(ARCHES)}")
    headers = Path(headers) if headers else (arm64_kdir() if arch == "arm64" else find_kdir())
    headers = headers.resolve()         # /lib/modules/<release>/build names no release
    version = TREE_NAME.removeprefix("linux-source-")
    release = headers.name.removeprefix("linux-headers-")
    if not (headers / ".config").is_file() or not release.startswith(version + "."):
        raise KmlcError(f"no clang build tree for {headers}: kmlc prepares one from the cached "
                        f"{TREE_NAME} only for Debian's {version} kernel headers; pass --kdir "
                        "with a clang-configured tree")
    require(CLANG_TOOLS)
    tree = source_tree(log=log)
    ident = hashlib.sha256(b"".join(f.read_bytes() for f in (
        headers / ".config", headers / "Module.symvers",
        cache_dir() / f"{tree.name}.stamp"))).hexdigest()
    build = cache_dir() / "kernel-build" / f"llvm-{release}"
    stamp = build / ".kmlc-stamp"
    with locked("clang-tree"):
        if stamp.is_file() and stamp.read_text() == ident:
            return build
        log(f"kmlc: preparing a clang build tree of {release} in {build} (once)")
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir(parents=True)
        shutil.copyfile(headers / ".config", build / ".config")
        for target in ("olddefconfig", "modules_prepare"):
            res = subprocess.run(["make", "-C", str(tree), f"O={build}", f"ARCH={arch}", "LLVM=1",
                                  f"-j{os.cpu_count() or 1}", target],
                                 capture_output=True, text=True)
            if res.returncode:
                raise KmlcError(f"preparing the clang build tree of {release} failed "
                                f"({target})", where=str(build),
                                details="\n".join((res.stdout + res.stderr).splitlines()[-15:]))
        shutil.copyfile(headers / "Module.symvers", build / "Module.symvers")
        stamp.write_text(ident)
    return build


CROSS = {"arm64": "aarch64-linux-gnu-"}


def make_command(kdir: Path, moddir: Path, *, llvm: bool = False, jobs: int | None = None,
                 arch: str = "x86_64"):
    if not shutil.which("make"):
        raise KmlcError("make is not installed; run the README's setup command")
    cmd = ["make", "-C", str(kdir), f"M={moddir.resolve()}", "W=1",
           f"-j{jobs or os.cpu_count() or 1}"]
    if arch in CROSS:
        cmd += [f"ARCH={arch}", f"CROSS_COMPILE={CROSS[arch]}"]
    if llvm:
        cmd.append("LLVM=1")
    return cmd


def arm64_kdir(kdir=None) -> Path:
    """The arm64 kernel build directory modules are cross-built against:
    ``kdir`` if given, else Debian's arm64 headers for the release of
    Debian's default x86-64 kernel (6.1.0-N-amd64 -> 6.1.0-N-arm64),
    fetched and unpacked once."""
    from .kunit import cache_dir, locked

    if kdir:
        return find_kdir(kdir)
    if not shutil.which("aarch64-linux-gnu-gcc"):
        raise KmlcError("aarch64-linux-gnu-gcc is not installed (Debian's "
                        "gcc-aarch64-linux-gnu; the README's setup installs it)")
    amd64 = find_kdir()
    release = amd64.name.removeprefix("linux-headers-")
    if not release.endswith("-amd64"):
        raise KmlcError(f"cannot tell Debian's arm64 kernel from {amd64}: pass --kdir with an "
                        "arm64 kernel build directory")
    release = release[:-len("-amd64")] + "-arm64"
    root = cache_dir() / "arm64" / release
    tree = root / "usr" / "src" / f"linux-headers-{release}"
    with locked("arm64"):
        if not (root / "ok").is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            download_package(f"linux-headers-{release}:arm64", root)
            # the host tools are this machine's linux-kbuild, the same version
            for link in ("scripts", "tools"):
                target = os.readlink(tree / link)          # ../../lib/linux-kbuild-X/...
                (tree / link).unlink()
                (tree / link).symlink_to("/usr/lib/" + target.split("/lib/", 1)[1])
            (root / "ok").write_text(release + "\n")
    if not (tree / "scripts" / "mod" / "modpost").exists():
        raise KmlcError(f"{tree}/scripts: this machine's linux-kbuild does not match Debian's "
                        f"arm64 {release} headers (install the linux-headers-amd64 of the same "
                        "kernel)")
    return tree


def download_package(pkg: str, dest: Path) -> None:
    """apt-get download ``pkg`` and unpack it into ``dest`` (arm64 packages
    need ``dpkg --add-architecture arm64`` and apt-get update first)."""
    import tempfile

    if not shutil.which("apt-get"):
        raise KmlcError(f"apt-get is needed to fetch {pkg} (Debian only)")
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)                          # apt's sandbox user writes here
        res = subprocess.run(["apt-get", "download", pkg], cwd=d, capture_output=True, text=True)
        debs = list(Path(d).glob("*.deb"))
        if res.returncode or not debs:
            hint = (" (is arm64 a dpkg architecture here? dpkg --add-architecture arm64 && "
                    "apt-get update: the README's setup does)" if ":arm64" in pkg else "")
            raise KmlcError(f"apt-get download {pkg} failed: "
                            f"{(res.stderr.strip().splitlines() or ['no output'])[-1]}{hint}")
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(dest)], check=True)


def target_kdir(kdir=None, *, llvm: bool = False, arch: str = "x86_64") -> Path:
    """The build directory a module for ``arch`` (with clang if ``llvm``)
    is built against."""
    if arch not in ARCHES:
        raise KmlcError(f"unknown --arch {arch}; choose from {', '.join(ARCHES)}")
    if llvm:
        return llvm_kdir(kdir, arch)
    return arm64_kdir(kdir) if arch == "arm64" else find_kdir(kdir)


def build_module(moddir: Path, *, kdir=None, llvm: bool = False, arch: str = "x86_64") -> Path:
    """Build the module in ``moddir`` (OUTDIR/kernel); returns the .ko path."""
    moddir = Path(moddir)
    if not (moddir / "Kbuild").is_file():
        raise KmlcError("no Kbuild here; compile with --target kernel (or all)",
                        where=str(moddir))
    k = target_kdir(kdir, llvm=llvm, arch=arch)
    # a tree configured with clang builds with clang only
    llvm = llvm or kernel_config(k).get("CONFIG_CC_IS_CLANG") == "y"

    def command(d: Path) -> list[str]:
        return make_command(k, d, llvm=llvm, arch=arch) + ["modules"]

    rc, log = buildcache.build(moddir, k, command, _module_name(moddir))
    (moddir / "build.log").write_text(log)
    warnings = [ln for ln in log.splitlines() if "warning:" in ln]
    if rc != 0:
        lines = log.splitlines()
        # a Kbuild $(error ...) ("*** ... Stop.") says why; else the first error
        errors = ([ln for ln in lines if "*** " in ln and ln.endswith("Stop.")]
                  + [ln for ln in lines if "error" in ln.lower()] or lines)
        first = (errors or ["no output"])[0].strip()
        raise KmlcError(f"module build against {k} failed: {first} (log: {moddir}/build.log)",
                        details="\n".join(errors[-15:]))
    if warnings:
        raise KmlcError(f"module build against {k} gave {len(warnings)} warning(s), the "
                        f"first: {warnings[0].strip()} (a kmlc bug; please report; log: "
                        f"{moddir}/build.log)", details="\n".join(warnings[:15]))
    kos = sorted(moddir.glob("*.ko"))
    if not kos:
        raise KmlcError("module build produced no .ko", where=str(moddir))
    return kos[0]


def _module_name(moddir: Path) -> str:
    """The module Kbuild makes (its obj-m line), else the directory's name."""
    m = re.search(r"^obj-m\s*\+?=\s*(\S+)\.o", (moddir / "Kbuild").read_text(), re.M)
    return m.group(1) if m else moddir.name


SIG_MAGIC = b"~Module signature appended~\n"


def sign_module(ko: Path, key, cert, kdir: Path) -> str:
    """Signs ``ko`` as Kbuild's modules_sign does: ``kdir``'s
    scripts/sign-file with the tree's CONFIG_MODULE_SIG_HASH (sha256 where
    the tree names none), the private key ``key`` (PEM, or a PKCS#11 URI)
    and the X.509 certificate ``cert`` (PEM or DER) whose key the kernel
    must trust.  A module signed before is signed afresh (its old
    signature stripped first, as sign-file appends).  Returns the hash."""
    ko, tool = Path(ko), Path(kdir) / "scripts" / "sign-file"
    if not os.access(tool, os.X_OK):
        raise KmlcError(f"no scripts/sign-file in {kdir}: signing needs the kernel's own tool "
                        "(Debian ships it in linux-kbuild-*)")
    for what, f in (("key", key), ("certificate", cert)):
        if not str(f).startswith("pkcs11:") and not Path(f).is_file():
            raise KmlcError(f"no such signing {what}", where=str(f))
    algo = kernel_config(kdir).get("CONFIG_MODULE_SIG_HASH", '"sha256"').strip('"')
    data = ko.read_bytes()
    if data.endswith(SIG_MAGIC):       # [module][PKCS#7][12-byte trailer][magic]
        sig_len = int.from_bytes(data[-len(SIG_MAGIC) - 4:-len(SIG_MAGIC)], "big")
        data = data[:-len(SIG_MAGIC) - 12 - sig_len]
    tmp = ko.with_name(ko.name + ".signing")   # the .ko is replaced whole, or left as it was
    tmp.write_bytes(data)
    res = subprocess.run([str(tool), algo, str(key), str(cert), str(tmp)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        tmp.unlink()
        why = (res.stderr.strip().splitlines() or ["no output"])[0]
        raise KmlcError(f"signing {ko.name} with {key} failed: {why}")
    os.replace(tmp, ko)
    return algo


def kernel_config(kdir: Path) -> dict[str, str]:
    """The build directory's configuration (include/config/auto.conf)."""
    conf = Path(kdir) / "include" / "config" / "auto.conf"
    out = {}
    if conf.is_file():
        for ln in conf.read_text().splitlines():
            if ln.startswith("CONFIG_") and "=" in ln:
                k, v = ln.split("=", 1)
                out[k] = v
    return out


def undefined_symbols(ko: Path) -> list[str]:
    res = subprocess.run(["nm", "-u", str(ko)], capture_output=True, text=True, check=True)
    return sorted({ln.split()[-1] for ln in res.stdout.splitlines() if ln.strip()})
