"""Real-kernel tests: boot Debian's own kernel in qemu and load kmlc modules.

``kmlc qemu-test OUTDIR...`` builds each model's module against the
installed headers, fetches the matching Debian kernel image
(``linux-image-<release>-unsigned``) and ``busybox-static`` with
``apt-get download`` (cached under ``~/.cache/kmlc/qemu/<release>``), packs
a busybox initramfs and boots it in qemu (TCG: no KVM needed) with
``-nographic``.  The initramfs's ``/init`` loads the modules (their
self-test runs the golden vectors through the real module), runs each hook's
scenario, prints ``KMLC-RESULT <name> PASS|FAIL <detail>`` lines and powers
off.  The run fails if any result fails, if the kernel logs a warning, a BUG
or an oops, or if the boot does not finish.
"""
from __future__ import annotations

import gzip
import os
import json
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import KmlcError
from .kernel import build_module, find_kdir
from .kunit import cache_dir, locked

# Debian modules a scenario may need, by name.  Their load order comes from
# each module's own "depends=" (what depmod writes into modules.dep), read
# from the image, so it follows the kernel version: 6.1's nfs.ko needs
# fscache.ko, 6.12's does not.
MODULE_PATHS = {
    "dm-mod": "drivers/md/dm-mod.ko", "null_blk": "drivers/block/null_blk/null_blk.ko",
    "configfs": "fs/configfs/configfs.ko", "brd": "drivers/block/brd.ko",
    "sunrpc": "net/sunrpc/sunrpc.ko", "auth_rpcgss": "net/sunrpc/auth_gss/auth_rpcgss.ko",
    "grace": "fs/nfs_common/grace.ko", "nfs_acl": "fs/nfs_common/nfs_acl.ko",
    "lockd": "fs/lockd/lockd.ko", "nfsd": "fs/nfsd/nfsd.ko", "netfs": "fs/netfs/netfs.ko",
    "fscache": "fs/fscache/fscache.ko", "nfs": "fs/nfs/nfs.ko", "nfsv4": "fs/nfs/nfsv4.ko",
    "dns_resolver": "net/dns_resolver/dns_resolver.ko",
}
BAD_LOG = re.compile(r"\b(WARNING:|BUG:|Oops|general protection fault|Call Trace:|"
                     r"kernel BUG|UBSAN:|KASAN:|memory leak)")
RESULT = re.compile(r"^KMLC-RESULT (\S+) (PASS|FAIL)\s*(.*)$", re.M)


@dataclass
class Scenario:
    """What one model contributes to the boot: its module, the Debian
    modules it needs, extra files and the shell commands that test it."""
    name: str
    ko: Path
    needs: list[str] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)   # initramfs path -> host path
    script: str = ""


def release_of(kdir: Path) -> str:
    """The kernel release (uname -r) a build directory builds modules for."""
    uts = kdir / "include" / "generated" / "utsrelease.h"
    m = re.search(r'UTS_RELEASE "([^"]+)"', uts.read_text()) if uts.is_file() else None
    if not m:
        raise KmlcError("no include/generated/utsrelease.h: not a configured kernel build "
                        "directory", where=str(kdir))
    return m.group(1)


def _download(pkg: str, dest: Path) -> None:
    if not shutil.which("apt-get"):
        raise KmlcError(f"apt-get is needed to fetch {pkg} (Debian only)")
    with tempfile.TemporaryDirectory() as d:
        res = subprocess.run(["apt-get", "download", pkg], cwd=d, capture_output=True, text=True)
        debs = list(Path(d).glob("*.deb"))
        if res.returncode or not debs:
            raise KmlcError(f"apt-get download {pkg} failed: {res.stderr.strip()[-300:]}")
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(dest)], check=True)


def kernel_image(release: str) -> Path:
    """The unpacked Debian kernel package for ``release`` (cached)."""
    root = cache_dir() / "qemu" / release
    with locked("qemu"):
        if not (root / "ok").is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            _download(f"linux-image-{release}-unsigned", root / "image")
            _download("busybox-static", root / "busybox")
            (root / "ok").write_text(release + "\n")
    return root


def _cpio_newc(entries: list[tuple[str, bytes | None, int]]) -> bytes:
    """A gzip-less newc archive of (path, data or None for a dir, mode)."""
    out = bytearray()
    for ino, (path, data, mode) in enumerate(entries + [("TRAILER!!!", b"", 0)], start=1):
        name = path.encode() + b"\0"
        body = data or b""
        hdr = "070701" + "".join(f"{v:08x}" for v in (
            ino, mode, 0, 0, 1, 0, len(body), 0, 0, 0, 0, len(name), 0))
        out += hdr.encode() + name
        out += b"\0" * (-(110 + len(name)) % 4)
        out += body
        out += b"\0" * (-len(body) % 4)
    return bytes(out)


