"""ONNX-ML tree ensembles (``TreeEnsembleRegressor``,
``TreeEnsembleClassifier``, and ``TreeEnsemble`` of ai.onnx.ml 5) as kmlc
IR: one ``trees`` op (kmlc.ops) that sums the leaves' votes per target,
then default-domain ops for the class decision and the post transform, in
the order of onnxruntime's CPU kernels, whose results are these
operators' reference:

  tables      the nodes of each tree, walked from its root (node 0; for
              TreeEnsemble, the node tree_roots names), numbered in
              depth-first order (true branch first) and trees in
              ascending tree id (TreeEnsemble: tree_roots' order): that is
              the order leaves are summed in, onnxruntime's on one thread.
              A tree is checked before it is compiled: every node id a
              branch names exists, no node or leaf is reached twice (no
              cycles, no shared subtrees), every feature id is an input,
              every vote is a leaf's and names a target.
  thresholds  float32, compared in float32 (x <= t for BRANCH_LEQ, and so
              on); a NaN goes to the true branch where
              nodes_missing_value_tracks_true says so, else wherever the
              comparison sends it (every test but NEQ fails)
  members     TreeEnsemble's BRANCH_MEMBER node (its list: the next of
              membership_values' NaN-ended lists, in node order) is a chain
              of tests on its feature whose exits lead to the node's two
              children; the walk takes the chain's longest path in steps.
              Up to 30 members from 0 to 30: x == v for each in turn (a
              NaN is no member).  Other sets onnxruntime 1.32 tests by the
              int32 x truncates to (a NaN or an x beyond int32: no member),
              where onnx's reference tests x itself; onnxruntime is the
              reference: each run a..b of consecutive members is the float
              interval whose values truncate into it, tested in ascending
              order as x <= its top, then x >= its bottom.  With missing
              tracks every test of the chain sends a NaN true.
  leaves      a vote (target, weight) per target a leaf names (one for
              TreeEnsemble); the sum of a target starts at 0.0 and adds
              the votes tree by tree, then AVERAGE divides it by the
              number of trees (onnx's reference divides each vote first)
              and base_values are added last (one per target; a single
              value for a single target; TreeEnsemble has none)
  regressor   the sums are the output (post_transform NONE); TreeEnsemble
              alike, a target no leaf of a row votes for is 0 there, as
              onnxruntime writes it
  classifier  with more than two classes:
              label = the class label of the first highest score, scores =
              post_transform(sums): NONE, LOGISTIC or SOFTMAX.  With two
              class labels and votes for class 0 only (the binary form
              scikit-learn, LightGBM and XGBoost converters write), s =
              the sum: when every weight is >= 0 the label is labels[1]
              if s > 0.5 and the scores are [1 - s, s]; otherwise labels[1]
              if s > 0, scores [sigmoid(-s), sigmoid(s)] for LOGISTIC
              (and refused otherwise: onnxruntime's scores then depend
              on the label)

What is refused, each in one line naming the node: string labels, the
``_as_tensor`` (double) attributes and TreeEnsemble's double tensors
(onnxruntime then compares and sums in double), PROBIT and SOFTMAX_ZERO,
aggregate MIN and MAX, a leaf voting twice for one target, a target some
rows would leave without a vote (onnxruntime keeps per-row flags of the
targets voted for and writes 0, or skips the class in the argmax, where a
row has none; base values and the argmax make that differ from a sum of
0), and the binary forms onnxruntime gives no consistent meaning: two base
values; votes for class 1 only; votes for both classes (its label is then
1 when class 1's sum is above 0, whatever class 0's, and not a class
label).  For TreeEnsemble: every post_transform but NONE (onnxruntime 1.32
applies LOGISTIC for code 1, SOFTMAX, and SOFTMAX for code 2, LOGISTIC,
and neither to a single target), a mode beyond 0..6, a non-finite split,
a BRANCH_MEMBER node without its list or with an empty one (onnxruntime
refuses it), more lists than such nodes, a member of a truncation-tested
set that is no int32 (onnxruntime refuses it) or is -2^31 (what its cast
makes of a NaN or an x beyond int32), and a single-leaf tree whose node
names a leaf other than the one onnxruntime reads: the node's own index.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from .onnx_ml import _const, _gemm, _label_of, _op, _scores, _text

MODES = {"BRANCH_LEQ": "le", "BRANCH_LT": "lt", "BRANCH_GTE": "ge", "BRANCH_GT": "gt",
         "BRANCH_EQ": "eq", "BRANCH_NEQ": "ne"}
CODES = ("le", "lt", "ge", "gt", "eq", "ne")      # flags & 7, kmlc.ops.TREE_MODES
V5_MODES = tuple(MODES) + ("BRANCH_MEMBER",)      # TreeEnsemble's nodes_modes 0 .. 6
MEMBER = 6


def _uint(n: int):
    """The narrowest unsigned type that holds 0 .. n."""
    return np.uint8 if n < 256 else np.uint16 if n < 65536 else np.uint32


class Tables:
    """The node and leaf tables of an ensemble, checked (see the module's
    docstring): ``_v3_tables`` and ``_v5_tables`` describe both forms'
    trees as ``nodes`` {key: ("LEAF",) or (mode, feature, threshold or
    members, true key, false key, missing)}, the leaves' ``votes`` {key:
    [(target, weight)]} and ``roots`` [(tree, key of its root)]; ``name``
    (key) says how a message names a key.  Every key is reached at most
    once over all trees."""

    def __init__(self, conv, node, nodes: dict, votes: dict, roots: list, name, targets: int,
                 weights: list[float]):
        self.conv, self.node, self.targets, self.weights = conv, node, targets, weights
        self.branch: list[list] = []     # (mode, feature, threshold, missing, [true, false])
        self.leaves: list[list] = []     # per leaf: its votes
        self.roots, self.depth = [], 0
        reached: set = set()
        for t, root in roots:
            self.roots.append(self._walk(t, root, nodes, votes, reached, name))
        self.n_branch = len(self.branch)

    def _walk(self, t, root, nodes, votes, reached, name) -> tuple:
        """Number tree t's nodes, depth first, true branch first, with an
        explicit stack; returns its root's reference, ("node", branch
        index) or ("leaf", leaf index) (``index`` makes it a node number).
        A node becomes a chain of tests (one, but for BRANCH_MEMBER: see
        ``_member_tests``) whose exits lead to its two children: the stack
        holds a child with the branch slots that lead to it, and its depth
        by the chain's longest path."""
        out = []
        stack = [(root, 0, [])]
        while stack:
            cur, d, slots = stack.pop()
            if cur not in nodes:
                self.conv.fail(f"tree {t} names {name(cur)}, which it does not have", self.node)
            if cur in reached:
                self.conv.fail(f"tree {t} reaches {name(cur)} twice (a cycle or a shared "
                               "subtree)", self.node)
            reached.add(cur)
            if nodes[cur][0] == "LEAF":
                ref = ("leaf", len(self.leaves))
                self.leaves.append(votes.get(cur, []))
                self.depth = max(self.depth, d)
            else:
                mode, feat, thr, true, false, miss = nodes[cur]
                tests = _member_tests(thr) if mode == "BRANCH_MEMBER" else \
                    [(MODES[mode], float(thr), "T", "F")]
                first, exits = len(self.branch), {"T": [], "F": []}
                for j, (code, v, *to) in enumerate(tests):
                    self.branch.append([code, int(feat), v, int(miss), [None, None]])
                    for side, nxt in enumerate(to):
                        if nxt in exits:
                            exits[nxt].append((first + j, side))
                        else:
                            self.branch[-1][4][side] = ("node", first + nxt)
                longest = [0] * len(tests)     # steps from test j to an exit
                for j in reversed(range(len(tests))):
                    longest[j] = 1 + max(longest[x] if isinstance(x, int) else 0
                                         for x in tests[j][2:])
                ref = ("node", first)
                stack.append((false, d + longest[0], exits["F"]))
                stack.append((true, d + longest[0], exits["T"]))
            for b, side in slots:
                self.branch[b][4][side] = ref
            out.append(ref)
        return out[0]

    def index(self, ref) -> int:
        return ref[1] if ref[0] == "node" else self.n_branch + ref[1]

    def op(self, x, base: list[float] | None, aggregate: str = "sum", **where):
        """The ``trees`` op over float input ``x`` [R, F], the tables its
        constant operands: the sums per target, base values added last."""
        conv, node = self.conv, self.node
        n, n_leaf, k = self.n_branch, len(self.leaves), self.targets
        modes = {b[0] for b in self.branch} or {"le"}
        # leaves are nodes too, whose both branches lead back to themselves:
        # every walk takes exactly ``depth`` steps, with no test of where it
        # is, so the C walks several trees in lockstep
        uniform = next(iter(modes))
        nodes = self.branch + [[uniform, 0, 0.0, 0, [("leaf", i), ("leaf", i)]]
                               for i in range(n_leaf)]
        idx_t = _uint(n + n_leaf)
        thr = np.array([b[2] for b in nodes], np.float32)
        feature = np.array([b[1] for b in nodes], _uint(max(b[1] for b in nodes)))
        nxt = np.array([[self.index(r) for r in b[4]] for b in nodes], idx_t)
        root = np.array([self.index(r) for r in self.roots], idx_t)
        missing = any(b[3] for b in self.branch)
        sparse = k > 1 and all(len(v) == 1 for v in self.leaves)
        if sparse:
            leaf = np.array([v[0][1] for v in self.leaves], np.float32)
            target = np.array([v[0][0] for v in self.leaves], _uint(k))
        else:
            leaf = np.zeros((n_leaf, k), np.float32)
            for i, v in enumerate(self.leaves):
                for j, w in v:
                    leaf[i, j] = w
        ins = [x, _const(conv, node, "threshold", thr), _const(conv, node, "leaf", leaf),
               _const(conv, node, "feature", feature), _const(conv, node, "next", nxt),
               _const(conv, node, "root", root)]
        if sparse:
            ins.append(_const(conv, node, "leaf_target", target))
        flags = len(modes) > 1 or missing
        if flags:
            ins.append(_const(conv, node, "flags", np.array(
                [CODES.index(b[0]) | (8 if b[3] else 0) for b in nodes], np.uint8)))
        if base is not None:
            ins.append(_const(conv, node, "base", np.array(base, np.float32)))
        attrs = {"targets": k, "depth": max(self.depth, 1), "branches": n,
                 "mode": modes.pop() if len(modes) == 1 else "mixed", "aggregate": aggregate,
                 "sparse": sparse, "flags": flags, "base": base is not None}
        return _op(conv, node, "trees", ins, attrs, **where)


