"""Tree ensembles (frontends/onnx_trees.py, the ``trees`` op) against
onnxruntime, the oracle, on one thread (its documented summation order:
trees in order; with several threads it sums partial ensembles per thread).

Acceptance models, trained here with fixed seeds on 11 integer Heimdall-like
features and 5 KML-like features: a depth-8 DecisionTreeClassifier, a
100-tree depth-6 RandomForestClassifier, 200-tree depth-4
GradientBoostingClassifier and LGBMClassifier, an XGBRegressor.  On 10,000
rows each:
  * float: labels identical; raw sums and probabilities that involve no
    exp (decision trees, forests, regressors) bit-identical; sigmoid and
    softmax (kml_math.h's, not libm's) within 1e-6; the twin is also
    bit-identical to kmlc's own evaluator of the graph;
  * fixed: labels on >= 99.9% of rows, and all of them for the integer
    features; regressor outputs within the compiler's own error bound of
    onnxruntime's (plus float32 rounding of onnxruntime's own sum).
Hand-built ensembles cover every node mode, mixed modes, missing-value
tracks, NaN and infinite inputs, AVERAGE, several targets with base values,
leaves voting for several targets and stumps; malformed tables are refused
in one line.
"""
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper

import kmlc
from conftest import check_refused
from kmlc.api import compile as kcompile, load
from kmlc.errors import KmlcError
from kmlc.ops import interpret

pytest.importorskip("skl2onnx")
ROWS = 10_000
ML = "ai.onnx.ml"


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def heimdall_like(n, seed):
    """11 integer features as Heimdall's hook counts them: queue length,
    three recent latencies and queue lengths, I/O size, throughput; the
    label: a slow read."""
    r = np.random.default_rng(seed)
    q = r.integers(0, 64, size=(n, 4))
    lat = r.gamma(2.0, 300.0, size=(n, 3)).astype(np.int64) + 20 * q[:, 1:]
    size = r.integers(1, 256, size=(n, 1)) * 4096
    thpt = r.integers(0, 2_000_000, size=(n, 1))
    x = np.hstack([q[:, :1], lat, q[:, 1:], size, thpt, q[:, :1] * lat[:, :1]])[:, :11]
    x = np.hstack([x, np.zeros((n, 11 - x.shape[1]), np.int64)])
    slow = (lat.mean(axis=1) + 15 * q[:, 0] + size[:, 0] / 8192
            + r.normal(0, 150, n)) > 1100
    return x.astype(np.float32), slow.astype(int), lat[:, 0] * 0.7 + 30 * q[:, 0]


def kml_like(n, seed):
    """5 real features as KML's readahead model reads them (offset deltas'
    mean and spread, pages per read, reads per file, a transaction rate);
    the label: one of four readahead sizes."""
    r = np.random.default_rng(seed)
    x = np.column_stack([r.lognormal(4, 2, n), r.lognormal(3, 1.5, n), r.uniform(1, 64, n),
                         r.uniform(0, 1, n), r.gamma(3, 200, n)]).astype(np.float32)
    score = np.log1p(x[:, 0]) - 0.5 * np.log1p(x[:, 1]) + 0.03 * x[:, 2] + x[:, 3]
    cls = np.digitize(score + r.normal(0, 0.3, n), [2.0, 3.5, 5.0])
    return x, cls, score.astype(np.float32)


def acceptance_models():
    import lightgbm as lgb
    import xgboost as xgb
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
    from sklearn.tree import DecisionTreeClassifier

    return {
        "dt": lambda: DecisionTreeClassifier(max_depth=8, random_state=0),
        "rf": lambda: RandomForestClassifier(n_estimators=100, max_depth=6, random_state=0),
        "gb": lambda: GradientBoostingClassifier(n_estimators=200, max_depth=4,
                                                 random_state=0),
        "lgbm": lambda: lgb.LGBMClassifier(n_estimators=200, max_depth=4, num_leaves=16,
                                           random_state=0, verbose=-1),
        "xgbr": lambda: xgb.XGBRegressor(n_estimators=100, max_depth=4, random_state=0),
    }


