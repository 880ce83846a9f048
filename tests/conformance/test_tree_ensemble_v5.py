"""TreeEnsemble (ai.onnx.ml 5, frontends/onnx_trees.py) against onnxruntime
1.32, the oracle, on one thread.

Hand-built ensembles cover every node mode with leaves as true and false
children at several depths, missing-value tracks, several trees and
targets (targets some rows' leaves never vote for: 0, as onnxruntime
writes them), SUM and AVERAGE, single-leaf trees, and BRANCH_MEMBER: lists
of one value, of +-0.0, of non-integers, a member node under another's
true branch, and the sets onnxruntime tests by the integer x truncates to
(more than 30 members, or one beyond 0..30).  Rows: NaN, +-inf, +-0.0,
integers and halves around the members, float32 neighbours of integers.
  * float: the twin's outputs bit-identical to onnxruntime's and to kmlc's
    own evaluator of the graph;
  * fixed point, on integer and half-integer features (exact in the
    encoding, a member off that grid never equal): sums within the
    compiler's bound of onnxruntime's;
  * refused in one line, through the command line: a double input or
    double tables, MIN and MAX, every post transform but NONE, a node or
    leaf id or a feature id out of range, a BRANCH_MEMBER node without its
    list, an empty list, a non-integer in an integer-tested set, a shared
    subtree.
onnx's own node case test_ai_onnx_ml_tree_ensemble_set_membership runs in
tests/conformance/test_onnx_nodes.py.
"""
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper

from conftest import check_refused
from kmlc.api import compile as kcompile, load
from kmlc.frontends import onnx as onnx_frontend
from kmlc.ops import interpret

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_trees import batched, bits, hostile_rows, oracle  # noqa: E402

ML = "ai.onnx.ml"
LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def ensemble(nodes, leaves, roots, *, k=1, f=3, members=(), dtype=T.FLOAT, **attrs):
    """A TreeEnsemble node: nodes (mode, feature, split, true, true is a
    leaf, false, false is a leaf, missing tracks true), leaves (target,
    weight), members one list per MEMBER node, each ended by a NaN."""
    c = list(zip(*nodes))
    npt = np.float64 if dtype == T.DOUBLE else np.float32
    ten = lambda name, v, t=npt: numpy_helper.from_array(np.array(v, t), name)  # noqa: E731
    kw = dict(nodes_modes=ten("modes", c[0], np.uint8), nodes_featureids=c[1],
              nodes_splits=ten("splits", c[2]), nodes_truenodeids=c[3], nodes_trueleafs=c[4],
              nodes_falsenodeids=c[5], nodes_falseleafs=c[6],
              nodes_missing_value_tracks_true=c[7], leaf_targetids=[t for t, _ in leaves],
              leaf_weights=ten("weights", [w for _, w in leaves]), tree_roots=roots,
              n_targets=k)
    if members:
        kw["membership_values"] = ten("members", [v for m in members for v in [*m, np.nan]])
    kw.update(attrs)
    node = helper.make_node("TreeEnsemble", ["x"], ["y"], domain=ML, name="ens", **kw)
    g = helper.make_graph([node], "ens", [helper.make_tensor_value_info("x", dtype, [None, f])],
                          [helper.make_tensor_value_info("y", dtype, [None, k])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid(ML, 5)])
    m.ir_version = 10
    return m


def three_deep(mode, at=0, leaf=0, miss=(0, 0, 0), thr=(0.5, -1.0, 2.0)):
    """One tree of nodes at..at+2 testing features 0, 1, 2 in ``mode``,
    leaves leaf..leaf+3 at depths 1 (a false child), 2 (a true one) and 3."""
    return [(mode, 0, thr[0], at + 1, 0, leaf, 1, miss[0]),
            (mode, 1, thr[1], leaf + 1, 1, at + 2, 0, miss[1]),
            (mode, 2, thr[2], leaf + 2, 1, leaf + 3, 1, miss[2])]