def _v3_tables(conv, node, a: dict, n_features: int, targets: int, prefix: str) -> Tables:
    """The tables of a TreeEnsembleRegressor (``prefix`` "target") or
    TreeEnsembleClassifier ("class") node: trees in ascending tree id,
    each from its node 0."""
    fail = lambda msg: conv.fail(msg, node)  # noqa: E731
    for k in a:
        if k.endswith("_as_tensor"):
            fail(f"attribute {k}: double-precision tree tables (onnxruntime then compares "
                 "and sums in double; kmlc's trees are float32)")
    get = lambda k: list(a.get(k, []))  # noqa: E731
    tids, nids = get("nodes_treeids"), get("nodes_nodeids")
    cols = {k: get(f"nodes_{k}") for k in ("featureids", "values", "modes", "truenodeids",
                                            "falsenodeids", "missing_value_tracks_true")}
    n = len(nids)
    if n == 0 or len(tids) != n:
        fail(f"{len(tids)} nodes_treeids for {n} nodes_nodeids")
    for k, v in cols.items():
        if k == "missing_value_tracks_true" and not v:
            cols[k] = [0] * n
        elif len(v) != n:
            fail(f"{len(v)} nodes_{k} for {n} nodes")
    nodes = {}
    for i, key in enumerate(zip(tids, nids)):
        if key in nodes:
            fail(f"tree {key[0]} has node {key[1]} twice")
        mode = _text(cols["modes"][i])
        if mode != "LEAF" and mode not in MODES:
            why = "its members are listed in TreeEnsemble, ai.onnx.ml 5, only" \
                if mode == "BRANCH_MEMBER" else "not a node mode"
            fail(f"node mode {mode} ({why})")
        if mode != "LEAF" and not 0 <= cols["featureids"][i] < n_features:
            fail(f"tree {key[0]} node {key[1]} tests feature {cols['featureids'][i]} of "
                 f"an input of {n_features}")
        nodes[key] = (mode, *(cols[k][i] for k in ("featureids", "values", "truenodeids",
                                                     "falsenodeids",
                                                     "missing_value_tracks_true")))
    votes = defaultdict(list)
    vt, vn, vi, vw = (get(f"{prefix}_{k}") for k in ("treeids", "nodeids", "ids", "weights"))
    if not len(vt) == len(vn) == len(vi) == len(vw):
        fail(f"{prefix}_treeids, _nodeids, _ids and _weights differ in length")
    for t, nid, k, w in zip(vt, vn, vi, vw):
        if nodes.get((t, nid), ("",))[0] != "LEAF":
            fail(f"a vote for tree {t} node {nid}, which is not a leaf")
        if not 0 <= k < targets:
            fail(f"a vote for target {k} of {targets}")
        if any(k == k2 for k2, _ in votes[(t, nid)]):
            fail(f"tree {t} leaf {nid} votes twice for target {k} (the order of the "
                 "two additions is not compiled)")
        votes[(t, nid)].append((int(k), float(w)))
    trees = sorted(set(tids))
    for t in trees:
        if (t, 0) not in nodes:
            fail(f"tree {t} has no node 0 (its root)")
    nodes = {k: (*v[:3], (k[0], v[3]), (k[0], v[4]), v[5]) for k, v in nodes.items()}
    return Tables(conv, node, nodes, votes, [(t, (t, 0)) for t in trees],
                  lambda key: f"node {key[1]}", targets, vw)