DATA = {"heimdall": heimdall_like, "kml": kml_like}


@pytest.fixture(scope="module")
def trained():
    pytest.importorskip("lightgbm")
    pytest.importorskip("xgboost")
    out = {}
    for data, make in DATA.items():
        x, y, target = make(3000, 1)
        xt, _, _ = make(ROWS, 2)
        for name, est in acceptance_models().items():
            out[data, name] = (est().fit(x, target if name == "xgbr" else y), x, xt)
    return out


def onnx_of(est, x):
    """The ONNX model kmlc's frontend compiles for ``est`` (the oracle's
    input) and its import."""
    from kmlc.frontends import onnx as onnx_frontend, sklearn as sk

    m, _ = sk.convert(est, x)
    return m, onnx_frontend.load(m)


def oracle(m, x):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


CASES = [(d, n) for d in DATA for n in acceptance_models()]


@pytest.mark.parametrize("data,name", CASES, ids=[f"{d}-{n}" for d, n in CASES])
def test_float_as_onnxruntime(trained, data, name, tmp_path):
    est, _, xt = trained[data, name]
    m, graph = onnx_of(est, xt)
    want = oracle(m, xt)
    kmlc.compile(est, xt[:5], tmp_path / "o", targets="user")
    got = load(tmp_path / "o").run_named(xt)
    outs = [o.name for o in m.graph.output]
    exp_free = name in ("dt", "rf", "xgbr")
    for o, w in zip(outs, want):
        g = got[o].reshape(w.shape)
        if w.dtype != np.float32:
            assert np.array_equal(g, w), (o, np.mean(g == w))
        elif exp_free:
            assert np.array_equal(bits(g), bits(w)), (o, np.max(np.abs(g - w)))
        else:
            assert np.max(np.abs(g - w)) <= 1e-6, (o, np.max(np.abs(g - w)))
    # the C computes what kmlc's evaluator computes, bit for bit
    ref = [interpret(graph, xt[i:i + 1]) for i in range(0, ROWS, 97)]
    for j, o in enumerate(outs):
        ev = np.concatenate([np.asarray(r[j]).reshape(1, -1) for r in ref])
        tw = got[o].reshape(ROWS, -1)[::97]
        assert np.array_equal(bits(tw), bits(ev.astype(np.float32))) if \
            ev.dtype.kind == "f" else np.array_equal(tw, ev)


@pytest.mark.parametrize("data,name", CASES, ids=[f"{d}-{n}" for d, n in CASES])
def test_fixed_point_as_onnxruntime(trained, data, name, tmp_path):
    est, x, xt = trained[data, name]
    m, _ = onnx_of(est, xt)
    want = oracle(m, xt)
    res = kmlc.compile(est, xt[:5], tmp_path / "o", targets="user", numerics="fixed",
                       calibration=x)
    got = load(tmp_path / "o").run_named(xt)
    first = m.graph.output[0].name
    if name == "xgbr":
        w = want[0].reshape(-1)
        g = got[first].reshape(-1)
        bound = res.program.quant.output_bounds[res.program.graph.outputs[0].name]
        # onnxruntime's own float32 sum: 100 roundings of at most |sum| u each
        slack = 100 * 2.0 ** -24 * np.abs(w).max()
        within = np.mean(np.abs(g - w) <= bound["error_bound"] + slack)
        # real features: a value within a step of the encoding from a
        # threshold may take the other branch (the bound assumes not)
        assert within == 1.0 if data == "heimdall" else within >= 0.999, within
        return
    agree = np.mean(got[first].reshape(-1) == want[0].reshape(-1))
    # integer features are encoded exactly: every test decides as float's
    assert agree == 1.0 if data == "heimdall" else agree >= 0.999, agree


