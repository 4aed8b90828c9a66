"""Hugging Face ``Trainer`` metrics blocks (``trainer.log_metrics("train", metrics)``).

::

    ***** train metrics *****
      epoch                    =        3.0
      eval_loss                =     0.1337
      total_flos               =  1470300GF
      train_loss               =     0.2154
      train_runtime            = 0:04:14.32
      train_samples_per_second =     94.369
      train_steps_per_second   =      5.898

``Trainer.metrics_format`` prints ``*_runtime`` as a ``datetime.timedelta`` and
``total_flos`` as ``f"{int(flos) >> 30}GF"``, so ``GF`` here is 2**30 floating-point
operations, not 10**9. Those are the only two non-numeric forms it writes; anything else
is an error.

A train block becomes one run: throughput is ``train_samples_per_second``, and the step
time ``1 / train_steps_per_second`` (the Trainer only reports the mean over training, so the
run has one step-time sample); the samples per step are their ratio, the number of steps
``train_runtime * train_steps_per_second``, both checked to be whole numbers. The step
count is exact only when the rounding of the two printed factors cannot move it by half a
step; otherwise ``details["train_steps"]`` is None and ``details["train_steps_estimate"]`` gives
the interval (the loss is still placed at the rounded estimate). The loss is ``train_loss``
(the Trainer's mean over training) at the last step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pytest_accelperf.ingest.base import IngestError, clip, near_int, parse_number
from pytest_accelperf.records.run import Run, RunDetails

HEADER = re.compile(r"^\s*\*{5} (\w+) metrics \*{5}\s*$")
_LINE = re.compile(r"^\s+(\w+)\s+=\s+(\S+)\s*$")
_DURATION = re.compile(r"^(\d+):(\d{2}):(\d{2}(?:\.\d+)?)$")
_FLOS = re.compile(r"^(\d+)GF$")
#: What this parser reads, for the errors of a file it cannot (:func:`.parse_file`).
EXPECTS = ("a Hugging Face Trainer log holding a '***** train metrics *****' block "
           "(trainer.log_metrics('train', metrics)), as text")
#: Keys a train block must have to make a run.
REQUIRED = ("train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second")


@dataclass
class MetricsBlock:
    """One ``***** <split> metrics *****`` block: values in seconds and FLOPs."""

    split: str
    line: int
    metrics: dict[str, float] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)


def _value(key: str, text: str, source: str, line: int) -> float:
    if key.endswith("_runtime"):
        m = _DURATION.match(text)
        if m is None:
            raise IngestError(source, line, f"{key}: {clip(text)} is not a duration H:MM:SS.ss")
        if len(m.group(1)) > 9:  # a billion hours: no run, and int() of a huge one is slow
            raise IngestError(source, line, f"{key}: {clip(text)} is out of range")
        return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    if key == "total_flos":
        m = _FLOS.match(text)
        if m is None:
            raise IngestError(source, line, f"total_flos: {clip(text)} is not '<n>GF' (the "
                                            f"Trainer prints FLOs in units of 2**30 as GF)")
        if len(m.group(1)) > 30:  # beyond a float (and int() of a huge one is slow)
            raise IngestError(source, line, f"total_flos: {clip(text)} is out of range")
        return float(int(m.group(1)) << 30)
    return parse_number(text, source, line, key)


def parse_blocks(lines: list[str], source: str, first_line: int = 1) -> list[MetricsBlock]:
    """Every metrics block in ``lines`` (``first_line`` is the file line of ``lines[0]``)."""
    blocks: list[MetricsBlock] = []
    current: MetricsBlock | None = None
    for i, raw in enumerate(lines):
        lineno = first_line + i
        header = HEADER.match(raw)
        if header:
            current = MetricsBlock(header.group(1), lineno)
            blocks.append(current)
            continue
        if current is None:
            continue
        m = _LINE.match(raw)
        if m is None:
            if raw.strip() and "=" in raw:
                raise IngestError(source, lineno, f"line in the {current.split} metrics block "
                                                  f"of line {current.line} is not 'key = value': "
                                                  f"{clip(raw.strip())}")
            current = None  # a blank line or a code fence ends the block
            continue
        key, text = m.group(1), m.group(2)
        if key in current.metrics:
            raise IngestError(source, lineno, f"{key} appears twice in the metrics block of "
                                              f"line {current.line} (first at line "
                                              f"{current.lines[key]})")
        current.metrics[key] = _value(key, text, source, lineno)
        current.lines[key] = lineno
        current.texts[key] = text
    return blocks


def _half_ulp(text: str) -> float:
    """Half a unit of the last printed digit: ``"0:00:02.06"`` -> 0.005."""
    decimals = len(text.rsplit(".", 1)[1]) if "." in text else 0
    return 0.5 * 10.0**-decimals


def run_from_block(block: MetricsBlock, source: str, case_id: str,
                   batch_hint: int | None = None) -> Run:
    """A run from a train metrics block (see the module docstring)."""
    missing = [k for k in REQUIRED if k not in block.metrics]
    if missing:
        raise IngestError(source, block.line, f"the {block.split} metrics block lacks "
                                              f"{', '.join(missing)} (truncated?)")
    m = block.metrics
    sps, steps_ps = m["train_samples_per_second"], m["train_steps_per_second"]
    at = block.lines["train_steps_per_second"]
    for key in ("train_samples_per_second", "train_steps_per_second", "train_runtime"):
        if m[key] <= 0:  # a rate or a time of 0 is no measurement (and 1/0 below)
            raise IngestError(source, block.lines[key], f"{key} is {block.texts[key]}: a "
                                                        f"training's rate and runtime are "
                                                        f"positive")
    batch = near_int(sps / steps_ps, source, at, "train_samples_per_second / "
                                                  "train_steps_per_second (samples per step)")
    if batch_hint is not None and batch_hint != batch:
        raise IngestError(source, at, f"the metrics give {batch} samples per step, but the "
                                      f"section says batch {batch_hint}")
    estimate = m["train_runtime"] * steps_ps
    steps = near_int(estimate, source, block.lines["train_runtime"],
                     "train_runtime * train_steps_per_second (steps)")
    # The Trainer rounds both factors: the step count is exact only when their rounding
    # cannot move the product by half a step (seed 001: minutes of runtime, so it is).
    spread = (_half_ulp(block.texts["train_runtime"]) * steps_ps
              + _half_ulp(block.texts["train_steps_per_second"]) * m["train_runtime"])
    details: RunDetails = {"hf_metrics": dict(m), "train_steps": steps,
                           "source": f"{source}:{block.line}"}
    if spread >= 0.5:
        details["train_steps"] = None
        details["train_steps_estimate"] = [round(estimate - spread, 1),
                                           round(estimate + spread, 1)]
    if "eval_loss" in m:
        details["eval_loss"] = m["eval_loss"]
    return Run(case_id=case_id, samples_per_step=batch, step_times=[1.0 / steps_ps],
               losses=[m["train_loss"]], loss_steps=[steps], details=details)


def parse_hf_trainer(text: str, source: str = "<text>") -> list[Run]:
    """One run per ``train`` metrics block of a Trainer log (eval-only blocks are skipped)."""
    blocks = [b for b in parse_blocks(text.splitlines(), source) if b.split == "train"]
    if not blocks:
        raise IngestError(source, 0, f"no '***** train metrics *****' block found; the "
                                     f"hf-trainer parser expects {EXPECTS}")
    return [run_from_block(b, source, f"hf-train-{i}") for i, b in enumerate(blocks)]
