"""Real-kernel tests: boot a kernel in qemu, load kmlc modules, run their hooks.

``kmlc qemu-test OUTDIR... [--kernel 6.1|6.12|rt|debug] [--arch arm64]
[--script FILE]`` builds each model's module against the kernel's build
directory (``kernels.py`` says where each kernel comes from), packs a
busybox initramfs and boots it in qemu (TCG: no KVM needed) with
``-nographic``: qemu-system-x86_64, or for arm64 qemu-system-aarch64 with
Debian's arm64 kernel, busybox and modules and helpers built with
aarch64-linux-gnu-gcc.
The initramfs's ``/init`` loads each module (its self-test runs the golden
vectors through the real module), then runs, for each model with a hook,
the hook's own scenario (``kmlc.hooks``) or, with ``--script``, the user's
script in the environment the hook's setup prepares, and powers off.

The verdict judges the hook, not the model's policy: a run passes when
every module loads and passes its self-test, every scenario step passes
(events flow, data checksums, parameters, restore, reload cycles; a
user's script exits 0), the module's trace replayed through the twin
gives its features and decisions bit for bit, and the kernel log has no
warning, BUG, oops, lockdep, KASAN, UBSAN or KFENCE report.  What a
policy did (readahead per file, rsize per mount) is printed as INFO.
"""
from __future__ import annotations

import gzip
import os
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import KmlcError
from ..hooks.guard import PARAMS as GUARD_PARAMS
from .kernel import CROSS, build_module, sign_module
from .kernels import Kernel, Loops, resolve, signing_key
from .kunit import cache_dir, locked
from .user import read_manifest

TOOLS = Path(__file__).resolve().parent / "qemu_tools"
# A scenario's Debian modules are found by name in the image's modules.order
# (every module the kernel builds, by path), and loaded after the modules
# each depends on (its own "depends=", what depmod writes into
# modules.dep), read from the image: so the order follows the kernel and
# the architecture (6.1's nfs.ko needs fscache.ko, 6.12's does not; arm64's
# dm-mod.ko needs dax.ko, which x86-64 builds in).  A module the kernel has
# built in (modules.builtin) needs no insmod.
MODULE_ARGS = {"null_blk": "nr_devices=0"}
BAD_LOG = re.compile(r"\b(WARNING:|BUG:|Oops|general protection fault|Call Trace:|"
                     r"kernel BUG|UBSAN:|KASAN:|KFENCE:|memory leak|"
                     r"possible (circular|recursive) locking|inconsistent lock state|"
                     r"INFO: (task|rcu|lockdep)|sleeping function called from invalid|"
                     r"scheduling while atomic|refcount_t:)")
RESULT = re.compile(r"^KMLC-RESULT (\S+) (PASS|FAIL|INFO)\s*(.*)$", re.M)
TRACE = re.compile(r"^KMLC-TRACE-BEGIN (\S+) (\S+)\n(.*?)^KMLC-TRACE-END", re.S | re.M)


@dataclass
class Scenario:
    """What one model contributes to the boot: its module, the Debian
    modules it needs, extra files and the shell commands that test it."""
    name: str
    ko: Path
    needs: list[str] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)   # initramfs path -> host path
    script: str = ""
    outdir: Path | None = None
    hook: object = None                                    # its kmlc.hooks owner, if any
    swaps: bool = False                                    # it runs the swap scenario


def tool(name: str, arch: str = "x86_64") -> Path:
    """A static helper binary for the initramfs of an ``arch`` guest, built
    once and cached (arm64: with aarch64-linux-gnu-gcc and its libc)."""
    src = TOOLS / f"{name}.c"
    tools = cache_dir() / "qemu" / "tools"
    out = tools / name if arch == "x86_64" else tools / arch / name
    cc, libc = ("gcc", "libc6-dev") if arch not in CROSS else \
        (CROSS[arch] + "gcc", "gcc-aarch64-linux-gnu and libc6-dev-arm64-cross")
    with locked("qemu-tools"):
        if not out.is_file() or out.stat().st_mtime < src.stat().st_mtime:
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                res = subprocess.run([cc, "-static", "-O2", "-Wall", "-o", str(out), str(src)],
                                     capture_output=True, text=True)
            except FileNotFoundError:
                raise KmlcError(f"{cc} is not installed (install {libc}; the README's setup "
                                "does)") from None
            if res.returncode:
                raise KmlcError(f"cannot build {name} statically (install {libc}): "
                                + res.stderr.strip()[-500:])
    return out


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


