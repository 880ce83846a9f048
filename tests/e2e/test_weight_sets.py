"""Weight sets in the twin (docs/weights.md): `kmlc pack` writes a retrained
model's weights for a model already compiled, and the twin runs on them.
The oracle is the retrained model compiled on its own: the swapped twin
must give its outputs bit for bit.  Sets for another structure, corrupted
or truncated sets are refused with one line, and the running set stays.
A hook's benefit guard judges each newly loaded set afresh."""
import numpy as np
import onnx
import pytest

from conftest import ROOT, kmlc_cli, mlp_model
from kmlc.api import compile as kcompile, load, pack
from kmlc.errors import KmlcError
from kmlc.hooks import guard as G


def rows(n=300, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 6)).astype(np.float32)


@pytest.fixture(scope="module")
def float_pair(tmp_path_factory):
    """A model and its retrained twin (other weights, the same graph),
    each compiled, and the retrained one's ONNX file."""
    d = tmp_path_factory.mktemp("sets")
    for seed in (1, 2):
        onnx.save(mlp_model([6, 20, 3], act="Tanh", seed=seed), d / f"m{seed}.onnx")
        kcompile(d / f"m{seed}.onnx", d / f"o{seed}", targets="user", name="ws")
    return d


def test_pack_and_run_the_retrained_weights(float_pair, tmp_path):
    d = float_pair
    res = kmlc_cli("pack", d / "m2.onnx", "--like", d / "o1", "-o", tmp_path / "m2.kmlw",
                   "--version", "5")
    assert res.returncode == 0, res.stderr
    assert "version 5" in res.stdout
    x = rows()
    np.save(tmp_path / "x.npy", x)
    res = kmlc_cli("run", d / "o1", "--input", tmp_path / "x.npy", "--output",
                   tmp_path / "y.npy", "--weights", tmp_path / "m2.kmlw")
    assert res.returncode == 0, res.stderr
    y = np.load(tmp_path / "y.npy")
    own = load(d / "o2").run(x)
    assert np.array_equal(y.view(np.uint32), own.view(np.uint32))
    assert not np.array_equal(y, load(d / "o1").run(x))   # the swap changed something
    twin = load(d / "o1", weights=(tmp_path / "m2.kmlw").read_bytes())
    assert twin.weights_version == 5
    assert np.array_equal(twin.run(x), own)
    twin.load_weights(None)                                 # back to the compiled set
    assert np.array_equal(twin.run(x), load(d / "o1").run(x))


def test_bad_sets_are_refused_and_the_running_set_stays(float_pair, tmp_path):
    d = float_pair
    pack(d / "m2.onnx", d / "o1", tmp_path / "good.kmlw")
    good = (tmp_path / "good.kmlw").read_bytes()
    twin = load(d / "o1", weights=good)
    x = rows(20)
    before = twin.run(x)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x10
    for blob, msg in ((bytes(bad), "checksum"), (good[:-1], "truncated")):
        with pytest.raises(KmlcError, match=msg):
            twin.load_weights(blob)
        assert np.array_equal(twin.run(x), before)
    (tmp_path / "bad.kmlw").write_bytes(bytes(bad))
    np.save(tmp_path / "x.npy", x)
    res = kmlc_cli("run", d / "o1", "--input", tmp_path / "x.npy", "--output",
                   tmp_path / "y.npy", "--weights", tmp_path / "bad.kmlw")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and "checksum" in res.stderr, res.stderr
    assert not (tmp_path / "y.npy").exists()


def test_pack_refuses_another_structure_in_one_line(float_pair, tmp_path):
    d = float_pair
    onnx.save(mlp_model([6, 21, 3], act="Tanh", seed=3), tmp_path / "wider.onnx")
    res = kmlc_cli("pack", tmp_path / "wider.onnx", "--like", d / "o1", "-o",
                   tmp_path / "w.kmlw")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "structure differs" in res.stderr and res.stderr.strip().count("\n") == 0
    assert not (tmp_path / "w.kmlw").exists() and not list(tmp_path.glob(".*kmlc-tmp"))


