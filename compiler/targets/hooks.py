"""The kernel hooks' real-kernel tests (qemu) and their userspace replay.

Each hook kind contributes, to the qemu boot of ``kmlc qemu-test``, the
Debian modules and helper programs it needs and a shell scenario that runs
while the model's module is loaded.  A scenario prints ``KMLC-RESULT`` lines
(see ``targets/qemu.py``) and may dump the module's debugfs trace between
``KMLC-TRACE-BEGIN <hook>`` / ``KMLC-TRACE-END`` for replay through the twin.

admission  two null_blk replicas with identical random data, the primary
           slow (10 ms completions); the dm target over them; 16 concurrent
           readers, 4 rounds, every region checksummed, while a writer
           writes 64 KiB blocks through the target (to the primary) and the
           same blocks to the replica, past the readers' regions; then 100
           attach / detach cycles of the model under the same load; then
           100 load / create / read / remove / unload cycles of the module.
           Passes when no checksum differs (reads, and the written blocks
           on both replicas), >= 80% of reads go to the replica, the
           target saw every write, and no memory is leaked.
readahead  two null_blk disks; a sequential reader on one and a random
           reader on the other, one file descriptor each; passes when the
           sequential file ends with more readahead than the random one;
           then 100 unload / reload cycles while both readers run.
nfs-rsize  an NFSv4.2 server (the kernel's nfsd, exporting a tmpfs) and
           client in the guest, over loopback; a random then a sequential
           reader on the mount; passes when the mount's rsize (as
           /proc/mounts shows it) follows the model: 4 KiB after random
           reads, 256 KiB after sequential ones, every byte checksummed.
           Then: detaching restores the negotiated rsize; a module for
           another mount leaves this one alone; 100 unload / reload cycles
           while a reader runs; unloading restores the negotiated rsize;
           nfs.ko loaded after the module is followed, and can be unloaded
           under it.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np

from ..errors import KmlcError
from .kunit import cache_dir, locked

TOOLS = Path(__file__).resolve().parent / "qemu_tools"
MODULE_ARGS = {"null_blk": "nr_devices=0"}


def tool(name: str) -> Path:
    """A static helper binary for the initramfs, built once and cached."""
    src = TOOLS / f"{name}.c"
    out = cache_dir() / "qemu" / "tools" / name
    with locked("qemu-tools"):
        if not out.is_file() or out.stat().st_mtime < src.stat().st_mtime:
            out.parent.mkdir(parents=True, exist_ok=True)
            res = subprocess.run(["gcc", "-static", "-O2", "-Wall", "-o", str(out), str(src)],
                                 capture_output=True, text=True)
            if res.returncode:
                raise KmlcError(f"cannot build {name} statically (install libc6-dev): "
                                + res.stderr.strip()[-500:])
    return out


ADMISSION = r"""
M={module}
P=/sys/module/$M/parameters
C=/sys/kernel/config/nullb
echo 1 > $P/trace
# null_blk names each disk after its configfs directory
for d in kmla0 kmla1; do
    mkdir $C/$d
    echo 64 > $C/$d/size; echo 1 > $C/$d/memory_backed
    echo 4096 > $C/$d/blocksize; echo 2 > $C/$d/irqmode
done
echo 10000000 > $C/kmla0/completion_nsec
echo 20000 > $C/kmla1/completion_nsec
echo 1 > $C/kmla0/power; echo 1 > $C/kmla1/power
S=/dev/kmla0; F=/dev/kmla1  # slow primary, fast replica
dd if=/dev/urandom of=/tmp/data bs=1M count=16 2>/dev/null
dd if=/tmp/data of=$S bs=1M 2>/dev/null; dd if=/tmp/data of=$F bs=1M 2>/dev/null; sync
for i in $(seq 0 15); do
    dd if=/tmp/data bs=64k skip=$((i * 16)) count=16 2>/dev/null | md5sum > /tmp/want.$i
