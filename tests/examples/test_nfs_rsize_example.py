"""examples/nfs_rsize: the NFS simulator against hand-computed RPCs, times
and page-cache behaviour, the learned policy against the compiled module's
own replay, and the one-command pipeline (quick mode) for reproducibility."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "nfs_rsize"
sys.path.insert(0, str(EXAMPLE.parent))

from nfs_rsize import nfs as N  # noqa: E402
from nfs_rsize.experiment import (ExploreHook, LearnedHook, ra_419, rsize_table,  # noqa: E402
                                  run)
from readahead import sim as S  # noqa: E402
from readahead.workloads import Db  # noqa: E402
from example_pipeline import (assert_one_line_errors, compile_with_hook,  # noqa: E402,F401
                              quick_runs, readme_results)

PAGE = S.PAGE_SIZE
LAN, WAN = N.NETS["lan"], N.NETS["wan"]
K, M = 1024, 1 << 20


def mount(rsize, net=LAN, cache=100_000, hook=None, pages=4096, **costs):
    trace: list = []
    sim = N.NfsSim(net, cache, rsize, costs=N.RpcCosts(**costs), hook=hook, trace=trace)
    return sim, S.File(0, pages * PAGE, 32), trace


def kinds(trace, kind):
    return [ev for ev in trace if ev[1] == kind]


# ---- the transport, by hand ----------------------------------------------------------

def lan_read_ns(pages):
    """One READ alone on the lan preset (0.2 ms RTT, 10 Gb/s = 0.8 ns a byte):
    request 250 B in one segment + 90 B of headers; server 12 us + 0.1 us a
    page; reply 150 B + data in 1448-byte segments, 90 B each on top;
    rpciod 5 us + 0.25 us a page."""
    reply = 150 + pages * PAGE
    segs = -(-reply // 1448)
    return (round(340 * 0.8) + 100_000 + 12_000 + 100 * pages
            + round((reply + 90 * segs) * 0.8) + 100_000 + 5_000 + 250 * pages)


def test_one_read_by_hand():
    t = N.Transport(LAN, N.RpcCosts(), 256)
    assert lan_read_ns(1) == 272 + 100_000 + 12_100 + 3_613 + 100_000 + 5_250 == 221_235
    assert t.read(0, 1) == 221_235
    assert (t.requests, t.pages_read) == (1, 1)
    # an idle transport later: the same again; a 32-page READ carries 91 segments
    assert t.read(10**9, 32) - 10**9 == lan_read_ns(32) == 272 + 215_200 + 111_530 + 13_000


def test_pipelining_slots_and_threads_by_hand():
    """Two slots, one nfsd thread, on the wan preset (2.5 ms each way, 1 Gb/s
    = 8 ns a byte): three 1-page READs at t=0.  The first two go out at
    once, the second waits for the server thread and the link; the third
    waits for a slot (the first's completion)."""
    t = N.Transport(WAN, N.RpcCosts(slots=2, nfsd_threads=1), 256)
    up, srv, down = 340 * 8, 12_100, 4516 * 8           # request, server, reply on the wire
    d1 = up + 2_500_000 + srv + down + 2_500_000 + 5_250
    assert t.read(0, 1) == d1
    # request 2 reaches the server 2.72 us after request 1, waits for the
    # thread, and its reply waits for the first's on the downlink
    assert t.read(0, 1) == d1 + down
    d3 = d1 + up + 2_500_000 + srv + down + 2_500_000 + 5_250
    assert t.read(0, 1) == d3


def test_write_back_uses_wsize_writes():
    t = N.Transport(LAN, N.RpcCosts(wsize=64 * K), 256)
    t.submit(0, 40, write=True)                # 40 pages in WRITEs of 16 pages
    assert (t.writes, t.pages_written, t.requests) == (3, 40, 0)


# ---- the NFS read path -------------------------------------------------------------

@pytest.mark.parametrize("rsize,reads", [(M, 7), (64 * K, 1 + 1 + 1 + 2 + 2 + 2 + 2),
                                         (4 * K, 4 + 8 + 16 + 32 + 32 + 32 + 32)])
def test_sequential_reads_split_windows_by_rsize(rsize, reads):
    """Pages 0..99 read one by one: readahead windows [0,4) [4,12) [12,28)
    [28,60) [60,92) [92,124) [124,156) (readahead example, hand-worked),
    each one nfs_readahead() run, cut into READs of rsize bytes."""
    sim, f, trace = mount(rsize)
    for p in range(100):
        sim.read(f, p * PAGE, PAGE)
    sim.drain()
    assert sim.disk.requests == reads == len(kinds(trace, N.READ)) == len(kinds(trace, N.DONE))
    assert sim.disk.pages_read == 156 == len(kinds(trace, N.PAGE))
    per = rsize // PAGE
    starts = [0, 4, 12, 28, 60, 92, 124]
    ends = starts[1:] + [156]
    want = [p * PAGE for s, e in zip(starts, ends) for p in range(s, e, per)]
    assert [ev[3] for ev in kinds(trace, N.READ)] == want
    assert sim.stats.misses == 1 and sim.stats.hits == 99


def test_random_read_by_hand_and_page_cache_hit():
    """One 1-page read at page 1000 (a standalone random read: just the
    page): syscall 1 us, page added 0.3 us, READ issued 2 us, wait for its
    reply, copy 0.4 us.  Reading it again is a hit: no RPC."""
    sim, f, trace = mount(M)
    sim.read(f, 1000 * PAGE, PAGE)
    done = 1_300 + lan_read_ns(1)
    assert sim.now == done + 400
    sim.drain()
    assert trace == [(1_300, N.PAGE, 0, 1000, M), (1_300, N.READ, 0, 1000 * PAGE, M),
                     (done, N.DONE, 0, lan_read_ns(1), M)]
    sim.read(f, 1000 * PAGE, PAGE)
    assert sim.now == done + 400 + 1_000 + 400
    assert sim.disk.requests == 1 and (sim.stats.hits, sim.stats.misses) == (1, 1)


def test_block_straddling_two_pages():
    """A 4101-byte RocksDB block at offset 4101 spans pages 1 and 2: one READ
    of 8 KiB, or two of 4 KiB, sent together: the read waits for the later."""
    for rsize, reads in ((M, 1), (4 * K, 2)):
        sim, f, trace = mount(rsize)
        f.ra.prev_pos = 100 * PAGE                 # not sequential, not at the start
        sim.read(f, 4101, 4101)
        assert sim.disk.requests == reads and sim.disk.pages_read == 2
    # the first 4 KiB READ is sent at 1.6 us; the second's reply arrives before
    # the first's is processed and waits for the rpciod CPU (5.25 us); a page
    # is copied while the second is still in flight
    assert sim.now == 1_600 + lan_read_ns(1) + 5_250 + 400


def test_new_rsize_applies_from_the_next_run():
    """A mount at 8 KiB and a hook that sets 4 KiB at the first READ: the
    window being sent keeps its descriptor's 8 KiB (two READs of 2 pages),
    the next window [4, 12) is eight READs of 1 page."""
    def hook(sim, t, kind, a):
        if kind == N.READ:
            sim.rsize = 4 * K
    sim, f, trace = mount(8 * K, hook=hook)
    sim.read(f, 0, PAGE)
    assert sim.disk.requests == 2 and sim.rsize == 4 * K
    sim.read(f, PAGE, PAGE)                            # the marker: window [4, 12)
    assert sim.disk.requests == 10
    assert [ev[3] // PAGE for ev in kinds(trace, N.READ)] == [0, 2, *range(4, 12)]
    assert [ev[4] for ev in kinds(trace, N.READ)] == [8 * K] + [4 * K] * 9


def test_reclaim_in_batches():
    """A 40-page cache: the 41st page added first reclaims 32 pages from the
    cold end (one reclaim event), so 9 stay."""
    sim, f, trace = mount(M, cache=40)
    for p in range(41):
        sim.read(f, (1000 + 7 * p) * PAGE, PAGE)   # 41 standalone random reads
    assert len(sim.cache) == 9
    rec = kinds(trace, N.RECLAIM)
    assert len(rec) == 1 and rec[0][3] == 32
    pages = [i for i, ev in enumerate(trace) if ev[1] == N.PAGE]
    assert trace.index(rec[0]) == pages[40] - 1     # right before the 41st page's add


def test_events_in_time_order_and_fixed_mounts():
    sim, f, trace = mount(M)
    for p in np.random.default_rng(0).integers(0, 4000, 300).tolist():
        sim.read(f, p * PAGE, 2 * PAGE)
    sim.drain()
    t = [ev[0] for ev in trace]
    assert t == sorted(t) and len(kinds(trace, N.DONE)) == sim.disk.requests
    assert ra_419(4 * K) == 15 and ra_419(M) == 3840
    assert run("readseq", "lan", "fixed-4k", Db(files=1, file_pages=256, cache_pages=512),
               seed=1, warm=0, measure=10)["read_rpcs"] > 0
    with pytest.raises(ValueError, match="unknown policy"):
        run("readseq", "lan", "fixed-4", Db(), seed=1, warm=0, measure=1)


# ---- the learned policy is the module's ------------------------------------------------

@pytest.fixture(scope="module")
def policy_dirs(tmp_path_factory):
    """The transparent test policy (readseq below 1024 x 4 KiB of mean READ
    offset difference, readrandom above) compiled fixed and float with the
    nfs-rsize hook."""
    from conftest import nfs_policy
    from kmlc.api import compile as kcompile

    m, cal = nfs_policy()
    d = tmp_path_factory.mktemp("nfspol")
    out = {}
    for numerics in ("fixed", "float"):
        out[numerics] = d / numerics
        kcompile(m, out[numerics], name="nfsp", numerics=numerics, targets=["kernel", "user"],
                 calibration=cal if numerics == "fixed" else None, hooks=["nfs-rsize"])
    return out


@pytest.mark.parametrize("numerics,vote", [("fixed", 1), ("float", 1), ("fixed", 3)])
def test_learned_policy_is_the_modules(policy_dirs, numerics, vote):
    """Sequential, random, then sequential reads over NFS under the learned
    policy: its windows, features, classes and rsize are the compiled hook's
    replay of the recorded events, and each decision is the mount's rsize
    from the closing event on (fixed point) or from the event after
    (float: the work item)."""
    from kmlc import features

    outdir = policy_dirs[numerics]
    assert rsize_table(outdir) == [4096, 4096, 262144, 262144]
    hook = LearnedHook(outdir, vote=vote, record=True)
    sim, f, trace = mount(M, hook=hook, pages=1 << 18, cache=8192)
    rng = np.random.default_rng(5)
    for phase in ("seq", "random", "seq"):
        for i in range(12_000 if phase == "seq" else 2_000):
            p = i if phase == "seq" else int(rng.integers(0, 1 << 18))
            sim.read(f, p * PAGE, PAGE)
            sim.think(30_000)
    sim.drain()
    ev = np.array(trace, dtype=np.int64)
    w = features.nfs(ev, window_ms=100, frac=hook.twin.hook_frac)
    assert len(w.raw) >= 10 and len(w.raw) == len(hook.windows)
    assert np.array_equal(w.raw, np.array([f for f, _, _ in hook.windows]))
    from kmlc.hooks import owner

    wants = [rsize_table(outdir)[c] for _, c, _ in hook.windows]
    rf, rd = hook.twin.replay(owner("nfs-rsize").rows_from_events(ev, w.closed_by, wants,
                                                                   vote=vote, orig=M))
    assert np.array_equal(rf, w.raw)
    assert rd.tolist() == [[c, r] for _, c, r in hook.windows]
    assert {0, 2} <= {c for _, c, _ in hook.windows}       # saw both kinds of reads
    assert {4096, 262144} <= {r for _, _, r in hook.windows}
    mount_events = np.flatnonzero(ev[:, 1] != N.RECLAIM)
    for i, (_, _, r) in zip(w.closed_by, hook.windows):
        # fixed: set at the closing event; float: at the mount's next event
        j = i if numerics == "fixed" else mount_events[np.searchsorted(mount_events, i + 1)]
        if j + 1 < len(ev):
            assert ev[j + 1, 4] == r, (i, j)


def test_explore_rows_are_kmlc_features():
    """Training rows (the stream, one event at a time) are the batch
    extractor's windows of the recorded trace, and rsize varies."""
    from kmlc import features

    hook, trace = ExploreHook(np.random.default_rng(0)), []
    run("readrandom", "lan", "explore", Db(files=2, file_pages=1024, cache_pages=1024),
        seed=4, warm=0, measure=6000, hook=hook, trace=trace)
    w = features.nfs(np.array(trace, dtype=np.int64), window_ms=100)
    assert len(hook.rows) >= 5
    assert np.array_equal(np.array(hook.rows), w.raw)
    assert len(set(w.raw[:, 7].tolist())) > 1


# ---- the pipeline ----------------------------------------------------------------------

@pytest.mark.torch
def test_quick_pipeline_is_reproducible(quick_runs):
    (da, a), (db_, b) = quick_runs
    for r in (a, b):
        r.pop("compile")           # kmlc's report names the output directory
    assert a == b
    assert (da / "nfs_rsize.onnx").read_bytes() == (db_ / "nfs_rsize.onnx").read_bytes()
    assert (da / "results" / "nfs_rsize.png").stat().st_size > 10_000
    res = a["results"]
    assert set(res) == {"lan", "wan"} and len(res["lan"]) == 5
    for per_p in res["wan"].values():
        assert set(per_p) == {"default", "fixed-4k", "fixed-256k", "learned-fixed",
                              "learned-float", "learned-fixed-v5", "learned-float-v5"}
        assert per_p["fixed-4k"]["read_rpcs"] >= per_p["default"]["read_rpcs"]
    assert a["agreement"]["all"]["windows"] > 0
    assert set(a["linux_4_19_readahead"]) == {"lan", "wan"}


def test_checked_in_model_compiles_with_the_hook(tmp_path):
    """From a fresh clone: the model and its calibration rows as checked in."""
    fx, fl = compile_with_hook(EXAMPLE / "nfs_rsize.onnx", EXAMPLE / "calibration.npy",
                               "nfs-rsize", tmp_path)
    assert (fx / "kernel" / "kml_nfs.c").is_file()
    assert rsize_table(fl) == [4096, 4096, 262144, 262144]


def test_readme_shows_the_checked_in_results():
    """The README's results section is results/results.md, as run.py wrote
    it, and results.json holds the full run's numbers."""
    block, r = readme_results(EXAMPLE)
    base = r["results"]["wan"]["readseq"]["default"]["throughput_mb_s"]
    assert f"| wan | readseq | {base:.2f} |" in block


def test_bad_arguments_fail_with_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    assert_one_line_errors(EXAMPLE, (
        (["--jobs", "0"], "--jobs must be at least 1"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--quick", "--workdir", str(tmp_path / "file" / "w")],
         f"[Errno 20] Not a directory: '{tmp_path / 'file' / 'w'}'")))