MEMBERS = [[1.0],                          # one value
           [-0.0, 2.0], [0.0],             # +-0.0: 0.0 and -0.0 are both members
           [0.1, 0.5, 1.5, 2.5, 30.0],     # non-integers, tested for equality
           [-3.0, -2.0, 0.0, 1.0, 2.0, 40.0, 41.0, 1000.0],   # by truncation (beyond 0..30)
           list(map(float, range(31)))]    # by truncation (31 values)


def hand_built():
    for mode in range(6):
        yield f"mode{mode}", ensemble(three_deep(mode), [(0, 1.0 + i) for i in range(4)], [0])
    # trees of mixed modes, missing tracks, three targets: target 1 has votes
    # on some rows only, target 2 on none; AVERAGE of 3 trees is inexact
    mixed = (three_deep(LEQ, miss=(1, 0, 1)) + three_deep(NEQ, 3, 4, miss=(0, 1, 1))
             + three_deep(GT, 6, 8, thr=(1.5, 0.0, -2.0)))
    mixed[1], mixed[4] = (GTE, *mixed[1][1:]), (LT, *mixed[4][1:])
    votes = [(i % 2 * (i < 8), 0.1 * i + 0.7) for i in range(12)]
    for agg in (0, 1):
        yield f"mixed_missing_agg{agg}", ensemble(mixed, votes, [0, 3, 6], k=3,
                                                  aggregate_function=agg)
    # BRANCH_MEMBER: six member nodes on features 0, 1, 2, each the previous
    # one's false child, with and without missing tracks, leaves as their
    # true children (1 to 16 tests deep) and as the last one's false child
    nodes, leaves = [], []
    for j, m in enumerate(MEMBERS):
        last = j == len(MEMBERS) - 1
        nodes.append((MEMBER, j % 3, 0.0, len(leaves), 1, j + 1 if not last else len(leaves) + 1,
                      0 if not last else 1, j % 2))
        leaves.append((0, 10.0 * j + 1))
    leaves.append((0, -5.0))
    yield "member_chain", ensemble(nodes, leaves, [0], members=MEMBERS)
    # a member node under another member's true branch, and plain tests, in
    # two trees voting for two targets; NaN in tree 1 goes true (tracks)
    nested = [(MEMBER, 0, 0.0, 1, 0, 2, 0, 0), (MEMBER, 1, 0.0, 0, 1, 1, 1, 1),
              (LEQ, 2, 0.25, 2, 1, 3, 1, 0), (MEMBER, 2, float("nan"), 4, 0, 4, 1, 1),
              (GTE, 0, -1.0, 5, 1, 6, 1, 1)]
    yield "member_nested", ensemble(
        nested, [(0, 1.0), (1, 2.0), (0, 4.0), (1, 8.0), (0, 16.0), (1, 32.0), (0, 64.0)],
        [0, 3], k=2, members=[[1.0, 2.0, 3.0], [-1.0, 5.0, 7.0], [0.0]])
    # a tree that is a single leaf (its node r names leaf r on both branches);
    # node 3 is in no tree (ignored, as onnxruntime ignores it)
    stump = three_deep(LEQ) + [(LEQ, 0, 0.0, 4, 1, 4, 1, 0), (LEQ, 0, 0.0, 4, 1, 4, 1, 0)]
    yield "stump", ensemble(stump, [(0, 1.0), (0, 2.0), (1, 3.0), (0, 4.0), (1, 0.5)],
                            [0, 4], k=2)


HAND = dict(hand_built())