def _v5_tables(conv, node, a: dict, n_features: int, targets: int) -> Tables:
    """The tables of a TreeEnsemble (ai.onnx.ml 5) node: trees in the
    order of tree_roots, keys ("node", i) and ("leaf", j) into the nodes_
    and leaf_ attributes, each BRANCH_MEMBER node with its members."""
    fail = lambda msg: conv.fail(msg, node)  # noqa: E731
    modes = [int(m) for m in _tensor(conv, node, a, "nodes_modes").reshape(-1)]
    splits = _tensor(conv, node, a, "nodes_splits").astype(np.float32).reshape(-1)
    n = len(modes)
    cols = {k: list(a.get(f"nodes_{k}", [])) for k in (
        "featureids", "truenodeids", "trueleafs", "falsenodeids", "falseleafs",
        "missing_value_tracks_true")}
    if not cols["missing_value_tracks_true"]:
        cols["missing_value_tracks_true"] = [0] * n
    if n == 0:
        fail("no nodes_modes (a tree that is a single leaf has a node naming it)")
    for k, v in [("splits", splits)] + list(cols.items()):
        if len(v) != n:
            fail(f"{len(v)} nodes_{k} for {n} nodes_modes")
    targ = [int(k) for k in a.get("leaf_targetids", [])]
    weight = _tensor(conv, node, a, "leaf_weights").astype(np.float32).reshape(-1)
    if not targ or len(targ) != len(weight):
        fail(f"{len(targ)} leaf_targetids for {len(weight)} leaf_weights")
    for j, k in enumerate(targ):
        if not 0 <= k < targets:
            fail(f"leaf {j} votes for target {k} of {targets}")
    sets = _member_lists(conv, node, a, modes)
    nodes, votes = {}, {}
    for j, (k, w) in enumerate(zip(targ, weight)):
        nodes[("leaf", j)] = ("LEAF",)
        votes[("leaf", j)] = [(k, float(w))]
    for i, mode in enumerate(modes):
        if not 0 <= mode < len(V5_MODES):
            fail(f"node {i} has mode {mode} (TreeEnsemble's modes are 0 to 6)")
        feat = cols["featureids"][i]
        if not 0 <= feat < n_features:
            fail(f"node {i} tests feature {feat} of an input of {n_features}")
        if mode != MEMBER and not np.isfinite(splits[i]):
            fail(f"node {i} splits at {splits[i]}: kmlc needs finite thresholds")
        kid = [("leaf" if cols[f"{s}leafs"][i] else "node", cols[f"{s}nodeids"][i])
               for s in ("true", "false")]
        nodes[("node", i)] = (V5_MODES[mode], feat, sets.get(i, splits[i]), *kid,
                              cols["missing_value_tracks_true"][i])
    roots = []
    for t, r in enumerate(a.get("tree_roots", [])):
        if not 0 <= r < n:
            fail(f"tree_roots names node {r} of {n}")
        kid = [(bool(cols[f"{s}leafs"][r]), cols[f"{s}nodeids"][r])
               for s in ("true", "false")]
        if kid[0][0] and kid[0] == kid[1]:   # a single leaf: onnxruntime reads leaf r
            if kid[0][1] != r:
                fail(f"tree {t} is the single leaf {kid[0][1]} named by node {r}, and "
                     f"onnxruntime reads leaf {r} for it (kmlc compiles the form when "
                     "the two are the same)")
            roots.append((t, ("leaf", r)))
        else:
            roots.append((t, ("node", r)))
    if not roots:
        fail("no tree_roots")
    return Tables(conv, node, nodes, votes, roots, lambda key: f"{key[0]} {key[1]}",
                  targets, list(weight))