def debian_modules(image: Path, scenarios: list[Scenario]) -> list[tuple[str, bytes]]:
    """The Debian modules the scenarios need, each after the modules it
    depends on (from its "depends=" field), with their contents."""
    modroot = next((image / "image" / "lib" / "modules").iterdir()) / "kernel"
    order: list[tuple[str, bytes]] = []
    visiting: set[str] = set()
    canon = {k.replace("-", "_"): k for k in MODULE_PATHS}  # depends= spells dm-mod dm_mod

    def visit(m: str) -> None:
        if m in visiting or any(m == n for n, _ in order):
            return
        if m not in MODULE_PATHS:
            raise KmlcError(f"the qemu tests do not know where Debian keeps module '{m}' "
                            "(add it to MODULE_PATHS)")
        visiting.add(m)
        data = debian_module(modroot / MODULE_PATHS[m])
        info = re.search(rb"\0depends=([^\0]*)\0", data)
        for dep in (info.group(1).decode().split(",") if info else []):
            if dep:
                visit(canon.get(dep.replace("-", "_"), dep))
        order.append((m, data))

    for sc in scenarios:
        for m in sc.needs:
            visit(m)
    return order


def build_initramfs(image: Path, scenarios: list[Scenario], init: str,
                    modules: list[tuple[str, bytes]] | None = None) -> bytes:
    busybox = (image / "busybox" / "bin" / "busybox").read_bytes()
    if modules is None:
        modules = debian_modules(image, scenarios)
    entries: list[tuple[str, bytes | None, int]] = []
    for d in ("bin", "dev", "proc", "sys", "tmp", "mnt", "lib", "lib/kmlc", "lib/debian",
              "sys/kernel", "sys/kernel/debug", "sys/kernel/config"):
        entries.append((d, None, stat.S_IFDIR | 0o755))
    entries.append(("bin/busybox", busybox, stat.S_IFREG | 0o755))
    for applet in ("sh", "mount", "insmod", "rmmod", "cat", "echo", "dmesg", "poweroff",
                   "sleep", "ls", "grep", "md5sum", "dd", "mkdir", "seq", "awk", "wc", "head",
                   "tail", "sync", "uname", "expr", "test", "[", "dirname", "cut", "cmp", "sort",
                   "stat", "umount", "ifconfig", "printf", "tr", "sed", "rmdir"):
        entries.append((f"bin/{applet}", b"busybox", stat.S_IFLNK | 0o777))
    for m, data in modules:
        entries.append((f"lib/debian/{m}.ko", data, stat.S_IFREG | 0o644))
    for sc in scenarios:
        entries.append((f"lib/kmlc/{sc.ko.name}", sc.ko.read_bytes(), stat.S_IFREG | 0o644))
        for dest, src in sc.files.items():
            entries.append((dest, Path(src).read_bytes(), stat.S_IFREG | 0o755))
    entries.append(("init", init.encode(), stat.S_IFREG | 0o755))
    return gzip.compress(_cpio_newc(entries), compresslevel=1)


def debian_module(path: Path) -> bytes:
    """A module of the Debian image, uncompressed (6.12 ships .ko.xz)."""
    import lzma

    if path.is_file():
        return path.read_bytes()
    for suffix, opener in ((".xz", lzma.open), (".gz", gzip.open)):
        packed = path.with_name(path.name + suffix)
        if packed.is_file():
            with opener(packed) as f:
                return f.read()
    raise KmlcError(f"the Debian kernel image has no {path.name}", where=str(path.parent))


def init_script(scenarios: list[Scenario], needed: list[str]) -> str:
    """/init: mount the pseudo filesystems, load the Debian modules in
    ``needed`` order, run every scenario, dump the kernel log, power off."""
    lines = ["#!/bin/sh", "mount -t proc proc /proc", "mount -t sysfs sysfs /sys",
             "mount -t devtmpfs dev /dev", "mount -t debugfs debugfs /sys/kernel/debug",
             'echo "KMLC-BOOTED $(uname -r)"',
             "# kB a leak would hold: unreclaimable slab and vmalloc, caches dropped",
             "kml_held() { echo 3 > /proc/sys/vm/drop_caches; "
             "awk '/^(SUnreclaim|VmallocUsed):/ { s += $2 } END { print s }' /proc/meminfo; }"]
    from .hooks import MODULE_ARGS

    for m in needed:
        args = MODULE_ARGS.get(m, "")
        lines.append(f"insmod /lib/debian/{m}.ko {args} || echo 'KMLC-RESULT {m} FAIL insmod'")
        if m == "configfs":
            lines.append("mount -t configfs none /sys/kernel/config")
    for sc in scenarios:
        lines += [f"# ---- {sc.name}", sc.script.strip()]
    lines += ["dmesg > /tmp/dmesg", "echo KMLC-DMESG-BEGIN", "cat /tmp/dmesg",
              "echo KMLC-DMESG-END", "echo KMLC-DONE", "poweroff -f"]
    return "\n".join(lines) + "\n"