done
dd if=/dev/urandom of=/tmp/wdata bs=64k count=64 2>/dev/null
bad=0
read_all() {{
    for i in $(seq 0 15); do
        dd if=$1 bs=64k skip=$((i * 16)) count=16 2>/dev/null | md5sum > /tmp/got.$i &
    done
    wait
    for i in $(seq 0 15); do
        [ "$(cat /tmp/got.$i)" = "$(cat /tmp/want.$i)" ] || bad=$((bad + 1))
    done
}}
# round $1's 16 blocks of /tmp/wdata, at 16 MiB + 64 KiB x block: through the
# target (it sends writes to the primary) and the same to the replica
write_some() {{
    for j in $(seq 0 15); do
        k=$(( ($1 - 1) * 16 + j ))
        for w in $DEV $F; do
            dd if=/tmp/wdata of=$w bs=64k skip=$k seek=$((256 + k)) count=1 oflag=direct \
               conv=notrunc 2>/dev/null
        done
    done
}}
# 20 MiB: the readers read the first 16, the writer writes the last 4
kml_dmsetup create kmladm "0 40960 $M $S $F" || echo "KMLC-RESULT $M-admission FAIL create"
DEV=/dev/$(ls /sys/block | grep dm- | head -1)
for round in 1 2 3 4; do
    echo 3 > /proc/sys/vm/drop_caches; write_some $round & read_all $DEV
done
want=$(md5sum < /tmp/wdata)
for w in $S $F; do
    [ "$(dd if=$w bs=64k skip=256 count=64 iflag=direct 2>/dev/null | md5sum)" = "$want" ] ||
        bad=$((bad + 1))
done
ST=$(ls -d /sys/kernel/debug/$M/dm-*)/stats
cat $ST
reads=$(awk '/^reads/{{print $2}}' $ST); rep=$(awk '/^to_replica/{{print $2}}' $ST)
wr=$(awk '/^writes/{{print $2}}' $ST)
echo KMLC-TRACE-BEGIN admission
cat $(dirname $ST)/trace
echo KMLC-TRACE-END
if [ $bad -eq 0 ] && [ $reads -ge 200 ] && [ $((rep * 100)) -ge $((reads * 80)) ] &&
   [ $wr -ge 64 ]; then
    echo "KMLC-RESULT $M-admission PASS reads=$reads to_replica=$rep writes=$wr checksum_errors=$bad"
else
    echo "KMLC-RESULT $M-admission FAIL reads=$reads to_replica=$rep writes=$wr checksum_errors=$bad"
fi
# attach and detach the model 100 times under load
echo 0 > $P/trace
bad=0
( for round in 1 2 3; do echo 3 > /proc/sys/vm/drop_caches; read_all $DEV; done
  echo $bad > /tmp/bad.load ) &
for c in $(seq 100); do echo 0 > $P/enabled; echo 1 > $P/enabled; done
wait
lbad=$(cat /tmp/bad.load)
[ "$lbad" = 0 ] && echo "KMLC-RESULT $M-attach-cycles PASS 100 cycles under load" ||
    echo "KMLC-RESULT $M-attach-cycles FAIL checksum_errors=$lbad"
kml_dmsetup remove kmladm || echo "KMLC-RESULT $M-admission FAIL remove"
rmmod $M
# load, create, read, remove and unload 100 times
before=$(kml_held)
bad=0
for c in $(seq 100); do
    insmod /lib/kmlc/{ko} || bad=$((bad + 1))
    kml_dmsetup create kmladm "0 32768 $M $S $F" || bad=$((bad + 1))
    DEV=/dev/$(ls /sys/block | grep dm- | head -1)
    [ "$(dd if=$DEV bs=64k count=4 2>/dev/null | md5sum)" = \
      "$(dd if=/tmp/data bs=64k count=4 2>/dev/null | md5sum)" ] || bad=$((bad + 1))
    kml_dmsetup remove kmladm || bad=$((bad + 1))
    rmmod $M || bad=$((bad + 1))
