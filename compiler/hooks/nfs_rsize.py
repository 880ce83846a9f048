"""``--hooks nfs-rsize``: KML's NFS read size, set per mount by the model.

The kernel side is ``runtime-kernel/kml_nfs.c`` (tracepoint probes; a table
of mounts; the trace events of ``kml_nfs_trace.h``); the twin's replay is
``runtime-user/kml_nfs_twin.c``.  docs/hooks.md describes the behaviour.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import KmlcError
from .base import ClassHook, Param, arch_need, Replay, lost_events, read_trace

if TYPE_CHECKING:
    from ..targets.kernels import Loops

FEATURES = 8
# KML's rsize per class (readrandom, readrandomwriterandom, readseq, readreverse), bytes.
RSIZE = (4096, 4096, 262144, 262144)
OPENS, CLOSES = 1, 2                  # kml_features.h: KML_NFS_OPENS, _CLOSES
DECISION = 4                          # the kind of a decision's replay row
# Replay rows, one per event or decision, each mount's in order (kml_twin_replay).
ROW = ("kind", "mount", "t", "a", "rsize", "orig", "flags", "window", "scans", "pages",
       "want", "vote")


class NfsRsize(ClassHook):
    name = "nfs-rsize"
    stem = "nfs"
    features = FEATURES
    what = f"KML's {FEATURES} NFS features"
    float_frac = "KML_NFS_FLOAT_FRAC"
    row_kinds, required_kinds = ("reads", "dones", "page adds"), 3
    params = {
        "window_ms": Param(1000, 1, 60000, "window length in ms"),
        "vote": Param(1, 1, 16, "majority vote over the last N predictions"),
        "rsize": Param(RSIZE, 4096, 1048576, "rsize in bytes per class"),
    }
    # nfs.ko's tracepoints are declared in fs/nfs/nfstrace.h, which the
    # installed headers lack: kml_nfs.c takes their prototypes as Linux 6.1
    # to 6.12 declare them (tests/unit/test_hooks.py checks both kernels' source)
    kbuild = """ifeq ($(filter 6.1 6.2 6.3 6.4 6.5 6.6 6.7 6.8 6.9 6.10 6.11 6.12,$(VERSION).$(PATCHLEVEL)),)
