"""``--hooks readahead``: KML's readahead, set per open file by the model.

The kernel side is ``runtime-kernel/kml_ra.c`` (probes through ftrace on
page_cache_sync_ra, page_cache_async_ra, filemap_fault and locks_remove_file;
a set-associative table of files; the trace events of ``kml_ra_trace.h``); the twin's replay
is ``runtime-user/kml_ra_twin.c``.  docs/hooks.md describes the behaviour.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import KmlcError
from .base import ClassHook, Param, arch_need, Replay, lost_events, read_trace

if TYPE_CHECKING:
    from ..targets.kernels import Loops

# KML's four classes, in the order of the model's outputs.
CLASSES = ("readrandom", "readrandomwriterandom", "readseq", "readreverse")
# KML's readahead per class: 16, 16, 640 and 960 sectors of 512 bytes, in 4 KiB pages.
RA_PAGES = (2, 2, 80, 120)
FEATURES = 5
NEW, CLOSES, FAULT = 1, 2, 4          # kml_features.h: KML_RA_NEW, _CLOSES, _FAULT
CAPACITY = 64 * 16                    # kml_ra.c: KML_RA_SETS x KML_RA_WAYS


class Readahead(ClassHook):
    name = "readahead"
    stem = "ra"
    features = FEATURES
    what = f"KML's {FEATURES} features"
    # A window's cost is its time per page consumed.  Where the model wins
    # (mmap, random reads) it wins by 30-150%, where it loses (pread) by
    # 1-2%, and each window it decides badly costs a whole window: so a
    # short trial (8 samples an arm, a period) and one window in 16, not 8,
    # to the control once trusted (examples/readahead/guards.py, README
    # "Guarded and unguarded").
    benefit = {"benefit_every": 16, "benefit_samples": 8}
    float_frac = "KML_RA_FLOAT_FRAC"
    params = {
        "window_events": Param(64, 2, 1024, "misses per window"),
        "window_ms": Param(1000, 1, 60000, "longest window in ms"),
        "ra_pages": Param(RA_PAGES, 0, 8192, "readahead in pages per class"),
    }
    kconfig = [arch_need("readahead"),
               ("DYNAMIC_FTRACE_WITH_REGS", "the readahead hook (probes through ftrace)"),
               ("FILE_LOCKING", "the readahead hook (locks_remove_file())")]

    # ---- trace and replay -------------------------------------------------------------

    def parse(self, text: str) -> dict:
        """A trace's readahead events: ``rows`` {file, index, ra_pages,
        flags}, each file's misses together in their order (what
        kml_twin_replay takes), ``seq`` their sequence numbers, and the
        module's decisions {file, seq, class, ra_pages}."""
        ev = read_trace(text, self.trace_events(),
                        {"kml_ra_miss": 5 + FEATURES, "kml_ra_decision": 4})
        miss, dec = ev["kml_ra_miss"], ev["kml_ra_decision"]
        order = np.lexsort((miss[:, 1], miss[:, 0])) if len(miss) else np.zeros(0, int)
        miss = miss[order]
        return {"rows": miss[:, [0, 2, 3, 4]], "seq": miss[:, 1], "features": miss[:, 5:],
                "decisions": dec, "lost": lost_events(text)}

    def replay(self, twin, text: str) -> Replay:
        """The module's trace replayed through the twin: the features of
        every window the module closed, and the class of every window it
        decided, beside the twin's."""
        t = self.parse(text)
        rows = t["rows"]
        closes = (rows[:, 3] & CLOSES) != 0
        tf, tc = twin.replay(rows)
        # the module's decisions, matched to the windows by (file, seq of the closing miss)
        keys = {(int(f), int(s)): i for i, (f, s) in
                enumerate(zip(rows[closes, 0], t["seq"][closes]))}
        decided = [keys.get((int(f), int(s)), -1) for f, s, _, _ in t["decisions"]]
        if -1 in decided:
            raise KmlcError("the trace has a decision for a window it has no miss for")
        idx = np.array(decided, dtype=int)
        return Replay(t["features"][closes], tf, t["decisions"][:, 2].astype(np.int32),
                      tc[idx], rows, t)

    def replay_rows(self, twin, rows) -> tuple[np.ndarray, np.ndarray]:
        """Rows {file, page index, ra_pages, flags} through the twin: the
        features and class of each window a row closes (flag 2)."""
        ev = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1, 4)
        closes = (ev[:, 3] & CLOSES) != 0
        order = np.argsort(ev[:, 0], kind="stable")  # each file's misses together, in order
        n = int(closes.sum())
        f, c = twin.call_replay(ev[order], n, FEATURES, n, 1)
        back = np.argsort(order[closes[order]], kind="stable")  # windows in row order
        return f[back], c[back]

    # ---- qemu -------------------------------------------------------------------------

    # the scenario's steps, each a KMLC-RESULT <module>-<step> line
    steps = ("params", "events", "table", "shadow", "restore", "fadvise", "reload-cycles",
             "replay-reads", "replay-multi", "files")
    needs = ["null_blk"]
    tools = ["kml_reader"]

    def setup(self, module: str) -> str:
        """A scratch disk for a user's script: $KML_DISK."""
        return SETUP

    def scenario(self, module: str, ko: str, loops: Loops) -> str:
        return SCENARIO.format(module=module, ko=ko, cycles=loops.cycles,
                               seq=loops.scaled(4096, 1024), rand=loops.scaled(1024, 256),
                               each=loops.scaled(40, 16), phase=loops.scaled(4096, 1024))

    load = ("dd if=$KML_DISK of=/dev/null bs=128k count=32 2>/dev/null; "
            "echo 1 > /proc/sys/vm/drop_caches")

    def about(self, module: str, tag: str, rep: Replay) -> list[str]:
        dec = rep.info["decisions"]            # file, seq, class, ra_pages set
        files, decided = np.unique(rep.rows[:, 0]), np.unique(dec[:, 0])
        if tag == "multi":
            ok = len(files) >= 256 and len(decided) >= 256
            return [f"{module}-files {'PASS' if ok else 'FAIL'} {len(files)} files read at once, "
                    f"{len(decided)} with a decision"]
        last = {int(f): int(r) for f, _, _, r in dec}
        return [f"{module}-policy INFO last readahead per file: " + ", ".join(
            f"file {f}: {r} pages" for f, r in sorted(last.items()))] if last else []