done
after=$(kml_held)
if [ $bad -eq 0 ] && [ $((after - before)) -lt 1024 ]; then
    echo "KMLC-RESULT $M-reload-cycles PASS 100 cycles, held $before -> $after kB"
else
    echo "KMLC-RESULT $M-reload-cycles FAIL errors=$bad held $before -> $after kB"
fi
for d in kmla0 kmla1; do echo 0 > $C/$d/power; rmdir $C/$d; done
insmod /lib/kmlc/{ko}
"""


READAHEAD = r"""
M={module}
P=/sys/module/$M/parameters
D=/sys/kernel/debug/$M
C=/sys/kernel/config/nullb
echo 1 > $P/trace
echo 16 > $P/window_events
for d in kmlr0 kmlr1 kmlr2 kmlr3; do
    mkdir $C/$d; echo 256 > $C/$d/size; echo 1 > $C/$d/power
done
newest() {{ sort -n $D/files | tail -1; }}
ra_of() {{ echo "$1" | awk '{{print $4}}'; }}
seq_sum=$(kml_reader seq /dev/kmlr0 65536 8192)
seq_ra=$(ra_of "$(newest)")
rand_sum=$(kml_reader rand /dev/kmlr1 65536 2048 7)
rand_ra=$(ra_of "$(newest)")
windows=$(awk '/^windows/{{print $2}}' $D/stats)
if [ -n "$seq_ra" ] && [ -n "$rand_ra" ] && [ "$seq_ra" -gt "$rand_ra" ] && [ "$windows" -gt 0 ]; then
    echo "KMLC-RESULT $M-readahead PASS sequential ra_pages=$seq_ra > random ra_pages=$rand_ra, $windows windows"
else
    echo "KMLC-RESULT $M-readahead FAIL sequential ra_pages=$seq_ra random ra_pages=$rand_ra windows=$windows"
fi
# the same readers through mmap, from a cold cache: page faults (trace flag 4);
# on devices of their own, since a new open of the same inode whose struct
# file reuses a freed one's address continues that file's state
echo 3 > /proc/sys/vm/drop_caches
before=$(awk '$4 >= 4' $D/trace | wc -l)
[ "$(kml_reader mseq /dev/kmlr2 65536 8192)" = "$seq_sum" ] || echo "KMLC-RESULT $M-mmap FAIL mseq sum"
mseq_ra=$(ra_of "$(newest)")
[ "$(kml_reader mrand /dev/kmlr3 65536 2048 7)" = "$rand_sum" ] || echo "KMLC-RESULT $M-mmap FAIL mrand sum"
mrand_ra=$(ra_of "$(newest)")
faults=$(( $(awk '$4 >= 4' $D/trace | wc -l) - before ))
cat $D/stats
echo KMLC-TRACE-BEGIN readahead
cat $D/trace
echo KMLC-TRACE-END
if [ -n "$mseq_ra" ] && [ -n "$mrand_ra" ] && [ "$mseq_ra" -gt "$mrand_ra" ] && [ "$faults" -gt 0 ]; then
    echo "KMLC-RESULT $M-mmap PASS sequential ra_pages=$mseq_ra > random ra_pages=$mrand_ra, $faults faults"
else
    echo "KMLC-RESULT $M-mmap FAIL sequential ra_pages=$mseq_ra random ra_pages=$mrand_ra faults=$faults"
fi
echo 0 > $P/trace
# unload and reload 100 times while two readers keep missing
( kml_reader rand /dev/kmlr1 65536 200000 3 > /tmp/bg1 ) &
( kml_reader seq /dev/kmlr0 65536 400000 > /tmp/bg2 ) &
before=$(kml_held)
bad=0
for c in $(seq 100); do
    rmmod $M || bad=$((bad + 1))
    insmod /lib/kmlc/{ko} window_events=16 || bad=$((bad + 1))
done
wait
after=$(kml_held)
[ "$(cat /tmp/bg1)" = "$(kml_reader rand /dev/kmlr1 65536 200000 3)" ] || bad=$((bad + 1))
if [ $bad -eq 0 ] && [ $((after - before)) -lt 1024 ]; then
    echo "KMLC-RESULT $M-reload-cycles PASS 100 cycles under load, held $before -> $after kB"
