"""Bad input gets one clear line, a non-zero exit, no traceback and no
partial output directory."""
import json
from pathlib import Path

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
         ["'r' (Relu)", "'x'", "int64", "float32", "Cast"])
    save("uint8_input", make_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                                   [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4])],
                                   [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 4])]),
         ["input 'x'", "uint8", "float32, int32, int64 or bool"])
    save("mixed_inputs", make_model([helper.make_node("Cast", ["a"], ["af"], to=1),
                                     helper.make_node("Add", ["af", "b"], ["y"], name="add")],
                                    [helper.make_tensor_value_info("a", TensorProto.INT64, [1, 2]),
                                     ("b", [1, 2])], [("y", [1, 2])]),
         ["'a' (i64)", "'b' (f32)", "one type"])
    save("unknown_input_type", make_model(  # found by tests/fuzz (shapes, seed 1 case 134)
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [helper.make_tensor_value_info("x", 999, [1, 4])], [("y", [1, 4])]),
        ["input 'x'", "999", "not an ONNX element type"])
    save("old_opset", relu_model(opset=11), ["opset 11", "13"])
    save("zero_size", make_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                                 [("x", [0, 4])], [("y", [0, 4])]), ["'x'", "size 0"])
    save("runtime_exponent", make_model([helper.make_node("Pow", ["x", "x"], ["y"], name="root")],
                                        [("x", [1, 4])], [("y", [1, 4])]),
         ["'root' (Pow)", "exponent", "constant"])
    save("runtime_reshape", make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")],
        [("x", [1, 4]), helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [("y", [2, 2])]), ["'rs' (Reshape)", "target shape", "constant"])
    save("other_domain", make_model(
        [helper.make_node("FusedGemm", ["x"], ["y"], name="fg", domain="com.microsoft")],
        [("x", [1, 4])], [("y", [1, 4])]), ["fg", "com.microsoft"])
    # constant folding that overflows or is undefined, non-finite attributes
    for label, op, a, b in (("pow_overflow", "Pow", 3e38, 1e38), ("div_zero", "Div", 1.0, 0.0)):
        save(label, make_model([helper.make_node(op, ["a", "b"], ["c"], name="cst"),
                                helper.make_node("Add", ["x", "c"], ["y"], name="add")],
                               [("x", [1, 4])], [("y", [1, 4])],
                               {"a": np.full(4, a, np.float32), "b": np.full(4, b, np.float32)}),
             ["cst", op, "infinity", "finite constants"])
    save("nan_alpha", make_model([helper.make_node("LeakyRelu", ["x"], ["y"], name="lr",
                                                   alpha=float("nan"))],
                                 [("x", [1, 4])], [("y", [1, 4])]), ["'lr'", "alpha", "nan"])
    # what onnxruntime refuses: no outputs, an untyped output, two nodes of one name
    save("no_outputs", make_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                                  [("x", [1, 4])], []), ["no outputs"])
    save("untyped_output", make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, [1, 4])]),
        ["'y'", "no element type"])
    # found by the fuzzer (case 3696 of seed 1: one flipped byte): a
    # value_info entry of an intermediate value typed UNDEFINED, or of no
    # ONNX type at all, which kmlc's own inference never read
    for label, t, words in (("untyped_value_info", TensorProto.UNDEFINED, ["no element type"]),
                            ("bad_value_info_type", 999, ["999"])):
        m = make_model([helper.make_node("Relu", ["x"], ["h"], name="r"),
                        helper.make_node("Relu", ["h"], ["y"], name="r2")],
                       [("x", [1, 4])], [("y", [1, 4])])
        m.graph.value_info.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 4]))
        m.graph.value_info[-1].type.tensor_type.elem_type = t
        save(label, m, ["value_info entry 'h'"] + words)
    save("duplicate_node_names", make_model(
        [helper.make_node("Relu", ["x"], ["h"], name="r"),
         helper.make_node("Relu", ["h"], ["y"], name="r")], [("x", [1, 4])], [("y", [1, 4])]),
        ["two nodes are named 'r'"])
    # declared shapes over the per-call budget: refused before anything is built
    for label, dims in (("huge_dimension", [2147483648, 5]), ("fixed_batch", [1000000, 4])):
        save(label, make_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                               [("x", dims)], [("y", dims)]),
             ["'x'", f"{dims[0]},{dims[1]}", "budget", "--max-workspace-bytes"])
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
    # click's own usage errors: one line, exit 1, naming the command
    (["run", "{out}", "--output", "{y}"], ["kmlc run", "--input", "--help"]),
    (["run", "{out}", "--input", "{good}", "--output", "{tmp}"], ["--output", "directory"]),
    (["compile", "{tmp}/m.onnx", "-o", "{tmp}/m.onnx"], ["kmlc compile", "is a file"]),
    (["compile", "--bogus", "{tmp}/m.onnx"], ["No such option", "--bogus"]),
    (["run", "{out}", "--input", "{good}", "--output", "{tmp}/nodir/y.npy"],
     ["nodir/y.npy", "cannot write"]),
])
def test_cli_usage_errors(tmp_path, args, words):
    onnx.save(mlp_model([4, 3, 2]), tmp_path / "m.onnx")
    out = tmp_path / "out"
    assert kmlc_cli("compile", tmp_path / "m.onnx", "-o", out).returncode == 0
    np.save(tmp_path / "bad.npy", np.zeros((3, 9), np.float32))
    np.save(tmp_path / "good.npy", np.zeros((3, 4), np.float32))
    fill = {"out": out, "bad": tmp_path / "bad.npy", "y": tmp_path / "y.npy", "tmp": tmp_path,
            "good": tmp_path / "good.npy",
            "kdir": kernel.find_kdir()}  # Debian's headers: configured for gcc
    res = kmlc_cli(*[a.format(**fill) for a in args])
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    line = res.stderr.strip().splitlines()[0]
    for w in words:
        assert w.format(**fill) in line, line