def _tensor(conv, node, a: dict, k: str) -> np.ndarray:
    """TreeEnsemble's tensor attribute ``k`` (an empty array if absent);
    a double one refused (onnxruntime then compares and sums in double)."""
    from onnx import TensorProto, numpy_helper

    t = a.get(k)
    if t is None:
        return np.zeros(0, np.float32)
    if not isinstance(t, TensorProto):
        conv.fail(f"attribute {k} is not a tensor", node)
    if t.data_type == TensorProto.DOUBLE:
        conv.fail(f"attribute {k} is a double tensor (onnxruntime then compares and sums in "
                  "double; kmlc's trees are float32)", node)
    return np.asarray(numpy_helper.to_array(t))


def _member_lists(conv, node, a: dict, modes: list[int]) -> dict[int, list[float]]:
    """{node index: its members} for the BRANCH_MEMBER nodes, in node
    order, from membership_values: one list per such node, each ended by
    a NaN (the last one's may be left out, as onnxruntime reads it); a
    list missing, one too many or an empty one (onnxruntime refuses it)
    refused."""
    vals = _tensor(conv, node, a, "membership_values").astype(np.float32).reshape(-1)
    lists, cur = [], []
    for v in vals:
        if np.isnan(v):
            lists.append(cur)
            cur = []
        else:
            cur.append(float(v))
    if cur:
        lists.append(cur)
    members = [i for i, m in enumerate(modes) if m == MEMBER]
    if len(lists) < len(members):
        conv.fail(f"node {members[len(lists)]} is BRANCH_MEMBER node {len(lists) + 1} of "
                  f"{len(members)}, and membership_values has {len(lists)} lists (one per "
                  "BRANCH_MEMBER node, each ended by a NaN)", node)
    if len(lists) > len(members):
        conv.fail(f"membership_values has {len(lists)} lists for {len(members)} "
                  "BRANCH_MEMBER nodes", node)
    for i, v in zip(members, lists):
        if not v:
            conv.fail(f"node {i} has an empty list of members (onnxruntime refuses it)", node)
        if not (len(v) < 31 and 0 <= min(v) and max(v) <= 30):
            bad = [m for m in v if not (-2.0**31 <= m < 2.0**31 and m == int(m))]
            if bad:
                conv.fail(f"node {i} has {bad[0]} among {len(v)} members from {min(v)} to "
                          f"{max(v)}: onnxruntime tests such a set (more than 30, or beyond 0 "
                          "to 30) on x truncated to int32, and refuses members that are not "
                          "int32", node)
            if -2.0**31 in v:
                conv.fail(f"node {i} has member -2147483648, which onnxruntime's truncation "
                          "to int32 also makes of a NaN and of every x beyond int32", node)
    return dict(zip(members, lists))