$(error kml_nfs.c: nfs.ko's tracepoint prototypes are known for Linux 6.1 to 6.12, not $(VERSION).$(PATCHLEVEL))
endif
# <linux/sunrpc/xdr.h> (xdr_stream_decode_uint32_array) compares a u32 with
# SIZE_MAX / 4: clang reports it once W=1 stops Makefile.extrawarn from
# turning the warning off, as it does for fs/nfs itself.
CFLAGS_kml_nfs.o += $(call cc-disable-warning,tautological-constant-out-of-range-compare)
"""
    kconfig = [arch_need("nfs-rsize"),
               ("TRACEPOINTS", "the nfs-rsize hook (tracepoint probes)"),
               ("NFS_FS", "the nfs-rsize hook")]

    # ---- trace and replay -------------------------------------------------------------

    def parse(self, text: str) -> dict:
        """A trace's NFS events as replay rows (ROW), each mount's events
        and decisions in their order; the module's features for each window
        an event closed, and its decisions {class, rsize}."""
        ev = read_trace(text, self.trace_events(),
                        {"kml_nfs_event": 11 + FEATURES, "kml_nfs_decision": 8})
        e, d = ev["kml_nfs_event"], ev["kml_nfs_decision"]
        n = len(e) + len(d)
        rows = np.zeros((n, len(ROW)), dtype=np.int64)
        seq = np.zeros(n, dtype=np.int64)
        # events: mount seq kind t a rsize orig scans pages flags window f...
        rows[:len(e)] = np.stack([e[:, 2], e[:, 0], e[:, 3], e[:, 4], e[:, 5], e[:, 6],
                                  e[:, 9], e[:, 10], e[:, 7], e[:, 8],
                                  np.zeros(len(e), np.int64), np.zeros(len(e), np.int64)], 1) \
            if len(e) else rows[:0]
        seq[:len(e)] = e[:, 1] if len(e) else seq[:0]
        # decisions: mount seq window cls want vote orig rsize
        if len(d):
            rows[len(e):] = np.stack([np.full(len(d), DECISION), d[:, 0], np.zeros(len(d)),
                                      np.zeros(len(d)), np.zeros(len(d)), d[:, 6],
                                      np.zeros(len(d)), d[:, 2], np.zeros(len(d)),
                                      np.zeros(len(d)), d[:, 4], d[:, 5]], 1)
            seq[len(e):] = d[:, 1]
        order = np.lexsort((seq, rows[:, 1]))
        rows = rows[order]
        feats = np.concatenate([e[:, 11:], np.zeros((len(d), FEATURES), np.int64)])[order]
        closes = (rows[:, 0] != DECISION) & ((rows[:, 6] & CLOSES) != 0)
        # the module's decisions {class, rsize}, in the order of their rows
        mod_dec = d[np.lexsort((d[:, 1], d[:, 0]))][:, [3, 7]] if len(d) else \
            np.zeros((0, 2), np.int64)
        return {"rows": rows, "features": feats[closes].astype(np.int32),
                "decisions": mod_dec.astype(np.int32), "lost": lost_events(text)}

    def replay(self, twin, text: str) -> Replay:
        t = self.parse(text)
        tf, td = self.replay_rows(twin, t["rows"])
        return Replay(t["features"], tf, t["decisions"], td, t["rows"], t)

    def replay_rows(self, twin, rows) -> tuple[np.ndarray, np.ndarray]:
        """Rows (ROW), each mount's in their order (mounts may interleave),
        through the twin: the features of each window an event closes, and
        {class, rsize} of each decision row (its window's features decided
        again, then the vote and clamps), both in the order of the rows."""
        ev = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1, len(ROW))
        order = np.argsort(ev[:, 1], kind="stable")     # each mount's rows together
        ev = ev[order].copy()
        closes = (ev[:, 0] != DECISION) & ((ev[:, 6] & CLOSES) != 0)
        dec = ev[:, 0] == DECISION
        # a decision row's "a": the index of its window's features
        index = {(int(m), int(w)): i for i, (m, w) in enumerate(zip(ev[closes, 1],
                                                                    ev[closes, 7]))}
        for i in np.flatnonzero(dec):
            key = (int(ev[i, 1]), int(ev[i, 7]))
            if key not in index:
                raise KmlcError(f"the trace has a decision for window {key[1]} of mount "
                                f"{key[0]}, which it has no features for")
            ev[i, 3] = index[key]
        f, d = twin.call_replay(ev, int(closes.sum()), FEATURES, int(dec.sum()), 2)
        back = lambda mask: np.argsort(order[mask], kind="stable")  # noqa: E731
        return f[back(closes)], d[back(dec)]

    def rows_from_events(self, ev, closed_by, wants, *, vote: int = 1,
                         orig: int = 1 << 20) -> np.ndarray:
        """The replay rows (ROW) the module's trace would give for an event
        stream as ``kmlc.features.nfs`` takes it ({t, kind, mount, a,
        rsize}, reclaim scans as kind 3): each event with the reclaim
        totals so far and its window flags, window n (from 1) closed at
        row closed_by[n - 1]; after it, when ``wants[n - 1]`` is not None,
        a decision asking that rsize, with vote length ``vote``."""
        rows, seen, scans, pages = [], set(), 0, 0
        closes = {int(i): n + 1 for n, i in enumerate(closed_by)}
        for i, (t, kind, mount, a, rsize) in enumerate(np.asarray(ev).tolist()):
            if kind == 3:
                scans, pages = scans + 1, pages + a
                continue
            window = closes.get(i, 0)
            flags = OPENS if mount not in seen or window else 0
            flags |= CLOSES if window else 0
            seen.add(mount)
            rows.append([kind, mount + 1, t, a, rsize, orig, flags, window, scans, pages, 0, 0])
            if window and wants[window - 1] is not None:
                rows.append([DECISION, mount + 1, t, 0, 0, orig, 0, window, 0, 0,
                             wants[window - 1], vote])
        return np.array(rows, dtype=np.int64).reshape(-1, len(ROW))

    # ---- qemu -------------------------------------------------------------------------

    # the scenario's steps, each a KMLC-RESULT <module>-<step> line
    steps = ("params", "events", "restore", "second-mount", "reload-cycles", "nfs-module",
             "replay-reads")
    needs = ["nfsd", "nfsv4"]
    tools = ["kml_reader", "kml_mount"]

    def setup(self, module: str) -> str:
        """An NFSv4.2 mount of a 48 MB tmpfs over loopback: $KML_MOUNT,
        holding data (32 MiB of random bytes)."""
        return SERVER + MOUNT + "export KML_MOUNT=/mnt/kmlnfs\n"

    def teardown(self, module: str) -> str:
        return "umount /mnt/kmlnfs\n"

    load = ("dd if=$KML_MOUNT/data of=/dev/null bs=64k count=64 2>/dev/null; "
            "echo 3 > /proc/sys/vm/drop_caches")

    def scenario(self, module: str, ko: str, loops: Loops) -> str:
        return SERVER + SCENARIO.format(
            module=module, ko=ko, cycles=loops.cycles, rand=loops.scaled(1500, 300),
            seq=loops.scaled(3072, 1024), reads=loops.scaled(1000, 300),
            seq_reads=loops.scaled(2048, 512))

    def about(self, module: str, tag: str, rep: Replay) -> list[str]:
        if not len(rep.decisions):
            return []
        return [f"{module}-policy INFO rsize decided: " + " -> ".join(
            str(r) for r in _runs(rep.decisions[:, 1]))]


def _runs(values) -> list[int]:
    """Values with repeats collapsed: 4096 4096 262144 -> 4096 262144."""
    out: list[int] = []
    for v in values:
        if not out or out[-1] != v:
            out.append(int(v))
    return out


SERVER = r"""
# An NFSv4.2 server over loopback, once per boot.  Busybox has no rpc.nfsd,
# mountd or exportfs: start the kernel's nfsd through its control files, and
# write the export cache entries mountd would: client 127.0.0.1 in domain
# "kmlc"; /export exported to it with flags 0x2402 = fsid (fsid=0: the NFSv4
# root) | no_subtree_check | insecure; the filehandle key of fsid 0.  NFSv4
# only (no lockd, no rpcbind); a recovery directory, so that the grace period
# can be ended at once.
if [ ! -d /export ]; then
    ifconfig lo 127.0.0.1 up
    mkdir -p /export /var/lib/nfs/v4recovery /mnt/kmlnfs /mnt/kmlnfs2
    mount -t tmpfs -o size=48m tmpfs /export
    dd if=/dev/urandom of=/export/data bs=1M count=32 2>/dev/null
    mount -t nfsd nfsd /proc/fs/nfsd
    echo -3 > /proc/fs/nfsd/versions
    echo 1048576 > /proc/fs/nfsd/max_block_size
    echo 10 > /proc/fs/nfsd/nfsv4gracetime
    far=2147483647
    printf '%s\n' "nfsd 127.0.0.1 $far kmlc" > /proc/net/rpc/auth.unix.ip/channel
    printf '%s\n' "kmlc /export $far 9218 0 0 0" > /proc/net/rpc/nfsd.export/channel
    printf '%s\n' "kmlc 1 \x00000000 $far /export" > /proc/net/rpc/nfsd.fh/channel
    echo "tcp 2049" > /proc/fs/nfsd/portlist
    echo 2 > /proc/fs/nfsd/threads
    echo Y > /proc/fs/nfsd/v4_end_grace
    for i in $(seq 50); do grep -q Y /proc/fs/nfsd/v4_end_grace && break; sleep 0.1; done
    # a memory cgroup where reading the 32 MB file reclaims pages
    mount -t cgroup2 none /sys/fs/cgroup && echo +memory > /sys/fs/cgroup/cgroup.subtree_control &&
        mkdir /sys/fs/cgroup/kml && echo 8M > /sys/fs/cgroup/kml/memory.max
fi
"""

MOUNT = r"""
kml_mount 127.0.0.1:/ /mnt/kmlnfs nfs4 vers=4.2,addr=127.0.0.1,clientaddr=127.0.0.1
"""

SCENARIO = r"""
M={module}
P=/sys/module/$M/parameters
D=/sys/kernel/debug/$M
N=/mnt/kmlnfs
opts=vers=4.2,addr=127.0.0.1,clientaddr=127.0.0.1
stat_of() {{ awk -v k=$1 '$1 == k {{print $2}}' $D/stats; }}
kml_mount 127.0.0.1:/ $N nfs4 $opts || kml_result $M-nfs FAIL mount
DEV=$(awk -v n=$N '$5 == n {{print $3}}' /proc/self/mountinfo)
rsize() {{ grep " $1 " /proc/mounts | tr , '\n' | sed -n 's/^rsize=//p'; }}
in_cgroup() {{ sh -c "echo \$\$ > /sys/fs/cgroup/kml/cgroup.procs 2>/dev/null; exec $*"; }}
orig=$(rsize $N)
want_rand=$(kml_reader rand /export/data 8192 {rand} 7)
want_seq=$(kml_reader seq /export/data 8192 {seq})

# events flow: random then sequential reads in 200 ms windows, every byte
# checksummed; the trace replays (host)
rmmod $M
insmod /lib/kmlc/{ko} dev=$DEV window_ms=200 vote=3
kml_trace_on $M
echo 3 > /proc/sys/vm/drop_caches
got_rand=$(kml_reader rand $N/data 8192 {rand} 7)
r_rand=$(rsize $N)
echo 3 > /proc/sys/vm/drop_caches
got_seq=$(in_cgroup kml_reader seq $N/data 8192 {seq})
r_seq=$(rsize $N)
kml_trace_dump $M reads
cat $D/stats
echo "mounts (id dev negotiated chosen class): $(cat $D/mounts)"
reads=$(stat_of reads); windows=$(stat_of windows); scans=$(stat_of reclaim_scans)
mode=$(stat -c %a $D/stats $D/mounts | sort -u)
if [ "$got_rand" = "$want_rand" ] && [ "$got_seq" = "$want_seq" ] && [ "$reads" -gt 0 ] &&
   [ "$windows" -gt 0 ] && [ "$mode" = 400 ]; then
    kml_result $M-events PASS "$reads READs, $windows windows, $scans reclaim scans; data identical; debugfs 0400"
else
    kml_result $M-events FAIL "reads=$reads windows=$windows sums $got_rand/$want_rand $got_seq/$want_seq debugfs $mode"
fi
kml_result $M-policy INFO "rsize $orig -> after random reads $r_rand -> after sequential reads $r_seq"

# detaching and unloading give the mount its negotiated rsize back: every
# class asks 4 KiB, then the model is detached, attached, the module unloaded
echo 50 > $P/window_ms
echo 4096,4096,4096,4096 > $P/rsize
# reads until the model's choice is in force: a decision takes 3 windows
# that saw READs, and on a loaded TCG host one round of reads can span fewer
read_until_rsize() {{
    i=0
    while [ $i -lt 5 ]; do
        echo 3 > /proc/sys/vm/drop_caches
        kml_reader rand $N/data 8192 {reads} $(($2 + i)) > /dev/null
        [ "$(rsize $N)" = "$1" ] && break
        i=$((i + 1))
    done
}}
read_until_rsize 4096 5
r_on=$(rsize $N)
echo 0 > $P/enabled
r_off=$(rsize $N)
kml_reader rand $N/data 8192 {reads} 5 > /dev/null
r_off2=$(rsize $N)
echo 1 > $P/enabled
read_until_rsize 4096 16
r_on2=$(rsize $N)
rmmod $M
r_unload=$(rsize $N)
insmod /lib/kmlc/{ko} dev=0:1 window_ms=100 rsize=4096,4096,4096,4096
kml_reader rand $N/data 8192 {reads} 7 > /dev/null
r_other=$(rsize $N)
tracked=$(cat $D/mounts)
rmmod $M
if [ "$r_on" = 4096 ] && [ "$r_off" = "$orig" ] && [ "$r_off2" = "$orig" ] &&
   [ "$r_on2" = 4096 ] && [ "$r_unload" = "$orig" ] && [ "$r_other" = "$orig" ] &&
   [ -z "$tracked" ]; then
    kml_result $M-restore PASS "4096, detached $r_off, kept $r_off2, attached $r_on2, unloaded $r_unload, other mount's module $r_other"
else
    kml_result $M-restore FAIL "$r_on, detached $r_off/$r_off2, attached $r_on2, unloaded $r_unload, other mount's module $r_other ($tracked)"
fi

# a second mount of the export while the hook has changed the first's rsize:
# NFS gives it a superblock of its own (nfs_compare_mount_options() compares
# rsize); the hook tracks it as a mount of its own, and both read right
insmod /lib/kmlc/{ko} window_ms=50 rsize=4096,4096,4096,4096
kml_reader rand $N/data 8192 {reads} 8 > /dev/null
kml_mount 127.0.0.1:/ /mnt/kmlnfs2 nfs4 $opts
DEV2=$(awk '$5 == "/mnt/kmlnfs2" {{print $3}}' /proc/self/mountinfo)
r2=$(kml_reader rand /mnt/kmlnfs2/data 8192 {reads} 9)
r1=$(kml_reader rand $N/data 8192 {reads} 9)
nmounts=$(wc -l < $D/mounts)
umount /mnt/kmlnfs2
rmmod $M
if [ "$DEV2" != "$DEV" ] && [ "$r1" = "$r2" ] && [ "$r1" = "$(kml_reader rand /export/data 8192 {reads} 9)" ] &&
   [ "$nmounts" = 2 ] && [ "$(rsize $N)" = "$orig" ]; then
    kml_result $M-second-mount PASS "own superblock $DEV2 beside $DEV, $nmounts mounts tracked, data identical"
else
    kml_result $M-second-mount FAIL "superblock $DEV2 beside $DEV, $nmounts mounts tracked, sums $r1/$r2"
fi

# unload and reload {cycles} times while a reader alternates random and
# sequential reads, in the small cgroup so that it keeps reading from the
# server; every read checksummed
insmod /lib/kmlc/{ko} window_ms=50 vote=2
want1=$(kml_reader rand /export/data 8192 {reads} 11)
want2=$(kml_reader seq /export/data 8192 {seq_reads})
rm -f /tmp/stop /tmp/bad
( while [ ! -f /tmp/stop ]; do
      [ "$(in_cgroup kml_reader rand $N/data 8192 {reads} 11)" = "$want1" ] || echo rand >> /tmp/bad
      [ "$(in_cgroup kml_reader seq $N/data 8192 {seq_reads})" = "$want2" ] || echo seq >> /tmp/bad
  done ) &
sleep 1
before=$(kml_held)
bad=0
for c in $(seq {cycles}); do
    rmmod $M || bad=$((bad + 1))
    insmod /lib/kmlc/{ko} window_ms=50 vote=2 || bad=$((bad + 1))
done
touch /tmp/stop
wait
after=$(kml_held)
rmmod $M || bad=$((bad + 1))
r_final=$(rsize $N)
[ -f /tmp/bad ] && bad=$((bad + $(wc -l < /tmp/bad)))
umount $N || bad=$((bad + 1))
if [ $bad -eq 0 ] && [ "$r_final" = "$orig" ] && [ $((after - before)) -lt $KML_LEAK_KB ]; then
    kml_result $M-reload-cycles PASS "{cycles} cycles under NFS load, rsize $r_final after, held $before -> $after kB"
else
    kml_result $M-reload-cycles FAIL "errors=$bad rsize $r_final after, held $before -> $after kB"
fi

# nfs.ko loaded after the module, and unloaded under it: the tracepoint
# module notifier attaches the probes and detaches them
unload_nfs() {{ for i in $(seq 50); do rmmod nfsv4 2>/dev/null && break; sleep 0.2; done; rmmod nfs; }}
bad=0
unload_nfs || bad=$((bad + 1))
insmod /lib/kmlc/{ko} window_ms=50
early=$(dmesg | grep "$M: attached" | tail -1)
insmod /lib/debian/nfs.ko && insmod /lib/debian/nfsv4.ko || bad=$((bad + 1))
kml_mount 127.0.0.1:/ $N nfs4 $opts || bad=$((bad + 1))
kml_reader rand $N/data 8192 {reads} 9 > /dev/null
reads=$(stat_of reads)
umount $N || bad=$((bad + 1))
unload_nfs || bad=$((bad + 1))
insmod /lib/debian/nfs.ko && insmod /lib/debian/nfsv4.ko || bad=$((bad + 1))
if [ $bad -eq 0 ] && [ "$reads" -gt 0 ] && echo "$early" | grep -q "when nfs.ko loads"; then
    kml_result $M-nfs-module PASS "nfs.ko loaded after the module: $reads reads seen; unloaded under it"
else
    kml_result $M-nfs-module FAIL "errors=$bad reads=$reads ($early)"
fi
"""

HOOK = NfsRsize()