else
    echo "KMLC-RESULT $M-reload-cycles FAIL errors=$bad held $before -> $after kB"
fi
for d in kmlr0 kmlr1 kmlr2 kmlr3; do echo 0 > $C/$d/power; rmdir $C/$d; done
"""


NFS_SERVER = r"""
# An NFSv4.2 server and client over loopback, once per boot.  Busybox has
# no rpc.nfsd, mountd or exportfs: start the kernel's nfsd through its
# control files, and write the export cache entries mountd would: client
# 127.0.0.1 in domain "kmlc"; /export exported to it with flags
# 0x2402 = fsid (fsid=0: the NFSv4 root) | no_subtree_check | insecure;
# the filehandle key of fsid 0.  NFSv4 only (no lockd, no rpcbind); a
# recovery directory, so that the grace period can be ended at once.
if [ ! -d /export ]; then
    ifconfig lo 127.0.0.1 up
    mkdir -p /export /var/lib/nfs/v4recovery /mnt/kmlnfs
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

NFS_RSIZE = r"""
M={module}
P=/sys/module/$M/parameters
D=/sys/kernel/debug/$M
N=/mnt/kmlnfs
kml_mount 127.0.0.1:/ $N nfs4 vers=4.2,addr=127.0.0.1,clientaddr=127.0.0.1 ||
    echo "KMLC-RESULT $M-nfs-rsize FAIL mount"
DEV=$(awk -v n=$N '$5 == n {{print $3}}' /proc/self/mountinfo)
rsize() {{ grep " $N " /proc/mounts | tr , '\n' | sed -n 's/^rsize=//p'; }}
in_cgroup() {{ sh -c "echo \$\$ > /sys/fs/cgroup/kml/cgroup.procs 2>/dev/null; exec $*"; }}
orig=$(rsize)
want_rand=$(kml_reader rand /export/data 8192 1500 7)
want_seq=$(kml_reader seq /export/data 8192 3072)
# this mount only, 200 ms windows, a vote over the last 3 predictions, traced
rmmod $M
insmod /lib/kmlc/{ko} dev=$DEV window_ms=200 vote=3 trace=1
echo 3 > /proc/sys/vm/drop_caches
got_rand=$(kml_reader rand $N/data 8192 1500 7)
r_rand=$(rsize)
echo 3 > /proc/sys/vm/drop_caches
got_seq=$(in_cgroup kml_reader seq $N/data 8192 3072)
r_seq=$(rsize)
cat $D/stats
echo "mounts (id dev negotiated chosen class): $(cat $D/mounts)"
echo "rsize of $DEV: negotiated $orig, after random reads $r_rand, after sequential reads $r_seq"
echo KMLC-TRACE-BEGIN nfs-rsize
cat $D/trace
echo KMLC-TRACE-END
inf=$(awk '/^inferences/{{print $2}}' $D/stats)
if [ "$orig" = 1048576 ] && [ "$r_rand" = 4096 ] && [ "$r_seq" = 262144 ] && [ "$inf" -gt 0 ] &&
   [ "$got_rand" = "$want_rand" ] && [ "$got_seq" = "$want_seq" ]; then
    echo "KMLC-RESULT $M-nfs-rsize PASS rsize $orig -> random $r_rand -> sequential $r_seq, $inf inferences"
else
    echo "KMLC-RESULT $M-nfs-rsize FAIL rsize $orig -> random $r_rand -> sequential $r_seq, inferences=$inf sums $got_rand/$want_rand $got_seq/$want_seq"
fi
echo 0 > $P/trace
# detach: the negotiated rsize comes back and stays; attach: the model again
echo 50 > $P/window_ms
echo 0 > $P/enabled
r_off=$(rsize)
kml_reader rand $N/data 8192 1000 5 > /dev/null
r_off2=$(rsize)
echo 1 > $P/enabled
kml_reader rand $N/data 8192 1000 6 > /dev/null
r_on=$(rsize)
# unload: the negotiated rsize comes back; a module for another mount leaves it
rmmod $M
r_unload=$(rsize)
insmod /lib/kmlc/{ko} dev=0:1 window_ms=100
kml_reader rand $N/data 8192 1000 7 > /dev/null
r_other=$(rsize)
tracked=$(cat $D/mounts)
rmmod $M
if [ "$r_off" = "$orig" ] && [ "$r_off2" = "$orig" ] && [ "$r_on" = 4096 ] &&
   [ "$r_unload" = "$orig" ] && [ "$r_other" = "$orig" ] && [ -z "$tracked" ]; then
    echo "KMLC-RESULT $M-nfs-detach PASS detached $r_off, reattached $r_on, unloaded $r_unload, other mount's module $r_other"
else
    echo "KMLC-RESULT $M-nfs-detach FAIL detached $r_off/$r_off2, reattached $r_on, unloaded $r_unload, other mount's module $r_other ($tracked)"
fi
# unload and reload 100 times while a reader alternates random and
# sequential reads, in the small cgroup so that it keeps reading from the
# server; every read checksummed
insmod /lib/kmlc/{ko} window_ms=50 vote=2
want1=$(kml_reader rand /export/data 8192 1000 11)
want2=$(kml_reader seq /export/data 8192 2048)
rm -f /tmp/stop /tmp/bad
( while [ ! -f /tmp/stop ]; do
      [ "$(in_cgroup kml_reader rand $N/data 8192 1000 11)" = "$want1" ] || echo rand >> /tmp/bad
      [ "$(in_cgroup kml_reader seq $N/data 8192 2048)" = "$want2" ] || echo seq >> /tmp/bad
  done ) &
sleep 1
before=$(kml_held)
bad=0
for c in $(seq 100); do
    rmmod $M || bad=$((bad + 1))
    insmod /lib/kmlc/{ko} window_ms=50 vote=2 || bad=$((bad + 1))
done
touch /tmp/stop
wait
after=$(kml_held)
rmmod $M || bad=$((bad + 1))
r_final=$(rsize)
[ -f /tmp/bad ] && bad=$((bad + $(wc -l < /tmp/bad)))
umount $N || bad=$((bad + 1))
if [ $bad -eq 0 ] && [ "$r_final" = "$orig" ] && [ $((after - before)) -lt 1024 ]; then
    echo "KMLC-RESULT $M-reload-cycles PASS 100 cycles under NFS load, rsize $r_final after, held $before -> $after kB"
else
    echo "KMLC-RESULT $M-reload-cycles FAIL errors=$bad rsize $r_final after, held $before -> $after kB"
fi
# nfs.ko loaded after the module, and unloaded under it: the tracepoint
# module notifier attaches the probes and detaches them
unload_nfs() {{ for i in $(seq 50); do rmmod nfsv4 2>/dev/null && break; sleep 0.2; done; rmmod nfs; }}
bad=0
unload_nfs || bad=$((bad + 1))
insmod /lib/kmlc/{ko} window_ms=50 || bad=$((bad + 1))
early=$(dmesg | grep "$M: attached" | tail -1)
insmod /lib/debian/nfs.ko && insmod /lib/debian/nfsv4.ko || bad=$((bad + 1))
kml_mount 127.0.0.1:/ $N nfs4 vers=4.2,addr=127.0.0.1,clientaddr=127.0.0.1 || bad=$((bad + 1))
kml_reader rand $N/data 8192 1000 9 > /dev/null
r_late=$(rsize)
reads=$(awk '/^reads/{{print $2}}' $D/stats)
umount $N || bad=$((bad + 1))
unload_nfs || bad=$((bad + 1))
insmod /lib/debian/nfs.ko && insmod /lib/debian/nfsv4.ko || bad=$((bad + 1))
if [ $bad -eq 0 ] && [ "$r_late" = 4096 ] && [ "$reads" -gt 0 ] &&
   echo "$early" | grep -q "when nfs.ko loads"; then
    echo "KMLC-RESULT $M-nfs-module PASS nfs.ko loaded after the module: $reads reads seen, rsize $r_late; unloaded under it"
else
    echo "KMLC-RESULT $M-nfs-module FAIL errors=$bad reads=$reads rsize $r_late ($early)"
fi
"""