def _member_tests(vals: list[float]) -> list[tuple]:
    """The tests of a BRANCH_MEMBER node as onnxruntime 1.32 decides it:
    (mode, threshold, where a test that holds goes, where one that fails
    goes), each a later test's index, "T" (the node's true child) or "F".
    Up to 30 members from 0 to 30: x == v for each, in order (x is a
    member exactly).  Otherwise onnxruntime tests the integer x truncates
    to (and ``_member_lists`` has checked each member is an integer): x
    is a member when it is in one of the float intervals whose values
    truncate to a run of consecutive members, tested in ascending order,
    x <= the interval's top, then x >= its bottom."""
    if len(vals) < 31 and 0 <= min(vals) and max(vals) <= 30:
        return [("eq", v, "T", j + 1 if j + 1 < len(vals) else "F")
                for j, v in enumerate(vals)]
    ints = sorted({int(v) for v in vals})
    runs = [[ints[0], ints[0]]]
    for v in ints[1:]:
        if v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    tests = []
    for j, (lo, hi) in enumerate(runs):
        # trunc(x) in [lo, hi]: x > lo - 1 (x >= lo above 0), x < hi + 1 (x <= hi below 0)
        bottom = float(lo) if lo > 0 else _next_f32(lo - 1, 1)
        top = float(hi) if hi < 0 else _next_f32(hi + 1, -1)
        k = len(tests)
        tests += [("le", top, k + 1, k + 2 if j + 1 < len(runs) else "F"),
                  ("ge", bottom, "T", "F")]
    return tests


