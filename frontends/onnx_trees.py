"""ONNX-ML tree ensembles (``TreeEnsembleRegressor``,
``TreeEnsembleClassifier``) as kmlc IR: one ``trees`` op (kmlc.ops) that
sums the leaves' votes per target, then default-domain ops for the class
decision and the post transform, in the order of onnxruntime's CPU
kernels, whose results are these operators' reference:

  tables      the nodes of each tree, walked from node 0, numbered in
              depth-first order (true branch first) and trees in
              ascending tree id: that is the order leaves are summed in,
              onnxruntime's on one thread.  A tree is checked before it is
              compiled: every node id a branch names exists, no node is
              reached twice (no cycles, no shared subtrees), every feature
              id is an input, every vote is a leaf's and names a target.
  thresholds  float32, compared in float32 (x <= t for BRANCH_LEQ, and so
              on); a NaN goes to the true branch where
              nodes_missing_value_tracks_true says so, else wherever the
              comparison sends it (every test but NEQ fails)
  leaves      a vote (target, weight) per target a leaf names; the sum of
              a target starts at 0.0 and adds the votes tree by tree,
              then AVERAGE divides it by the number of trees and
              base_values are added last (one per target; a single value
              for a single target)
  regressor   the sums are the output (post_transform NONE)
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
``_as_tensor`` (double) attributes (onnxruntime then compares and sums in
double), PROBIT and SOFTMAX_ZERO, aggregate MIN and MAX, a leaf voting
twice for one target, a target some rows would leave without a vote
(onnxruntime keeps per-row flags of the targets voted for and writes 0,
or skips the class in the argmax, where a row has none), and the binary
forms onnxruntime gives no consistent meaning: two base values; votes for
class 1 only; votes for both classes (its label is then 1 when class 1's
sum is above 0, whatever class 0's, and not a class label).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from .onnx_ml import _const, _gemm, _label_of, _op, _scores, _text

MODES = {"BRANCH_LEQ": "le", "BRANCH_LT": "lt", "BRANCH_GTE": "ge", "BRANCH_GT": "gt",
         "BRANCH_EQ": "eq", "BRANCH_NEQ": "ne"}
CODES = ("le", "lt", "ge", "gt", "eq", "ne")      # flags & 7, kmlc.ops.TREE_MODES


def _uint(n: int):
    """The narrowest unsigned type that holds 0 .. n."""
    return np.uint8 if n < 256 else np.uint16 if n < 65536 else np.uint32


class Tables:
    """The node and leaf tables of an ensemble, checked (see the module's
    docstring)."""

    def __init__(self, conv, node, a: dict, n_features: int, targets: int, prefix: str):
        self.conv, self.node = conv, node
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
                fail(f"node mode {mode} (BRANCH_MEMBER and others are not compiled)")
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
        self.weights = vw
        self.trees = sorted(set(tids))
        self.branch: list[tuple] = []    # (mode, feature, threshold, missing, [true, false])
        self.leaves: list[list] = []     # per leaf: its votes
        self.roots, self.depth = [], 0
        reached = set()
        for t in self.trees:
            if (t, 0) not in nodes:
                fail(f"tree {t} has no node 0 (its root)")
            self.roots.append(self._walk(t, nodes, votes, reached))
        self.n_branch = len(self.branch)
        self.targets = targets

    def _walk(self, t, nodes, votes, reached) -> tuple:
        """Number tree t's nodes, depth first, true branch first, with an
        explicit stack; returns its root's reference, ("node", branch
        index) or ("leaf", leaf index) (``index`` makes it a node number)."""
        out: dict = {}
        stack = [(0, 0, None, 0)]
        while stack:
            cur, d, parent, side = stack.pop()
            if (t, cur) not in nodes:
                self.conv.fail(f"tree {t} names node {cur}, which it does not have", self.node)
            if (t, cur) in reached:
                self.conv.fail(f"tree {t} reaches node {cur} twice (a cycle or a shared "
                               "subtree)", self.node)
            reached.add((t, cur))
            mode, feat, thr, true, false, miss = nodes[(t, cur)]
            if mode == "LEAF":
                ref = ("leaf", len(self.leaves))
                self.leaves.append(votes.get((t, cur), []))
                self.depth = max(self.depth, d)
            else:
                ref = ("node", len(self.branch))
                self.branch.append([MODES[mode], int(feat), float(thr), int(miss), [None, None]])
                stack.append((false, d + 1, ref[1], 1))
                stack.append((true, d + 1, ref[1], 0))
            if parent is None:
                out["root"] = ref
            else:
                self.branch[parent][4][side] = ref
        return out["root"]

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


def convert(conv, node, a: dict, x) -> None:
    """Converts TreeEnsembleRegressor and TreeEnsembleClassifier ``node``
    over float input ``x`` [R, F] (onnx_ml.convert has cast and shaped it)."""
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
        tab = Tables(conv, node, a, f, k, "target")
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
    tab = Tables(conv, node, a, f, k, "class")
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
    tab = Tables(conv, node, a, x.type.shape[1], 1, "class")
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
