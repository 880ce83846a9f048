"""db_bench-like workloads over a RocksDB-like file set.

The database is ``files`` SST-like files of ``file_pages`` pages, made of
data blocks of ``block_bytes`` (4 KiB plus RocksDB's 5-byte block trailer,
no compression), so most blocks straddle two pages, as in RocksDB.  Keys
are numbered in sorted order, ``keys_per_block`` to a block (16-byte keys,
100-byte values: db_bench's defaults).  The page cache holds half the
database (KML: 1 GiB of RAM, a 2 GiB database).

An operation is (kind, file, block, keys, cpu_ns): kind READ reads a block
with pread(), APPEND appends ``APPEND_BYTES`` to the write-ahead log (file
id ``files``); ``cpu_ns`` is the application's own CPU time for it.  Index
and filter blocks are taken to be in RocksDB's block cache (no page-cache
reads), and files are read without fadvise hints (``advise_random_on_open=
false``: with RocksDB's default hint, FMODE_RANDOM, Linux reads exactly the
requested pages whatever ra_pages is, and readahead tuning has nothing to
act on).

  readseq                 every block of every file, in order (an iterator)
  readreverse             every block, last file first, last block first
  readrandom              Gets of uniformly random keys
  readrandomwriterandom   90% Gets of random keys, 10% Puts (WAL appends);
                          memtable flushes and compactions are not modelled
  mixgraph                Cao et al. (FAST'20) / db_bench mixgraph op mix:
                          83% Get, 14% Put, 3% Seek followed by a scan whose
                          length in keys is generalized-Pareto (db_bench's
                          iter_k 2.517, iter_sigma 14.236), capped at
                          ``scan_cap_keys``; keys drawn with Pareto (Zipf,
                          s = 0.99) popularity, hot keys scattered over the
                          key space by a fixed permutation (hashed keys)

CPU costs per operation are calibrated so that, on the NVMe preset under
Linux's default readahead, readseq adds about 30K pages per second to the
page cache and mixgraph about 20K: the add_to_page_cache event rates the
KML paper reports (results/results.md prints the rates measured).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

READ, APPEND = 0, 1
APPEND_BYTES = 16 + 100 + 8          # key + value + record header
WORKLOADS = ("readseq", "readrandom", "readreverse", "readrandomwriterandom", "mixgraph")
# KML's four training classes, in the order of the hook's class table.
CLASSES = ("readrandom", "readrandomwriterandom", "readseq", "readreverse")


@dataclass(frozen=True)
class Db:
    files: int = 4
    file_pages: int = 16384          # 64 MiB, RocksDB's target_file_size_base
    block_bytes: int = 4101
    keys_per_block: int = 32
    cache_pages: int = 32768         # half the database
    scan_cap_keys: int = 2048

    @property
    def blocks_per_file(self) -> int:
        return self.file_pages * 4096 // self.block_bytes

    @property
    def keys(self) -> int:
        return self.files * self.blocks_per_file * self.keys_per_block


@dataclass(frozen=True)
class CpuCosts:
    """The application's CPU time, ns (db_bench with a warm block cache)."""
    next_key: int = 1_000            # an iterator's Next()
    get: int = 6_000                 # Get(): bloom filter, index search, block decode
    put: int = 4_000                 # Put(): memtable insert, WAL record
    seek: int = 8_000                # Seek()


def _ops(kind, file, block, cpu) -> np.ndarray:
    n = len(file)
    out = np.zeros((n, 4), dtype=np.int64)
    out[:, 0], out[:, 1], out[:, 2], out[:, 3] = kind, file, block, cpu
    return out


def generate(name: str, db: Db, n_ops: int, seed: int, cpu: CpuCosts = CpuCosts()) -> np.ndarray:
    """``n_ops`` operations of workload ``name`` as rows (kind, file, block,
    cpu_ns); sequential workloads wrap around the database."""
    rng = np.random.default_rng(seed)
    bpf = db.blocks_per_file
    nblocks = db.files * bpf
    per_block = db.keys_per_block * cpu.next_key
    if name in ("readseq", "readreverse"):
        b = np.arange(n_ops) % nblocks
        if name == "readreverse":
            b = nblocks - 1 - b
        return _ops(READ, b // bpf, b % bpf, per_block)
    if name == "readrandom":
        b = rng.integers(0, nblocks, n_ops)
        return _ops(READ, b // bpf, b % bpf, cpu.get)
    if name == "readrandomwriterandom":
        b = rng.integers(0, nblocks, n_ops)
        put = rng.random(n_ops) < 0.10
        return _ops(np.where(put, APPEND, READ), np.where(put, db.files, b // bpf), b % bpf,
                    np.where(put, cpu.put, cpu.get))
    if name == "mixgraph":
        return _mixgraph(db, n_ops, rng, cpu)
    raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")


def zipf_ranks(rng, n_keys: int, n: int, s: float = 0.99) -> np.ndarray:
    """Key ranks 0..n_keys-1 with P(rank r) proportional to (r+1)^-s."""
    cdf = np.cumsum(np.arange(1, n_keys + 1, dtype=np.float64) ** -s)
    return np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")


def _mixgraph(db: Db, n_ops: int, rng, cpu: CpuCosts) -> np.ndarray:
    kind = rng.choice(3, n_ops, p=[0.83, 0.14, 0.03])     # Get, Put, Seek
    perm = rng.permutation(db.keys)                        # rank -> key
    keys = perm[zipf_ranks(rng, db.keys, n_ops)]
    u = rng.random(n_ops)
    k, sigma = 2.517, 14.236                               # db_bench ParetoCdfInversion, theta 0
    scan = np.minimum(sigma * (u ** -k - 1) / k, db.scan_cap_keys).astype(np.int64) + 1
    rows = []
    bpf, kpb = db.blocks_per_file, db.keys_per_block
    nblocks = db.files * bpf
    for op, key, length in zip(kind.tolist(), keys.tolist(), scan.tolist()):
        blk = key // kpb
        if op == 0:
            rows.append((READ, blk // bpf, blk % bpf, cpu.get))
        elif op == 1:
            rows.append((APPEND, db.files, 0, cpu.put))
        else:   # Seek, then Next() over ``length`` keys: every block the scan touches
            last = min(nblocks - 1, (key + length - 1) // kpb)
            for j, b in enumerate(range(blk, last + 1)):
                nkeys = min((b + 1) * kpb, key + length) - max(b * kpb, key)
                rows.append((READ, b // bpf, b % bpf,
                             (cpu.seek if j == 0 else 0) + nkeys * cpu.next_key))
    return np.array(rows, dtype=np.int64)