def ensemble(nodes, votes, *, classifier=False, f=3, **attrs):
    """A hand-built ensemble: nodes (tree, id, mode, feature, value, true,
    false, missing), votes (tree, id, target, weight)."""
    cols = list(zip(*nodes))
    kw = dict(nodes_treeids=cols[0], nodes_nodeids=cols[1], nodes_modes=cols[2],
              nodes_featureids=cols[3], nodes_values=[float(v) for v in cols[4]],
              nodes_truenodeids=cols[5], nodes_falsenodeids=cols[6],
              nodes_missing_value_tracks_true=cols[7])
    pre = "class" if classifier else "target"
    vc = list(zip(*votes))
    kw.update({f"{pre}_treeids": vc[0], f"{pre}_nodeids": vc[1], f"{pre}_ids": vc[2],
               f"{pre}_weights": [float(w) for w in vc[3]]}, **attrs)
    if not classifier:
        kw.setdefault("n_targets", 1)
    op = "TreeEnsembleClassifier" if classifier else "TreeEnsembleRegressor"
    outs = ["label", "scores"] if classifier else ["y"]
    node = helper.make_node(op, ["x"], outs, domain=ML, name="ens", **kw)
    k = len(attrs.get("classlabels_int64s", [])) if classifier else kw["n_targets"]
    vi = [helper.make_tensor_value_info("label", T.INT64, [None]),
          helper.make_tensor_value_info("scores", T.FLOAT, [None, k])] if classifier else \
        [helper.make_tensor_value_info("y", T.FLOAT, [None, k])]
    g = helper.make_graph([node], "ens", [helper.make_tensor_value_info("x", T.FLOAT,
                                                                        [None, f])], vi)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(ML, 3)])
    m.ir_version = 8
    return m


def two_level(mode, miss=(0, 0, 0), tree=0, thr=(0.5, -1.0, 2.0)):
    """One depth-2 tree testing features 0, 1 and 2 in ``mode``."""
    L = "LEAF"
    return [(tree, 0, mode, 0, thr[0], 1, 2, miss[0]), (tree, 1, mode, 1, thr[1], 3, 4, miss[1]),
            (tree, 2, mode, 2, thr[2], 5, 6, miss[2])] + \
        [(tree, i, L, 0, 0.0, 0, 0, 0) for i in range(3, 7)]


MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def hand_built():
    for mode in MODES:
        yield mode.lower(), ensemble(two_level(mode), [(0, i, 0, float(i)) for i in range(3, 7)])
    mixed = two_level("BRANCH_LEQ", miss=(1, 0, 1))
    mixed[1] = (0, 1, "BRANCH_NEQ", 1, -1.0, 3, 4, 1)
    mixed[2] = (0, 2, "BRANCH_GT", 2, 2.0, 5, 6, 0)
    yield "mixed_missing", ensemble(mixed + two_level("BRANCH_LT", tree=1, miss=(1, 1, 1)),
                                    [(t, i, 0, 0.25 * i - t) for t in (0, 1)
                                     for i in range(3, 7)])
    yield "missing_leq", ensemble(two_level("BRANCH_LEQ", miss=(1, 0, 1)),
                                  [(0, i, 0, float(i)) for i in range(3, 7)])
    two = two_level("BRANCH_LEQ") + two_level("BRANCH_GT", tree=1, thr=(1.5, 0.0, -2.0))
    yield "average_targets_base", ensemble(
        two, [(t, i, k, 0.1 * i + k - t) for t in (0, 1) for i in range(3, 7) for k in (0, 1)],
        n_targets=2, aggregate_function="AVERAGE", base_values=[0.5, -3.0])
    three = two + two_level("BRANCH_GTE", tree=2, thr=(0.0, 1.0, -1.0))
    yield "sparse_targets", ensemble(three, [(t, i, t, 1.5 * i - t) for t in (0, 1, 2)
                                             for i in range(3, 7)], n_targets=3,
                                     base_values=[1.0, 2.0, 3.0])
    stump = [(2, 0, "LEAF", 0, 0.0, 0, 0, 0)]
    yield "stump_and_tree", ensemble(two_level("BRANCH_LEQ") + stump,
                                     [(0, i, 0, float(i)) for i in range(3, 7)]
                                     + [(2, 0, 0, 10.0)])
    yield "classes_softmax", ensemble(two, [(t, i, k, 0.3 * i - k + t) for t in (0, 1)
                                            for i in range(3, 7) for k in range(3)],
                                      classifier=True, classlabels_int64s=[4, 8, 15],
                                      post_transform="SOFTMAX", base_values=[0.1, 0.2, 0.3])
    yield "binary_probabilities", ensemble(two_level("BRANCH_LEQ"),
                                           [(0, i, 0, 0.2 * i - 0.5) for i in range(3, 7)],
                                           classifier=True, classlabels_int64s=[7, 9])
    yield "binary_logistic", ensemble(two_level("BRANCH_LT"),
                                      [(0, i, 0, 0.7 * i - 3.2) for i in range(3, 7)],
                                      classifier=True, classlabels_int64s=[0, 1],
                                      post_transform="LOGISTIC", base_values=[0.25])


