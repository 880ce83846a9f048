"""Builds kept between runs (compiler/targets/buildcache.py).  Modules:
the same sources for the same kernel reuse Kbuild's objects, anything
Kbuild finds out of date is built again from scratch.  Twins: the same
preprocessed sources, command and compiler give the kept bytes, which are
a fresh build's; any header changed is a new build.  A warning or error is
never hidden by a build kept from before."""
from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from conftest import mlp_model
from kmlc.api import compile as kcompile
from kmlc.errors import KmlcError
from kmlc.targets import buildcache, kernel


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KMLC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KMLC_BUILD_CACHE", raising=False)
    return tmp_path / "cache" / "modules"


@pytest.fixture
def twins(tmp_path, monkeypatch):
    monkeypatch.setenv("KMLC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KMLC_BUILD_CACHE", raising=False)
    return tmp_path / "cache" / "twins"


def model(tmp_path, name, seed=0):
    kcompile(mlp_model([4, 6, 2], seed=seed), tmp_path / name, name=name, targets="kernel")
    return tmp_path / name / "kernel"


def objects(d):
    return {p.name: p.stat().st_mtime_ns for p in d.glob("*.o")}


@pytest.mark.kernel
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


@pytest.mark.kernel
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


@pytest.mark.kernel
def test_least_recently_used_builds_go_first(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(buildcache, "KEEP", 2)
    dirs = [model(tmp_path, f"bcl{i}", seed=i) for i in range(3)]
    for d in (dirs[0], dirs[1], dirs[0]):   # bcl0 built, then used again after bcl1
        kernel.build_module(d)
    assert len([d for d in cache.iterdir() if d.is_dir()]) == 2
    kernel.build_module(dirs[2])
    left = sorted(d.name.split("-")[0] for d in cache.iterdir() if d.is_dir())
    assert left == ["kml_bcl0", "kml_bcl2"]


@pytest.mark.kernel
def test_the_cache_can_be_turned_off(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("KMLC_BUILD_CACHE", "0")
    a = model(tmp_path, "bco")
    kernel.build_module(a)
    assert not cache.exists()
    assert str(a.resolve()) in (a / ".bco.o.cmd").read_text()


def compile_counted(cmd, cwd):
    """buildcache.compile_twin with the compiler runs counted."""
    runs = []

    def run(c):
        runs.append(c)
        return subprocess.run(c, cwd=cwd, capture_output=True, text=True)
    rc, err = buildcache.compile_twin(cmd, cwd, run)
    return rc, err, len(runs)


def test_twins_kept_are_the_bytes_a_build_gives_and_any_header_change_rebuilds(tmp_path, twins,
                                                                               monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.h").write_text("#define K 3\n")
    (src / "t.c").write_text('#include "k.h"\nint f(int x) { return x * K; }\n')
    cmd = ["gcc", "-O2", "-fPIC", "-Wall", "-shared", "-o", "libt.so", "t.c"]
    assert compile_counted(cmd, src) == (0, "", 1)
    first = (src / "libt.so").read_bytes()
    (src / "libt.so").unlink()
    assert compile_counted(cmd, src) == (0, "", 0)          # kept
    assert (src / "libt.so").read_bytes() == first
    # the same in another directory: kept too; and a fresh build gives these bytes
    other = tmp_path / "other"
    shutil.copytree(src, other, ignore=shutil.ignore_patterns("*.so"))
    assert compile_counted(cmd, other) == (0, "", 0)
    monkeypatch.setenv("KMLC_BUILD_CACHE", "0")
    assert compile_counted(cmd, other)[2] == 1
    assert (other / "libt.so").read_bytes() == first
    monkeypatch.delenv("KMLC_BUILD_CACHE")
    # a header's change, other flags, another compiler: built
    (src / "k.h").write_text("#define K 5\n")
    assert compile_counted(cmd, src) == (0, "", 1)
    assert (src / "libt.so").read_bytes() != first
    assert compile_counted([*cmd[:1], "-O1", *cmd[2:]], src)[2] == 1
    assert compile_counted(["clang", *cmd[1:]], src)[2] == 1
    assert len(list(twins.iterdir())) == 4


def test_a_twin_that_warns_or_fails_is_never_kept(tmp_path, twins):
    (tmp_path / "w.c").write_text("int f(int x) { int unused; return x; }\n")
    cmd = ["gcc", "-O2", "-fPIC", "-Wall", "-shared", "-o", "libw.so", "w.c"]
    for _ in range(2):
        rc, err, runs = compile_counted(cmd, tmp_path)
        assert rc == 0 and "unused" in err and runs == 1
    (tmp_path / "e.c").write_text("int f(int x) { return }\n")
    for _ in range(2):
        rc, err, runs = compile_counted([*cmd[:-1], "e.c"], tmp_path)
        assert rc != 0 and "error" in err and runs == 1
    assert not twins.exists() or not list(twins.iterdir())


def test_a_garbled_or_unwritable_cache_only_means_a_build(tmp_path, twins, monkeypatch):
    (tmp_path / "t.c").write_text("int f(int x) { return x + 1; }\n")
    cmd = ["gcc", "-O2", "-fPIC", "-shared", "-o", "libt.so", "t.c"]
    assert compile_counted(cmd, tmp_path)[2] == 1
    first = (tmp_path / "libt.so").read_bytes()
    [entry] = list(twins.iterdir())
    entry.write_bytes(entry.read_bytes()[:-100])            # truncated
    assert compile_counted(cmd, tmp_path) == (0, "", 1)
    assert (tmp_path / "libt.so").read_bytes() == first
    assert compile_counted(cmd, tmp_path) == (0, "", 0)     # kept again, whole
    shutil.rmtree(tmp_path / "cache")
    (tmp_path / "cache").write_text("a file where the cache directory would be")
    for _ in range(2):
        assert compile_counted(cmd, tmp_path) == (0, "", 1)
        assert (tmp_path / "libt.so").read_bytes() == first


@pytest.mark.kernel
def test_a_module_builds_in_place_when_the_cache_cannot_be_written(tmp_path, cache):
    a = model(tmp_path, "bcu")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("a file where the build directories would be")
    kernel.build_module(a)
    assert str(a.resolve()) in (a / ".bcu.o.cmd").read_text()


@pytest.mark.kernel
def test_kbuilds_environment_is_in_the_key_and_every_output_comes_back(tmp_path, cache,
                                                                      monkeypatch):
    """KCFLAGS changes what Kbuild makes (here -fstack-usage's .su files):
    another kept directory, and its outputs all copied into OUTDIR/kernel."""
    a = model(tmp_path, "bck")
    kernel.build_module(a)
    assert not list(a.glob("*.su"))
    monkeypatch.setenv("KCFLAGS", "-fstack-usage")
    kernel.build_module(a)
    assert {p.stem for p in a.glob("*.su")} >= {"bck", "bck_fp", "bck_mod"}
    assert len([d for d in cache.iterdir() if d.is_dir()]) == 2


@pytest.mark.kernel
def test_a_module_directory_with_subdirectories_builds_in_place(tmp_path, cache):
    """A Kbuild may build objects from subdirectories, which the kept
    directory (the top directory's files) would not have."""
    a = model(tmp_path, "bcs")
    (a / "extra").mkdir()
    kernel.build_module(a)
    assert str(a.resolve()) in (a / ".bcs.o.cmd").read_text()
    assert not cache.exists() or not [d for d in cache.iterdir() if d.is_dir()]