def _manifest(outdir) -> dict:
    man = Path(outdir) / "kmlc.json"
    if not man.is_file():
        raise KmlcError("not a kmlc output directory (no kmlc.json)", where=str(outdir))
    return json.loads(man.read_text())


def model_scenario(outdir: Path, kdir=None) -> Scenario:
    """Load the model's module (its self-test runs), run its hooks'
    scenarios, unload it."""
    from .hooks import qemu_parts

    meta = _manifest(outdir)
    mod = meta["module"]
    ko = build_module(Path(outdir) / "kernel", kdir=kdir)
    needs, files, hook_script = qemu_parts(Path(outdir), meta, ko)
    script = f"""
if insmod /lib/kmlc/{ko.name}; then
    if dmesg | grep -q "{mod}: selftest: .* bit-identical"; then
        echo "KMLC-RESULT {mod} PASS $(dmesg | grep '{mod}: selftest' | tail -1)"
    else
        echo "KMLC-RESULT {mod} FAIL no selftest line"
    fi
{hook_script}
    rmmod {mod} || echo "KMLC-RESULT {mod}-unload FAIL rmmod"
else
    echo "KMLC-RESULT {mod} FAIL insmod (selftest or symbol error: see dmesg)"
fi"""
    return Scenario(mod, ko, needs=needs, files=files, script=script)


def boot(initramfs: bytes, image: Path, *, timeout: int = 300, memory: str = "512M",
         log=print) -> str:
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        raise KmlcError("qemu-system-x86_64 is not installed (package qemu-system-x86)")
    vmlinuz = next((image / "image" / "boot").glob("vmlinuz-*"))
    with tempfile.TemporaryDirectory() as d:
        rd = Path(d) / "initramfs.gz"
        rd.write_bytes(initramfs)
        cmd = [qemu, "-m", memory, "-smp", os.environ.get("KMLC_QEMU_SMP", "2"), "-kernel", str(vmlinuz), "-initrd", str(rd),
               "-append", "console=ttyS0 panic=-1 oops=panic loglevel=" + os.environ.get("KMLC_QEMU_LOGLEVEL", "4"),
               "-nographic", "-no-reboot", "-monitor", "none", "-accel", "tcg,thread=single"]
        # TCG only: /dev/kvm can exist where KVM does not work (nested VMs), and
        # a test that hangs is worse than one that takes 10 seconds more.
        try:
            res = subprocess.run(cmd, capture_output=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace")
            raise KmlcError(f"the qemu boot did not finish in {timeout} s; last output:\n"
                            + out[-2000:]) from None
    return res.stdout.decode(errors="replace").replace("\r", "")


def check(log: str) -> tuple[bool, list[str]]:
    results = RESULT.findall(log)
    lines = [f"{name}: {status} {detail}".rstrip() for name, status, detail in results]
    problems = []
    if "KMLC-DONE" not in log:
        problems.append("the test script did not finish")
    dmesg = log.split("KMLC-DMESG-BEGIN")[-1].split("KMLC-DMESG-END")[0]
    bad = [ln for ln in dmesg.splitlines() if BAD_LOG.search(ln)]
    if bad:
        problems.append("kernel log: " + " | ".join(bad[:5]))
    if not results:
        problems.append("no results")
    ok = not problems and all(s == "PASS" for _, s, _ in results)
    return ok, lines + problems


def run(outdirs: list[Path], *, kdir=None, timeout: int = 600, log=print) -> dict:
    names = [_manifest(d)["module"] for d in outdirs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise KmlcError(f"two models build the module {', '.join(twice)}; one kernel loads a "
                        "module name once (compile with distinct --name)")
    k = find_kdir(kdir)
    release = release_of(k)
    image = kernel_image(release)
    scenarios = [model_scenario(d, kdir=k) for d in outdirs]
    modules = debian_modules(image, scenarios)
    init = init_script(scenarios, [m for m, _ in modules])
    out = boot(build_initramfs(image, scenarios, init, modules), image, timeout=timeout, log=log)
    ok, lines = check(out)
    for ln in lines:
        log(f"kmlc qemu-test: {ln}")
    return {"ok": ok, "lines": lines, "log": out}
