"""Cases (``collect/cases.py``): readable, stable ids; bad cases, keywords and tolerances
refused with one line naming them."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_accelperf import Case, cases, grid


def test_ids_are_readable_and_stable() -> None:
    ids = [c.id for c in grid(backend="jax", mesh=[None, (4, 2), (8, 1)], batch=[128, 1024])]
    assert ids == ["jax-nomesh-b128", "jax-nomesh-b1024", "jax-mesh4x2-b128",
                   "jax-mesh4x2-b1024", "jax-mesh8x1-b128", "jax-mesh8x1-b1024"]
    assert Case(backend="jax", batch=4096, label="full").id == "jax-nomesh-b4096-full"
    assert Case(backend="jax", model="charlm", batch=8).id == "jax-charlm-nomesh-b8"


def test_bad_cases_are_rejected() -> None:
    with pytest.raises(ValueError, match="batch must be positive"):
        Case(backend="jax", batch=0)
    with pytest.raises(ValueError, match="unknown tolerance"):
        Case(backend="jax", batch=1, tolerances={"speed": 1.0})
    with pytest.raises(ValueError, match="duplicate case ids"):
        cases(Case(backend="jax", batch=1), Case(backend="jax", batch=1))
    with pytest.raises(ValueError, match="more axes"):
        Case(backend="jax", batch=1, mesh=(2, 2, 2))
    # the grid's keywords are Case's fields, declared there once: a typo or a wrong type
    # is one line naming it, not a TypeError from deep inside
    with pytest.raises(ValueError, match=r"unknown case keyword\(s\) stpes; a case takes: "
                                         r"backend, batch, mesh, model, "):
        cases(backend="jax", batch=[8], stpes=3)
    with pytest.raises(ValueError, match=r"Case.steps must be int, got '3' \(str\)"):
        grid(backend="jax", batch=[8], steps="3")
    with pytest.raises(ValueError, match="cases\\(\\) with grid keywords needs batch"):
        cases(backend="jax", steps=3)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.05, True, "lots", None])
def test_case_tolerances_are_checked_like_the_flags(value: object) -> None:
    """A NaN band passes any loss change (every comparison with NaN is false), inf too, and
    a negative one fails every run: a case's tolerances get the flags' check."""
    bad: dict[str, Any] = {"loss_rtol": value}
    with pytest.raises(ValueError, match=r"tolerances\['loss_rtol'\]: expected a finite "
                                         r"number >= 0"):
        Case(backend="jax", batch=1, tolerances=bad)
    with pytest.raises(ValueError, match=r"tolerances\['loss_rtol'\]"):
        cases(backend="jax", batch=[1], tolerances=bad)


def test_grad_clip_refuses_inf_too() -> None:
    with pytest.raises(ValueError, match="grad_clip must be a finite positive number or None"):
        Case(backend="jax", batch=1, grad_clip=float("inf"))
    assert Case(backend="jax", batch=1, grad_clip=1.0).grad_clip == 1.0


def test_tolerances_themselves_refuse_what_the_flags_refuse() -> None:
    from pytest_accelperf.records.verdict import Tolerances

    with pytest.raises(ValueError, match="tolerance loss_rtol: expected a finite number"):
        Tolerances(loss_rtol=float("nan"))
    with pytest.raises(ValueError, match="tolerance memory_tolerance: expected a finite"):
        Tolerances().merged({"memory_tolerance": True})
    text: dict[str, Any] = {"loss_rtol": "0.5"}  # as a case's tolerances may hold it
    assert Tolerances().merged(text).loss_rtol == 0.5
    assert Case(backend="jax", batch=1, tolerances={"loss_rtol": 0.0}).tolerances == {
        "loss_rtol": 0.0}
