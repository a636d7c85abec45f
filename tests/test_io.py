"""Measurement, ledger and model files: exact round trips, versions, corruption."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_dpgm import io
from numpyro_dpgm.distributions import MarkovRandomField
from numpyro_dpgm.domain import Domain
from numpyro_dpgm.io import (
    FileFormatError,
    load_ledger,
    load_measurements,
    load_model,
    save_ledger,
    save_measurements,
    save_model,
)
from numpyro_dpgm.io._files import write_document
from numpyro_dpgm.measurements import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    Measurement,
)
from numpyro_dpgm.network import MarkovNetwork
from numpyro_dpgm.privacy import (
    ZCDP,
    ApproxDP,
    PrivacyLedger,
    PureDP,
    release_tables,
    simulate_release,
)

DOMAIN = Domain({"a": 2, "b": 3, "c": 4})
# floats that a decimal format must not round: 0.1 + 0.2, tiny, denormal, huge, negative zero
AWKWARD = [0.1 + 0.2, 1e-300, 5e-324, 1.7976931348623157e308, -0.0, 1 / 3]


def _measurements():
    rng = np.random.default_rng(0)
    return [
        Measurement(("a", "b"), AWKWARD, Laplace(1 / 3)),
        Measurement(("c",), rng.normal(size=4), Gaussian(2.5)),
        Measurement(("b", "c"), rng.integers(-5, 20, 12), DiscreteLaplace(3.0)),
        Measurement(("a",), [7.0, 9.0], DiscreteGaussian(0.7)),
        Measurement(("b", "a"), rng.normal(size=2), Gaussian(1.0), query=rng.normal(size=(2, 6))),
    ]


def _same_measurements(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys, strict=True):
        assert x.clique == y.clique and x.noise == y.noise and type(x.noise) is type(y.noise)
        assert x.values.tobytes() == y.values.tobytes()  # bit for bit, -0.0 included
        assert (x.query is None) == (y.query is None)
        if x.query is not None:
            assert x.query.tobytes() == y.query.tobytes()


def test_measurements_round_trip_exactly(tmp_path):
    ledger = PrivacyLedger(ApproxDP(4.0, 1e-6), currency="zcdp", conversion="cks20")
    ledger.debit(PureDP(0.3), "one-way", {"cliques": (("a",), ("c",)), "noise": Laplace(2.0)})
    ledger.debit([ApproxDP(0.3, 1e-7), ZCDP(0.01)], "two-way",
                 {"nested": {"x": [1, 2.5, None, True]}, "$odd": "key", "inf": math.inf})
    meas = _measurements()
    path = save_measurements(tmp_path / "m.json", meas, DOMAIN,
                             categories={"a": ["no", "yes"], "c": [1, 2.5, True, "x"]},
                             total=1234.0, ledger=ledger)
    saved = load_measurements(path)
    _same_measurements(meas, saved.measurements)
    assert saved.domain == DOMAIN and list(saved.domain) == ["a", "b", "c"]
    assert saved.categories == {"a": ["no", "yes"], "c": [1, 2.5, True, "x"]}
    assert type(saved.categories["c"][2]) is bool
    assert saved.total == 1234.0
    back = saved.ledger
    assert back.total == ledger.total and back.currency == "zcdp"
    assert back.conversion == "cks20" and back.budget == ledger.budget
    assert back.history == ledger.history and back.spent == ledger.spent
    assert back.history[1].details["inf"] == math.inf
    assert back.history[0].details["cliques"] == (("a",), ("c",))
    # the file is plain JSON with its header
    doc = json.loads(path.read_text())
    assert doc["format"] == "numpyro_dpgm.measurements" and doc["version"] == 1


def test_ledger_of_a_real_release_round_trips(tmp_path):
    ledger = PrivacyLedger(PureDP(3.0))
    records = np.array([[0, 1, 2], [1, 2, 3], [0, 0, 0]])
    simulate_release(records, [("a", "b")], 1.0, jax.random.key(0), domain=DOMAIN, ledger=ledger)
    release_tables({("c",): np.array([1.0, 2.0, 3.0, 4.0])}, 0.5, ledger=ledger,
                   mechanism="discrete_laplace")
    save_ledger(tmp_path / "l.json", ledger)
    back = load_ledger(tmp_path / "l.json")
    assert back.history == ledger.history and back.remaining == ledger.remaining
    assert back.history[0].details["sensitivity"] == ledger.history[0].details["sensitivity"]
    # the loaded ledger keeps refusing to overspend
    assert not back.can_afford(PureDP(1.6)) and back.can_afford(PureDP(1.5))


def test_model_round_trip_exactly(tmp_path):
    net = MarkovNetwork(DOMAIN, [("a", "b"), ("b", "c")])
    theta = jax.random.normal(jax.random.key(1), (net.num_params,))
    theta = theta.at[3].set(-1e300)
    model = MarkovRandomField(net, theta, method="min_size")
    prov = {"estimator": "cgm_em", "options": {"max_em_iters": 3, "init": "naive"},
            "noise": (Laplace(2.0), PureDP(1.0)), "array": np.arange(3.0)}
    save_model(tmp_path / "model.json", model, categories={"b": ["x", "y", "z"]}, total=50,
               provenance=prov)
    saved = load_model(tmp_path / "model.json")
    assert saved.model.network == net and saved.model.method == "min_size"
    assert np.asarray(saved.model.theta).tobytes() == np.asarray(theta).tobytes()
    assert saved.categories == {"b": ["x", "y", "z"]} and saved.total == 50.0
    assert saved.provenance["options"] == prov["options"]
    assert saved.provenance["noise"] == prov["noise"]
    np.testing.assert_array_equal(saved.provenance["array"], prov["array"])
    # batched theta (posterior draws) keep their shape
    draws = MarkovRandomField(net, jnp.stack([jnp.zeros(net.num_params), theta]))
    save_model(tmp_path / "draws.json", draws)
    assert load_model(tmp_path / "draws.json").model.theta.shape == (2, net.num_params)


def test_result_adds_its_run_facts(tmp_path):
    from numpyro_dpgm.estimation.naive import naive_mle

    net = MarkovNetwork(DOMAIN, [("a", "b")])
    meas = [Measurement(("a", "b"), [10.0, 5, 3, 1, 2, 9], Laplace(1.0))]
    result = naive_mle(meas, net, total_count=30.0)
    save_model(tmp_path / "r.json", result, provenance={"estimator": "naive_mle"})
    prov = load_model(tmp_path / "r.json").provenance
    assert prov["iterations"] == result.iterations and prov["converged"] == result.converged


def _model_file(tmp_path):
    net = MarkovNetwork(DOMAIN, [("a", "b")])
    return save_model(tmp_path / "model.json", MarkovRandomField(net, jnp.zeros(6)))


def test_version_and_kind_errors(tmp_path):
    path = _model_file(tmp_path)
    text = path.read_text()
    for version, message in (("2", "format version 2, newer than"),
                             ("0", "invalid format version 0"),
                             ('"1"', "invalid format version '1'")):
        bad = tmp_path / f"v{len(message)}.json"
        bad.write_text(text.replace('"version": 1', f'"version": {version}', 1))
        with pytest.raises(FileFormatError, match=message):
            load_model(bad)
    with pytest.raises(FileFormatError, match="not a measurements file"):
        load_measurements(path)
    with pytest.raises(FileFormatError, match="not a ledger file"):
        load_ledger(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nothing.json")


def test_corrupt_files(tmp_path):
    path = _model_file(tmp_path)
    text = path.read_text()
    cases = {
        "truncated": (text[:-40], "invalid JSON"),
        "altered": (text.replace("0.0", "1.0", 1), "checksum does not match"),
        "no header": ("[1, 2]", "no 'format' header"),
        "binary": (None, "not UTF-8"),
    }
    for name, (content, message) in cases.items():
        bad = tmp_path / f"{name}.json"
        if content is None:
            bad.write_bytes(b"\xff\xfe\x00garbage")
        else:
            bad.write_text(content)
        with pytest.raises(FileFormatError, match=message):
            load_model(bad)
    # structurally wrong bodies with a valid checksum
    net_doc = json.loads(text)
    body = {k: v for k, v in net_doc.items()
            if k not in ("format", "version", "library_version", "checksum")}
    write_document(tmp_path / "missing.json", io.MODEL_FORMAT,
              {k: v for k, v in body.items() if k != "theta"})
    with pytest.raises(FileFormatError, match=r"missing \['theta'\]"):
        load_model(tmp_path / "missing.json")
    body["theta"] = {"dtype": "float64", "shape": [5], "data": [0.0] * 5}
    write_document(tmp_path / "shape.json", io.MODEL_FORMAT, body)
    with pytest.raises(FileFormatError, match=r"theta has shape \(5,\)"):
        load_model(tmp_path / "shape.json")


def test_failed_saves_write_nothing(tmp_path):
    net = MarkovNetwork(DOMAIN, [("a", "b")])
    model = MarkovRandomField(net, jnp.zeros(6))
    target = tmp_path / "model.json"
    with pytest.raises(TypeError, match="cannot save a value of type object"):
        save_model(target, model, provenance={"bad": object()})
    with pytest.raises(ValueError, match="has 3 labels but the domain gives 2"):
        save_model(target, model, categories={"a": ["x", "y", "z"]})
    with pytest.raises(ValueError, match="measurement of .* has 6 cells; the domain gives 4"):
        save_measurements(target, [Measurement(("c",), np.zeros(6), Laplace(1.0))], DOMAIN)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_model(tmp_path / "no" / "model.json", model)
    assert list(tmp_path.iterdir()) == []


def test_model_keeps_the_whole_domain(tmp_path):
    """``domain=``: the attributes in no clique are stored (with their labels) and the
    parameters are unchanged; the model's attributes must keep their sizes."""
    full = Domain({"a": 2, "z": 4, "b": 3, "c": 2})
    net = MarkovNetwork(DOMAIN.project(["a", "b"]), [("a", "b")])
    theta = jax.random.normal(jax.random.key(2), (net.num_params,))
    draws = MarkovRandomField(net, jnp.stack([theta, 2 * theta]))
    save_model(tmp_path / "m.json", draws, domain=full,
               categories={"z": ["w", "x", "y", "z"], "b": ["p", "q", "r"]})
    saved = load_model(tmp_path / "m.json")
    assert saved.model.network.domain == full and saved.model.network.cliques == (("a", "b"),)
    assert np.asarray(saved.model.theta).tobytes() == np.asarray(draws.theta).tobytes()
    assert saved.categories["z"] == ["w", "x", "y", "z"]
    with pytest.raises(ValueError, match=r"lacks the model's attribute\(s\) \['b'\]"):
        save_model(tmp_path / "x.json", draws, domain={"a": 2, "c": 2})
    with pytest.raises(ValueError, match=r"\['b'\] other sizes"):
        save_model(tmp_path / "x.json", draws, domain={"a": 2, "b": 4})
    assert not (tmp_path / "x.json").exists()
