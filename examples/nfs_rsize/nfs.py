"""An NFS client's read path, on the readahead example's page cache.

Linux's NFS client reads through the generic page cache and readahead
(mm/filemap.c, mm/readahead.c), so ``NfsSim`` is the readahead example's
``Sim`` (Linux 6.1's read path and on-demand readahead, function by
function) with the block device replaced by an NFS mount.  What changes,
from Linux 6.1's fs/nfs (under ~/.cache/kmlc/linux-source-6.1):

* readahead: the mount's bdi keeps ra_pages = VM_READAHEAD_PAGES (32 pages,
  128 KiB: nothing in fs/nfs sets it) and gets io_pages = rpages at mount
  (fs/nfs/super.c, nfs_get_tree_common()): rsize does not size readahead
  windows, it only bounds the size of READs for reads larger than ra_pages;
* READ RPCs: read_pages() hands each contiguous run of new pages to
  nfs_readahead(), a page readahead did not add goes to nfs_read_folio();
  both put the pages into an nfs_pageio_descriptor whose size limit,
  pg_bsize, is the mount's rsize when the descriptor is set up
  (nfs_pageio_init_read()), and nfs_generic_pg_test() closes a READ at
  that many bytes (fs/nfs/read.c, fs/nfs/pagelist.c).  So a run of n pages
  is ceil(n / rpages) READs, and a new rsize applies from the next
  descriptor on;
* all pages of a READ become up to date together when its reply has been
  processed (nfs_read_completion());
* the tracepoints the nfs-rsize hook listens to fire here: nfs_initiate_read
  when a READ is sent, nfs_readpage_done when its reply is in,
  mm_filemap_add_to_page_cache for every page added (reads, readahead and
  writes alike), mm_vmscan_lru_shrink_inactive for every reclaim batch.

The transport (``Transport``) is a pipeline of FIFO resources, in integer
nanoseconds:

  client   the reading task spends ``issue_ns`` per READ
           (nfs_initiate_pgio(): header, rpc_run_task(), asynchronous);
  slots    at most ``slots`` RPCs in flight (NFSv4.1 session slots: the
           client's max_session_slots, NFS4_DEF_SLOT_TABLE_SIZE = 64);
  uplink   the request (``request_bytes``; a WRITE's data too), then half
           the RTT;
  server   ``nfsd_threads`` threads (rpc.nfsd's default, 8), each RPC
           ``server_ns`` plus ``server_page_ns`` per page; the data is in
           the server's page cache (a server with more RAM than the
           database: the server's disk is not modelled);
  downlink the reply (data + ``reply_bytes``, framed in TCP segments of
           ``mss`` bytes + ``frame_bytes`` of Ethernet/IP/TCP headers) at the
           link's bandwidth, one reply after another, then half the RTT;
  rpciod   one client CPU receives and completes replies, ``client_ns`` per
           RPC plus ``client_page_ns`` per page.

Simplifications: replies leave the server in the order requests were
issued (one TCP connection; with equal per-RPC server times the order
would hardly differ); no GETATTR/attribute revalidation, OPEN or COMMIT
traffic; reclaim costs no CPU; no packet loss or congestion control.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from readahead.sim import (MAPPED, PAGE_SHIFT, PAGE_SIZE, PREFETCHED, STATE, USED, Cpu,
                           Device, Sim)

PAGE_INDEX = MAPPED + 1   # a cached page's list: readahead.sim's fields, then its index

INDEX_MASK = (1 << 40) - 1        # readahead.sim's cache key: file id << 40 | page index
RECLAIM_BATCH = 32                # SWAP_CLUSTER_MAX: pages per shrink_inactive_list() batch
READ, DONE, PAGE, RECLAIM = 0, 1, 2, 3   # the hook's event kinds (kmlc.features.NFS_KINDS)


@dataclass(frozen=True)
class Net:
    """A network path between client and server: round-trip time and
    bandwidth (the bottleneck link's)."""
    name: str
    rtt_ns: int
    gbit_s: float


# Presets.
#   lan: the KML paper's testbed: 10 GbE switches, 0.2 ms average RTT measured.
#   wan: a datacenter-to-datacenter link: 1 Gb/s, 5 ms RTT (about 500 km of
#        fibre each way at 4.9 us/km, light at c/1.47), the kind of path
#        KML emulated by injecting network delays.
#   far: 1 Gb/s, 20 ms RTT (2,000 km), for training only: with it the model
#        does not take a long READ latency for an access pattern.
NETS = {
    "lan": Net("lan", 200_000, 10.0),
    "wan": Net("wan", 5_000_000, 1.0),
    "far": Net("far", 20_000_000, 1.0),
}


@dataclass(frozen=True)
class RpcCosts:
    """Per-RPC costs, ns (see the module's docstring).  Estimates of this
    order: a 4 KiB READ on the lan preset takes 0.22 ms end to end, within
    the 0.2-0.5 ms usually quoted for NFS over 10 GbE."""
    issue_ns: int = 2_000
    client_ns: int = 5_000
    client_page_ns: int = 250        # copy a page out of the socket buffers (~16 GB/s)
    server_ns: int = 12_000          # nfsd: decode, SEQUENCE + PUTFH + READ, encode, send
    server_page_ns: int = 100        # nfsd: a page from its page cache (spliced, not copied)
    request_bytes: int = 250         # a READ call: RPC header, SEQUENCE, PUTFH, READ
    reply_bytes: int = 150           # a READ reply's headers, before the data
    mss: int = 1448                  # TCP payload per segment (1500-byte MTU, timestamps)
    frame_bytes: int = 90            # per segment: Ethernet 38 (with preamble, gap) + IP 20 + TCP 32
    slots: int = 64
    nfsd_threads: int = 8
    wsize: int = 1 << 20             # WRITEs (write-back of the log)


class Transport:
    """READ and WRITE RPCs through the client, the network and the server
    (the class docstring's pipeline); ``dev.io_pages`` is the mount's
    bdi->io_pages (rpages at mount)."""

    def __init__(self, net: Net, costs: RpcCosts, io_pages: int):
        self.net, self.c = net, costs
        self.dev = Device("nfs", 0, 1.0, 1.0, io_pages=io_pages)
        self.ns_per_byte = 8 / net.gbit_s
        self.slots = [0] * costs.slots
        self.threads = [0] * costs.nfsd_threads
        self.up = self.down = self.rpciod = 0
        self.requests = self.pages_read = self.pages_written = self.writes = 0
        self.down_bytes = 0            # bytes on the wire from the server

    def _wire(self, nbytes: int) -> int:
        """Bytes on the wire for a message of nbytes: TCP segments of mss."""
        return nbytes + -(-nbytes // self.c.mss) * self.c.frame_bytes

    def _rpc(self, now: int, send_bytes: int, reply_bytes: int, pages: int) -> int:
        c, half = self.c, self.net.rtt_ns // 2
        start = max(now, heapq.heappop(self.slots))
        self.up = max(start, self.up) + round(self._wire(send_bytes) * self.ns_per_byte)
        t = max(self.up + half, heapq.heappop(self.threads)) + c.server_ns + \
            pages * c.server_page_ns
        heapq.heappush(self.threads, t)
        wire = self._wire(reply_bytes)
        self.down_bytes += wire
        self.down = max(t, self.down) + round(wire * self.ns_per_byte)
        self.rpciod = max(self.down + half, self.rpciod) + c.client_ns + \
            pages * c.client_page_ns
        heapq.heappush(self.slots, self.rpciod)
        return self.rpciod

    def read(self, now: int, pages: int) -> int:
        """A READ of ``pages`` pages sent at ``now``: when its pages are up to date."""
        self.requests += 1
        self.pages_read += pages
        return self._rpc(now, self.c.request_bytes, self.c.reply_bytes + (pages << PAGE_SHIFT),
                         pages)

    def submit(self, now: int, pages: int, write: bool = False) -> int:
        """Sim.append()'s background write-back: WRITEs of up to wsize."""
        assert write, "reads go through read()"
        done, per = now, self.c.wsize >> PAGE_SHIFT
        for i in range(0, pages, per):
            n = min(per, pages - i)
            self.writes += 1
            self.pages_written += n
            done = self._rpc(now, self.c.request_bytes + (n << PAGE_SHIFT), self.c.reply_bytes,
                             n)
        return done


class NfsSim(Sim):
    """The page cache and readahead of ``readahead.sim.Sim`` over one NFS
    mount (id 0) of ``rsize`` bytes (as mounted: io_pages follows it).

    ``hook(sim, t_ns, kind, a)`` sees every tracepoint the nfs-rsize hook
    probes, in time order: READ (a: offset), DONE (a: ns since its READ was
    sent), PAGE (a: page index), RECLAIM (a: pages reclaimed); it may set
    ``sim.rsize`` (NFS_SERVER(inode)->rsize) and advance ``sim.now`` (CPU it
    costs the reading task).  ``trace``: a list that gets every event as
    (t_ns, kind, mount, a, rsize when it fired): kmlc.features.nfs's rows.
    """

    def __init__(self, net: Net, cache_pages: int, rsize: int, cpu: Cpu = Cpu(),
                 costs: RpcCosts = RpcCosts(), hook=None, trace: list | None = None):
        super().__init__(Device("nfs", 0, 1.0, 1.0), cache_pages, cpu)
        self.disk = Transport(net, costs, rsize >> PAGE_SHIFT)
        self.rsize = rsize
        self.nfs_hook, self.events = hook, trace
        self._inflight: list = []          # (done ns, seq, latency ns): replies to come
        self._seq = 0
        self.read_ns = self.nreads = 0

    # ---- tracepoints ------------------------------------------------------------------

    def _fire(self, t: int, kind: int, a: int) -> None:
        seen = self.rsize
        if self.nfs_hook is not None:
            self.nfs_hook(self, t, kind, a)
        if self.events is not None:
            self.events.append((t, kind, 0, a, seen))

    def _deliver(self, t: int) -> None:
        """nfs_readpage_done for every reply processed by time t."""
        inflight = self._inflight
        while inflight and inflight[0][0] <= t:
            done, _, lat = heapq.heappop(inflight)
            self._fire(done, DONE, lat)

    def emit(self, kind: int, a: int) -> None:
        """A tracepoint fires now (after the replies due by now)."""
        self._deliver(self.now)
        self._fire(self.now, kind, a)

    def drain(self) -> None:
        """Delivers the replies still to come (the end of a run)."""
        self._deliver(1 << 62)

    # ---- the page cache ---------------------------------------------------------------

    def _add(self, key: int, state: int) -> list:
        """filemap_add_folio(); when the cache is full, reclaim first frees a
        batch of SWAP_CLUSTER_MAX pages from the cold end of the LRU.  The
        page's list gets its index (for the READ's offset)."""
        if len(self.cache) >= self.capacity:
            n = 0
            while n < RECLAIM_BATCH and self.cache:
                _, victim = self.cache.popitem(last=False)
                if victim[STATE] == PREFETCHED:
                    self.stats.wasted += 1
                victim[STATE] = USED
                n += 1
            self.emit(RECLAIM, n)
        page = super()._add(key, state)
        page.append(key & INDEX_MASK)
        self.emit(PAGE, key & INDEX_MASK)
        return page

    def _submit(self, pages: list, write: bool = False) -> None:
        """read_pages() -> nfs_readahead() (or nfs_read_folio() for one page):
        READs of up to rsize bytes, the limit read when the descriptor is set
        up (a new rsize from the hook applies from the next run on)."""
        if not pages:
            return
        self._deliver(self.now)
        per = max(1, self.rsize >> PAGE_SHIFT)
        for i in range(0, len(pages), per):
            chunk = pages[i:i + per]
            sent = self.now
            self.emit(READ, chunk[0][PAGE_INDEX] << PAGE_SHIFT)
            self.now += self.disk.c.issue_ns
            done = self.disk.read(sent, len(chunk))
            for p in chunk:
                p[0] = done
            self._seq += 1
            heapq.heappush(self._inflight, (done, self._seq, done - sent))

    def read(self, f, pos: int, count: int) -> int:
        t0 = self.now
        got = super().read(f, pos, count)
        self.read_ns += self.now - t0
        self.nreads += 1
        return got

    # ---- metrics ----------------------------------------------------------------------

    def start_measuring(self) -> None:
        super().start_measuring()
        self.read_ns = self.nreads = 0
        self.disk.down_bytes = 0

    def result(self) -> dict:
        out = super().result()
        d, secs = self.disk, out["seconds"]
        out.update({
            "read_rpcs": d.requests,
            "mb_read_over_nfs": d.pages_read * PAGE_SIZE / 1e6,
            "mb_delivered": self.stats.bytes / 1e6,
            "wasted_mb": self.stats.wasted * PAGE_SIZE / 1e6,
            "mean_read_us": self.read_ns / self.nreads / 1e3 if self.nreads else 0.0,
            "rpcs_per_s": d.requests / secs if secs else 0.0,
            "downlink_busy": d.down_bytes * d.ns_per_byte / (secs * 1e9) if secs else 0.0,
            "rsize_end": self.rsize,
        })
        return out