def damaged(out: Path, how: str) -> None:
    meta = out / "kmlc.json"
    d = json.loads(meta.read_text())
    if how == "truncated json":
        meta.write_text(meta.read_text()[:40])
    elif how == "missing key":
        del d["in_elems"]
    elif how == "wrong type":
        d["out_elems"] = "2"
    elif how == "out_elems edited":
        d["out_elems"] = 1                 # once: the twin wrote past its buffer
    elif how == "outputs edited":
        d["outputs"][0]["elems"] = 1
    elif how == "out_dtype edited":
        d["out_dtype"] = "i64"             # the twin would read 8-byte elements from a float array
    elif how == "inputs not a list":
        d["inputs"] = {"x": 1}
    elif how == "not an object":
        meta.write_text("[1, 2]")
    elif how == "library not a library":
        next((out / "user").glob("*.so")).write_text("junk")
    if how in ("missing key", "wrong type", "out_elems edited", "outputs edited",
               "out_dtype edited", "inputs not a list"):
        meta.write_text(json.dumps(d))


@pytest.mark.parametrize("how", ["truncated json", "missing key", "wrong type", "out_elems edited",
                                 "outputs edited", "out_dtype edited", "inputs not a list",
                                 "not an object", "library not a library"])
def test_damaged_outdir_is_one_line(tmp_path, how):
    """A damaged OUTDIR (kmlc.json edited, truncated or of the wrong shape;
    a .so that is not a library) is one line and exit 1: the twin takes its
    sizes from the library and refuses a kmlc.json that disagrees."""
    onnx.save(mlp_model([4, 3, 2]), tmp_path / "m.onnx")
    out = tmp_path / "out"
    assert kmlc_cli("compile", tmp_path / "m.onnx", "-o", out, "--target", "user").returncode == 0
    np.save(tmp_path / "x.npy", np.ones((3, 4), np.float32))
    damaged(out, how)
    res = kmlc_cli("run", out, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy")
    assert res.returncode == 1, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "kmlc: error:" in res.stderr, res.stderr
    assert not (tmp_path / "y.npy").exists()


def test_run_output_names_the_file_written_and_refuses_nan_in_fixed_point(tmp_path):
    onnx.save(mlp_model([4, 3, 2]), tmp_path / "m.onnx")
    x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    np.save(tmp_path / "cal.npy", x)
    out = tmp_path / "out"
    assert kmlc_cli("compile", tmp_path / "m.onnx", "-o", out, "--target", "user", "--numerics",
                    "fixed", "--calibration", tmp_path / "cal.npy").returncode == 0
    res = kmlc_cli("run", out, "--input", tmp_path / "cal.npy", "--output", tmp_path / "y")
    assert res.returncode == 0 and f"-> {tmp_path / 'y.npy'} " in res.stdout, res.stdout
    assert np.load(tmp_path / "y.npy").shape == (50, 2)
    x[7, 2] = np.nan
    np.save(tmp_path / "nan.npy", x)
    res = kmlc_cli("run", out, "--input", tmp_path / "nan.npy", "--output", tmp_path / "z.npy")
    assert res.returncode == 1 and "row 7" in res.stderr and "column 2" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Warning" not in res.stderr


@pytest.mark.parametrize("point", ["mkdtemp", "rmtree"])
def test_a_signal_at_the_worst_moment(tmp_path, monkeypatch, point):
    """Found under load by the test below: SIGTERM right after mkdtemp made
    the temporary directory (before compile held its name), or while the
    previous OUTDIR was being removed, left a directory behind.  Here the
    signal arrives at exactly those points, every time: nothing is left
    but OUTDIR, whole (the old one, or the new one once the swap began)."""
    import os
    import signal

    import kmlc.api
    from kmlc.cli import _terminated

    out = tmp_path / "out"
    if point == "rmtree":
        kmlc.api.compile(mlp_model([3, 4, 2]), out, targets="user")
    mod = kmlc.api.tempfile if point == "mkdtemp" else kmlc.api.shutil
    real = getattr(mod, point)

    def then_signal(*a, **k):
        if point == "mkdtemp":              # the directory exists, unnamed yet
            r = real(*a, **k)
            os.kill(os.getpid(), signal.SIGTERM)
            return r
        if ".kmlc-old" in str(a[0]) and os.path.exists(a[0]):   # the old OUTDIR's removal
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)
    monkeypatch.setattr(mod, point, then_signal)
    old = signal.signal(signal.SIGTERM, _terminated)
    try:
        with pytest.raises(KeyboardInterrupt):
            kmlc.api.compile(mlp_model([3, 4, 2], seed=1), out, targets="user")
    finally:
        signal.signal(signal.SIGTERM, old)
    assert [p.name for p in tmp_path.iterdir()] == ([] if point == "mkdtemp" else ["out"])
    if point == "rmtree":
        assert (out / "kmlc.json").is_file() and (out / "user").is_dir()


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_interrupted_compile_leaves_nothing(tmp_path, sig):
    """A compile interrupted once its temporary directory exists (SIGINT or
    SIGTERM) removes it, creates no OUTDIR, and leaves an existing OUTDIR
    as it was."""
    import signal
    import subprocess
    import sys
    import time

    onnx.save(mlp_model([64, 64, 64, 2]), tmp_path / "m.onnx")
    out = tmp_path / "out"
    assert kmlc_cli("compile", tmp_path / "m.onnx", "-o", out, "--target", "user").returncode == 0
    before = sorted(p.name for p in (out / "user").iterdir())
    for target in (tmp_path / "fresh", out):
        exe = Path(sys.executable).parent / "kmlc"
        proc = subprocess.Popen([exe, "compile", tmp_path / "m.onnx", "-o", target],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(f".{target.name}.kmlc-*")) and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=60)
        assert not list(tmp_path.glob(".*kmlc-*")), list(tmp_path.iterdir())
        assert "Traceback" not in err, err
        if proc.returncode == 0:
            # on a loaded machine the compile can finish between the poll
            # that saw its temporary directory and the signal: then it is
            # whole (the signal's moment itself: test_a_signal_at_the_worst_moment)
            assert (target / "kmlc.json").is_file() and (target / "kunit").is_dir()
            continue
        assert target.exists() == (target == out)
    assert sorted(p.name for p in (out / "user").iterdir()) == before


