"""Module builds kept between runs (compiler/targets/buildcache.py): the
same sources for the same kernel reuse Kbuild's objects, anything Kbuild
finds out of date is built again from scratch, and a warning or error is
never hidden by a build kept from before."""
from __future__ import annotations

import shutil
import time

import pytest

from conftest import mlp_model
from kmlc.api import compile as kcompile
from kmlc.errors import KmlcError
from kmlc.targets import buildcache, kernel

pytestmark = pytest.mark.kernel


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KMLC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KMLC_MODULE_CACHE", raising=False)
    return tmp_path / "cache" / "modules"


def model(tmp_path, name, seed=0):
    kcompile(mlp_model([4, 6, 2], seed=seed), tmp_path / name, name=name, targets="kernel")
    return tmp_path / name / "kernel"


def objects(d):
    return {p.name: p.stat().st_mtime_ns for p in d.glob("*.o")}


def test_same_sources_reuse_the_objects_and_a_stale_one_rebuilds_all(tmp_path, cache):
    a = model(tmp_path, "bca")
    ko = kernel.build_module(a)
    [stage] = [d for d in cache.iterdir() if d.is_dir()]
    built = objects(stage)
    log = (a / "build.log").read_text()
    # every object compiled, and the log names OUTDIR/kernel, not the kept directory
    assert len(built) >= 4 and all(f"CC [M]  {a.resolve()}/{o}" in log for o in built
                                   if not o.endswith(".mod.o") and o != ko.with_suffix(".o").name)
    assert str(stage) not in log
    assert str(stage) not in (a / f".{ko.stem}.o.cmd").read_text()

    # a copy of the sources elsewhere: the same objects, untouched, and the same .ko
    b = tmp_path / "copy"
    shutil.copytree(a.parent, b, ignore=shutil.ignore_patterns("*.o", "*.ko", ".*", "build.log"))
    kob = kernel.build_module(b / "kernel")
    assert objects(stage) == built
    assert kob.read_bytes() == ko.read_bytes()
    assert (b / "kernel" / "build.log").read_text() == log.replace(str(a.resolve()),
                                                                   str((b / "kernel").resolve()))

    # a header newer than the objects: Kbuild would rebuild part; kmlc rebuilds all
    time.sleep(0.01)
    (stage / "kml_math.h").touch()
    kernel.build_module(b / "kernel")
    again = objects(stage)
    assert again.keys() == built.keys() and all(again[o] > built[o] for o in built)

    # other sources: another directory
    c = model(tmp_path, "bca2", seed=1)
    kernel.build_module(c)
    assert len([d for d in cache.iterdir() if d.is_dir()]) == 2


def test_a_warning_is_never_hidden_by_a_kept_build(tmp_path, cache):
    a = model(tmp_path, "bcw")
    src = a / "bcw_mod.c"
    src.write_text(src.read_text() + "\nstatic int kml_unused_fn(void) { return 0; }\n")
    for _ in range(2):          # the second build sees the same warning as the first
        with pytest.raises(KmlcError, match="warning.*kml_unused_fn"):
            kernel.build_module(a)
        assert "kml_unused_fn" in (a / "build.log").read_text()
        assert not [d for d in cache.iterdir() if d.is_dir()]
    # and an error
    src.write_text(src.read_text() + "\nint kml_broken(void) { return }\n")
    with pytest.raises(KmlcError, match="failed"):
        kernel.build_module(a)
    assert not [d for d in cache.iterdir() if d.is_dir()]


def test_least_recently_used_builds_go_first(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(buildcache, "KEEP", 2)
    dirs = [model(tmp_path, f"bcl{i}", seed=i) for i in range(3)]
    for d in (dirs[0], dirs[1], dirs[0]):   # bcl0 built, then used again after bcl1
        kernel.build_module(d)
    assert len([d for d in cache.iterdir() if d.is_dir()]) == 2
    kernel.build_module(dirs[2])
    left = sorted(d.name.split("-")[0] for d in cache.iterdir() if d.is_dir())
    assert left == ["kml_bcl0", "kml_bcl2"]


def test_the_cache_can_be_turned_off(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("KMLC_MODULE_CACHE", "0")
    a = model(tmp_path, "bco")
    kernel.build_module(a)
    assert not cache.exists()
    assert str(a.resolve()) in (a / ".bco.o.cmd").read_text()