def test_fixed_point_sets(tmp_path):
    """Fixed point: pack pins the compiled model's formats (every range,
    weight width and accumulator), so a retrained model packs for it.  The
    same model packed for itself runs as compiled, bit for bit; a retrained
    one runs its own weights (its outputs track onnxruntime on the
    retrained model, not the compiled one's); weights whose sums no longer
    fit the compiled accumulator are refused in one line; pack needs
    calibration rows."""
    import onnxruntime as ort

    m = mlp_model([6, 20, 3], act="Relu", seed=1)
    onnx.save(m, tmp_path / "m.onnx")
    kcompile(m, tmp_path / "o", targets="user", numerics="fixed", calibration=rows(), name="wf")
    with pytest.raises(KmlcError, match="calibration"):
        pack(tmp_path / "m.onnx", tmp_path / "o", tmp_path / "s.kmlw")
    pack(tmp_path / "m.onnx", tmp_path / "o", tmp_path / "s.kmlw", calibration=rows(), version=2)
    x = rows(200, seed=3)
    twin = load(tmp_path / "o", weights=tmp_path / "s.kmlw")
    assert twin.weights_version == 2
    raw = twin.encode(x)
    assert np.array_equal(twin.run_raw(raw), load(tmp_path / "o").run_raw(raw))

    m2 = mlp_model([6, 20, 3], act="Relu", seed=2)
    onnx.save(m2, tmp_path / "m2.onnx")
    pack(tmp_path / "m2.onnx", tmp_path / "o", tmp_path / "s2.kmlw", calibration=rows(seed=5))
    twin.load_weights(tmp_path / "s2.kmlw")

    def ref(model):
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, {sess.get_inputs()[0].name: x})[0]

    y, y1, y2 = twin.run(x), ref(m), ref(m2)
    err2, err1 = np.abs(y - y2).max(), np.abs(y - y1).max()
    span = np.abs(y2).max()
    assert err2 < 0.02 * span < err1, (err2, err1, span)
    assert (y.argmax(1) == y2.argmax(1)).mean() >= 0.97

    big = mlp_model([6, 20, 3], act="Relu", seed=2)
    b = next(t for t in big.graph.initializer if t.name == "b0")   # fc0's bias, huge
    b.CopyFrom(onnx.numpy_helper.from_array(np.full(tuple(b.dims), 1e9, np.float32), "b0"))
    onnx.save(big, tmp_path / "big.onnx")
    np.save(tmp_path / "cal.npy", rows())
    res = kmlc_cli("pack", tmp_path / "big.onnx", "--like", tmp_path / "o", "-o",
                   tmp_path / "big.kmlw", "--calibration", tmp_path / "cal.npy")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "accumulator" in res.stderr and res.stderr.strip().count("\n") == 0, res.stderr
    assert not (tmp_path / "big.kmlw").exists()


def retrained(src, dst) -> None:
    """The model at ``src`` as another training might leave it (its
    matrices' weights shuffled), saved at ``dst``."""
    from onnx import numpy_helper

    m = onnx.load(src)
    for init in m.graph.initializer:
        w = numpy_helper.to_array(init)
        if w.ndim == 2:
            w = np.random.default_rng(w.size).permutation(w.reshape(-1)).reshape(w.shape)
            init.CopyFrom(numpy_helper.from_array(w, init.name))
    onnx.save(m, dst)


