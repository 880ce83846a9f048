"""A trace-driven page cache with Linux 6.1's on-demand readahead.

One single-threaded application reads files through a page cache of
bounded size (plain LRU) in front of one device, either with pread() or
through a shared file mapping (mmap).  The pread path mirrors mm/filemap.c
(filemap_read -> filemap_get_pages); the mmap path mirrors the read fault
(mm/memory.c do_read_fault -> do_fault_around -> filemap_map_pages, then
mm/filemap.c filemap_fault with its mmap read-around); readahead mirrors
mm/readahead.c function by function, including its quirks; each function
below names the kernel function it follows (Linux 6.1, as unpacked under
~/.cache/kmlc/linux-source-6.1).  What is not modelled:

* large folios (ext4 in 6.1 has none, so page_cache_ra_order() always takes
  its do_page_cache_ra() fallback), FMODE_RANDOM and madvise hints
  (VM_RAND_READ/VM_SEQ_READ), transparent huge pages, the fault retry
  after dropping mmap_lock (it finds the page and does nothing else), and
  blk-cgroup congestion;
* Linux's active/inactive LRU lists: one LRU list, and pages added by
  readahead enter it at the most-recently-used end;
* writeback of dirty pages is a background device transfer; dirty pages are
  never read back (the workloads only write append-only logs).

Time is simulated, in integer nanoseconds: CPU costs (the application's own,
plus per syscall and per page) advance the clock; a read that needs a page
whose I/O has not completed waits for it.  Device requests follow
``Disk.submit``: a fixed latency per request that overlaps with other
requests in flight, and transfers that share the device's bandwidth one
after another.

The readahead decision points are page_cache_sync_ra(),
page_cache_async_ra() and a fault on a page that is not cached (where
filemap_fault() calls do_sync_mmap_readahead()), where the kmlc readahead
hook's probes (ftrace callbacks) sit: every one goes to ``Sim.hook(sim, file, index, t_ns)``
first (it may change
``file.ra.ra_pages``, as the hook does) and, with ``Sim.trace`` set, is
recorded as {time ns, file id, page index, ra_pages as the hook saw it}:
the event stream the hook sees and kmlc.features consumes.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

PAGE_SHIFT = 12
PAGE_SIZE = 1 << PAGE_SHIFT
ULONG_MAX = (1 << 64) - 1
KEY_SHIFT = 40            # cache key: file id << KEY_SHIFT | page index

# Page states, for the metrics only (the kernel has no such thing).
USED = 0                  # read by the application at least once (or written)
PREFETCHED_WARM = 1       # added by readahead during warm-up, not read yet
PREFETCHED = 2            # added by readahead while measuring, not read yet
DEMAND = 3                # added for the read that is waiting for it

# A cached page: [ready ns, PG_readahead, state, mapped in the application's page table]
READY, MARKED, STATE, MAPPED = range(4)
FAULT_AROUND_PAGES = 16   # mm/memory.c fault_around_bytes: 64 KiB
MMAP_LOTSAMISS = 100      # mm/filemap.c


@dataclass(frozen=True)
class Device:
    """Per-request latency (overlapping across requests in flight) plus a
    transfer at the device's bandwidth (serialized)."""
    name: str
    latency_ns: int
    read_mb_s: float
    write_mb_s: float
    io_pages: int = 320   # bdi->io_pages: 6.1's default max_sectors_kb 1280 / 4 KiB

    def page_ns(self, write: bool = False) -> float:
        return PAGE_SIZE * 1e3 / (self.write_mb_s if write else self.read_mb_s)


# Presets: the two device classes of the KML paper (README, "Devices").
#   SATA: Intel DC S3700 200 GB (the paper's SATA SSD) datasheet: sustained
#         sequential read 500 MB/s, write 460 MB/s, read latency 50 us typical.
#   NVMe: PCIe 3.0 x4 MLC NVMe of the paper's Samsung generation (950 PRO /
#         SM951 datasheets): sequential read 2.5 GB/s, write 1.5 GB/s,
#         4 KiB random read at queue depth 1 about 12K IOPS, i.e. ~83 us per
#         read: 80 us latency + 1.6 us transfer.
DEVICES = {
    "nvme": Device("nvme", 80_000, 2500.0, 1500.0),
    "sata": Device("sata", 50_000, 500.0, 460.0),
}


