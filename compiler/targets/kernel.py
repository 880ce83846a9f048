"""Kernel target: builds the generated module with Kbuild.

``find_kdir`` picks the kernel build directory: the one given, else the
running kernel's ``/lib/modules/$(uname -r)/build``, else the newest
``/usr/src/linux-headers-*`` tree Debian's ``linux-headers-amd64`` installed.
``build_module`` runs ``make M=... W=1 modules`` there and treats any
compiler warning as a failure: generated code must build cleanly.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import KmlcError

HEADERS_GLOB = "linux-headers-*"


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


def llvm_kdir(kdir=None) -> Path:
    """The kernel tree an LLVM=1 build uses: ``kdir`` if given, else the
    clang-built x86_64 KUnit kernel (Debian's headers are configured for
    gcc).  Either must be configured for clang."""
    from .kunit import llvm_kdir as kunit_llvm_kdir

    k = find_kdir(kdir) if kdir else kunit_llvm_kdir()
    if k is None:
        raise KmlcError("LLVM=1 needs a kernel tree configured with clang, and Debian's headers "
                        "are configured for gcc: pass --kdir, or run `kmlc kunit OUTDIR --arch "
                        "x86_64` once, which builds one under ~/.cache/kmlc")
    if kernel_config(k).get("CONFIG_CC_IS_CLANG") != "y":
        raise KmlcError(f"{k} was not configured with clang (no CONFIG_CC_IS_CLANG=y), so "
                        "LLVM=1 cannot build against it; pass --kdir with a clang-configured tree")
    return k


def make_command(kdir: Path, moddir: Path, *, llvm: bool = False, jobs: int | None = None):
    if not shutil.which("make"):
        raise KmlcError("make is not installed; run the README's setup command")
    cmd = ["make", "-C", str(kdir), f"M={moddir.resolve()}", "W=1",
           f"-j{jobs or os.cpu_count() or 1}"]
    if llvm:
        cmd.append("LLVM=1")
    return cmd


def build_module(moddir: Path, *, kdir=None, llvm: bool = False) -> Path:
    """Build the module in ``moddir`` (OUTDIR/kernel); returns the .ko path."""
    moddir = Path(moddir)
    if not (moddir / "Kbuild").is_file():
        raise KmlcError("no Kbuild here; compile with --target kernel (or all)",
                        where=str(moddir))
    k = llvm_kdir(kdir) if llvm else find_kdir(kdir)
    res = subprocess.run(make_command(k, moddir, llvm=llvm) + ["modules"],
                         capture_output=True, text=True)
    log = res.stdout + res.stderr
    (moddir / "build.log").write_text(log)
    warnings = [ln for ln in log.splitlines() if "warning:" in ln]
    if res.returncode != 0:
        errors = [ln for ln in log.splitlines() if "error" in ln.lower()] or log.splitlines()
        first = (errors or ["no output"])[0].strip()
        raise KmlcError(f"module build against {k} failed: {first} (log: {moddir}/build.log)"
                        "\n" + "\n".join(errors[-15:]))
    if warnings:
        raise KmlcError(f"module build against {k} gave {len(warnings)} warning(s), the "
                        f"first: {warnings[0].strip()} (a kmlc bug; please report; log: "
                        f"{moddir}/build.log)\n" + "\n".join(warnings[:15]))
    kos = sorted(moddir.glob("*.ko"))
    if not kos:
        raise KmlcError("module build produced no .ko", where=str(moddir))
    return kos[0]


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