def _next_f32(v: int, way: int) -> float:
    """The float32 next to the integer ``v``: the least above it (way 1)
    or the greatest below it (way -1)."""
    f = np.float32(v)
    if (float(f) - v) * way <= 0:
        f = np.nextafter(f, np.float32(way * np.inf))
    return float(f)


def convert_v5(conv, node, a: dict, x) -> None:
    """Converts a TreeEnsemble (ai.onnx.ml 5) ``node`` over float input
    ``x`` [R, F]: the sums per target, from 0.0 (a target no leaf of a row
    votes for is 0, as onnxruntime writes it), AVERAGE's division; post
    transform NONE."""
    post = int(a.get("post_transform", 0))
    agg = int(a.get("aggregate_function", 1))
    if post != 0:
        name = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
        what = name[post] if 0 <= post < len(name) else "unknown"
        conv.fail(f"post_transform {post} ({what}): kmlc compiles 0 (NONE); onnxruntime 1.32 "
                  "applies LOGISTIC for 1 and SOFTMAX for 2, and neither to a single target "
                  "(put a Softmax or Sigmoid node after this one)", node)
    if agg not in (0, 1):
        conv.fail(f"aggregate_function {agg}: kmlc compiles 0 (AVERAGE) and 1 (SUM)", node)
    k = int(a.get("n_targets", 0))
    if k < 1:
        conv.fail(f"n_targets {k}: a TreeEnsemble has at least one target", node)
    tab = _v5_tables(conv, node, a, x.type.shape[1], k)
    tab.op(x, None, "average" if agg == 0 else "sum", last=True)


def convert(conv, node, a: dict, x) -> None:
    """Converts TreeEnsembleRegressor and TreeEnsembleClassifier ``node``
    over float input ``x`` [R, F] (onnx_ml.convert has cast and shaped it),
    and TreeEnsemble (``convert_v5``)."""
    if node.op_type == "TreeEnsemble":
        convert_v5(conv, node, a, x)
        return
    post = _text(a.get("post_transform", "NONE"))
    agg = _text(a.get("aggregate_function", "SUM"))
    f = x.type.shape[1]
    if node.op_type == "TreeEnsembleRegressor":
        if post != "NONE":
            conv.fail(f"post_transform {post}: kmlc compiles NONE for regressors (onnxruntime "
                      "ignores LOGISTIC and SOFTMAX for a single target)", node)
        if agg not in ("SUM", "AVERAGE"):
            conv.fail(f"aggregate_function {agg}: kmlc compiles SUM and AVERAGE", node)
        k = int(a.get("n_targets", 1))
        tab = _v3_tables(conv, node, a, f, k, "target")
        _check_voted(conv, node, tab, k, "target")
        base = [float(v) for v in a.get("base_values", [])]
        if base and len(base) != k:
            conv.fail(f"{len(base)} base_values for {k} targets", node)
        # onnxruntime adds a single target's origin, 0 without base values
        tab.op(x, base or ([0.0] if k == 1 else None), agg.lower(), last=True)
        return
    if a.get("classlabels_strings"):
        conv.fail("string class labels: kmlc outputs numbers (use classlabels_int64s)", node)
    if post not in ("NONE", "LOGISTIC", "SOFTMAX"):
        conv.fail(f"post_transform {post}: kmlc compiles NONE, LOGISTIC and SOFTMAX", node)
    labels = [int(v) for v in a.get("classlabels_int64s", [])]
    if len(labels) < 2:
        conv.fail(f"{len(labels)} class labels", node)
    base = [float(v) for v in a.get("base_values", [])]
    ids = set(a.get("class_ids", []))
    scores_out = node.output[1] if len(node.output) > 1 and node.output[1] else None
    if len(labels) == 2 and ids <= {0}:
        _binary(conv, node, a, x, labels, base, post, scores_out)
        return
    if len(labels) == 2 and ids == {1}:
        conv.fail("two classes with votes for class 1 only (onnxruntime's scores for it "
                  "depend on the base values in ways its code calls undefined)", node)
    k = len(labels)
    if k == 2:
        conv.fail("two classes both voted for: onnxruntime then gives 1 when class 1's sum is "
                  "above 0 and 0 otherwise, not a class label, whatever class 0's sum (kmlc "
                  "refuses the form rather than pick a meaning)", node)
    tab = _v3_tables(conv, node, a, f, k, "class")
    if base and len(base) != k:
        conv.fail(f"{len(base)} base_values for {k} classes", node)
    if not base:                       # base values give every class a score
        _check_voted(conv, node, tab, k)
    s = tab.op(x, base or None)
    idx = _op(conv, node, "argmax", [s], {"axis": 1, "keepdims": 0, "select_last_index": 0})
    _label_of(conv, node, idx, labels)
    if scores_out:
        _scores(conv, node, s, post, scores_out)


