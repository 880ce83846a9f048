"""The scikit-learn frontend: fitted estimators and pipelines compiled in
memory through skl2onnx, checked against scikit-learn's own predictions
(the oracle) in both numerics; what it cannot take is refused in one
line."""
import warnings

import numpy as np
import pytest

pytest.importorskip("skl2onnx")
from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

import kmlc  # noqa: E402
from kmlc.errors import KmlcError  # noqa: E402


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def data(n=4000, seed=0):
    r = np.random.default_rng(seed)
    x = (r.normal(size=(n, 5)) * [1, 3, 0.5, 10, 2] + [0, 5, 1, -20, 0]).astype(np.float32)
    return x, (x[:, 0] - 0.3 * x[:, 1] + 0.1 * x[:, 3] > -2).astype(int)


@pytest.mark.parametrize("numerics", ["float", "fixed"])
def test_a_scaled_logistic_regression_predicts_as_scikit_learn(numerics, tmp_path):
    x, y = data()
    pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(x, y)
    res = kmlc.compile(pipe, x[:10], tmp_path / "o", targets="user", numerics=numerics,
                       calibration=x if numerics == "fixed" else None)
    assert res.manifest["name"] == "pipeline"
    got = kmlc.load(tmp_path / "o").run_named(x)
    labels = got["label"].reshape(-1)
    probs = got["probabilities"].reshape(len(x), 2)
    agree = np.mean(labels == pipe.predict(x))
    assert agree == 1.0 if numerics == "float" else agree >= 0.999
    tol = 1e-5 if numerics == "float" else 0.05     # fixed: int16 logits, the sigmoid LUT
    assert np.max(np.abs(probs - pipe.predict_proba(x))) < tol


def test_a_three_class_logistic_regression_in_float(tmp_path):
    x, _ = data()
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 5)
    lr = LogisticRegression().fit(x, y)
    kmlc.compile(lr, x[:3], tmp_path / "o", targets="user")
    got = kmlc.load(tmp_path / "o").run_named(x)
    assert np.array_equal(got["label"].reshape(-1), lr.predict(x))
    assert np.max(np.abs(got["probabilities"].reshape(len(x), 3) - lr.predict_proba(x))) < 1e-5


def test_linear_regression_and_integer_features(tmp_path):
    x, _ = data()
    xi = np.round(x).astype(np.int64)
    target = xi @ np.array([0.5, -1, 2, 0.1, 3]) + 7
    reg = LinearRegression().fit(xi, target)
    kmlc.compile(reg, xi[:3], tmp_path / "o", targets="user")
    twin = kmlc.load(tmp_path / "o")
    assert twin.in_dtype == np.int64
    got = twin.run(xi).reshape(-1)
    assert np.allclose(got, reg.predict(xi), rtol=1e-5, atol=1e-3)


def test_what_it_cannot_take_is_one_line(tmp_path):
    x, y = data(300)
    with pytest.raises(KmlcError, match="skl2onnx cannot convert this LogisticRegression"):
        kmlc.compile(LogisticRegression(), x, tmp_path / "a")          # not fitted
    with pytest.raises(KmlcError, match="no output directory given.*scikit-learn"):
        kmlc.compile(LogisticRegression().fit(x, y), tmp_path / "b")
    for d in "ab":
        assert not (tmp_path / d).exists()


def test_l1_normalized_scores_in_fixed_point(tmp_path):
    """skl2onnx writes a multi-class LogisticRegression as a LinearClassifier
    and an L1 Normalizer, a quotient by a runtime sum: fixed point takes it
    (a reciprocal table and a product), its labels scikit-learn's on every
    row, its probabilities within the compiler's error bound of
    predict_proba's."""
    x, y = data(300)
    three = (x[:, 0] > 0).astype(int) + (x[:, 1] > 5)
    lr = LogisticRegression().fit(x, three)
    res = kmlc.compile(lr, x, tmp_path / "c", numerics="fixed", calibration=x, targets="user")
    got = kmlc.load(tmp_path / "c").run_named(x)
    assert np.array_equal(got["label"].reshape(-1), lr.predict(x))
    bound = {o["name"]: o for o in res.manifest["fixed"]["outputs"]}["probabilities"]
    err = np.abs(got["probabilities"].reshape(len(x), 3) - lr.predict_proba(x)).max()
    assert 0 < err <= bound["error_bound"] + 1e-6 and err < 0.01, (err, bound)