def _modroot(root: Path) -> Path:
    return next((root / "image" / "lib" / "modules").iterdir())


def _canon(module: str) -> str:
    return module.replace("-", "_")          # depends= spells dm-mod dm_mod


def debian_modules(root: Path, scenarios: list[Scenario]) -> list[tuple[str, bytes]]:
    """The modules the scenarios need from the kernel's image, each after
    the modules it depends on, with their contents; modules the kernel has
    built in are left out."""
    modroot = _modroot(root)

    def names(f: str) -> dict[str, str]:
        listed = modroot / f
        paths = listed.read_text().split() if listed.is_file() else []
        return {_canon(Path(p).name.split(".ko")[0]): p for p in paths}

    builtin, paths = names("modules.builtin"), names("modules.order")
    order: list[tuple[str, bytes]] = []
    seen: set[str] = set()          # canonical names: visited, or built in

    def visit(m: str) -> None:
        c = _canon(m)
        if c in seen or c in builtin:
            return
        if c not in paths:
            raise KmlcError(f"the {root.name} kernel has no module '{m}' (not in its "
                            "modules.order) and does not build it in", where=str(modroot))
        seen.add(c)
        data = debian_module(modroot / paths[c])
        info = re.search(rb"\0depends=([^\0]*)\0", data)
        for dep in (info.group(1).decode().split(",") if info else []):
            if dep:
                visit(dep)
        order.append((Path(paths[c]).name.split(".ko")[0], data))

    for sc in scenarios:
        for m in sc.needs:
            visit(m)
    return order


def debian_module(path: Path) -> bytes:
    """A module of the kernel's image, uncompressed (6.12 ships .ko.xz)."""
    import lzma

    if path.is_file():
        return path.read_bytes()
    for suffix, opener in ((".xz", lzma.open), (".gz", gzip.open)):
        packed = path.with_name(path.name + suffix)
        if packed.is_file():
            with opener(packed) as f:
                return f.read()
    raise KmlcError(f"the kernel image has no {path.name}", where=str(path.parent))


APPLETS = ("sh", "mount", "insmod", "rmmod", "cat", "echo", "dmesg", "poweroff", "sleep", "ls",
           "grep", "md5sum", "dd", "mkdir", "seq", "awk", "wc", "head", "tail", "sync", "uname",
           "expr", "test", "[", "dirname", "cut", "cmp", "sort", "stat", "umount", "ifconfig",
           "printf", "tr", "sed", "rmdir", "rm", "touch", "cp", "mv", "true", "false", "env",
           "reboot", "fstrim",
           "kill", "mkfifo", "od", "hexdump", "xargs", "uniq", "date", "blockdev", "fsync",
           "truncate", "ln", "find", "gunzip", "zcat", "gzip", "base64", "readlink", "basename")