def _check_voted(conv, node, tab: Tables, k: int, what: str = "class") -> None:
    """Every target has a vote on every row: some tree votes for it at
    every leaf.  onnxruntime keeps a per-row flag of the targets a row's
    leaves voted for, and writes 0 for a regressor's target without a vote
    (its base value ignored) and leaves a class without one out of the
    argmax; kmlc's sums have no such flags, so it compiles only ensembles
    whose flags are set on every row."""
    always = set()
    for r in tab.roots:
        sets = [frozenset(j for j, _ in tab.leaves[i]) for i in _leaves_of(tab, r)]
        always |= frozenset.intersection(*sets)
    missing = sorted(set(range(k)) - always)
    if missing:
        conv.fail(f"{what} {missing[0]} has no vote on some rows: no tree votes for it at every "
                  f"leaf (onnxruntime then writes 0 for it, or leaves it out of the argmax, "
                  "row by row)", node)


def _leaves_of(tab: Tables, ref) -> list[int]:
    out, stack = [], [ref]
    while stack:
        r = stack.pop()
        if r[0] == "leaf":
            out.append(r[1])
        else:
            stack.extend(tab.branch[r[1]][4])
    return out


def _binary(conv, node, a, x, labels, base, post, scores_out) -> None:
    if len(base) > 1:
        conv.fail(f"two classes, votes for class 0 only and {len(base)} base values "
                  "(onnxruntime uses one)", node)
    tab = _v3_tables(conv, node, a, x.type.shape[1], 1, "class")
    _check_voted(conv, node, tab, 1)
    s = tab.op(x, base or None)
    positive = all(w >= 0 for w in tab.weights)
    cut = _const(conv, node, "cut", np.array([0.5 if positive else 0.0], np.float32))
    flat = _op(conv, node, "reshape", [s], {"shape": [s.type.shape[0]]})
    win = _op(conv, node, "compare", [flat, cut], {"cmp": "gt"})
    _op(conv, node, "where", [win, _const(conv, node, "positive", np.array([labels[1]], np.int64)),
                              _const(conv, node, "negative", np.array([labels[0]], np.int64))],
        last=True)
    if not scores_out:
        return
    if positive:                       # [1 - s, s] = s @ [[-1, 1]] + [1, 0], exact
        sign = _const(conv, node, "sign", np.array([[-1, 1]], np.float32))
        one = _const(conv, node, "one", np.array([1, 0], np.float32))
        _gemm(conv, node, [s, sign, one], out=scores_out)
    elif post == "LOGISTIC":           # [sigmoid(-s), sigmoid(s)]
        both = _gemm(conv, node, [s, _const(conv, node, "sign", np.array([[-1, 1]],
                                                                              np.float32))])
        _op(conv, node, "sigmoid", [both], out=scores_out)
    else:
        conv.fail(f"two classes, signed votes for class 0 and post_transform {post} "
                  "(onnxruntime's scores then depend on the label; kmlc compiles LOGISTIC)",
                  node)
