"""Each graph pass on hand-built graphs: what it does, and that the graph
computes the same bits before and after (by the reference evaluator)."""
import copy

import numpy as np
import pytest
from onnx import helper

from conftest import make_model
from kmlc.frontends.onnx import load
from kmlc.ir import verify
from kmlc.ops import interpret
from kmlc.passes import GRAPH_PASSES, eliminate_dead, fold_constants, fuse_dense


def graph(nodes, inputs, outputs, inits=()):
    return load(make_model(nodes, inputs, outputs, inits), name="t")


def same_bits(g0, g1, shape, n=50, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        a = interpret(g0, x)
        b = interpret(g1, x)
        for u, v in zip(a, b):
            assert np.array_equal(np.asarray(u).view(np.uint32) if u.dtype == np.float32 else u,
                                  np.asarray(v).view(np.uint32) if v.dtype == np.float32 else v)


def kinds(g):
    return [op.kind for op in g.ops]


def test_fold_constant_normalization_subgraph():
    # (x - mean) / sqrt(var + eps): the constant side folds, Sub and Div stay
    mean = np.float32([1.0, 2.0, 3.0])
    var = np.float32([4.0, 9.0, 0.25])
    nodes = [helper.make_node("Add", ["var", "eps"], ["v"], name="add_eps"),
             helper.make_node("Sqrt", ["v"], ["std"], name="sqrt"),
             helper.make_node("Mul", ["std", "one"], ["std1"], name="mul_one"),
             helper.make_node("Sub", ["x", "mean"], ["c"], name="center"),
             helper.make_node("Div", ["c", "std1"], ["y"], name="scale")]
    g = graph(nodes, [("x", [1, 3])], [("y", [1, 3])],
              {"mean": mean, "var": var, "eps": np.float32(1e-5), "one": np.float32([1.0])})
    g0 = copy.deepcopy(g)
    assert kinds(g) == ["add", "sqrt", "mul", "sub", "div"]
    g = verify(fold_constants(g))
    assert kinds(g) == ["sub", "div"]
    std = g.ops[1].inputs[1].data
    expect = np.sqrt(var + np.float32(1e-5)) * np.float32(1.0)  # f32 throughout
    assert np.array_equal(std.reshape(-1), expect)
    same_bits(g0, g, (1, 3))


def test_fold_leaves_nothing_all_constant():
    nodes = [helper.make_node("Mul", ["a", "b"], ["ab"], name="m"),
             helper.make_node("Sigmoid", ["ab"], ["s"], name="s"),
             helper.make_node("Add", ["x", "s"], ["y"], name="add")]
    g = graph(nodes, [("x", [4])], [("y", [4])],
              {"a": np.float32([1, 2, 3, 4]), "b": np.float32([0.5, -1, 2, 0])})
    g0 = copy.deepcopy(g)
    g = verify(fold_constants(g))
    assert kinds(g) == ["add"]
    same_bits(g0, g, (4,))


def test_dead_code_removed():
    nodes = [helper.make_node("Relu", ["x"], ["unused"], name="dead"),
             helper.make_node("Sigmoid", ["unused"], ["unused2"], name="dead2"),
             helper.make_node("Tanh", ["x"], ["y"], name="live")]
    g = graph(nodes, [("x", [3])], [("y", [3])])
    assert kinds(verify(eliminate_dead(g))) == ["tanh"]


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)])
@pytest.mark.parametrize("act", [None, "Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip"])
def test_fuse_gemm_bias_activation(trans_b, alpha, beta, act):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(6, 4) if trans_b else (4, 6)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="gemm", alpha=alpha,
                              beta=beta, transB=trans_b)]
    inits = {"w": w, "b": rng.normal(size=6).astype(np.float32)}
    out = "h"
    if act:
        ins = ["h", "lo", "hi"] if act == "Clip" else ["h"]
        nodes.append(helper.make_node(act, ins, ["y"], name="act"))
        inits.update({"lo": np.float32(-0.5), "hi": np.float32(0.75)} if act == "Clip" else {})
        out = "y"
    g = graph(nodes, [("x", [1, 4])], [(out, [1, 6])], inits)
    g0 = copy.deepcopy(g)
    g = verify(fuse_dense(g))
    assert kinds(g) == ["dense"]
    d = g.ops[0]
    assert d.inputs[1].type.shape == (4, 6)  # stored [K, N]
    assert d.attrs["act"] == (act.lower().replace("leakyrelu", "leaky_relu") if act else "none")
    assert d.origin == (("gemm (Gemm)", f"act ({act})") if act else ("gemm (Gemm)",))
    same_bits(g0, g, (1, 4))


def test_fuse_matmul_add_sub_bias():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(5, 3)).astype(np.float32)
    for op in ("Add", "Sub"):
        ins = ["b", "h"] if op == "Add" else ["h", "b"]
        nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                 helper.make_node(op, ins, ["y"], name="bias"),
                 helper.make_node("Relu", ["y"], ["z"], name="relu")]
        g = graph(nodes, [("x", [5])], [("z", [3])],
                  {"w": w, "b": rng.normal(size=3).astype(np.float32)})
        g0 = copy.deepcopy(g)
        g = verify(fuse_dense(g))
        assert kinds(g) == ["dense"], op
        assert len(g.ops[0].inputs) == 3 and g.ops[0].attrs["act"] == "relu"
        same_bits(g0, g, (5,))


def test_no_fusion_across_a_second_user_or_graph_output():
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Sigmoid", ["h"], ["s"], name="sig"),
             helper.make_node("Tanh", ["h"], ["t"], name="tanh")]
    g = graph(nodes, [("x", [1, 3])], [("s", [1, 2]), ("t", [1, 2])],
              {"w": rng.normal(size=(3, 2)).astype(np.float32)})
    g = verify(fuse_dense(g))
    assert kinds(g) == ["dense", "sigmoid", "tanh"]
    assert g.ops[0].attrs["act"] == "none"


def test_gemm_with_runtime_b_is_not_fused():
    nodes = [helper.make_node("Gemm", ["x", "y"], ["z"], name="g", transA=1)]
    g = graph(nodes, [("x", [3, 2]), ("y", [3, 4])], [("z", [2, 4])])
    assert kinds(verify(fuse_dense(g))) == ["gemm"]


def test_pipeline_preserves_bits_on_seed_model(seed_inputs):
    from conftest import EXAMPLES

    g = load(EXAMPLES / "nfs_rsize.onnx")
    g0 = copy.deepcopy(g)
    for _, p in GRAPH_PASSES:
        g = verify(p(g))
    assert kinds(g) == ["sub", "div", "dense", "dense", "dense", "dense"]
    x = seed_inputs("nfs_rsize", 200, 3)
    for row in x:
        a, b = interpret(g0, row[None])[0], interpret(g, row[None])[0]
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