def build_initramfs(root: Path, scenarios: list[Scenario], init: str,
                    modules: list[tuple[str, bytes]]) -> bytes:
    busybox = (root / "busybox" / "bin" / "busybox").read_bytes()
    entries: list[tuple[str, bytes | None, int]] = []
    for d in ("bin", "dev", "proc", "sys", "tmp", "mnt", "lib", "lib/kmlc", "lib/debian",
              "sys/kernel", "sys/kernel/debug", "sys/kernel/config", "sys/kernel/tracing"):
        entries.append((d, None, stat.S_IFDIR | 0o755))
    entries.append(("bin/busybox", busybox, stat.S_IFREG | 0o755))
    for applet in APPLETS:
        entries.append((f"bin/{applet}", b"busybox", stat.S_IFLNK | 0o777))
    for m, data in modules:
        entries.append((f"lib/debian/{m}.ko", data, stat.S_IFREG | 0o644))
    seen = {e[0] for e in entries}
    for sc in scenarios:
        entries.append((f"lib/kmlc/{sc.ko.name}", sc.ko.read_bytes(), stat.S_IFREG | 0o644))
        for dest, src in sc.files.items():
            parents = list(Path(dest).parents)[-2::-1]      # its directories, outermost first
            for d in [str(p) for p in parents] + [dest]:
                if d not in seen:
                    seen.add(d)
                    entries.append((d, Path(src).read_bytes(), stat.S_IFREG | 0o755)
                                   if d == dest else (d, None, stat.S_IFDIR | 0o755))
    entries.append(("init", init.encode(), stat.S_IFREG | 0o755))
    return gzip.compress(_cpio_newc(entries), compresslevel=1)


# Shell helpers every scenario and user script may use.
HELPERS = r"""
# kB a leak would hold: unreclaimable slab and vmalloc, caches dropped
kml_held() { echo 3 > /proc/sys/vm/drop_caches
    awk '/^(SUnreclaim|VmallocUsed):/ { s += $2 } END { print s }' /proc/meminfo; }
# kml_result NAME PASS|FAIL|INFO DETAIL
kml_result() { echo "KMLC-RESULT $1 $2 $3"; echo "KMLC-TIME $(cut -d" " -f1 /proc/uptime) $1"; }
T=/sys/kernel/tracing
# kml_trace_on SYSTEM: record the events of SYSTEM (a module's, kml_<name>) from now
kml_trace_on() { [ -d $T/events ] || mount -t tracefs nodev $T
    echo 0 > $T/tracing_on; echo 16384 > $T/buffer_size_kb; echo global > $T/trace_clock
    echo > $T/trace; echo 1 > $T/events/$1/enable; echo 1 > $T/tracing_on; }
# kml_trace_dump SYSTEM TAG: print what was recorded (gzip, base64: replayed by kmlc on
# the host), and stop
kml_trace_dump() { echo 0 > $T/events/$1/enable; echo "KMLC-TRACE-BEGIN $1 $2"
    gzip -c $T/trace | base64; echo KMLC-TRACE-END; echo > $T/trace; }
# kml_rejects M PARAM VALUE...: each write fails and leaves the parameter as it was
kml_rejects() { m=$1; p=$2; shift 2; was=$(cat /sys/module/$m/parameters/$p)
    for v in "$@"; do
        if echo "$v" > /sys/module/$m/parameters/$p 2>/dev/null; then
            echo "$p=$v accepted"; fi
        [ "$(cat /sys/module/$m/parameters/$p)" = "$was" ] || echo "$p=$v changed it"
    done; }
"""


def init_script(scenarios: list[Scenario], needed: list[str], debug: bool = False) -> str:
    """/init: mount the pseudo filesystems, load the kernel's modules in
    ``needed`` order, run every scenario, dump the kernel log, power off.
    Reload cycles may leave 1 MB held (20 KB a cycle); on the debug kernel
    16 MB, since KASAN's quarantine keeps freed objects for a while."""
    lines = ["#!/bin/sh", "mount -t proc proc /proc", "mount -t sysfs sysfs /sys",
             "mount -t devtmpfs dev /dev", "mount -t debugfs debugfs /sys/kernel/debug",
             'echo "KMLC-BOOTED $(uname -r)"', HELPERS.strip(),
             f"KML_LEAK_KB={16384 if debug else 1024}"]
    for m in needed:
        args = MODULE_ARGS.get(m, "")
        lines.append(f"insmod /lib/debian/{m}.ko {args} || echo 'KMLC-RESULT {m} FAIL insmod'")
        if m == "configfs":
            lines.append("mount -t configfs none /sys/kernel/config")
    if "configfs" not in needed:
        lines.append("mount -t configfs none /sys/kernel/config 2>/dev/null")
    for sc in scenarios:
        lines += [f"# ---- {sc.name}", sc.script.strip()]
    lines += ["dmesg > /tmp/dmesg", "echo KMLC-DMESG-BEGIN", "cat /tmp/dmesg",
              "echo KMLC-DMESG-END", "echo KMLC-DONE",
              "reboot -f  # qemu -no-reboot exits: no ACPI needed"]
    return "\n".join(lines) + "\n"