def test_every_error_is_one_line(tmp_path, monkeypatch, capsys):
    """A newline in --name is escaped; a message with details (a compiler's
    output) prints its first line and says how to see the rest."""
    from kmlc import cli

    onnx.save(mlp_model([4, 3, 2]), tmp_path / "m.onnx")
    out = tmp_path / "out"
    res = kmlc_cli("compile", tmp_path / "m.onnx", "-o", out, "--name", "evil\nname")
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "'evil\\nname'" in res.stderr and not out.exists()

    def fails(*a, **k):
        raise cli.KmlcError("the build failed", details="second\nthird")
    monkeypatch.setattr("kmlc.api.compile", fails)
    assert cli.main(["compile", str(tmp_path / "m.onnx"), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == "kmlc: error: the build failed (2 more lines with KMLC_DEBUG=1)\n"
    monkeypatch.setenv("KMLC_DEBUG", "1")
    assert cli.main(["compile", str(tmp_path / "m.onnx"), "-o", str(out)]) == 1
    assert capsys.readouterr().err.count("\n") == 3


def test_names_holding_newlines_stay_on_one_line(tmp_path):
    """Found by reading the fuzzer's names class: a name with a newline cut
    the one error line at the newline (the rest of the message behind
    "1 more line").  Control characters in the line are escaped now."""
    from onnx import TensorProto
    for elem, op, words in ((TensorProto.INT64, "Relu", ["operand 'a\\nb'", "int64"]),
                            (TensorProto.FLOAT, "Pow", ["'r\\nq\\t' (Pow)", "constant"])):
        m = make_model([helper.make_node(op, ["a\nb"] * (2 if op == "Pow" else 1), ["y\nz"],
                                         name="r\nq\t")],
                       [helper.make_tensor_value_info("a\nb", elem, [1, 3])],
                       [helper.make_tensor_value_info("y\nz", elem, [1, 3])])
        onnx.save(m, tmp_path / "m.onnx")
        out = tmp_path / "out"
        assert_clean_failure(kmlc_cli("compile", tmp_path / "m.onnx", "-o", out), out, words)
        assert "more line" not in kmlc_cli("compile", tmp_path / "m.onnx", "-o", out).stderr


@pytest.mark.parametrize("field,value,words", [
    ("offset", "abc", ["offset 'abc'", "decimal byte count"]),
    ("offset", "0x10", ["offset '0x10'"]),
    ("offset", "", ["offset ''"]),
    ("length", "-5", ["length '-5'"]),
    ("location", "w\x00.bin", ["unsafe external data location"]),
    ("elem_type", 999, ["data type 999"]),
    ("op_type", b"G\xffmm", ["not valid UTF-8"]),
])
def test_malformed_external_data_and_strings(tmp_path, field, value, words):
    """Malformed external-data fields, an unknown element type and a
    string that is not UTF-8: one line, exit 1, no OUTDIR."""
    from onnx.external_data_helper import convert_model_to_external_data

    m = mlp_model([64, 64, 2])
    convert_model_to_external_data(m, location="w.bin", size_threshold=0)
    onnx.save(m, tmp_path / "ext.onnx")
    m = onnx.load(tmp_path / "ext.onnx", load_external_data=False)
    t = m.graph.initializer[0]
    if field == "elem_type":
        t.data_type = value
    elif field == "location":
        next(e for e in t.external_data if e.key == "location").value = value
    elif field in ("offset", "length"):
        e = t.external_data.add()
        e.key, e.value = field, value
    data = m.SerializeToString()
    if field == "op_type":
        data = data.replace(b"Gemm", value, 1)
    (tmp_path / "bad.onnx").write_bytes(data)
    out = tmp_path / "out"
    assert_clean_failure(kmlc_cli("compile", tmp_path / "bad.onnx", "-o", out), out, words)