@dataclass(frozen=True)
class Cpu:
    """CPU time the kernel spends per read() call and per page; the
    application's own time per operation is the workload's."""
    syscall_ns: int = 1_000        # pread entry/exit, VFS
    copy_ns: int = 400             # copy one page to user space (~10 GB/s)
    insert_ns: int = 300           # allocate a page, add it to the cache and LRU, set up I/O
    fault_ns: int = 1_000          # a page fault: entry, VMA lookup, page table walk
    map_ns: int = 100              # fault-around: map one cached page
    # The learned policy's hook (kml_ra.c): per hooked call, an ftrace
    # callback (at most a kprobe through ftrace, which is one plus the
    # kprobe's own work; Documentation/trace/kprobes.rst: 0.06 us for an
    # optimized probe on a 2.33 GHz Xeon), the set's lock and the window
    # step (benchmarks.md "Hook feature steps": 5.5 ns); per inference, the
    # model and setting ra_pages: kmlc's readahead model takes 120 ns
    # (p99 190 ns, benchmarks.md, `make bench`), and a float model adds its
    # work item and FPU section (fpu_cost.md: 179 ns on a first call).
    # Both are charged at several times that.  (KML's 21 us per inference
    # is its own float code's, not kmlc's.)
    hook_event_ns: int = 250
    hook_infer_ns: int = 1_000


class Disk:
    def __init__(self, dev: Device):
        self.dev = dev
        self.free = 0              # when the transfer channel is next free
        self.read_ns, self.write_ns = dev.page_ns(), dev.page_ns(True)
        self.requests = self.pages_read = self.pages_written = 0

    def submit(self, now: int, pages: int, write: bool = False) -> int:
        """A request of ``pages`` contiguous pages issued at ``now``; returns
        its completion time.  Its latency runs in parallel with earlier
        requests; its transfer starts once the latency has passed and the
        channel is free."""
        done = max(now + self.dev.latency_ns, self.free) + \
            round(pages * (self.write_ns if write else self.read_ns))
        self.free = done
        self.requests += 1
        if write:
            self.pages_written += pages
        else:
            self.pages_read += pages
        return done


class RaState:
    """struct file_ra_state (include/linux/fs.h)."""
    __slots__ = ("start", "size", "async_size", "ra_pages", "mmap_miss", "prev_pos")

    def __init__(self, ra_pages: int):
        # file_ra_state_init(): ra_pages from the bdi, prev_pos = -1
        self.start = self.size = self.async_size = self.mmap_miss = 0
        self.ra_pages = ra_pages
        self.prev_pos = -1


class File:
    __slots__ = ("id", "isize", "ra", "base")

    def __init__(self, fid: int, isize: int, ra_pages: int):
        self.id, self.isize, self.ra = fid, isize, RaState(ra_pages)
        self.base = fid << KEY_SHIFT


def roundup_pow_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def get_init_ra_size(size: int, max_pages: int) -> int:
    """mm/readahead.c get_init_ra_size(): the first window, from the request
    size: x4 when small, x2 when medium, else the maximum."""
    newsize = roundup_pow_of_two(size)
    if newsize <= max_pages // 32:
        return newsize * 4
    if newsize <= max_pages // 4:
        return newsize * 2
    return max_pages


def get_next_ra_size(cur: int, max_pages: int) -> int:
    """mm/readahead.c get_next_ra_size(): ramp-up, x4 then x2 up to max."""
    if cur < max_pages // 16:
        return 4 * cur
    if cur <= max_pages // 2:
        return 2 * cur
    return max_pages


