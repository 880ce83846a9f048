"""Bad input gets one clear line, a non-zero exit, no traceback and no
partial output directory."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import kmlc_cli, make_model, mlp_model
from kmlc.targets import kernel


def relu_model(**kw):
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                      [("x", ["N", 4])], [("y", ["N", 4])], **kw)


def bad_models(tmp_path):
    """(label, path, words the message must contain)"""
    cases = []

    def save(label, model, words):
        p = tmp_path / f"{label}.onnx"
        onnx.save(model, p) if isinstance(model, onnx.ModelProto) else p.write_bytes(model)
        cases.append((label, p, words))

    save("unknown_op", make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv1")],
                                  [("x", [1, 1, 4, 4])], [("y", [1, 1, 3, 3])],
                                  {"w": np.ones((1, 1, 2, 2), np.float32)}),
         ["conv1", "Conv", "supported ops", "Gemm"])
    good = mlp_model([4, 3, 2]).SerializeToString()
    save("truncated", good[: len(good) // 2], ["truncated"])
    save("empty", b"", ["not a readable ONNX model"])
    save("dynamic_dim", make_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                                   [("x", ["N", "seq"])], [("y", ["N", "seq"])]),
         ["'x'", "dynamic dimension 1", "seq"])
    save("missing_initializer",
         make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                    [("x", [1, 4])], [("y", [1, 2])]), ["mm", "'w'"])
    save("int_input", make_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                                 [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 4])],
                                 [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 4])]),
         ["input 'x'", "int64", "float32"])
    save("old_opset", relu_model(opset=11), ["opset 11", "13"])
    save("zero_size", make_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                                 [("x", [0, 4])], [("y", [0, 4])]), ["'x'", "size 0"])
    save("runtime_sqrt", make_model([helper.make_node("Sqrt", ["x"], ["y"], name="root")],
                                    [("x", [1, 4])], [("y", [1, 4])]),
         ["root", "sqrt", "compile time"])
    save("runtime_reshape", make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")],
        [("x", [1, 4]), helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [("y", [2, 2])]), ["input 's'", "int64"])
    save("other_domain", make_model(
        [helper.make_node("FusedGemm", ["x"], ["y"], name="fg", domain="com.microsoft")],
        [("x", [1, 4])], [("y", [1, 4])]), ["fg", "com.microsoft"])
    return cases


def assert_clean_failure(res, outdir, words):
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("kmlc: error: ")
    assert "Traceback" not in res.stderr + res.stdout
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"
    assert not outdir.exists()
    assert not [p for p in outdir.parent.iterdir() if ".kmlc-" in p.name], "temp dir left behind"


def test_bad_models(tmp_path):
    for label, path, words in bad_models(tmp_path):
        out = tmp_path / f"out_{label}"
        assert_clean_failure(kmlc_cli("compile", path, "-o", out), out, words)


def test_missing_external_data(tmp_path):
    from onnx.external_data_helper import convert_model_to_external_data

    m = mlp_model([64, 64, 2])
    convert_model_to_external_data(m, location="w.bin", size_threshold=0)
    onnx.save(m, tmp_path / "ext.onnx")
    assert (tmp_path / "w.bin").exists()
    (tmp_path / "w.bin").unlink()
    out = tmp_path / "out"
    assert_clean_failure(kmlc_cli("compile", tmp_path / "ext.onnx", "-o", out), out,
                         ["w.bin", "not found"])


def test_over_budget(tmp_path):
    onnx.save(mlp_model([512, 512, 2]), tmp_path / "big.onnx")
    out = tmp_path / "out"
    assert_clean_failure(kmlc_cli("compile", tmp_path / "big.onnx", "-o", out,
                                  "--max-weight-bytes", "100000"), out,
                         # 4 B * (512*512 + 512 + 512*2 + 2) = 1054728
                         ["1054728 B of weights", "100000", "w0"])


def test_missing_file_and_bad_golden_data(tmp_path):
    out = tmp_path / "out"
    assert_clean_failure(kmlc_cli("compile", tmp_path / "nope.onnx", "-o", out), out,
                         ["nope.onnx", "no such file"])
    onnx.save(mlp_model([4, 3, 2]), tmp_path / "m.onnx")
    np.save(tmp_path / "g.npy", np.zeros((5, 7), np.float32))
    assert_clean_failure(kmlc_cli("compile", tmp_path / "m.onnx", "-o", out, "--golden-data",
                                  tmp_path / "g.npy"), out, ["golden data", "(5, 7)", "4"])


def test_refuses_to_replace_a_foreign_directory(tmp_path):
    onnx.save(mlp_model([4, 3, 2]), tmp_path / "m.onnx")
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("do not delete")
    res = kmlc_cli("compile", tmp_path / "m.onnx", "-o", out)
    assert res.returncode == 1 and "refusing" in res.stderr
    assert (out / "thesis.tex").read_text() == "do not delete"


def test_failed_recompile_keeps_previous_output(tmp_path):
    onnx.save(mlp_model([4, 3, 2]), tmp_path / "m.onnx")
    out = tmp_path / "out"
    assert kmlc_cli("compile", tmp_path / "m.onnx", "-o", out, "--target", "user").returncode == 0
    before = sorted(p.name for p in (out / "user").iterdir())
    (tmp_path / "m.onnx").write_bytes(b"garbage")
    res = kmlc_cli("compile", tmp_path / "m.onnx", "-o", out, "--target", "user")
    assert res.returncode == 1
    assert sorted(p.name for p in (out / "user").iterdir()) == before


@pytest.mark.parametrize("args,words", [
    (["run", "{out}", "--input", "{bad}", "--output", "{y}"], ["(3, 9)", "rows of 4"]),
    (["run", "{tmp}", "--input", "{bad}", "--output", "{y}"], ["kmlc.json"]),
    (["build", "{tmp}"], ["no Kbuild"]),
    (["build", "{out}", "--kdir", "{tmp}"], ["not a kernel build directory"]),
    (["build", "{out}", "--llvm", "--kdir", "{kdir}"], ["not configured with clang", "LLVM=1"]),
    (["qemu-test", "{out}", "{out}"], ["two models build the module kml_m", "--name"]),
    (["qemu-test", "{tmp}"], ["kmlc.json", "{tmp}"]),
])
def test_cli_usage_errors(tmp_path, args, words):
    onnx.save(mlp_model([4, 3, 2]), tmp_path / "m.onnx")
    out = tmp_path / "out"
    assert kmlc_cli("compile", tmp_path / "m.onnx", "-o", out).returncode == 0
    np.save(tmp_path / "bad.npy", np.zeros((3, 9), np.float32))
    fill = {"out": out, "bad": tmp_path / "bad.npy", "y": tmp_path / "y.npy", "tmp": tmp_path,
            "kdir": kernel.find_kdir()}  # Debian's headers: configured for gcc
    res = kmlc_cli(*[a.format(**fill) for a in args])
    assert res.returncode == 1 and "Traceback" not in res.stderr
    line = res.stderr.strip().splitlines()[0]
    for w in words:
        assert w.format(**fill) in line, line
