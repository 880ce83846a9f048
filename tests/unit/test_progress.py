"""Progress of long kernel builds (kmlc.targets.progress): object files
counted as the build writes them, an estimate from the rate so far, no
estimate for a partial rebuild, and silence once stopped."""
import threading
import time

from kmlc.targets import progress


def test_line_estimates_from_the_rate_so_far():
    # 500 of 2000 in 10 minutes: 1500 more at 50 a minute
    assert progress.line("kmlc: building X", 500, 2000, 600.0) == \
        "kmlc: building X: 500 object files of about 2,000, 10 min so far, about 30 min left"
    assert progress.line("b", 0, 2000, 30.0) == "b: 0 object files of about 2,000, 30 s so far"
    assert progress.line("b", 2100, 2000, 120.0).endswith(", 2 min so far, finishing")
    assert progress.line("b", 7, None, 61.0) == "b: 7 object files, 61 s so far"


def test_watch_counts_the_objects_the_build_writes(tmp_path):
    (tmp_path / "old.o").write_bytes(b"")          # from before: not counted
    old = time.time() - 100
    import os
    os.utime(tmp_path / "old.o", (old, old))
    got, done = [], threading.Event()

    def build():
        for i in range(6):
            (tmp_path / "d").mkdir(exist_ok=True)
            (tmp_path / "d" / f"{i}.o").write_bytes(b"")
            (tmp_path / "d" / f"{i}.c").write_bytes(b"")
            time.sleep(0.03)
        done.set()
    with progress.watch(tmp_path, "w", 12, got.append, every=0.02):
        threading.Thread(target=build).start()
        done.wait(5)
        time.sleep(0.05)
    n = len(got)
    time.sleep(0.1)
    assert len(got) == n > 2                        # silent once the build is over
    counts = [int(s.split(": ")[1].split()[0]) for s in got]
    assert counts == sorted(counts) and counts[-1] == 6
    assert all(" of about 12, " in s for s in got) and "left" in got[-1]


def test_a_partial_rebuild_gets_no_estimate_and_stop_ends_the_watch(tmp_path):
    import os

    old = time.time() - 100
    for i in range(8):
        (tmp_path / f"{i}.o").write_bytes(b"")
        os.utime(tmp_path / f"{i}.o", (old, old))
    got = []
    with progress.watch(tmp_path, "w", 10, got.append, every=0.02) as stop:
        time.sleep(0.1)
        stop.set()
        n = len(got)
        time.sleep(0.1)
    assert n > 0 and len(got) == n
    assert all(s.startswith("w: 0 object files, ") and "about" not in s for s in got)