class Stats:
    __slots__ = ("bytes", "ops", "reads", "pages", "hits", "misses", "prefetched", "used",
                 "wasted", "sync_calls", "async_calls", "fault_calls", "faults", "added",
                 "wait_ns", "t0", "t1")

    def __init__(self):
        for k in self.__slots__:
            setattr(self, k, 0)


class Sim:
    """The page cache, the device and the kernel's read and readahead code.

    ``hook(sim, file, index, t_ns)``: called at the entry of
    page_cache_sync_ra() and page_cache_async_ra(), and of filemap_fault()
    for a page that is not cached, like the kmlc hook's probes; it may
    change ``file.ra.ra_pages`` and returns the ra_pages its
    window saw (None: the file's, unchanged).  ``trace``: a list to which
    each of those calls is appended as (t_ns, file id, index, ra_pages), with
    the ra_pages the hook saw: what the module's trace=1 records.
    """

    def __init__(self, device: Device, cache_pages: int, cpu: Cpu = Cpu(), hook=None,
                 trace: list | None = None):
        self.disk = Disk(device)
        self.cpu = cpu
        self.capacity = cache_pages
        self.cache: OrderedDict[int, list] = OrderedDict()  # key -> page (READY, ...)
        self.now = 0
        self.hook = hook
        self.trace = trace
        self.measuring = False
        self.stats = Stats()

    # ---- metrics ------------------------------------------------------------------

    def start_measuring(self) -> None:
        """Counters restart here; pages prefetched before stay warm-up pages."""
        self.stats = Stats()
        self.stats.t0 = self.now
        self.disk.requests = self.disk.pages_read = self.disk.pages_written = 0
        self.measuring = True

    def result(self) -> dict:
        s = self.stats
        s.t1 = self.now
        secs = (s.t1 - s.t0) / 1e9
        return {
            "seconds": secs,
            "throughput_mb_s": s.bytes / 1e6 / secs if secs else 0.0,
            "ops_per_s": s.ops / secs if secs else 0.0,
            "hit_ratio": s.hits / s.pages if s.pages else 0.0,
            "io_wait": s.wait_ns / (s.t1 - s.t0) if s.t1 > s.t0 else 0.0,
            "prefetched": s.prefetched,
            "prefetch_accuracy": s.used / s.prefetched if s.prefetched else 0.0,
            "wasted_pages": s.wasted,
            "pages_added_per_s": s.added / secs if secs else 0.0,
            "ra_calls_per_s": (s.sync_calls + s.async_calls + s.fault_calls) / secs
            if secs else 0.0,
            "sync_calls": s.sync_calls,
            "async_calls": s.async_calls,
            "fault_calls": s.fault_calls,
            "faults": s.faults,
            "device_requests": self.disk.requests,
            "device_pages_read": self.disk.pages_read,
        }

    # ---- the page cache --------------------------------------------------------------

    def _add(self, key: int, state: int) -> list:
        """filemap_add_folio(): a new page, locked until its I/O completes,
        at the LRU's most-recently-used end; evicts the least recently used
        page when the cache is full."""
        cache = self.cache
        if len(cache) >= self.capacity:
            _, victim = cache.popitem(last=False)
            if victim[STATE] == PREFETCHED:
                self.stats.wasted += 1
            victim[STATE] = USED    # a read still holding it (a batch) is not a prefetch hit
        page = [ULONG_MAX, False, state, False]
        cache[key] = page
        self.now += self.cpu.insert_ns
        self.stats.added += 1
        return page

    def _submit(self, pages: list, write: bool = False) -> None:
        """read_pages(): one request for a run of contiguous new pages."""
        if pages:
            done = self.disk.submit(self.now, len(pages), write)
            for p in pages:
                p[READY] = done

    def page_cache_next_miss(self, f: File, index: int, max_scan: int) -> int:
        """mm/filemap.c page_cache_next_miss() as 6.1 has it: checks index,
        index+1, ... (an XA_STATE starts *at* index); returns the first gap,
        or the last index checked when there is none."""
        cache, base = self.cache, f.base
        i = index
        for step in range(max_scan):
            if step:
                i += 1
            if base | i not in cache:
                break
        return i

    def page_cache_prev_miss(self, f: File, index: int, max_scan: int) -> int:
        """mm/filemap.c page_cache_prev_miss() as 6.1 has it: checks index,
        index-1, ...; returns the first gap, ULONG_MAX when it runs below
        page 0, or the last index checked (a cached page) when there is no
        gap in max_scan pages."""
        cache, base = self.cache, f.base
        i = index
        for step in range(max_scan):
            if step:
                i -= 1
            if i < 0:
                return ULONG_MAX
            if base | i not in cache:
                break
        return i

    # ---- mm/readahead.c ------------------------------------------------------------

    def page_cache_ra_unbounded(self, f: File, index: int, nr_to_read: int,
                                lookahead_size: int) -> None:
        """Adds the pages of [index, index + nr_to_read) that are not cached,
        marks the one at nr_to_read - lookahead_size with PG_readahead (not
        if it was already cached), and issues one request per contiguous run
        of new pages."""
        cache, base = self.cache, f.base
        state = PREFETCHED if self.measuring else PREFETCHED_WARM
        demand_lo, demand_hi = self._demand
        run = []
        for i in range(nr_to_read):
            key = base | (index + i)
            if key in cache:
                self._submit(run)       # kick off the batch before the cached page
                run = []
                continue
            pg = index + i
            is_demand = demand_lo <= pg < demand_hi
            page = self._add(key, DEMAND if is_demand else state)
            if not is_demand:
                self.stats.prefetched += self.measuring
            if i == nr_to_read - lookahead_size:
                page[MARKED] = True
            run.append(page)
        self._submit(run)

    def do_page_cache_ra(self, f: File, index: int, nr_to_read: int,
                         lookahead_size: int) -> None:
        """do_page_cache_ra(): never reads past the page with the file's last byte."""
        if f.isize == 0:
            return
        end_index = (f.isize - 1) >> PAGE_SHIFT
        if index > end_index:
            return
        if nr_to_read > end_index - index:
            nr_to_read = end_index - index + 1
        self.page_cache_ra_unbounded(f, index, nr_to_read, lookahead_size)

    def force_page_cache_ra(self, f: File, index: int, nr_to_read: int) -> None:
        """force_page_cache_ra(): the request only, in 2 MiB chunks (ra_pages 0)."""
        nr_to_read = min(nr_to_read, max(self.disk.dev.io_pages, f.ra.ra_pages))
        while nr_to_read:
            chunk = min(512, nr_to_read)
            self.do_page_cache_ra(f, index, chunk, 0)
            index += chunk
            nr_to_read -= chunk

    def count_history_pages(self, f: File, index: int, max_pages: int) -> int:
        """count_history_pages(): cached pages right before index (unsigned)."""
        head = self.page_cache_prev_miss(f, index - 1, max_pages)
        return (index - 1 - head) & ULONG_MAX

    def try_context_readahead(self, f: File, index: int, req_size: int,
                              max_pages: int) -> bool:
        """try_context_readahead(): a read after enough cached history pages is
        treated as a sequential stream; async_size 1 puts the marker on the
        window's last page."""
        ra = f.ra
        size = self.count_history_pages(f, index, max_pages)
        if size <= req_size:        # not enough history pages: it could be a random read
            return False
        if size >= index:           # starts from the beginning of the file
            size *= 2
        ra.start = index
        ra.size = min(size + req_size, max_pages)
        ra.async_size = 1
        return True

    def ondemand_readahead(self, f: File, index: int, marked: bool, req_size: int) -> None:
        """ondemand_readahead(); ``marked``: called for a folio with
        PG_readahead (page_cache_async_ra), not for a miss."""
        ra = f.ra
        max_pages = ra.ra_pages
        # If the request exceeds the readahead window, allow up to the optimal I/O size.
        if req_size > max_pages and self.disk.dev.io_pages > max_pages:
            max_pages = min(req_size, self.disk.dev.io_pages)
        if index == 0:                                    # start of file
            return self._initial(f, index, req_size, max_pages)
        # The expected callback index: assume sequential access, ramp up.
        expected = ra.start + ra.size - ra.async_size     # round_down(.., 1 << 0)
        if index == expected or index == ra.start + ra.size:
            ra.start += ra.size
            ra.size = max(ra.size, get_next_ra_size(ra.size, max_pages))
            ra.async_size = ra.size
            return self._readit(f, index, max_pages)
        # Hit a marked folio without valid readahead state (e.g. interleaved
        # reads): take the cached run after it as the old async_size, ramp up.
        if marked:
            start = self.page_cache_next_miss(f, index + 1, max_pages)
            if not start or start - index > max_pages:
                return
            ra.start = start
            ra.size = start - index + req_size
            ra.size = get_next_ra_size(ra.size, max_pages)
            ra.async_size = ra.size
            return self._readit(f, index, max_pages)
        if req_size > max_pages:                          # oversize read
            return self._initial(f, index, req_size, max_pages)
        # Sequential cache miss: index - prev_index is 1 (trivial) or 0 (unaligned),
        # in unsigned arithmetic.
        prev_index = (ra.prev_pos & ULONG_MAX) >> PAGE_SHIFT
        if (index - prev_index) & ULONG_MAX <= 1:
            return self._initial(f, index, req_size, max_pages)
        # Look for the cached history a sequential stream would leave behind.
        if self.try_context_readahead(f, index, req_size, max_pages):
            return self._readit(f, index, max_pages)
        # Standalone, small random read: read as is, leave the readahead state alone.
        self.do_page_cache_ra(f, index, req_size, 0)

    def _initial(self, f: File, index: int, req_size: int, max_pages: int) -> None:
        """ondemand_readahead(), label initial_readahead."""
        ra = f.ra
        ra.start = index
        ra.size = get_init_ra_size(req_size, max_pages)
        ra.async_size = ra.size - req_size if ra.size > req_size else ra.size
        self._readit(f, index, max_pages)

    def _readit(self, f: File, index: int, max_pages: int) -> None:
        """ondemand_readahead(), label readit: if this read would hit the
        marker of its own window, merge the next window into this one; then
        page_cache_ra_order(), which without large folios is
        do_page_cache_ra(ra->start, ra->size, ra->async_size)."""
        ra = f.ra
        if index == ra.start and ra.size == ra.async_size:
            add_pages = get_next_ra_size(ra.size, max_pages)
            if ra.size + add_pages <= max_pages:
                ra.async_size = add_pages
                ra.size += add_pages
            else:
                ra.size = max_pages
                ra.async_size = max_pages >> 1
        self.do_page_cache_ra(f, ra.start, ra.size, ra.async_size)

    def _event(self, f: File, index: int) -> None:
        """The probes on page_cache_sync_ra()/page_cache_async_ra(), and on
        filemap_fault() for a page that is not cached."""
        t = self.now
        seen = self.hook(self, f, index, t) if self.hook is not None else None
        if self.trace is not None:
            self.trace.append((t, f.id, index, f.ra.ra_pages if seen is None else seen))

    def page_cache_sync_ra(self, f: File, index: int, req_count: int) -> None:
        """page_cache_sync_ra(): a read missed the cache at index."""
        self._event(f, index)
        self.stats.sync_calls += 1
        if not f.ra.ra_pages:   # readahead disabled: read just the page
            return self.force_page_cache_ra(f, index, 1)
        self.ondemand_readahead(f, index, False, req_count)

    def page_cache_async_ra(self, f: File, index: int, page: list, req_count: int) -> None:
        """page_cache_async_ra(): a read reached a page marked PG_readahead."""
        self._event(f, index)
        self.stats.async_calls += 1
        if not f.ra.ra_pages:
            return
        page[MARKED] = False         # folio_clear_readahead(); never under writeback here
        self.ondemand_readahead(f, index, True, req_count)

    # ---- mm/filemap.c ------------------------------------------------------------------

    def _read_batch(self, f: File, index: int, last: int) -> list:
        """filemap_get_read_batch(): the cached pages from index on, up to
        last; stops at a gap, and after a page that is not up to date or is
        marked PG_readahead."""
        cache, base, now = self.cache, f.base, self.now
        batch = []
        for i in range(index, last + 1):
            page = cache.get(base | i)
            if page is None:
                break
            batch.append((i, page))
            if page[READY] > now or page[MARKED]:
                break
        return batch

    def read(self, f: File, pos: int, count: int) -> int:
        """pread(fd, count, pos): filemap_read().  Returns the bytes read."""
        self.now += self.cpu.syscall_ns
        want = pos + count                  # iocb->ki_pos + iter->count
        end = min(want, f.isize)
        got = 0
        st = self.stats
        while pos < end:
            # filemap_get_pages()
            index = pos >> PAGE_SHIFT
            last_index = (want + PAGE_SIZE - 1) >> PAGE_SHIFT
            batch = self._read_batch(f, index, last_index - 1)
            if not batch:
                self._demand = (index, last_index)
                self.page_cache_sync_ra(f, index, last_index - index)
                self._demand = (0, 0)
                batch = self._read_batch(f, index, last_index - 1)
            if not batch:
                # filemap_create_folio(): readahead did not add the page; read it alone
                page = self._add(f.base | index, DEMAND)
                self._submit([page])
                batch = [(index, page)]
            i, page = batch[-1]
            if page[MARKED]:                                              # filemap_readahead()
                self._demand = (i, last_index)
                self.page_cache_async_ra(f, i, page, last_index - i)
                self._demand = (0, 0)
            self._wait(page)                                              # filemap_update_page()
            # copy the batch; prev_pos follows each page copied
            for i, page in batch:
                self._use(f.base | i, page)
                n = min(end, (i + 1) << PAGE_SHIFT) - pos
                pos += n
                got += n
                self.now += self.cpu.copy_ns
            f.ra.prev_pos = pos
        st.bytes += got
        st.reads += 1
        return got

    _demand = (0, 0)   # pages the current read is waiting for (for the metrics)

    def _wait(self, page: list) -> None:
        """The reader waits until the page's I/O has completed."""
        if page[READY] > self.now:
            self.stats.wait_ns += page[READY] - self.now
            self.now = page[READY]

    def _use(self, key: int, page: list) -> None:
        """The application reads a page it has (metrics, and the LRU)."""
        st = self.stats
        if key in self.cache:
            self.cache.move_to_end(key)
        state = page[STATE]
        if state == DEMAND:
            st.misses += 1
        else:
            st.hits += 1
            st.used += state == PREFETCHED
        page[STATE] = USED
        st.pages += 1

    def mmap_read(self, f: File, pos: int, count: int) -> int:
        """Reads [pos, pos + count) through a shared mapping of the whole file
        (no madvise): a page already in the page table is read as is (and
        touches the LRU, as its accessed bit would on reclaim); any other
        page faults (``fault``).  Returns the bytes read."""
        end = min(pos + count, f.isize)
        if end <= pos:
            return 0
        cache, base = self.cache, f.base
        for i in range(pos >> PAGE_SHIFT, ((end - 1) >> PAGE_SHIFT) + 1):
            page = cache.get(base | i)
            if page is None or not page[MAPPED]:
                page = self.fault(f, i)
            self._use(base | i, page)
        self.stats.bytes += end - pos
        self.stats.reads += 1
        return end - pos

    def fault(self, f: File, index: int) -> list:
        """A read fault on page ``index`` of a shared file mapping: mm/memory.c
        do_read_fault(): do_fault_around() first (filemap_map_pages()), then
        filemap_fault() if that did not map the page; waits for the page and
        maps it (finish_fault()).  Returns the page."""
        cache, base, cpu, ra = self.cache, f.base, self.cpu, f.ra
        self.now += cpu.fault_ns
        self.stats.faults += 1
        # do_fault_around() -> filemap_map_pages(): the 16-page aligned block
        # around the fault; each cached page that is up to date, unlocked and
        # not marked PG_readahead counts as an mmap hit (mmap_miss--), and is
        # mapped unless it already is.
        lo = index & -FAULT_AROUND_PAGES
        hi = min(lo + FAULT_AROUND_PAGES - 1, (f.isize - 1) >> PAGE_SHIFT)
        now = self.now
        for i in range(lo, hi + 1):
            page = cache.get(base | i)
            if page is None or page[READY] > now or page[MARKED]:
                continue
            if ra.mmap_miss > 0:
                ra.mmap_miss -= 1
            if not page[MAPPED]:
                page[MAPPED] = True
                self.now += cpu.map_ns
        page = cache.get(base | index)
        if page is not None and page[MAPPED]:
            return page
        # filemap_fault()
        self._demand = (index, index + 1)
        if page is not None:
            self._async_mmap_readahead(f, index, page)
        else:
            self._sync_mmap_readahead(f, index)
            page = cache.get(base | index)
            if page is None:     # __filemap_get_folio(FGP_CREAT), filemap_read_folio()
                page = self._add(base | index, DEMAND)
                self._submit([page])
        self._demand = (0, 0)
        self._wait(page)                 # lock_folio_maybe_drop_mmap()
        page[MAPPED] = True
        return page

    def _sync_mmap_readahead(self, f: File, index: int) -> None:
        """mm/filemap.c do_sync_mmap_readahead(), after the hook's probe on
        filemap_fault(): mmap read-around, ra_pages centred on the fault with
        the marker a quarter from its end, unless the file has missed more
        than MMAP_LOTSAMISS times more than it hit."""
        self._event(f, index)
        self.stats.fault_calls += 1
        ra = f.ra
        if not ra.ra_pages:
            return
        if ra.mmap_miss < MMAP_LOTSAMISS * 10:
            ra.mmap_miss += 1
        if ra.mmap_miss > MMAP_LOTSAMISS:
            return
        ra.start = max(0, index - ra.ra_pages // 2)
        ra.size = ra.ra_pages
        ra.async_size = ra.ra_pages // 4
        self.do_page_cache_ra(f, ra.start, ra.size, ra.async_size)   # page_cache_ra_order()

    def _async_mmap_readahead(self, f: File, index: int, page: list) -> None:
        """mm/filemap.c do_async_mmap_readahead(): a fault that found its page
        cached (but not mapped by fault-around) is an mmap hit; a marked
        page starts asynchronous readahead of ra_pages."""
        ra = f.ra
        if not ra.ra_pages:
            return
        if ra.mmap_miss:
            ra.mmap_miss -= 1
        if page[MARKED]:
            self.page_cache_async_ra(f, index, page, ra.ra_pages)

    def append(self, f: File, nbytes: int, flush_pages: int = 256) -> None:
        """write() appending to a log: new pages enter the cache dirty (no
        read, no readahead); every ``flush_pages`` full pages go to the
        device as one background write (writeback)."""
        self.now += self.cpu.syscall_ns
        old = f.isize
        f.isize += nbytes
        for i in range((old + PAGE_SIZE - 1) >> PAGE_SHIFT,
                       (f.isize + PAGE_SIZE - 1) >> PAGE_SHIFT):
            page = self._add(f.base | i, USED)
            page[READY] = self.now
            self.now += self.cpu.copy_ns
        full = f.isize >> PAGE_SHIFT
        if full // flush_pages > (old >> PAGE_SHIFT) // flush_pages:
            self.disk.submit(self.now, flush_pages, write=True)

    def think(self, ns: int) -> None:
        """The application's own CPU time."""
        self.now += ns