def member_rows(n=4000, f=3, seed=5):
    """Rows whose features sit on, between and beside the members and
    thresholds: integers and halves from -4 to 42, +-0.0, float32
    neighbours of integers, values near 1000, the thresholds and members
    themselves often, and hostile_rows' NaN, infinities and extremes."""
    r = np.random.default_rng(seed)
    ints = np.arange(-4, 43, dtype=np.float32)
    near = np.concatenate([np.nextafter(ints, np.float32(np.inf)),
                           np.nextafter(ints, np.float32(-np.inf))])
    pool = np.concatenate([ints, ints + 0.5, near, [0.0, -0.0, 999.5, 1000.0, 1000.75,
                                                    -2.999, -3.5, 40.9999, 41.5]])
    hot = np.array([0.5, -1.0, 2.0, 1.5, -2.0, 0.25, 0.0, -0.0, 1.0, 2.5, 3.0, 5.0, 7.0,
                    30.0, 40.0, 1000.0, 0.1])
    x = np.where(r.random((n, f)) < 0.5, r.choice(pool, size=(n, f)), r.choice(hot, (n, f)))
    return np.where(r.random((n, f)) < 0.2, hostile_rows(n, f, seed), x).astype(np.float32)


@pytest.mark.parametrize("name", sorted(HAND))
def test_hand_built_ensembles_as_onnxruntime(name, tmp_path):
    """The twin bit for bit as onnxruntime and as kmlc's evaluator."""
    m, x = HAND[name], member_rows()
    want = oracle(m, x)[0]
    onnx.save(m, tmp_path / "m.onnx")
    kcompile(tmp_path / "m.onnx", tmp_path / "o", targets="user")
    got = load(tmp_path / "o").run_named(x)["y"].reshape(want.shape)
    assert np.array_equal(bits(got), bits(want)), (x[bits(got) != bits(want)][:5])
    graph = onnx_frontend.load(m)
    for i in range(0, len(x), 41):
        ev = np.asarray(interpret(graph, x[i:i + 1])[0], np.float32).reshape(-1)
        assert np.array_equal(bits(ev), bits(got[i])), i


def test_member_tests_are_chains_walked_in_bounded_steps(tmp_path):
    """A member node is its chain of tests (one per member, or two per run
    of consecutive integers where onnxruntime truncates x), all on the
    node's feature: depth is the longest path through the chains."""
    from kmlc.frontends import onnx_trees

    assert onnx_trees._member_tests([1.0, 2.5]) == [("eq", 1.0, "T", 1), ("eq", 2.5, "T", "F")]
    runs = onnx_trees._member_tests([-3.0, -2.0, 0.0, 1.0, 40.0])
    assert [t[:2] for t in runs] == [("le", -2.0), ("ge", float(np.nextafter(
        np.float32(-4), np.float32(0)))), ("le", float(np.nextafter(np.float32(2), np.float32(
            0)))), ("ge", float(np.nextafter(np.float32(-1), np.float32(0)))),
        ("le", float(np.nextafter(np.float32(41), np.float32(0)))), ("ge", 40.0)]
    res = kcompile(HAND["member_chain"], tmp_path / "o", targets="user")
    trees = next(op for op in res.program.graph.ops if op.kind == "trees")
    # 1 + 2 + 1 + 5 tests of equality, then 4 runs' and 1 run's tests of
    # intervals, whose longest paths are 4 + 1 and 1 + 1 tests
    assert trees.attrs["branches"] == 1 + 2 + 1 + 5 + 8 + 2
    assert trees.attrs["depth"] == 1 + 2 + 1 + 5 + 5 + 2


@pytest.mark.parametrize("name", ["mode4", "mixed_missing_agg0", "member_chain",
                                  "member_nested", "stump"])
def test_hand_built_ensembles_in_fixed_point(name, tmp_path):
    """Integer and half-integer features, exact in the encoding: every test
    decides as float's, so sums are within the compiler's bound of
    onnxruntime's.  A member off the encoding's grid (0.1 at 2^-24) is
    never equal: its test is decided at compile time."""
    m = HAND[name]
    r = np.random.default_rng(6)
    x = (r.integers(-8, 84, size=(3000, 3)) / 2).astype(np.float32)
    want = oracle(m, x)[0]
    onnx.save(m, tmp_path / "m.onnx")
    res = kcompile(tmp_path / "m.onnx", tmp_path / "o", targets="user", numerics="fixed",
                   calibration=x)
    got = load(tmp_path / "o").run_named(x)["y"].reshape(want.shape)
    bound = res.program.quant.output_bounds[res.program.graph.outputs[0].name]["error_bound"]
    assert np.max(np.abs(got - want)) <= bound + 1e-6 * (1 + np.abs(want).max()), bound
    trees = next(op for op in res.program.graph.ops if op.kind == "trees")
    never = np.count_nonzero(trees.inputs[1].data.astype(np.int64) >= 2**62)
    assert never == (name == "member_chain"), never


