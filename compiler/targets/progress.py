"""Progress of a long kernel build: minutes of silence otherwise.

``watch(build, what, expected, log)`` is a context manager for the time a
build runs in the directory ``build`` (or until the event it yields is
set): every ``every`` seconds it logs how
many object files (``*.o``) the build has written since it began, of about
how many, and an estimate of the time left at the rate so far.  The
expected counts are those of the builds on our machines (``EXPECTED``);
a build that found most of its objects in place (a configuration change)
is a partial rebuild, and gets no estimate.  Nothing is counted before the
first report, so a build that ends sooner costs nothing.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path

# *.o files in a finished build directory (find BUILD -name '*.o' | wc -l):
# the debug kernel (kernels.DEBUG_CONFIG) and KUnit's UML and arm64 kernels
EXPECTED = {"debug": 1617, "kunit-um": 693, "kunit-arm64": 656}


def objects(build: Path, since: float) -> tuple[int, int]:
    """Object files under ``build``: all of them, and those modified at or
    after ``since``."""
    total = new = 0
    for p in build.rglob("*.o"):
        try:
            new += p.stat().st_mtime >= since
            total += 1
        except OSError:          # removed while we looked
            pass
    return total, new


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


class _Stop(threading.Event):
    """An event whose set() waits out a line being logged: once it returns,
    the watch logs nothing more."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def set(self):
        with self.lock:
            super().set()


@contextmanager
def watch(build: Path, what: str, expected: int | None, log=print, every: float = 60.0):
    build = Path(build)
    start = time.time()
    stop = _Stop()

    def run():
        partial = None           # decided at the first count: nothing is scanned up front
        while not stop.wait(every):
            # file times come from a coarse clock (a jiffy behind): a second of slack
            total, done = objects(build, start - 1.0) if build.is_dir() else (0, 0)
            if partial is None:
                partial = expected is not None and total - done > expected // 2
            text = line(what, done, None if partial else expected, time.time() - start)
            with stop.lock:
                if not stop.is_set():
                    log(text)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield stop              # set it to stop watching before the build ends
    finally:
        stop.set()
        t.join()
