"""The kernels ``kmlc qemu-test --kernel`` boots, and where each comes from.

    6.1     Debian's own kernel (linux-headers-amd64 and the matching
            linux-image-*-unsigned package)
    6.12    the newest Debian 12 Linux 6.12 (linux-headers-6.12.*)
    rt      Debian's PREEMPT_RT kernel (linux-headers-rt-amd64): spinlock_t
            sleeps, interrupts are threads
    debug   Linux 6.1 from Debian's linux-source-6.1, built here with lockdep
            (PROVE_LOCKING), DEBUG_ATOMIC_SLEEP, KASAN, UBSAN and KFENCE, and
            what the hook scenarios need (kprobes, tracing, device-mapper,
            null_blk, ext4, NFS client and server), as modules where Debian
            has them as modules; KUnit, whose x86_64 suites run here as
            modules (``kunit.run(arch="x86_64")``); and
            CONFIG_MODULE_SIG_FORCE: it loads only
            modules signed with the key its build made (certs/signing_key.pem,
            in its built-in keyring), as a Secure Boot machine loads only
            signed ones.  modules_install signs its own modules; kmlc signs
            the model's (``signing_key``)

A kernel is its build directory (modules are built against it), its
release, and an image root laid out as Debian's package is (boot/vmlinuz-*,
lib/modules/<release>/...), with busybox beside it.  Debian's images come
from ``apt-get download``; the debug kernel is built once into
``~/.cache/kmlc/kernel-build/debug`` and rebuilt only when its source or
configuration changes.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..errors import KmlcError
from . import progress
from .kernel import (KBUILD_TOOLS, arm64_kdir, download_package, find_kdir, installed_headers,
                     kernel_config, require)
from .kunit import UNUSED_DEFAULTS, cache_dir, locked, source_tree

NAMES = ("6.1", "6.12", "rt", "debug")


class Loops(NamedTuple):
    """The iteration counts of a boot's scenarios."""
    cycles: int     # module unload/reload cycles under load, per hooked model
    swaps: int      # weight-set swaps under load, per model given --weights
    volume: int = 100   # percent of the data each scenario step reads and writes

    def scaled(self, n: int, least: int = 1) -> int:
        """A step's count ``n`` (reads, files, rounds) at this volume, at least ``least``."""
        return max(least, n * self.volume // 100)


@dataclass
class Kernel:
    name: str
    kdir: Path              # build directory: modules are built against it
    release: str            # uname -r
    root: Path              # image/ (boot, lib/modules) and busybox/
    memory: str = "512M"    # qemu -m
    debug: bool = False     # sanitizers: scenarios run shorter loops (``loops``)
    arch: str = "x86_64"    # x86_64 or arm64 (qemu-system-aarch64, TCG)

    @property
    def loops(self) -> Loops:
        """How long the scenarios' loops run on this kernel (``kmlc
        qemu-test --cycles/--swaps`` override it for a soak).  Debian's x86-64
        kernels: 25 reload cycles, 100 weight swaps.  The debug kernel: 5
        reload cycles (lockdep, KASAN, UBSAN and KFENCE report a bad lock
        order or access the first time it happens, not the tenth, and
        KASAN's quarantine makes the leak bound loose anyway) and 100 swaps
        too (a swap races the hook's inferences, which read the old set
        under RCU: a use after free there needs the race to happen, so
        KASAN gets every swap the fast kernels get; the three hooks' 300
        swaps and the rest of their scenarios took 258 s under TCG).
        arm64, whose instructions TCG translates from another
        architecture's, several times slower: 5 and 20.  The
        hooks' C is the same on every kernel: the long loops of the x86-64
        kernels are what bound leaks and races.  The same holds for the data
        the scenarios' steps move (files written, reads checksummed, load
        rounds): the debug kernel and arm64 move 40% of it, the least each
        step's check still needs (``Loops.scaled``); under KASAN every byte
        costs several times Debian's kernel's.  Debian's 6.12: 8 reload
        cycles (its module unload waits out RCU grace periods, about 1.4 s a
        cycle under TCG, most of it idle: 25 cycles took 34 s per model; 6.1
        and 6.1 RT keep 25), the rest as 6.1."""
        if self.arch != "x86_64":
            return Loops(5, 20, 40)
        if self.debug:
            return Loops(5, 100, 40)
        return Loops(8, 100) if self.release.startswith("6.12") else Loops(25, 100)

    @property
    def vmlinuz(self) -> Path:
        return next((self.root / "image" / "boot").glob("vmlinuz-*"))


def release_of(kdir: Path) -> str:
    """The kernel release (uname -r) a build directory builds modules for."""
    uts = Path(kdir) / "include" / "generated" / "utsrelease.h"
    m = re.search(r'UTS_RELEASE "([^"]+)"', uts.read_text()) if uts.is_file() else None
    if not m:
        raise KmlcError("no include/generated/utsrelease.h: not a configured kernel build "
                        "directory", where=str(kdir))
    return m.group(1)


def resolve(name: str | None = None, kdir=None, log=print, arch: str = "x86_64") -> Kernel:
    """The kernel ``--kernel NAME`` names; or, with ``kdir`` (a Debian
    headers directory), the Debian kernel it builds for; by default
    Debian's own (6.1).  On arm64, Debian's arm64 6.1 kernel: the one whose
    headers ``kmlc build --arch arm64`` builds against."""
    if name and kdir:
        raise KmlcError("give --kernel or --kdir, not both")
    if arch == "arm64":
        if name not in (None, "6.1"):
            raise KmlcError(f"--arch arm64 boots Debian's arm64 6.1 kernel; --kernel {name} "
                            "is x86-64 only")
        k = arm64_kdir(kdir)
        release = release_of(k)
        return Kernel("6.1", k, release, debian_image(release, arch="arm64"), arch="arm64")
    if arch != "x86_64":
        raise KmlcError(f"unknown --arch {arch}; choose from x86_64, arm64")
    if name == "debug":
        return debug_kernel(log=log)
    if name is None or name == "6.1":
        k = find_kdir(kdir)
    elif name in ("6.12", "rt"):
        pat = {"6.12": r"^6\.12\.", "rt": r"-rt-amd64$"}[name]
        found = [k for k in installed_headers() if re.search(pat, release_of(k))]
        if not found:
            pkg = {"6.12": "linux-headers-6.12.*-amd64", "rt": "linux-headers-rt-amd64"}[name]
            raise KmlcError(f"no {name} kernel headers are installed: install {pkg} (the "
                            "README's setup does)")
        k = found[-1]
    else:
        raise KmlcError(f"unknown --kernel {name}; choose from {', '.join(NAMES)}")
    release = release_of(k)
    return Kernel(name or "6.1", k, release, debian_image(release))


def debian_image(release: str, arch: str = "x86_64") -> Path:
    """The unpacked Debian kernel package for ``release``, and busybox, of
    ``arch`` (cached)."""
    root = cache_dir() / "qemu" / release
    with locked("qemu"):
        if not (root / "ok").is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            download_package(f"linux-image-{release}-unsigned{_FOREIGN.get(arch, '')}", root / "image")
            _busybox(root, arch)
            (root / "ok").write_text(release + "\n")
    return root


_FOREIGN = {"arm64": ":arm64"}         # apt's spelling of another architecture's package


def _busybox(root: Path, arch: str = "x86_64") -> None:
    download_package(f"busybox-static{_FOREIGN.get(arch, '')}", root / "busybox")


# ---- the debug kernel ------------------------------------------------------------------

# alldefconfig plus what the scenarios and KUnit need (a serial console,
# initramfs, signed modules, kprobes through ftrace, null_blk, device-mapper,
# ext4, NFS over IPv4 loopback) and the sanitizers, without defaults nothing
# here uses (kunit.UNUSED_DEFAULTS, IPv6, ethtool's netlink: 126 of 1,743
# objects, leaving 1,617).  _check_config names any line Kconfig did not keep.
DEBUG_CONFIG = """\
CONFIG_LOCALVERSION="-kmlc-debug"
# CONFIG_LOCALVERSION_AUTO is not set
""" + UNUSED_DEFAULTS + """\
# CONFIG_IPV6 is not set
# CONFIG_ETHTOOL_NETLINK is not set
CONFIG_64BIT=y
CONFIG_SMP=y
CONFIG_NR_CPUS=8
CONFIG_PREEMPT=y
CONFIG_HIGH_RES_TIMERS=y
CONFIG_PRINTK=y
CONFIG_PRINTK_TIME=y
CONFIG_MULTIUSER=y
CONFIG_SYSVIPC=y
CONFIG_POSIX_TIMERS=y
CONFIG_FUTEX=y
CONFIG_EPOLL=y
CONFIG_SIGNALFD=y
CONFIG_TIMERFD=y
CONFIG_EVENTFD=y
CONFIG_SHMEM=y
CONFIG_AIO=y
CONFIG_FILE_LOCKING=y
CONFIG_TTY=y
CONFIG_SERIAL_8250=y
CONFIG_SERIAL_8250_CONSOLE=y
CONFIG_BLK_DEV_INITRD=y
CONFIG_RD_GZIP=y
CONFIG_BINFMT_ELF=y
CONFIG_BINFMT_SCRIPT=y
CONFIG_DEVTMPFS=y
CONFIG_PROC_FS=y
CONFIG_PROC_SYSCTL=y
CONFIG_SYSFS=y
CONFIG_TMPFS=y
CONFIG_KALLSYMS=y
CONFIG_MODULES=y
CONFIG_MODULE_UNLOAD=y
CONFIG_MODULE_SIG=y
CONFIG_MODULE_SIG_FORCE=y
CONFIG_MODULE_SIG_ALL=y
CONFIG_MODULE_SIG_SHA256=y
CONFIG_MODULE_SIG_KEY="certs/signing_key.pem"
CONFIG_JUMP_LABEL=y
CONFIG_KPROBES=y
CONFIG_FTRACE=y
CONFIG_FUNCTION_TRACER=y
CONFIG_DYNAMIC_FTRACE=y
CONFIG_KPROBES_ON_FTRACE=y
CONFIG_DEBUG_FS=y
CONFIG_BLOCK=y
CONFIG_BLK_DEV=y
CONFIG_BLK_DEV_NULL_BLK=m
CONFIG_CONFIGFS_FS=m
CONFIG_MD=y
CONFIG_BLK_DEV_DM=m
CONFIG_DM_FLAKEY=m
CONFIG_DM_DELAY=m
CONFIG_EXT4_FS=m
CONFIG_CRYPTO=y
CONFIG_CRYPTO_CRC32C=y
CONFIG_CRYPTO_MD5=y
CONFIG_CRYPTO_SHA256=y
CONFIG_NET=y
CONFIG_INET=y
CONFIG_UNIX=y
CONFIG_NETWORK_FILESYSTEMS=y
CONFIG_NFS_FS=m
CONFIG_NFS_V4=m
CONFIG_NFS_V4_1=y
CONFIG_NFS_V4_2=y
CONFIG_NFSD=m
CONFIG_NFSD_V4=y
CONFIG_CGROUPS=y
CONFIG_MEMCG=y
CONFIG_DEBUG_KERNEL=y
CONFIG_DEBUG_INFO_NONE=y
CONFIG_PROVE_LOCKING=y
CONFIG_DEBUG_ATOMIC_SLEEP=y
CONFIG_DEBUG_PREEMPT=y
CONFIG_KASAN=y
CONFIG_KASAN_GENERIC=y
CONFIG_KASAN_INLINE=y
CONFIG_UBSAN=y
CONFIG_UBSAN_BOUNDS=y
CONFIG_UBSAN_SHIFT=y
CONFIG_KFENCE=y
CONFIG_KUNIT=y
"""


def debug_build_dir() -> Path:
    return cache_dir() / "kernel-build" / "debug"


def _make(tree: Path, build: Path, *targets, env=None, log=print) -> None:
    cmd = ["make", "-C", str(tree), f"O={build}", "ARCH=x86_64",
           f"-j{os.cpu_count() or 1}", *targets]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        tail = "\n".join((res.stdout + res.stderr).splitlines()[-15:])
        raise KmlcError(f"building the debug kernel failed ({' '.join(targets)})", details=tail)


def debug_kernel(log=print) -> Kernel:
    """The debug kernel: built from the cached 6.1 source on first use
    (about 20 minutes on 2 cores), then reused while the source and
    DEBUG_CONFIG stay the same."""
    require(KBUILD_TOOLS + (("bc", "bc"), ("depmod", "kmod")))
    tree = source_tree(log=log)
    build = debug_build_dir()
    source = (cache_dir() / "linux-source-6.1.stamp").read_text()
    ident = hashlib.sha256(DEBUG_CONFIG.encode() + source.encode()).hexdigest()
    stamp = build / ".kmlc-stamp"
    with locked("debug-kernel"):
        if not stamp.is_file() or stamp.read_text() != ident:
            log(f"kmlc: building the debug kernel (lockdep, KASAN, UBSAN, KFENCE) in {build} "
                "(once; about 20 minutes on 2 cores)")
            # a configuration change rebuilds what it changes; another source, everything
            if not (build / ".kmlc-source").is_file() or \
                    (build / ".kmlc-source").read_text() != source:
                shutil.rmtree(build, ignore_errors=True)
            build.mkdir(parents=True, exist_ok=True)
            (build / ".kmlc-source").write_text(source)
            frag = build / "kmlc.config"
            frag.write_text(DEBUG_CONFIG)
            env = dict(os.environ, KCONFIG_ALLCONFIG=str(frag))
            _make(tree, build, "alldefconfig", env=env, log=log)
            _check_config(build / ".config")
            with progress.watch(build, "kmlc: building the debug kernel",
                                progress.EXPECTED["debug"], log):
                _make(tree, build, "bzImage", "modules", log=log)
            release = release_of(build)
            root = cache_dir() / "qemu" / release
            shutil.rmtree(root, ignore_errors=True)
            (root / "image" / "boot").mkdir(parents=True)
            shutil.copyfile(build / "arch/x86/boot/bzImage",
                            root / "image" / "boot" / f"vmlinuz-{release}")
            shutil.copyfile(build / ".config", root / "image" / "boot" / f"config-{release}")
            _make(tree, build, "modules_install", f"INSTALL_MOD_PATH={root / 'image'}",
                  "INSTALL_MOD_STRIP=1", log=log)
            _busybox(root)
            (root / "ok").write_text(release + "\n")
            stamp.write_text(ident)
    release = release_of(build)
    return Kernel("debug", build, release, cache_dir() / "qemu" / release, memory="1G",
                  debug=True)


def signing_key(kdir: Path) -> tuple[Path, Path] | None:
    """The key and certificate modules built against ``kdir`` must be
    signed with to load, if its kernel refuses unsigned modules
    (CONFIG_MODULE_SIG_FORCE) and its build made the key (Kbuild makes
    certs/signing_key.pem when CONFIG_MODULE_SIG_KEY names the default);
    else None."""
    key, cert = Path(kdir) / "certs" / "signing_key.pem", Path(kdir) / "certs" / "signing_key.x509"
    if kernel_config(kdir).get("CONFIG_MODULE_SIG_FORCE") != "y" or not key.is_file():
        return None
    return key, cert


def _check_config(config: Path) -> None:
    """Every option of DEBUG_CONFIG made it into the configuration (Kconfig
    drops what a dependency rules out, silently, and keeps an option that
    something selects, or that has no prompt, on)."""
    have = config.read_text().splitlines()
    wanted = [ln for ln in DEBUG_CONFIG.splitlines() if ln.startswith("CONFIG_")]
    unset = [m.group(1) for m in re.finditer(r"^# (CONFIG_\w+) is not set$", DEBUG_CONFIG, re.M)]
    missing = [ln for ln in wanted if ln not in have] + \
        [f"{o} off" for o in unset if any(ln.startswith(o + "=") for ln in have)]
    if missing:
        raise KmlcError("the debug kernel's configuration lacks " + ", ".join(missing),
                        where=str(config))