def module_for(outdir: Path, kernel: Kernel, ko: Path | None = None) -> Path:
    """The model's module for ``kernel``: ``ko`` as built elsewhere (by
    DKMS, say), which must be built for this kernel's release, or else
    OUTDIR/kernel built against the kernel's build directory, and signed
    with its key if the kernel loads only signed modules."""
    if ko is not None:
        ko = Path(ko)
        if not ko.is_file():
            raise KmlcError("no such module", where=str(ko))
        m = re.search(rb"\0vermagic=([^ \0]+)", b"\0" + ko.read_bytes())
        if not m or m.group(1).decode() != kernel.release:
            built = m.group(1).decode() if m else "no vermagic"
            raise KmlcError(f"built for {built}, not for the {kernel.name} kernel "
                            f"({kernel.release})", where=str(ko))
        return ko
    ko = build_module(Path(outdir) / "kernel", kdir=kernel.kdir, arch=kernel.arch)
    key = signing_key(kernel.kdir)
    if key is not None:
        sign_module(ko, *key, kernel.kdir)
    return ko


def model_scenario(outdir: Path, kernel: Kernel, script: Path | None = None,
                   sets: list[bytes] | None = None, scratch: Path | None = None,
                   ko: Path | None = None, *, loops: Loops) -> Scenario:
    """Load the model's module (its self-test runs), run its hook's
    scenario or the user's script, swap in the weight sets ``sets`` (if
    any), unload it.  ``ko``: a module built elsewhere (``module_for``);
    ``loops``: the scenario's iteration counts."""
    from ..hooks import owner

    meta = read_manifest(Path(outdir))
    mod = meta["module"]
    ko = module_for(outdir, kernel, ko)
    hooks = meta.get("hooks", [])
    hook = owner(hooks[0]) if hooks else None
    needs: list[str] = []
    files: dict[str, Path] = {}
    body = ""
    if hook is not None:
        needs += hook.needs
        files.update({f"bin/{t}": tool(t, kernel.arch) for t in hook.tools})
        files.update(hook.files())
        if "kml_dmsetup" in hook.tools:
            files["bin/dmsetup"] = tool("kml_dmsetup", kernel.arch)
        if script is None:
            body = param_checks(mod, hook) + hook.scenario(mod, ko.name, loops)
    if script is not None:
        files["lib/kmlc/user-script.sh"] = Path(script)
        setup = hook.setup(mod) if hook is not None else ""
        teardown = hook.teardown(mod) if hook is not None else ""
        body = f"""
( export KML_MODULE={mod}
{setup.strip()}
sh /lib/kmlc/user-script.sh ); rc=$?
{teardown.strip()}
[ $rc -eq 0 ] && kml_result {mod}-script PASS "exit 0" || kml_result {mod}-script FAIL "exit $rc"
"""
    if sets:
        files.update(swap_files(Path(outdir), sets, scratch / mod))
        body += swap_scenario(mod, hook, len(sets), loops.swaps)
    text = f"""
if insmod /lib/kmlc/{ko.name}; then
    if dmesg | grep -q "{mod}: selftest: .* bit-identical"; then
        echo "KMLC-RESULT {mod} PASS $(dmesg | grep '{mod}: selftest' | tail -1)"
    else
        echo "KMLC-RESULT {mod} FAIL no selftest line"
    fi
{body}
    rmmod {mod} || echo "KMLC-RESULT {mod}-unload FAIL rmmod"
else
    echo "KMLC-RESULT {mod} FAIL insmod (selftest or symbol error: see dmesg)"
fi"""
    return Scenario(mod, ko, needs=needs, files=files, script=text, outdir=Path(outdir),
                    hook=hook, swaps=bool(sets))



