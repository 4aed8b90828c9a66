"""The numerics check's state section (issue 16, part 2): a section of its own beside the
parameters', a moved state leaf named by its path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pytest_accelperf.backends.measure.common import fingerprint, with_state
from pytest_accelperf.checks.numerics import check_numerics
from pytest_accelperf.records.fingerprint import compact
from pytest_accelperf.records.verdict import Verdict
from pytest_accelperf.store.baselines import BaselineStore, check_block, read
from pytest_accelperf.store.schema import validate_block
from unit.store.test_baselines_compact import TOL, _params


# -- the training state beside the parameters (issue 23) --------------------------------------
def _with_state(seed: int = 0, mean: float = 0.5) -> dict[str, Any]:
    """A per-leaf fingerprint of :func:`_params` and, marked as state, the running
    statistics of a BatchNorm and a step counter."""
    rng = np.random.default_rng(seed + 100)
    state = {"batch_stats/BatchNorm_0/mean": mean + 0.1 * rng.standard_normal(16),
             "batch_stats/BatchNorm_0/var": 1.0 + 0.1 * rng.random(16),
             "step": np.asarray(7, np.int32)}
    flat, names = with_state(_params(seed), state)
    return fingerprint(flat, names)


def test_the_state_is_a_section_of_its_own_and_the_parameters_section_is_as_before(
        tmp_path: Path) -> None:
    fp = _with_state()
    stored = check_block("m.py::t", {"outcome": "ok", "environment": {}, "numerics": fp})
    numerics = stored["numerics"]
    # The parameters' section is what the store held before the state was fingerprinted.
    assert {k: numerics[k] for k in ("sketch", "structure", "tags")} == \
        compact(fingerprint(_params()))
    assert len(numerics["state"]["sketch"]) == 3 and len(numerics["state"]["tags"]) == 6
    BaselineStore(tmp_path, "cpu").write({"m.py::t": stored})
    back = read(tmp_path / "cpu" / "m.json").cases["t"]
    assert back == stored
    validate_block(back)
    r = check_numerics({"numerics": fp}, back, TOL)
    assert r is not None and r.verdict is Verdict.PASS, r.detail
    assert r.detail.startswith("fingerprints of 6 parameter and 3 state leaves match")


def test_a_state_leaf_that_moved_is_a_regression_named_by_its_path() -> None:
    base = {"numerics": compact(_with_state())}
    r = check_numerics({"numerics": _with_state(mean=0.6)}, base, TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION
    assert r.detail.startswith("batch_stats/BatchNorm_0/mean differs from the baseline "
                               "fingerprint: max |Δ| = "), r.detail
    assert r.data["failing"] == ["batch_stats/BatchNorm_0/mean"]


def test_a_baseline_of_the_parameters_alone_passes_with_the_state_new() -> None:
    """Baselines recorded before the state was fingerprinted hold the parameters only: a
    run that fingerprints more compares the parameters as before and names the state as
    new (not compared until re-recorded); a changed parameter still fails."""
    for base in ({"numerics": compact(fingerprint(_params()))},  # compact, as stored
                 {"numerics": fingerprint(_params())}):  # per leaf, before the compact form
        r = check_numerics({"numerics": _with_state()}, base, TOL)
        assert r is not None and r.verdict is Verdict.PASS, r.detail
        assert r.data["new"] == ["batch_stats/BatchNorm_0/mean", "batch_stats/BatchNorm_0/var",
                                 "step"]
        assert r.detail.startswith("fingerprints of 6 parameter leaves match the baseline")
        assert "; new, not compared: batch_stats/BatchNorm_0/mean; " in r.detail
        assert "--accelperf-update records it" in r.detail
        moved = _with_state()
        key = sorted(_params())[1]
        moved[key] = {**moved[key], "rms": moved[key]["rms"] * 2,
                      "sample": [2 * v for v in moved[key]["sample"]]}
        r = check_numerics({"numerics": moved}, base, TOL)
        assert r is not None and r.verdict is Verdict.REGRESSION
        assert r.detail.startswith(f"{key} differs from the baseline fingerprint")


def test_a_run_without_the_state_the_baseline_has_is_a_structure_change() -> None:
    base = {"numerics": compact(_with_state())}
    r = check_numerics({"numerics": fingerprint(_params())}, base, TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION
    assert r.detail == ("state structure changed: removed the 3 state leaves beside the "
                        "parameters that the baseline fingerprints")
    grown = _with_state()
    grown["scaler/scale"] = {**grown["step"], "rms": 65536.0, "sample": [65536.0]}
    r = check_numerics({"numerics": grown}, base, TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION
    assert r.detail.startswith("state structure changed: added scaler/scale () int32")