@pytest.mark.parametrize("numerics", ["float", "fixed"])
def test_a_hooks_decisions_follow_the_loaded_set(tmp_path, numerics):
    """The hook's entry points (decide, replay) read the current set, as
    the module's hooks do after a write to its weights attribute: a twin
    that loaded a retrained set decides as the retrained model compiled on
    its own, and as before once it goes back to the compiled set."""
    src = ROOT / "examples" / "readahead" / "readahead.onnx"
    cal = ROOT / "examples" / "readahead" / "calibration.npy"
    retrained(src, tmp_path / "v2.onnx")
    opts = dict(numerics=numerics, hooks=["readahead"], targets="kernel,user",
                calibration=np.load(cal) if numerics == "fixed" else None)
    kcompile(src, tmp_path / "v1", name="ra", **opts)
    kcompile(tmp_path / "v2.onnx", tmp_path / "v2", name="ra", **opts)
    pack(tmp_path / "v2.onnx", tmp_path / "v1", tmp_path / "v2.kmlw",
         calibration=opts["calibration"], version=2)
    v1, v2 = load(tmp_path / "v1"), load(tmp_path / "v2")
    feats = np.round(np.load(cal)[:400] * np.exp2(v1.hook_frac.astype(np.float64)))
    feats = feats.astype(np.int32)
    before = v1.decide(feats)
    assert not np.array_equal(before, v2.decide(feats))
    v1.load_weights(tmp_path / "v2.kmlw")
    assert np.array_equal(v1.decide(feats), v2.decide(feats))
    v1.load_weights(None)
    assert np.array_equal(v1.decide(feats), before)


def test_a_swapped_set_is_judged_afresh_by_the_benefit_guard(tmp_path):
    """The readahead hook guarded (--guard benefit, a trial first), in a
    simulated world where a decision costs 100 when it is the retrained
    model's class and 150 otherwise, and the kernel's own readahead 120:
    the compiled set loses its trial and is demoted; loading the retrained
    set is a new generation, which the guard puts on trial afresh (one
    reset) and trusts within that trial, long before a demoted model's
    probes could bring it back; going back to the compiled set is a
    generation too, demoted again.  Each decision's generation is the one
    its own C read with the set."""
    src = ROOT / "examples" / "readahead" / "readahead.onnx"
    cal = np.load(ROOT / "examples" / "readahead" / "calibration.npy")
    retrained(src, tmp_path / "v2.onnx")
    kcompile(src, tmp_path / "v1", name="ra", numerics="fixed", calibration=cal,
             hooks=["readahead"], targets="kernel,user",
             guards=["benefit=2", "benefit_samples=8", "benefit_periods=2"])
    pack(tmp_path / "v2.onnx", tmp_path / "v1", tmp_path / "v2.kmlw", calibration=cal, version=2)
    twin = load(tmp_path / "v1")
    feats = np.round(cal[:400] * np.exp2(twin.hook_frac.astype(np.float64))).astype(np.int32)
    right = load(tmp_path / "v1", weights=tmp_path / "v2.kmlw").decide(feats)
    assert (twin.decide(feats) == right).mean() < 0.6       # v1 is mostly wrong here
    g = twin.guard_session()
    cfg = dict(zip(G.PARAMS, g.cfg.tolist()))
    assert (cfg["benefit_every"], cfg["benefit_trial"], cfg["benefit_probe_every"]) == (2, 1, 64)

    def run(n, start):
        whys = []
        for i in range(start, start + n):
            f = feats[i % len(feats)]
            cls = int(twin.decide(f)[0])
            assert twin.decided_generation == twin.weights_generation
            d, why, arm = g.decide(cls, G.KERNEL, key=0, now=i)
            whys.append(G.WHY[why])
            if arm != G.ARM_NONE:
                g.cost(arm, 120 if d == G.KERNEL else 100 if d == right[i % len(feats)] else 150)
        return whys

    trial = 2 * 8 * 2                         # differing decisions to a trial's verdict
    run(trial, 0)
    assert g.state == 1 and g.counters["demotions"] == 1 and g.counters["resets"] == 0
    demoted = run(64, trial)                  # one differing decision in 64 its probe
    assert demoted.count("demoted") == 63 and demoted.count("probe") == 1
    twin.load_weights(tmp_path / "v2.kmlw")
    assert twin.weights_generation == 1 and twin.weights_version == 2
    whys = run(trial, 100)                    # on trial: one in 2 each way
    assert whys[:2] == ["control", "probe"] and g.counters["resets"] == 1
    assert g.state == 0 and g.counters["promotions"] == 1
    assert run(20, 200).count("model") == 10   # trusted: one in 2 to the control
    twin.load_weights(None)                   # the compiled set again: a generation too
    assert twin.weights_generation == 2
    run(trial, 300)
    assert g.state == 1 and g.counters["demotions"] == 2 and g.counters["resets"] == 2