def test_a_batch_of_rows_per_call(tmp_path):
    m = batched(HAND["member_nested"], 3)
    x = member_rows(600)
    onnx.save(m, tmp_path / "m.onnx")
    kcompile(tmp_path / "m.onnx", tmp_path / "o", targets="user")
    twin = load(tmp_path / "o")
    for i in range(0, len(x), 3):
        want = oracle(m, x[i:i + 3])[0]
        got = np.asarray(twin.run_named(x[i:i + 3].reshape(-1))["y"]).reshape(want.shape)
        assert np.array_equal(bits(got), bits(want)), i


def test_member_c_meets_the_kernel_c_standards(tmp_path):
    """The kernel C of a member ensemble: no libm, allocation or mutable
    globals, bounded stack, every walk as deep as the longest chain."""
    import re

    import kernel_c

    onnx.save(HAND["member_nested"], tmp_path / "tr_v5.onnx")
    kcompile(tmp_path / "tr_v5.onnx", tmp_path / "tr_v5", name="tr_v5")
    d = tmp_path / "tr_v5"
    kernel_c.check_no_libm_allocation_or_mutable_globals(d, "tr_v5")
    kernel_c.check_stack_and_no_recursion(d, "tr_v5", tmp_path)
    core = next((d / "kernel").glob("tr_v5_f?.c")).read_text()
    walks = re.findall(r"for \(d = 0; d < (\d+)[; ]", core)
    assert walks and all(int(depth) == 3 + 4 for depth in walks), walks


def refused():
    ok = three_deep(LEQ)
    leaves = [(0, 1.0 + i) for i in range(4)]
    yield "double_input", ensemble(ok, leaves, [0], dtype=T.DOUBLE), "element type double", \
        "input 'x'"
    dbl = ensemble(ok, leaves, [0])
    a = next(a for a in dbl.graph.node[0].attribute if a.name == "leaf_weights")
    a.t.CopyFrom(numpy_helper.from_array(np.array([1.0, 2, 3, 4]), "weights"))
    yield "double_tables", dbl, "'leaf_weights' must have same type as input", \
        "node name: ens"
    for agg in (2, 3):
        yield f"aggregate{agg}", ensemble(ok, leaves, [0], aggregate_function=agg), \
            f"aggregate_function {agg}", None
    for post in (1, 2, 3, 4):
        name = ("SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")[post - 1]
        yield f"post{post}", ensemble(ok, leaves, [0], k=1, post_transform=post), \
            f"post_transform {post} \\({name}\\)", None
    gone = list(ok)
    gone[1] = (LEQ, 1, -1.0, 1, 1, 9, 0, 0)
    yield "node_id", ensemble(gone, leaves, [0]), "names node 9, which it does not have", None
    gone[1] = (LEQ, 1, -1.0, 7, 1, 2, 0, 0)
    yield "leaf_id", ensemble(gone, leaves, [0]), "names leaf 7, which it does not have", None
    yield "root_id", ensemble(ok, leaves, [0, 5]), "tree_roots names node 5 of 3", None
    feat = list(ok)
    feat[2] = (LEQ, 7, 2.0, 2, 1, 3, 1, 0)
    yield "feature", ensemble(feat, leaves, [0]), "node 2 tests feature 7 of an input of 3", None
    two = [(MEMBER, 0, 0.0, 0, 1, 1, 0, 0), (MEMBER, 1, 0.0, 1, 1, 2, 1, 0)]
    three = [(0, 1.0), (0, 2.0), (0, 3.0)]
    yield "member_list", ensemble(two, three, [0], members=[[1.0, 2.0]]), \
        "node 1 is BRANCH_MEMBER node 2 of 2, and membership_values has 1 lists", None
    yield "member_lists", ensemble(two, three, [0], members=[[1.0], [2.0], [3.0]]), \
        "3 lists for 2 BRANCH_MEMBER nodes", None
    yield "member_empty", ensemble(two, three, [0], members=[[1.0], []]), \
        "node 1 has an empty list of members", None
    yield "member_fraction", ensemble(two, three, [0], members=[[1.0], [0.5, 40.0]]), \
        "node 1 has 0.5 among 2 members", None
    yield "member_int_min", ensemble(two, three, [0], members=[[1.0], [-2.0**31, 4.0]]), \
        "node 1 has member -2147483648", None
    shared = list(ok)
    shared[2] = (LEQ, 2, 2.0, 1, 0, 3, 1, 0)      # node 2's true child: node 1 again
    yield "cycle", ensemble(shared, leaves, [0]), "tree 0 reaches node 1 twice", None
    yield "shared_tree", ensemble(ok, leaves, [0, 2]), "tree 1 reaches node 2 twice", None
    shared[2] = (LEQ, 2, 2.0, 2, 1, 2, 1, 0)      # both branches: leaf 2
    yield "shared_leaf", ensemble(shared, leaves, [0]), "tree 0 reaches leaf 2 twice", None
    stump = ok + [(LEQ, 0, 0.0, 1, 1, 1, 1, 0)]
    yield "stump_leaf", ensemble(stump, leaves, [3]), "onnxruntime reads leaf 3", None