def qemu_parts(outdir: Path, meta: dict, ko: Path) -> tuple[list[str], dict, str]:
    """(Debian modules, initramfs files, scenario) for a model's hooks."""
    needs: list[str] = []
    files: dict[str, Path] = {}
    script = ""
    for h in meta.get("hooks", []):
        if h == "admission":
            needs += ["dm-mod", "null_blk"]
            files["bin/kml_dmsetup"] = tool("kml_dmsetup")
            script += ADMISSION.format(module=meta["module"], ko=ko.name)
        elif h == "readahead":
            needs += ["null_blk"]
            files["bin/kml_reader"] = tool("kml_reader")
            script += READAHEAD.format(module=meta["module"], ko=ko.name)
        elif h == "nfs-rsize":
            needs += ["nfsd", "nfsv4"]
            files["bin/kml_reader"] = tool("kml_reader")
            files["bin/kml_mount"] = tool("kml_mount")
            script += NFS_SERVER + NFS_RSIZE.format(module=meta["module"], ko=ko.name)
    return needs, files, script


# ---- replay ------------------------------------------------------------------------

TRACE = re.compile(r"KMLC-TRACE-BEGIN (\S+)\n(.*?)KMLC-TRACE-END", re.S)


def parse_admission_trace(text: str):
    """The module's debugfs trace as (events for the twin, the module's
    features, the module's decisions).  Rows {kind, a, b, c}: a read "R
    size qlen decision f..." is (0, size, qlen, 0); a completion on the
    primary "D r|w qlen lat_ns bytes" is (1 for a read or 2 for a write,
    qlen, lat_ns, bytes)."""
    events, feats, decisions = [], [], []
    for ln in text.splitlines():
        p = ln.split()
        if not p:
            continue
        if p[0] == "D":
            events.append([{"r": 1, "w": 2}[p[1]], int(p[2]), int(p[3]), int(p[4])])
        elif p[0] == "R":
            events.append([0, int(p[1]), int(p[2]), 0])
            decisions.append(int(p[3]))
            feats.append([int(v) for v in p[4:]])
    return (np.array(events, dtype=np.int64).reshape(-1, 4),
            np.array(feats, dtype=np.int32), np.array(decisions, dtype=np.int32))


