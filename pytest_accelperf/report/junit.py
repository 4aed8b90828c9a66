"""Per-case metrics and verdicts as JUnit ``<property>`` entries.

pytest's own ``--junitxml`` writes ``item.user_properties`` of each test as
``<properties><property name=... value=.../></properties>`` under its ``<testcase>``, for
every ``junit_family`` (only the ``record_property`` *fixture* warns under ``xunit2``; the
attribute itself is family-neutral). The plugin appends these properties in
``pytest_runtest_makereport`` before the report is built, so they travel inside the test
report: under xdist the worker's report is serialized with its ``user_properties`` and the
controller's junitxml writes them, with no extra channel.
"""

from __future__ import annotations

from typing import Any

from pytest_accelperf.report.data import CaseRecord

PREFIX = "accelperf"

#: ``run["derived"]`` keys exported, with the property suffix that names their unit.
_DERIVED = (("samples_per_second", "samples_per_second"),
            ("median_step_time", "median_step_time_s"),
            ("peak_memory", "peak_memory_bytes"),
            ("mfu", "mfu"))


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def junit_properties(record: CaseRecord) -> list[tuple[str, str]]:
    """``(name, value)`` pairs for one case: its verdict and outcome, headline numbers, and
    for each check its verdict, baseline, value now, relative change and detail."""
    props: list[tuple[str, str]] = [
        (f"{PREFIX}.verdict", record.verdict.value),
        (f"{PREFIX}.outcome", str(record.run.get("outcome", ""))),
        (f"{PREFIX}.platform", record.platform),
    ]
    derived = record.run.get("derived") or {}
    for key, name in _DERIVED:
        if derived.get(key) is not None:
            props.append((f"{PREFIX}.{name}", _text(derived[key])))
    if record.run.get("compile_time") is not None:
        props.append((f"{PREFIX}.compile_time_s", _text(record.run["compile_time"])))
    losses = [x for x in record.run.get("losses") or [] if isinstance(x, (int, float))]
    if losses:
        props.append((f"{PREFIX}.final_loss", _text(float(losses[-1]))))
    if record.error:
        props.append((f"{PREFIX}.error", record.error))
    for check in record.checks:
        key = f"{PREFIX}.{check.metric}"
        props.append((f"{key}.verdict", check.verdict.value))
        for field, value in (("baseline", check.baseline), ("now", check.now),
                             ("change", check.change)):
            if value is not None:
                props.append((f"{key}.{field}", _text(value)))
        if check.unit:
            props.append((f"{key}.unit", check.unit))
        if check.detail:
            props.append((f"{key}.detail", check.detail))
    return props