REFUSED = list(refused())


@pytest.mark.parametrize("name,m,why,where", REFUSED, ids=[c[0] for c in REFUSED])
def test_malformed_or_unsupported_ensembles_are_refused(name, m, why, where, tmp_path):
    check_refused(m, why, where or "node 'ens'", tmp_path)


def test_what_onnxruntime_refuses_or_swaps():
    """The refusals above that are onnxruntime's own: an empty list, a
    non-integer member of a set it tests by truncation; and what it does
    with the forms kmlc refuses: -2^31 in such a set takes a NaN and an
    infinity in, post_transform 1 (SOFTMAX) and 2 (LOGISTIC) it applies
    swapped (to several targets) or not at all (to one)."""
    for name, why in (("member_empty", "at least one membership value"),
                      ("member_fraction", "cannot be cast into int32")):
        m = next(c[1] for c in REFUSED if c[0] == name)
        with pytest.raises(Exception, match=why):
            oracle(m, np.zeros((1, 3), np.float32))
    m = next(c[1] for c in REFUSED if c[0] == "member_int_min")
    odd = np.array([[0, np.nan, 0], [0, np.inf, 0], [0, 5, 0]], np.float32)
    assert oracle(m, odd)[0].reshape(-1).tolist() == [2.0, 2.0, 3.0]
    x = np.array([[0.0, 0.0, 0.0], [1.0, 3.0, 0.0]], np.float32)
    ok = three_deep(LEQ)
    leaves = [(0, 1.0), (1, -2.0), (0, 0.5), (1, 3.0)]
    raw = oracle(ensemble(ok, leaves, [0], k=2), x)[0]
    sig, soft = 1 / (1 + np.exp(-raw)), np.exp(raw) / np.exp(raw).sum(1, keepdims=True)
    assert np.allclose(oracle(ensemble(ok, leaves, [0], k=2, post_transform=1), x)[0], sig)
    assert np.allclose(oracle(ensemble(ok, leaves, [0], k=2, post_transform=2), x)[0], soft)
    one = [(0, w) for _, w in leaves]
    raw = oracle(ensemble(ok, one, [0]), x)[0]
    for post in (1, 2):
        assert np.array_equal(oracle(ensemble(ok, one, [0], post_transform=post), x)[0], raw)