SETUP = r"""
C=/sys/kernel/config/nullb
mkdir $C/kmlrs; echo 256 > $C/kmlrs/size; echo 1 > $C/kmlrs/memory_backed
echo 1 > $C/kmlrs/power; echo none > /sys/block/kmlrs/queue/scheduler
export KML_DISK=/dev/kmlrs
"""

SCENARIO = r"""
M={module}
P=/sys/module/$M/parameters
D=/sys/kernel/debug/$M
C=/sys/kernel/config/nullb
stat_of() {{ awk -v k=$1 '$1 == k {{print $2}}' $D/stats; }}
ios() {{ awk '{{print $1}}' /sys/block/$1/stat; }}
# kmlr0..3: 16 MiB of the same random bytes (memory-backed), read and
# checksummed; the others: I/O counts only (reads return no stored data)
DISKS="kmlr0 kmlr1 kmlr2 kmlr3 kmlr4 kmlr5 kmlr6 kmlr7 kmlr8 kmlr9 kmlr10 kmlr11"
for d in $DISKS; do
    mkdir $C/$d; echo 512 > $C/$d/size; echo 1024 > $C/$d/max_sectors
    case $d in kmlr[0-3]) echo 16 > $C/$d/size; echo 1 > $C/$d/memory_backed ;; esac
    echo 1 > $C/$d/power; echo none > /sys/block/$d/queue/scheduler
done
dd if=/dev/urandom of=/tmp/rdata bs=1M count=16 2>/dev/null
for d in kmlr0 kmlr1 kmlr2 kmlr3; do dd if=/tmp/rdata of=/dev/$d bs=1M oflag=direct 2>/dev/null; done
rm /tmp/rdata
echo 3 > /proc/sys/vm/drop_caches

# events flow: reads and faults, sequential and random, every byte
# checksummed; the trace replays (host)
echo 16 > $P/window_events
kml_trace_on $M
bad=0
seq_sum=$(kml_reader seq /dev/kmlr0 4096 {seq})
rand_sum=$(kml_reader rand /dev/kmlr1 4096 {rand} 7)
echo 3 > /proc/sys/vm/drop_caches
[ "$(kml_reader mseq /dev/kmlr2 4096 {seq})" = "$seq_sum" ] || bad=$((bad + 1))
[ "$(kml_reader mrand /dev/kmlr3 4096 {rand} 7)" = "$rand_sum" ] || bad=$((bad + 1))
[ "$(kml_reader seq /dev/kmlr2 4096 {seq})" = "$seq_sum" ] || bad=$((bad + 1))
kml_trace_dump $M reads
cat $D/stats
misses=$(stat_of misses); faults=$(stat_of faults); windows=$(stat_of windows)
mode=$(stat -c %a $D/stats $D/files | sort -u)
if [ $bad -eq 0 ] && [ "$misses" -gt 0 ] && [ "$faults" -gt 0 ] && [ "$windows" -gt 0 ] &&
   [ "$mode" = 400 ]; then
    kml_result $M-events PASS "$misses misses, $faults faults, $windows windows; debugfs 0400"
else
    kml_result $M-events FAIL "misses=$misses faults=$faults windows=$windows sums_differ=$bad debugfs $mode"
fi

# 256 files read at once: each gets windows and decisions, none evicted
echo 2 > $P/window_events
kml_trace_on $M
ev0=$(stat_of evictions)
rm -f /tmp/hold /tmp/multi
kml_reader multi /dev/kmlr4 256 64 {each} /tmp/hold > /tmp/multi &
while [ ! -s /tmp/multi ]; do sleep 0.1; done
sleep 1
decided=$(awk '$3 >= 0' $D/files | wc -l)
tracked=$(stat_of tracked)
touch /tmp/hold; wait
kml_trace_dump $M multi
ev=$(( $(stat_of evictions) - ev0 ))
if [ "$decided" -ge 256 ] && [ "$ev" -eq 0 ]; then
    kml_result $M-table PASS "$tracked files tracked, $decided with a decision, $ev evicted"
else
    kml_result $M-table FAIL "$tracked files tracked, $decided with a decision, $ev evicted"
fi

# shadow mode, switched on at run time: every window is decided (and
# traced) but no file's readahead changes; the guards' parameters refuse
# values out of range
echo 1 > $P/guard_shadow
ch0=$(stat_of changes); sh0=$(stat_of guard_shadow); win0=$(stat_of windows)
kml_reader seq /dev/kmlr11 8192 4096 > /dev/null; sleep 0.3
ch=$(( $(stat_of changes) - ch0 )); sh=$(( $(stat_of guard_shadow) - sh0 ))
win=$(( $(stat_of windows) - win0 ))
echo 0 > $P/guard_shadow
if [ "$win" -gt 0 ] && [ "$sh" -gt 0 ] && [ "$ch" -eq 0 ]; then
    kml_result $M-shadow PASS "$win windows, $sh decided in shadow mode, $ch readahead changes"
else
    kml_result $M-shadow FAIL "windows=$win shadow=$sh changes=$ch"
fi

# detaching and unloading give each file its own readahead back: read I/Os
# for {phase} sequential pages with the hook's 4 pages, then with the
# kernel's 32.  Each phase starts a new stream at a far offset (a stream's
# window does not shrink in Debian's 6.1: ondemand_readahead() keeps
# max(size, next size)), after a first phase that gets the file its
# decision (a float model's comes from a work item).
# The guards off (at run time): the step compares the model's readahead
# with the kernel's, decision by decision.
for g in benefit_every rate_ms envelope_pct; do echo 0 > $P/guard_$g; done
echo 4,4,4,4 > $P/ra_pages
phases() {{ rm -rf /tmp/ph; mkdir -p /tmp/ph
    kml_reader phases /dev/$1 {phase} 3 /tmp/ph > /dev/null & }}
phase() {{ a=$(ios $1); touch /tmp/ph/go.$2
    while [ ! -f /tmp/ph/done.$2 ]; do sleep 0.05; done; echo $(( $(ios $1) - a )); }}
phases kmlr5
phase kmlr5 0 > /dev/null; sleep 0.5
a0=$(phase kmlr5 1)
echo 0 > $P/enabled
a1=$(phase kmlr5 2)
wait
echo 1 > $P/enabled
phases kmlr6
phase kmlr6 0 > /dev/null; sleep 0.5
u0=$(phase kmlr6 1)
rmmod $M
u1=$(phase kmlr6 2)
wait
insmod /lib/kmlc/{ko}
if [ $((a1 * 2)) -lt "$a0" ] && [ $((u1 * 2)) -lt "$u0" ]; then
    kml_result $M-restore PASS "read I/Os: attached $a0, detached $a1; attached $u0, unloaded $u1"
else
    kml_result $M-restore FAIL "read I/Os: attached $a0, detached $a1; attached $u0, unloaded $u1"
fi

# explicit choices are left alone: POSIX_FADV_SEQUENTIAL reads with the
# same I/Os whether the hook is attached or not; POSIX_FADV_RANDOM files
# are hands off
echo 4,4,4,4 > $P/ra_pages; echo 2 > $P/window_events
echo 0 > $P/enabled; a=$(ios kmlr7)
KML_FADVISE=sequential kml_reader seq /dev/kmlr7 2048 2048 > /dev/null
off=$(( $(ios kmlr7) - a ))
echo 1 > $P/enabled; echo 3 > /proc/sys/vm/drop_caches; a=$(ios kmlr7)
KML_FADVISE=sequential kml_reader seq /dev/kmlr7 2048 2048 > /dev/null
on=$(( $(ios kmlr7) - a ))
rm -f /tmp/hold /tmp/multi
KML_FADVISE=random kml_reader multi /dev/kmlr8 2 512 64 /tmp/hold > /tmp/multi &
while [ ! -s /tmp/multi ]; do sleep 0.1; done
hands=$(awk '$7 == 1' $D/files | wc -l)
touch /tmp/hold; wait
if [ "$on" -le $((off + off / 4 + 2)) ] && [ "$hands" -ge 2 ]; then
    kml_result $M-fadvise PASS "sequential: $on read I/Os attached, $off detached; $hands random files hands off"
else
    kml_result $M-fadvise FAIL "sequential: $on read I/Os attached, $off detached; $hands random files hands off"
fi
rmmod $M; insmod /lib/kmlc/{ko}

# unload and reload {cycles} times while two readers keep missing (and
# end without an error); they stop when the cycles do
rm -f /tmp/stop
export KML_UNTIL=/tmp/stop
( kml_reader rand /dev/kmlr9 65536 200000 3 > /dev/null || echo rand >> /tmp/bgbad ) &
( kml_reader seq /dev/kmlr10 65536 400000 > /dev/null || echo seq >> /tmp/bgbad ) &
unset KML_UNTIL
before=$(kml_held)
bad=0
for c in $(seq {cycles}); do
    rmmod $M || bad=$((bad + 1))
    insmod /lib/kmlc/{ko} window_events=16 || bad=$((bad + 1))
done
touch /tmp/stop
wait
after=$(kml_held)
[ -f /tmp/bgbad ] && bad=$((bad + $(wc -l < /tmp/bgbad)))
if [ $bad -eq 0 ] && [ $((after - before)) -lt $KML_LEAK_KB ]; then
    kml_result $M-reload-cycles PASS "{cycles} cycles under load, held $before -> $after kB"
else
    kml_result $M-reload-cycles FAIL "errors=$bad held $before -> $after kB"
fi
for d in $DISKS; do echo 0 > $C/$d/power; rmdir $C/$d; done
"""

HOOK = Readahead()
