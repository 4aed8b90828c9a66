"""Cerebras Model Zoo run logs (``cszoo fit`` / ``run.py`` on a CS-X appliance, seed 003).

::

    2024-04-10 06:09:56,046 INFO:   Effective batch size is 1024.          <- a run starts
    2024-04-10 06:10:41,144 INFO:   Compiling the model. This may take a few minutes.
    2024-04-10 06:11:27,470 INFO:   Compile was successful!
    2024-04-10 06:11:27,474 INFO:   Programming Cerebras Wafer Scale Cluster for execution. ...
    2024-04-10 06:15:20,271 INFO:   Device programming is complete
    2024-04-10 06:15:58,772 INFO:   | Train Device=CSX, Step=100, Loss=9.48438,
        Rate=4979.03 samples/sec, GlobalRate=4979.03 samples/sec      <- (one line in the log)
    ...
    2024-04-10 06:20:29,931 INFO:   Processed 1024000 sample(s) in 209.45877985 seconds.

A run: ``samples_per_step`` is the effective batch size; each ``Step=`` line gives one
step-time sample, ``batch / Rate`` (the mean step time over the steps since the previous
line), and one loss at that step; ``compile_time`` is the time between "Compiling the
model" and "Compile was successful!"; ``run.details`` holds the programming time ("Programming
..." to "Device programming is complete"), the time to send the initial weights, the final
``GlobalRate``, and the processed samples and seconds of the summary line, which must equal
batch x last step. A log whose last run has no summary line is truncated: an error, as are
steps or timestamps going backwards and a rate in a unit other than samples/sec.

Several runs may share one file (seed 003 pastes three, each under a ``#Batch size N``
note); each run's ``details["section"]`` is its note, or ``"batch size N"`` without one.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field

from pytest_accelperf.ingest.base import NUMBER, IngestError, clip, finite, parse_int
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.run import Run, RunDetails
from pytest_accelperf.stats.units import UnitError, to_base_unit

# The message is stripped in code: "(.*?)\s*$" backtracked quadratically on a long line.
_LOG = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ([A-Z]+):\s+(.*)$")
#: What this parser reads, for the errors of a file it cannot (:func:`.parse_file`).
EXPECTS = ("a Cerebras Model Zoo run log as text ('2024-04-10 06:09:56,046 INFO:   ...' "
           "lines, each run from 'Effective batch size is N.' to 'Processed N sample(s) in S "
           "seconds.')")
_BATCH = re.compile(r"^Effective batch size is (\d+)\.$")
_STEP = re.compile(rf"^\| Train Device=(\w+), Step=(\d+), Loss=({NUMBER}|nan|inf), "
                   rf"Rate=({NUMBER}) (\S+), GlobalRate=({NUMBER}) (\S+)$")
_DONE = re.compile(rf"^Processed (\d+) sample\(s\) in ({NUMBER}) seconds\.$")
_DEVICES = re.compile(r"^Preparing to execute using (\d+) (\w+)$")
_EVENTS = {
    "compile_start": re.compile(r"^Compiling the model\."),
    "compile_end": re.compile(r"^Compile was successful!"),
    "program_start": re.compile(r"^Programming Cerebras Wafer Scale Cluster"),
    "program_end": re.compile(r"^Device programming is complete"),
    "weights_start": re.compile(r"^About to send initial weights"),
    "weights_end": re.compile(r"^Finished sending initial weights"),
}
_SPANS = {"compile_time": ("compile_start", "compile_end"),
          "programming_time": ("program_start", "program_end"),
          "weights_time": ("weights_start", "weights_end")}


@dataclass
class _Log:
    batch: int
    line: int
    section: str
    events: dict[str, tuple[dt.datetime, int]] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    step_lines: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    global_rate: float | None = None
    device: str = ""
    devices: int | None = None
    done: tuple[int, float, int] | None = None


def _rate(value: str, unit: str, source: str, line: int, what: str) -> float:
    try:
        rate, dimension = to_base_unit(float(value), unit)
    except UnitError as exc:
        raise IngestError(source, line, f"{what}: {exc}") from None
    if dimension != "samples/s":
        raise IngestError(source, line, f"{what}: {clip(unit)} is not a rate in samples/sec")
    if not rate > 0:  # a step time is batch / rate
        raise IngestError(source, line, f"{what}: {value} {clip(unit)} is no rate of a run "
                                        f"that trained")
    return finite(rate, source, line, what)


def _step(log: _Log, m: re.Match[str], source: str, line: int) -> None:
    if log.done is not None:
        raise IngestError(source, line, f"a Step line after the run's summary at line "
                                        f"{log.done[2]} (reordered log?)")
    step = parse_int(m.group(2), source, line, "Step")
    if log.steps and step <= log.steps[-1]:
        raise IngestError(source, line, f"Step={step} follows Step={log.steps[-1]} of line "
                                        f"{log.step_lines[-1]}: steps must increase "
                                        f"(reordered or concatenated logs?)")
    log.device = m.group(1)
    log.steps.append(step)
    log.step_lines.append(line)
    log.losses.append(float(m.group(3)))
    log.rates.append(_rate(m.group(4), m.group(5), source, line, "Rate"))
    log.global_rate = _rate(m.group(6), m.group(7), source, line, "GlobalRate")


def _finish(log: _Log, source: str, last_line: int) -> Run:
    if log.done is None:
        raise IngestError(source, last_line, f"the run of line {log.line} (batch {log.batch}) "
                                             f"ends without 'Processed N sample(s) in S "
                                             f"seconds.' (truncated log?)")
    if not log.steps:
        raise IngestError(source, log.done[2], f"the run of line {log.line} has no "
                                               f"'| Train ... Step=' lines")
    samples, seconds, done_line = log.done
    if samples != log.batch * log.steps[-1]:
        raise IngestError(source, done_line, f"processed {samples} samples, but batch "
                                             f"{log.batch} x last step {log.steps[-1]} = "
                                             f"{log.batch * log.steps[-1]}")
    details: RunDetails = {"section": log.section, "source": f"{source}:{log.line}",
                           "total_samples": samples, "total_time": seconds,
                           "global_rate": log.global_rate, "rates": list(log.rates)}
    compile_time: float | None = None
    for name, (start, end) in _SPANS.items():
        if start not in log.events:
            continue
        if end not in log.events:
            raise IngestError(source, log.events[start][1], f"{start.replace('_', ' ')} without "
                                                            f"its end (truncated log?)")
        span = (log.events[end][0] - log.events[start][0]).total_seconds()
        if name == "compile_time":
            compile_time = span
        elif name == "programming_time":
            details["programming_time"] = span
        else:
            details["weights_time"] = span
    return Run(case_id=f"cerebras-b{log.batch}", samples_per_step=log.batch,
               n_devices=log.devices or 1,
               step_times=[log.batch / r for r in log.rates], compile_time=compile_time,
               losses=list(log.losses), loss_steps=list(log.steps), details=details,
               environment=Environment.from_json({
                   "platform": f"cerebras-{log.device.lower() or 'csx'}",
                   "device_kind": log.device or "CSX", "device_count": log.devices,
                   "packages": {}}))


def parse_cerebras_log(text: str, source: str = "<text>") -> list[Run]:
    """One run per ``Effective batch size is N.`` in the log (see the module docstring)."""
    runs: list[Run] = []
    log: _Log | None = None
    note = ""
    last_time: tuple[dt.datetime, int] | None = None
    lineno = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if raw.startswith("#"):
            note = raw.lstrip("#").strip()
            continue
        m = _LOG.match(raw)
        if m is None:
            continue
        try:
            when = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        except ValueError:  # the shape of a timestamp, not a date: a month 13, a day 00
            raise IngestError(source, lineno, f"timestamp {m.group(1)} is not a date and "
                                              f"time") from None
        message = m.group(3).rstrip()
        batch = _BATCH.match(message)
        if batch:
            if log is not None:
                runs.append(_finish(log, source, lineno - 1))
            size = parse_int(batch.group(1), source, lineno, "Effective batch size")
            if size == 0:
                raise IngestError(source, lineno, "Effective batch size is 0")
            log = _Log(size, lineno, note or f"batch size {batch.group(1)}")
            note, last_time = "", None
        if log is None:
            continue
        if last_time is not None and when < last_time[0]:
            raise IngestError(source, lineno, f"timestamp {m.group(1)} is earlier than line "
                                              f"{last_time[1]}'s (reordered log?)")
        last_time = (when, lineno)
        step = _STEP.match(message)
        if step:
            _step(log, step, source, lineno)
            continue
        done = _DONE.match(message)
        if done:
            log.done = (parse_int(done.group(1), source, lineno, "Processed samples"),
                        finite(float(done.group(2)), source, lineno, "Processed seconds"),
                        lineno)
            continue
        devices = _DEVICES.match(message)
        if devices:
            log.devices = parse_int(devices.group(1), source, lineno, "devices")
            continue
        if message.startswith("| Train"):
            raise IngestError(source, lineno, f"unrecognized step line: {message[:100]!r}")
        for event, pattern in _EVENTS.items():
            if pattern.match(message):
                log.events.setdefault(event, (when, lineno))
    if log is None:
        raise IngestError(source, 0, f"no 'Effective batch size is N.' line: not a Cerebras "
                                     f"run log; the cerebras parser expects {EXPECTS}")
    runs.append(_finish(log, source, lineno))
    return runs
