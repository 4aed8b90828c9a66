"""The session report as plain data: what ran, what each check said, what to store.

Printing (terminal table, JSON file) is a thin layer over this, so the report is
unit-testable and identical whether it was assembled in one process or merged from xdist
workers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_accelperf.checks.family import SuiteVerdict, suite_verdict
from pytest_accelperf.checks.recordable import clearable, refused
from pytest_accelperf.records.caserecord import CaseRecord as CaseRecord
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.verdict import Verdict

REPORT_SCHEMA_VERSION = 1


@dataclass
class SessionReport:
    accel: str = ""
    platform: str = ""
    update: bool = False
    environment: Environment = field(default_factory=lambda: Environment.from_json({}))
    records: list[CaseRecord] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: The machine whose timing the session judged and records (``--accelperf-machine``,
    #: :mod:`pytest_accelperf.store.machines`); "" in a report written before.
    machine: str = ""

    def add(self, record: CaseRecord) -> None:
        self.records.append(record)

    def sorted_records(self) -> list[CaseRecord]:
        return sorted(self.records, key=lambda r: r.nodeid)

    def counts(self) -> dict[str, int]:
        counter = Counter(c.verdict.value for r in self.records for c in r.checks)
        return {v.value: counter.get(v.value, 0) for v in Verdict}

    @property
    def regressions(self) -> list[CaseRecord]:
        return [r for r in self.sorted_records() if r.regressed]

    @property
    def acceptable(self) -> list[CaseRecord]:
        """The regressed cases that accepting their run as a baseline would clear (at least
        in part; :func:`pytest_accelperf.checks.recordable.clearable`), and that may be stored: a
        reference failure, an A/B comparison, a leak are no baseline matter."""
        return [r for r in self.regressions
                if clearable(r.checks) and not any(refused(c) for c in r.checks)]

    @property
    def recorded_noisy(self) -> list[CaseRecord]:
        """The cases whose baseline this session stored marked noisy."""
        return [r for r in self.sorted_records() if r.recorded_noisy]

    def stacks(self) -> list[tuple[tuple[str, ...], int]]:
        """The stack changes the session's cases were judged across (an upgrade, as their
        checks' ``data["stack"]`` say) and how many cases each: ``[(("jax 0.8.3 →
        0.10.2", ...), 12)]``, the commonest first; empty when every baseline was recorded
        on this stack."""
        counter: Counter[tuple[str, ...]] = Counter()
        for (changes, _), n in self._stacks_against().items():
            counter[changes] += n
        return counter.most_common()

    def _stacks_against(self) -> Counter[tuple[tuple[str, ...], str]]:
        """Per stack change and what it was judged against (A/B mode's base arm, ``""``:
        the stored baselines), how many cases."""
        counter: Counter[tuple[tuple[str, ...], str]] = Counter()
        for record in self.records:
            found = next((c for c in record.checks if isinstance(c.data.get("stack"), list)),
                         None)
            if found is not None and found.data["stack"]:
                against = found.data.get("against") if found.data.get("mode") == "ab" else ""
                counter[tuple(str(x) for x in found.data["stack"]),
                        str(against or "")] += 1
        return counter

    def stack_lines(self) -> list[str]:
        """One line per stack change (:meth:`stacks`) and what it was judged against:
        ``stack: jax 0.8.3 → 0.10.2, jaxlib 0.8.3 → 0.10.2 (against the baselines of 3
        cases; judged, not incomparable)``; in A/B mode ``(against the base arm, HEAD
        (0123456789), in 1 case; ...)``."""
        out = []
        for (changes, against), n in self._stacks_against().most_common():
            cases = f"{n} case{'s' if n != 1 else ''}"
            whom = (f"the base arm, {against}, in {cases}" if against
                    else f"the baselines of {cases}")
            out.append(f"stack: {', '.join(changes)} (against {whom}; judged, not "
                       f"incomparable)")
        return out

    def suite(self) -> SuiteVerdict:
        """The session as one verdict (:mod:`pytest_accelperf.checks.family`), over
        :meth:`sorted_records`: its positions are those of the report's cases."""
        return suite_verdict(self.sorted_records())

    def to_json(self, exit_status: int | None = None) -> dict[str, Any]:
        """The JSON report: the session, its suite verdict (``suite``), and its cases, each
        statistical check's data with its ``p_value`` and ``q_value`` across the session."""
        suite = self.suite()
        cases = [r.to_json() for r in self.sorted_records()]
        for tested in suite.tested:
            data = cases[tested.case]["checks"][tested.check]["data"]
            data.update({"p_value": tested.p_value, "q_value": tested.q_value})
        return {
            "schema_version": REPORT_SCHEMA_VERSION,
            "accel": self.accel,
            "platform": self.platform,
            "machine": self.machine,
            "update": self.update,
            "environment": self.environment.to_json(),
            "summary": self.counts(),
            "exit_status": exit_status,
            "baselines_written": self.written,
            "recorded_noisy": [{"nodeid": r.nodeid, "platform": r.platform,
                                "why": r.recorded_noisy} for r in self.recorded_noisy],
            "errors": self.errors,
            "suite": suite.to_json(),
            "cases": cases,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionReport:
        """The report of a saved ``--accelperf-json`` file (see ``report.loading`` for the
        checked read of a file)."""
        return cls(
            accel=str(data.get("accel", "")),
            platform=str(data.get("platform", "")),
            machine=str(data.get("machine") or ""),
            update=bool(data.get("update", False)),
            environment=Environment.from_json(data.get("environment") or {}),
            records=[CaseRecord.from_json(c) for c in data.get("cases", [])],
            written=list(data.get("baselines_written") or []),
            errors=list(data.get("errors") or []),
        )


#: Keys of a stored block that a report keeps beside the run (numerics and environment are
#: left out: large, and already summarized by the checks).
_BASELINE_VIEW_KEYS = ("outcome", "samples_per_step", "samples_per_second", "step_time", "probe",
                       "loss", "metrics", "memory", "compile_time", "mfu", "recorded_at",
                       "max_batch", "noisy")


def baseline_view(block: Mapping[str, object] | None) -> dict[str, object] | None:
    """The part of a stored baseline block that a report carries for its plots."""
    if block is None:
        return None
    return {k: block[k] for k in _BASELINE_VIEW_KEYS if k in block}
