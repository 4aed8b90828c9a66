"""Per-case metrics and verdicts as JUnit ``<property>`` entries.

pytest's own ``--junitxml`` writes ``item.user_properties`` of each test as
``<properties><property name=... value=.../></properties>`` under its ``<testcase>``, for
every ``junit_family`` (only the ``record_property`` *fixture* warns under ``xunit2``; the
attribute itself is family-neutral). The plugin appends these properties in
``pytest_runtest_makereport`` before the report is built, so they travel inside the test
report: under xdist the worker's report is serialized with its ``user_properties`` and the
controller's junitxml writes them, with no extra channel.

The session's own facts (platform, environment fingerprint, package versions, verdict
counts) are :func:`suite_properties`, written once as ``<testsuite>`` properties by
:func:`add_suite_properties` on the controller, after the workers' records are merged.
"""

from __future__ import annotations

import pytest

from pytest_accelperf.report.data import CaseRecord, SessionReport
from pytest_accelperf.report.history import fingerprint_hash

PREFIX = "accelperf"

#: ``run["derived"]`` keys exported, with the property suffix that names their unit.
_DERIVED = (("samples_per_second", "samples_per_second"),
            ("median_step_time", "median_step_time_s"),
            ("peak_memory", "peak_memory_bytes"),
            ("mfu", "mfu"))


def _text(value: object) -> str:
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


def suite_properties(report: SessionReport) -> list[tuple[str, str]]:
    """``(name, value)`` pairs for the session: where it ran (accelerator, platform, host
    CPU, the environment fingerprint's hash and package versions), how many cases, how
    many of them regressed, and the count of each check verdict."""
    env = report.environment.to_json()
    props: list[tuple[str, str]] = [(f"{PREFIX}.accel", report.accel),
                                    (f"{PREFIX}.platform", report.platform)]
    if env:
        props.append((f"{PREFIX}.fingerprint", fingerprint_hash(env)))
        for key in ("host_cpu", "cpu_isa", "python"):
            if env.get(key):
                props.append((f"{PREFIX}.{key}", str(env[key])))
        for name, version in sorted((env.get("packages") or {}).items()):
            props.append((f"{PREFIX}.package.{name}", str(version)))
    props += [(f"{PREFIX}.update", str(report.update).lower()),
              (f"{PREFIX}.cases", str(len(report.records))),
              (f"{PREFIX}.cases_regressed", str(len(report.regressions)))]
    props += [(f"{PREFIX}.checks.{verdict}", str(n)) for verdict, n in report.counts().items()]
    if report.errors:
        props.append((f"{PREFIX}.errors", str(len(report.errors))))
    return props


def add_suite_properties(config: pytest.Config, report: SessionReport) -> bool:
    """Give pytest's ``--junitxml`` writer the session's :func:`suite_properties`; whether
    there was one. Must run before its own ``pytest_sessionfinish`` writes the file.

    ``record_testsuite_property`` is the public route, but it is a fixture: it runs on
    xdist workers, which write no XML, and before the last case is checked. This reaches
    the writer where that fixture does (``xml_key`` in the config's stash)."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # a pytest that moved it: the per-case properties still stand
        return False
    xml = config.stash.get(xml_key, None)
    if xml is None:
        return False
    for name, value in suite_properties(report):
        xml.add_global_property(name, value)
    return True
