"""Progress of a long kernel build: minutes of silence otherwise.

``watch(build, what, expected, log)`` is a context manager for the time a
build runs in the directory ``build`` (or until the event it yields is
set): every ``every`` seconds it logs how
many object files (``*.o``) the build has written since it began, of about
how many, and an estimate of the time left at the rate so far.  The
expected counts are those of the builds on our machines (``EXPECTED``);
a build that starts with most of its objects in place (a configuration
change) is a partial rebuild, and gets no estimate.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path

# *.o files in a finished build directory (find BUILD -name '*.o' | wc -l):
# the debug kernel (kernels.DEBUG_CONFIG) and KUnit's UML and x86_64 kernels
EXPECTED = {"debug": 1678, "kunit-um": 693, "kunit-x86_64": 1426}


def objects(build: Path, since: float = 0.0) -> int:
    """Object files under ``build`` modified at or after ``since``."""
    n = 0
    for p in build.rglob("*.o"):
        try:
            n += p.stat().st_mtime >= since
        except OSError:          # removed while we looked
            pass
    return n


def minutes(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 90 else f"{s:.0f} s"


def line(what: str, done: int, expected: int | None, elapsed: float) -> str:
    """One progress line: objects so far, and with ``expected``, of about
    how many and the time left at the rate so far."""
    text = f"{what}: {done:,} object files"
    if expected:
        text += f" of about {expected:,}"
    text += f", {minutes(elapsed)} so far"
    if expected and done:
        left = max(expected - done, 0) * elapsed / done
        text += f", about {minutes(left)} left" if done < expected else ", finishing"
    return text


@contextmanager
def watch(build: Path, what: str, expected: int | None, log=print, every: float = 60.0):
    build = Path(build)
    start = time.time()
    before = objects(build) if build.is_dir() else 0
    partial = expected is not None and before > expected // 2
    stop = threading.Event()

    def run():
        while not stop.wait(every):
            # file times come from a coarse clock (a jiffy behind): a second of slack
            done = objects(build, start - 1.0) if build.is_dir() else 0
            log(line(what, done, None if partial else expected, time.time() - start))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield stop              # set it to stop watching before the build ends
    finally:
        stop.set()
        t.join()