HAND = dict(hand_built())


def hostile_rows(n=4000, f=3, seed=4):
    r = np.random.default_rng(seed)
    x = r.choice(np.array([0.5, -1.0, 2.0, 1.5, 0.0, -0.0, -2.0], np.float32), size=(n, f))
    x = np.where(r.random((n, f)) < 0.5, r.normal(0, 2, (n, f)).astype(np.float32), x)
    special = np.array([np.nan, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-45], np.float32)
    x[: n // 4] = r.choice(special, size=(n // 4, f))
    return x.astype(np.float32)


@pytest.mark.parametrize("name", sorted(HAND))
def test_hand_built_ensembles_as_onnxruntime(name, tmp_path):
    """Every output bit for bit where no exp is involved, NaN and infinite
    features included (missing-value tracks send NaN to the true branch)."""
    m, x = HAND[name], hostile_rows()
    want = oracle(m, x)
    onnx.save(m, tmp_path / "m.onnx")
    kcompile(tmp_path / "m.onnx", tmp_path / "o", targets="user")
    got = load(tmp_path / "o").run_named(x)
    for o, w in zip(m.graph.output, want):
        g = got[o.name].reshape(w.shape)
        if w.dtype != np.float32:
            assert np.array_equal(g, w)
        elif "softmax" in name or "logistic" in name:
            assert np.max(np.abs(g - w)) <= 1e-6
        else:
            assert np.array_equal(bits(g), bits(w)), np.argwhere(bits(g) != bits(w))[:5]


@pytest.mark.parametrize("name", ["branch_leq", "branch_eq", "mixed_missing",
                                  "average_targets_base", "sparse_targets", "classes_softmax"])
def test_hand_built_ensembles_in_fixed_point(name, tmp_path):
    """Integer-valued and half-integer features (exact in the encoding):
    every test decides as float's, so labels agree on every row and sums
    within the compiler's bound."""
    m = HAND[name]
    r = np.random.default_rng(6)
    x = (r.integers(-6, 7, size=(3000, 3)) / 2).astype(np.float32)
    want = oracle(m, x)
    onnx.save(m, tmp_path / "m.onnx")
    res = kcompile(tmp_path / "m.onnx", tmp_path / "o", targets="user", numerics="fixed",
                   calibration=x)
    got = load(tmp_path / "o").run_named(x)
    q = res.program.quant
    for o, w, v in zip(m.graph.output, want, res.program.graph.outputs):
        g = got[o.name].reshape(w.shape)
        if w.dtype != np.float32:
            assert np.array_equal(g, w)
        else:
            bound = q.output_bounds[v.name]["error_bound"]
            assert np.max(np.abs(g - w)) <= bound + 1e-6 * (1 + np.abs(w).max()), bound


def refused():
    ok = two_level("BRANCH_LEQ")
    votes = [(0, i, 0, 1.0) for i in range(3, 7)]
    cyc = list(ok)
    cyc[1] = (0, 1, "BRANCH_LEQ", 1, 0.0, 0, 4, 0)
    yield "cycle", ensemble(cyc, votes), "reaches node 0 twice"
    gone = list(ok)
    gone[2] = (0, 2, "BRANCH_LEQ", 2, 0.0, 5, 9, 0)
    yield "missing_node", ensemble(gone, votes), "names node 9"
    feat = list(ok)
    feat[0] = (0, 0, "BRANCH_LEQ", 7, 0.0, 1, 2, 0)
    yield "feature", ensemble(feat, votes), "tests feature 7 of an input of 3"
    yield "vote_on_branch", ensemble(ok, votes + [(0, 1, 0, 1.0)]), "not a leaf"
    yield "twice", ensemble(ok, votes + [(0, 3, 0, 2.0)]), "votes twice for target 0"
    member = list(ok)
    member[0] = (0, 0, "BRANCH_MEMBER", 0, 0.0, 1, 2, 0)
    yield "member", ensemble(member, votes), "BRANCH_MEMBER"
    yield "probit", ensemble(ok, votes, classifier=True, classlabels_int64s=[0, 1, 2],
                             post_transform="PROBIT"), "PROBIT"
    yield "min", ensemble(ok, votes, aggregate_function="MIN"), "aggregate_function MIN"
    yield "class_ones", ensemble(ok, [(0, i, 1, 1.0) for i in range(3, 7)], classifier=True,
                                 classlabels_int64s=[0, 1]), "class 1 only"
    yield "binary_both", ensemble(ok, [(0, i, k, 0.5) for i in range(3, 7) for k in (0, 1)],
                                  classifier=True, classlabels_int64s=[5, 9]), \
        "two classes both voted for"
    partial = [(0, i, k, 1.0) for i in range(3, 7) for k in range(3) if (i, k) != (4, 2)]
    yield "partial_class", ensemble(ok, partial, classifier=True,
                                    classlabels_int64s=[0, 1, 2]), "class 2 has no vote"
    yield "partial_target", ensemble(ok, [(0, i, i % 2, 1.0) for i in range(3, 7)],
                                     n_targets=2), "target 0 has no vote on some rows"


@pytest.mark.parametrize("name,m,why", list(refused()), ids=[c[0] for c in refused()])
def test_malformed_or_unsupported_ensembles_are_refused(name, m, why, tmp_path):
    check_refused(m, why, "node 'ens'", tmp_path)


def test_fixed_point_trees_read_graph_inputs_only(tmp_path):
    """A tree after a dense layer has no exact integer test: refused with
    the reason (float compiles it)."""
    from onnx import numpy_helper

    m = HAND["branch_leq"]
    g = m.graph
    g.node[0].input[0] = "xs"
    g.node.insert(0, helper.make_node("MatMul", ["x", "mix"], ["xs"], name="mix"))
    g.initializer.append(numpy_helper.from_array(np.eye(3, dtype=np.float32) * 2, "mix"))
    onnx.save(m, tmp_path / "m.onnx")
    x = hostile_rows()[1000:]
    kcompile(tmp_path / "m.onnx", tmp_path / "f", targets="user")
    with pytest.raises(KmlcError, match="tree ensemble over computed values"):
        kcompile(tmp_path / "m.onnx", tmp_path / "o", targets="user", numerics="fixed",
                 calibration=np.nan_to_num(x, posinf=9, neginf=-9))


def test_a_retrained_ensemble_of_the_same_shape_swaps_in(tmp_path):
    """Float: new thresholds, leaf values and base values of the same trees
    pack into a weight set the twin (kml_set_check) takes, and then computes
    the new ensemble's outputs bit for bit; a set that changes a tree's
    structure (a child index) is refused, as is an ensemble of another
    shape."""
    from kmlc.api import pack
    from kmlc.weightset import member_offsets, pack as pack_blob, HEADER, crc32c
    import struct

    m = HAND["average_targets_base"]
    onnx.save(m, tmp_path / "a.onnx")
    res = kcompile(tmp_path / "a.onnx", tmp_path / "o", targets="user")
    new = onnx.ModelProto()
    new.CopyFrom(m)
    attrs = {a.name: a for a in new.graph.node[0].attribute}
    attrs["nodes_values"].floats[:] = [v + 0.25 for v in attrs["nodes_values"].floats]
    attrs["target_weights"].floats[:] = [w * 3 - 1 for w in attrs["target_weights"].floats]
    attrs["base_values"].floats[:] = [7.0, -7.0]
    onnx.save(new, tmp_path / "b.onnx")
    pack(tmp_path / "b.onnx", tmp_path / "o", tmp_path / "b.kmlw", version=2)
    x = hostile_rows()
    got = load(tmp_path / "o", weights=tmp_path / "b.kmlw").run_named(x)["y"]
    want = oracle(new, x)[0]
    assert np.array_equal(bits(got.reshape(want.shape)), bits(want))
    # a child index changed behind a valid checksum: refused, the set kept
    prog = res.program
    blob = bytearray(pack_blob(prog, 3))
    nxt = next(k.operands["next"] for k in prog.kernels if k.kind == "trees")
    at = HEADER.size + member_offsets(prog)[nxt.name]
    blob[at] ^= 1
    blob[-4:] = struct.pack("<I", crc32c(bytes(blob[:-4])))
    with pytest.raises(KmlcError, match="tree's structure"):
        load(tmp_path / "o").check_set(bytes(blob))
    other = HAND["branch_leq"]
    onnx.save(other, tmp_path / "c.onnx")
    with pytest.raises(KmlcError, match="structure differs"):
        pack(tmp_path / "c.onnx", tmp_path / "o", tmp_path / "c.kmlw")


def batched(m, rows: int):
    """``m`` with a static batch of ``rows`` rows per call."""
    b = onnx.ModelProto()
    b.CopyFrom(m)
    for v in list(b.graph.input) + list(b.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = rows
    return b


@pytest.mark.parametrize("name,numerics", [("mixed_missing", "float"),
                                           ("sparse_targets", "fixed")])
def test_a_batch_of_rows_per_call(name, numerics, tmp_path):
    """A static batch of three rows walks each row's trees into its own
    sums: float bit for bit as onnxruntime (NaN and infinities included),
    fixed point exactly on values of the encoding's grid."""
    m = batched(HAND[name], 3)
    r = np.random.default_rng(11)
    grid = (r.integers(-6, 7, size=(600, 3)) / 2).astype(np.float32)
    x = hostile_rows(600) if numerics == "float" else grid
    onnx.save(m, tmp_path / "m.onnx")
    kcompile(tmp_path / "m.onnx", tmp_path / "o", targets="user", numerics=numerics,
             calibration=grid.reshape(-1, 9) if numerics == "fixed" else None)
    twin = load(tmp_path / "o")
    for i in range(0, len(x), 3):
        want = oracle(m, x[i:i + 3])[0]
        got = np.asarray(twin.run_named(x[i:i + 3].reshape(-1))[m.graph.output[0].name])
        got = got.reshape(want.shape)
        if numerics == "float":
            assert np.array_equal(bits(got), bits(want)), i
        else:
            assert np.max(np.abs(got - want)) <= 1e-5 * (1 + np.abs(want).max()), i


KERNEL_MODELS = [("tr_mixed", "mixed_missing", "float", 1),
                 ("tr_sparse", "sparse_targets", "float", 1),
                 ("tr_modes", "mixed_missing", "fixed", 1),
                 ("tr_cls", "classes_softmax", "fixed", 1),
                 ("tr_avg", "average_targets_base", "fixed", 1),
                 # a batch of rows per call: one loop deeper, lines still within 100 columns
                 ("tr_rows", "mixed_missing", "float", 3),
                 ("tr_rowsfx", "sparse_targets", "fixed", 3)]


@pytest.fixture(scope="module")
def kernel_builds(tmp_path_factory):
    d = tmp_path_factory.mktemp("tree_kernel")
    r = np.random.default_rng(8)
    cal = (r.integers(-6, 7, size=(2400, 3)) / 2).astype(np.float32)
    out = {}
    for tag, case, numerics, rows in KERNEL_MODELS:
        onnx.save(batched(HAND[case], rows), d / f"{tag}.onnx")
        c = cal.reshape(-1, 3 * rows)
        kcompile(d / f"{tag}.onnx", d / tag, name=tag, numerics=numerics,
                 calibration=c if numerics == "fixed" else None, golden_data=c[:32],
                 golden_count=32)
        out[tag] = d / tag
    return out


def test_tree_c_meets_the_kernel_c_standards(kernel_builds, tmp_path):
    """No libm, allocation or mutable globals; bounded stack, no
    recursion; every tree walk a bounded loop over static const tables."""
    import re

    import kernel_c

    for tag, d in kernel_builds.items():
        kernel_c.check_no_libm_allocation_or_mutable_globals(d, tag)
        kernel_c.check_stack_and_no_recursion(d, tag, tmp_path)
        core = next((d / "kernel").glob(f"{tag}_f?.c")).read_text()
        walks = re.findall(r"for \(d = 0; d < (\d+)[; ]", core)
        assert walks and all(int(depth) == 2 for depth in walks), walks


@pytest.mark.kernel
def test_tree_modules_build_and_checkpatch_clean(kernel_builds):
    import kernel_c
    from kmlc.targets import kernel

    for tag, d in kernel_builds.items():
        kernel_c.check_checkpatch_clean(d / "kernel")
        kernel_c.check_checkpatch_clean(d / "kunit")
        kernel.build_module(d / "kernel")


@pytest.fixture(scope="module")
def acceptance_builds(trained, tmp_path_factory):
    """The acceptance ensembles (every estimator, both feature sets, both
    numerics) as module, twin and KUnit sources; golden vectors from the
    held-out rows."""
    d = tmp_path_factory.mktemp("tree_acceptance")
    out = {}
    for (data, name), (est, x, xt) in trained.items():
        for numerics in ("float", "fixed"):
            tag = f"ta_{data[0]}{name}_{numerics[:2]}"
            kmlc.compile(est, xt[:5], d / tag, name=tag, numerics=numerics,
                         calibration=x if numerics == "fixed" else None,
                         golden_data=xt[:64], golden_count=64)
            out[tag] = d / tag
    return out


@pytest.mark.kunit
@pytest.mark.parametrize("arch", ["um", "x86_64"])
def test_tree_modules_equal_their_twins_under_kunit(kernel_builds, acceptance_builds, arch):
    """The module's C and the twin's give the same bits on the golden
    vectors, in UML (gcc) and in an x86_64 kernel (the debug kernel: gcc,
    lockdep, KASAN, UBSAN; the float ones in a real FPU section), one
    kernel boot for both sets:
    - the hand-written ensembles, in float (node flags, sparse leaves) and
      fixed point (mixed integer tests, a class decision on int64 sums,
      AVERAGE);
    - every acceptance ensemble (DecisionTree depth 8, RandomForest 100x6,
      GradientBoosting and LightGBM 200x4, XGBRegressor; Heimdall-like and
      KML-like features; float and fixed point) on 64 held-out rows."""
    from kmlc.targets import kunit

    res = kunit.run(list(kernel_builds.values()) + list(acceptance_builds.values()), arch=arch)
    assert res["ok"], res["summary"]
    for tag, d in kernel_builds.items():
        assert res["suites"][f"kml_{tag}"]["passed"] == kunit.cases(d) >= 33, res["summary"]
    for tag, d in acceptance_builds.items():
        assert res["suites"][f"kml_{tag}"]["passed"] == kunit.cases(d) >= 64, res["summary"]
