"""A case of a session's report: its run, its verdicts, the block to store.

Declared here, below the store, so that the report's schema
(:class:`pytest_accelperf.store.schema.ReportCase`) is made of its fields, as the report's
run is made of :class:`~pytest_accelperf.records.run.Run`'s; the report
(:mod:`pytest_accelperf.report.data`) names it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.records.verdict import CheckResult, Verdict


@dataclass
class CaseRecord:
    """One case of the session: its run, its verdicts and the block to store."""

    nodeid: str
    case_id: str
    platform: str
    run: dict[str, Any]
    checks: list[CheckResult] = field(default_factory=list)
    block: dict[str, Any] | None = None
    #: The case as JSON (:meth:`pytest_accelperf.collect.cases.Case.to_json`).
    case: dict[str, JSONValue] = field(default_factory=dict)
    error: str | None = None
    worker: str = "main"
    #: The stored baseline the run was checked against, as
    #: :func:`pytest_accelperf.report.data.baseline_view` trims it
    #: (what the HTML plots need: step times, loss checkpoints, memory); None: none stored.
    baseline: dict[str, Any] | None = None

    @property
    def regressed(self) -> bool:
        return any(c.failed for c in self.checks)

    @property
    def recorded_noisy(self) -> str:
        """Why this session stored its baseline (or its added session) marked noisy
        (:func:`pytest_accelperf.checks.throughput.recording_noise`), or ``""``."""
        block = self.block or {}
        sessions = (block.get("step_time") or {}).get("sessions")
        last = sessions[-1] if isinstance(sessions, list) and sessions else None
        why = block.get("noisy") or (last.get("noisy") if isinstance(last, dict) else None)
        return str(why) if why else ""

    def to_json(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "case_id": self.case_id,
            "platform": self.platform,
            "case": self.case,
            "worker": self.worker,
            "error": self.error,
            "outcome": self.run.get("outcome"),
            "verdict": self.verdict.value,
            "checks": [c.to_json() for c in self.checks],
            "run": self.run,
            "block": self.block,
            "baseline": self.baseline,
        }

    @property
    def verdict(self) -> Verdict:
        """The case's overall verdict: the most severe of its checks."""
        order = (Verdict.REGRESSION, Verdict.NEW, Verdict.INCONCLUSIVE, Verdict.INCOMPARABLE,
                 Verdict.IMPROVEMENT, Verdict.PASS)
        present = {c.verdict for c in self.checks}
        for v in order:
            if v in present:
                return v
        return Verdict.PASS

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseRecord:
        return cls(
            nodeid=data["nodeid"],
            case_id=data["case_id"],
            platform=data["platform"],
            run=data["run"],
            checks=[CheckResult.from_json(c) for c in data["checks"]],
            block=data.get("block"),
            case=data.get("case", {}),
            error=data.get("error"),
            worker=data.get("worker", "main"),
            baseline=data.get("baseline"),
        )