def parse_readahead_trace(text: str):
    """The module's readahead trace as (events for the twin, the module's
    features and classes for each window it closed)."""
    events, feats, classes = [], [], []
    for ln in text.splitlines():
        p = [int(v) for v in ln.split()]
        if len(p) != 10:
            continue
        events.append(p[:4])
        if p[3] & 2:
            feats.append(p[5:])
            classes.append(p[4])
    return (np.array(events, dtype=np.int64).reshape(-1, 4),
            np.array(feats, dtype=np.int32).reshape(-1, 5), np.array(classes, dtype=np.int32))


def parse_nfs_trace(text: str):
    """The module's NFS rsize trace as (rows for the twin: {kind, mount, t,
    a, rsize, orig, flags, window}; the module's features for each window
    it closed; the module's decisions {class, rsize})."""
    events, feats, decisions = [], [], []
    for ln in text.splitlines():
        try:
            p = [int(v) for v in ln.split()]
        except ValueError:
            continue
        if len(p) != 18:
            continue
        events.append(p[:8])
        if p[0] != 4 and p[6] & 2:
            feats.append(p[10:])
        if p[6] & 4:
            decisions.append(p[8:10])
    return (np.array(events, dtype=np.int64).reshape(-1, 8),
            np.array(feats, dtype=np.int32).reshape(-1, 8),
            np.array(decisions, dtype=np.int32).reshape(-1, 2))


def traces(log: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in TRACE.finditer(log)}