def swap_files(outdir: Path, blobs: list[bytes], into: Path) -> dict[str, Path]:
    """The initramfs files of a swap scenario for the model in ``outdir``:
    each blob (``set<k>.kmlw``), what the module must then say of it
    (``expect<k>``: its version; ``gold<k>``: the twin's outputs on the
    self-test's inputs with that set, as debugfs "goldens" prints them), and
    forgeries made from the first: one byte corrupted, one byte short."""
    from .user import Twin

    meta = read_manifest(Path(outdir))
    mod = meta["module"]
    twin = Twin(outdir)
    rows = [ln.split() for ln in (outdir / "kernel" / "selftest_inputs.txt").read_text()
            .splitlines()]
    x = np.array([[int(v, 16) for v in r] for r in rows], dtype=f"u{twin.in_dtype.itemsize}")
    x = x.view(twin.in_dtype)
    files = {}
    into.mkdir(parents=True, exist_ok=True)
    for k, blob in enumerate(blobs):
        twin.load_weights(blob)
        y = twin.run_raw(x)
        bits = np.ascontiguousarray(y).view(f"u{y.dtype.itemsize}").reshape(len(x), -1)
        text = "".join("".join(f"{int(b):x} " for b in row) + f"{int(n)}\n"
                       for row, n in zip(bits, twin.last_saturations))
        (into / f"set{k}.kmlw").write_bytes(blob)
        (into / f"expect{k}").write_text(f"{twin.weights_version}\n")
        (into / f"gold{k}").write_text(text)
        for f in (f"set{k}.kmlw", f"expect{k}", f"gold{k}"):
            files[f"lib/kmlc/{mod}/{f}"] = into / f
    bad = bytearray(blobs[0])
    bad[len(bad) // 2] ^= 0x20
    (into / "corrupt.kmlw").write_bytes(bytes(bad))
    (into / "short.kmlw").write_bytes(blobs[0][:-1])
    files[f"lib/kmlc/{mod}/corrupt.kmlw"] = into / "corrupt.kmlw"
    files[f"lib/kmlc/{mod}/short.kmlw"] = into / "short.kmlw"
    return files


def swap_scenario(module: str, hook, sets: int, swaps: int) -> str:
    """Shell: ``swaps`` swaps cycling through the ``sets`` weight sets (while
    the hook's load runs, for a model with a hook), each followed by the
    module's version and its golden outputs on the new set, which must be
    the twin's; then a corrupted and a truncated blob, each refused with the
    running set kept; then rollback, once."""
    setup = hook.setup(module) + hook.load_start() if hook is not None else ""
    stop = hook.load_stop() + hook.teardown(module) if hook is not None else ""
    count = hook.inferences(module) if hook is not None else "echo 0"
    return f"""
( M={module}; S=/sys/module/$M; L=/lib/kmlc/$M; G=/sys/kernel/debug/$M/goldens
{setup.strip()}
before=$({count})
# is set $1 the running one: its version, and its golden outputs the twin's?
# (read and test are the shell's own: two programs a swap, which the debug
# kernel under TCG takes a good part of a second to start)
running() {{ read v < $L/expect$1; read got < $S/weights_version
    [ "$got" = "$v" ] && cmp -s $G $L/gold$1; }}
fail=""; i=0
while [ $i -lt {swaps} ]; do
    k=$((i % {sets}))
    cat $L/set$k.kmlw > $S/weights || fail="$fail swap$i"
    running $k || fail="$fail set$i"
    i=$((i + 1))
done
for f in corrupt short; do
    cat $L/$f.kmlw > $S/weights 2>/dev/null && fail="$fail $f-taken"
    running $k || fail="$fail $f-moved"
done
dmesg | grep -q "$M: weights refused: checksum" || fail="$fail no-checksum-line"
dmesg | grep -q "$M: weights refused: .* bytes (truncated" || fail="$fail no-truncated-line"
echo 1 > $S/rollback || fail="$fail rollback"
running $(( ({swaps} - 2) % {sets} )) || fail="$fail rollback-set"
echo 1 > $S/rollback 2>/dev/null && fail="$fail second-rollback"
after=$({count})
{stop.strip()}
mode=$(stat -c %a $S/weights $S/weights_version $S/rollback | tr '\n' ' ')
[ "$mode" = "200 444 200 " ] || fail="$fail modes:$mode"
if [ -z "$fail" ]; then
    kml_result $M-swap PASS "{swaps} swaps over {sets} sets, each version's golden outputs \
the twin's; corrupted and truncated blobs refused; rollback; $((after - before)) inferences \
meanwhile"
else
    kml_result $M-swap FAIL "$(echo $fail | cut -c1-300)"
fi
[ {1 if hook is not None else 0} -eq 0 ] || [ $((after - before)) -gt 0 ] ||
    kml_result $M-swap-load FAIL "the hook ran no inference during the swaps" )
"""


def param_checks(module: str, hook) -> str:
    """Shell: every out-of-range write to each of the hook's parameters
    fails with -EINVAL and changes nothing."""
    calls = [f"kml_rejects {module} enabled 2 x"]
    for name, p in hook.params.items():
        if isinstance(p.default, bool):
            bad = ["2", "x"]
        elif isinstance(p.default, tuple):
            n = len(p.default)
            ok = ",".join([str(p.lo)] * n)
            bad = [",".join([str(p.lo)] * (n - 1)), ok + f",{p.lo}",
                   ",".join([str(p.hi + 1)] + [str(p.lo)] * (n - 1)), ",".join(["x"] * n)]
        else:
            bad = ["x", "-1", str(p.hi + 1)] + ([str(p.lo - 1)] if p.lo > 0 else [])
        calls.append(f"kml_rejects {module} {name} " + " ".join(bad))
    for name, (_, lo, hi, zero) in GUARD_PARAMS.items():
        # guard_envelope_pct's top is 0 in a model without an envelope
        top = 100 if name == "envelope_pct" else hi
        low = [str(lo - 1)] if lo > 1 or (lo == 1 and not zero) else []
        calls.append(f"kml_rejects {module} guard_{name} x -1 {top + 1} " + " ".join(low))
    return f"""
bad=$( {"; ".join(calls)} )
[ -z "$bad" ] && kml_result {module}-params PASS "out-of-range writes refused" ||
    kml_result {module}-params FAIL "$(echo $bad)"
"""


# every instruction set TCG emulates (AVX2 included), without 5-level paging,
# whose page walks slow TCG down
MAX_CPU = "max,la57=off"


def qemu_cpu(kernel: Kernel) -> str:
    """Debian's 6.1 kernel gets every instruction set TCG emulates (AVX2
    included: the self-test and the hooks run each SIMD path of
    fixed-point models: ``MAX_CPU``); the other kernels keep qemu's default
    CPU (SSE2: the scalar and SSE2 paths), since the debug kernel's
    scenarios ran much longer on the larger CPU (docs/hooks.md)."""
    if kernel.arch == "arm64":
        return "cortex-a57"     # NEON; "max" adds pointer authentication, slow under TCG
    return MAX_CPU if kernel.name == "6.1" else "qemu64"


# Per arch: qemu, its package, machine options, the serial console.
QEMU = {"x86_64": ("qemu-system-x86_64", "qemu-system-x86", [], "ttyS0"),
        "arm64": ("qemu-system-aarch64", "qemu-system-arm", ["-machine", "virt"], "ttyAMA0")}


def boot(initramfs: bytes, kernel: Kernel, *, timeout: int = 600,
         log_path: Path | None = None, cpu: str | None = None) -> str:
    binary, package, machine, console = QEMU[kernel.arch]
    qemu = shutil.which(binary)
    if not qemu:
        raise KmlcError(f"{binary} is not installed (package {package}); the README's setup "
                        "installs it")
    with tempfile.TemporaryDirectory() as d:
        rd = Path(d) / "initramfs.gz"
        rd.write_bytes(initramfs)
        # noirqdebug: under PREEMPT_RT and TCG, the serial port's threaded
        # interrupt can lag behind long output, and the kernel would then
        # disable it as spurious ("irq 4: nobody cared")
        append = (f"console={console} panic=-1 oops=panic log_buf_len=4M noirqdebug loglevel="
                  + os.environ.get("KMLC_QEMU_LOGLEVEL", "4"))
        cmd = [qemu, *machine, "-m", kernel.memory, "-smp", os.environ.get("KMLC_QEMU_SMP", "2"),
               "-kernel", str(kernel.vmlinuz), "-initrd", str(rd), "-append", append,
               "-nographic", "-no-reboot", "-monitor", "none", "-accel", "tcg,thread=single",
               "-cpu", os.environ.get("KMLC_QEMU_CPU") or cpu or qemu_cpu(kernel)]
        # TCG only: /dev/kvm can exist where KVM does not work (nested VMs), and
        # a test that hangs is worse than one that takes 10 seconds more.
        try:
            res = subprocess.run(cmd, capture_output=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace").replace("\r", "")
            if log_path:
                Path(log_path).write_text(out)
            raise KmlcError(f"the qemu boot did not finish in {timeout} s; last output follows",
                            details=out[-2000:]) from None
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
    ok = not problems and all(s != "FAIL" for _, s, _ in results)
    return ok, lines + problems


def traces(log: str) -> dict[str, dict[str, str]]:
    """The trace dumps of a boot: {system: {tag: text}}."""
    import base64
    import binascii

    out: dict[str, dict[str, str]] = {}
    for m in TRACE.finditer(log):
        try:
            text = gzip.decompress(base64.b64decode("".join(m.group(3).split()))).decode()
        except (binascii.Error, OSError, EOFError):
            text = f"# the dump of {m.group(2)} did not arrive whole\n"
        out.setdefault(m.group(1), {})[m.group(2)] = text
    return out


def replay_verdicts(scenarios: list[Scenario], log: str) -> list[str]:
    """Each hook's verdicts on its module's trace dumps: replayed through
    the model's twin, the module's features and decisions bit for bit."""
    from .user import Twin

    dumps = traces(log)
    out = []
    for sc in scenarios:
        if sc.hook is None or sc.name not in dumps:
            continue
        if not (sc.outdir / "user").is_dir():
            out.append(f"{sc.name}-replay: INFO skipped: compiled without --target user")
            continue
        for ln in sc.hook.verdicts(sc.name, dumps[sc.name], Twin(sc.outdir)):
            name, status, detail = (ln.split(" ", 2) + ["", ""])[:3]
            out.append(f"{name}: {status} {detail}".rstrip())
    return out


def missing_steps(scenarios: list[Scenario], lines: list[str]) -> list[str]:
    """A line for each step of a hook's scenario that gave no result (the
    script stopped before it)."""
    seen = {ln.split(":", 1)[0] for ln in lines}
    out = []
    for sc in scenarios:
        steps = list(sc.hook.steps) if sc.hook is not None else []
        steps += ["swap"] if sc.swaps else []
        if steps:
            gone = [s for s in steps if f"{sc.name}-{s}" not in seen]
            if gone:
                out.append(f"{sc.name}: no result from " + ", ".join(gone))
    return out


def match_sets(outdirs: list[Path], weights: list[Path]) -> dict[Path, list[bytes]]:
    """Each ``.kmlw`` blob, by the model it was packed for (its structure
    hash, bytes 8..40); one that fits no model is an error."""
    by_hash = {read_manifest(Path(d)).get("structure_sha256"): Path(d) for d in outdirs}
    out: dict[Path, list[bytes]] = {}
    for w in weights:
        try:
            blob = Path(w).read_bytes()
        except OSError as e:
            raise KmlcError(f"cannot read the weight set: {e.strerror}", where=str(w)) from None
        d = by_hash.get(blob[8:40].hex())
        if d is None:
            raise KmlcError("a weight set for none of the models given (kmlc pack --like "
                            "OUTDIR makes one)", where=str(w))
        out.setdefault(d, []).append(blob)
    return out


def default_timeout(scenarios: list[Scenario], kernel: Kernel) -> int:
    """Seconds a boot may take unless --timeout says: a budget per
    scenario, from the slowest runs seen (a hook's scenario about 90 s of
    guest time on Debian's kernels under TCG, 300 s on the debug kernel;
    a self-test a few seconds), with room for a machine slower or busier
    by half again; at least 600 s (1,800 on the debug kernel).  A boot that
    hangs is still stopped, after about as long as a slow one would take."""
    per_hook, per_model, floor = (450, 60, 1800) if kernel.debug else (150, 20, 600)
    return max(floor, sum(per_hook + per_hook // 2 * sc.swaps if sc.hook else per_model
                          for sc in scenarios))


def run(outdirs: list[Path], *, kernel: str | None = None, kdir=None,
        script: Path | None = None, timeout: int | None = None, log=print,
        log_path: Path | None = None, weights: list[Path] = (),
        modules: dict[Path, Path] | None = None, files: dict[str, Path] | None = None,
        arch: str = "x86_64", cycles: int | None = None, swaps: int | None = None) -> dict:
    """Boot ``kernel`` with the models of ``outdirs`` and run their
    scenarios (or ``script``); ``modules``: {outdir: .ko} for models whose
    module was built elsewhere, not from OUTDIR/kernel; ``files``: {path in
    the guest: host file} for a script to use; ``cycles``, ``swaps``: the
    scenarios' reload cycles and weight swaps (``Kernel.loops`` by default)."""
    modules = {Path(d): Path(k) for d, k in (modules or {}).items()}
    names = [read_manifest(Path(d))["module"] for d in outdirs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise KmlcError(f"two models build the module {', '.join(twice)}; one kernel loads a "
                        "module name once (compile with distinct --name)")
    if script is not None and not Path(script).is_file():
        raise KmlcError("no such script", where=str(script))
    sets = match_sets(outdirs, weights)
    k = resolve(kernel, kdir, log=log, arch=arch)
    loops = k.loops._replace(cycles=cycles or k.loops.cycles, swaps=swaps or k.loops.swaps)
    with tempfile.TemporaryDirectory(prefix="kmlc-swap-") as scratch:
        scenarios = [model_scenario(d, k, script, sets.get(Path(d)), Path(scratch),
                                    modules.get(Path(d)), loops=loops) for d in outdirs]
        scenarios[0].files.update(files or {})
        modules = debian_modules(k.root, scenarios)
        init = init_script(scenarios, [m for m, _ in modules], debug=k.debug)
        initramfs = build_initramfs(k.root, scenarios, init, modules)
    out = boot(initramfs, k, timeout=timeout or default_timeout(scenarios, k), log_path=log_path)
    if log_path:
        Path(log_path).write_text(out)
    ok, lines = check(out)
    replayed = replay_verdicts(scenarios, out)
    n = len(RESULT.findall(out))
    lines = lines[:n] + replayed + lines[n:]
    missing = missing_steps(scenarios, lines) if script is None else []
    ok = ok and not missing and not any(": FAIL" in ln for ln in replayed)
    lines += missing
    for ln in lines:
        log(f"kmlc qemu-test: {ln}")
    return {"ok": ok, "lines": lines, "log": out, "kernel": k.name, "release": k.release,
            "loops": loops}
