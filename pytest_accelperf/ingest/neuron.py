"""Neuron profiler summaries (``neuron-profile view --output-format summary-text`` pasted as
markdown tables), optionally beside Hugging Face Trainer metrics, one section per run.

The layout of seed 001::

    # Batch 16                                     <- a section: one run
    ***** train metrics *****  ...                 <- optional, see :mod:`.hf`
    **Summary metrics account for Logical NeuronCore config = 2**
    | Group          | Name                 | Value        |
    | -------------- | -------------------- | ------------ |
    | overall_stats  | **event_count**      | 723620       |   <- a group's first row
    | **total_time** | 73.37 **ms**         |              |   <- the rest of the group
    ...
    | ND Idx | NC Idx | Usage Type | Amount      |               <- memory by usage type
    | 0      | 0      | Tensor     | 34.35 **MiB** |
    | 0      | 0      | Total      | 6.056 **GiB** |

Values are converted to base units (bytes, seconds, FLOPs; percentages stay percent) with
:func:`pytest_accelperf.stats.units.to_base_unit`; an unknown unit is an error, as is a row with
the wrong number of cells, a continuation row before any group row (reordered), a metric
that appears twice, a section missing the metrics a run needs, or a memory table without
its ``Total`` row (truncated).

The run of a section: with Trainer metrics, their throughput, step time and loss (see
:mod:`.hf`); without, one step of the profiled execution's ``total_time``. From the
profile: ``flops_per_step`` = ``model_flops``, ``memory_per_device`` = the memory table's
``Total`` per NeuronCore, and every metric in ``run.details["profile"]`` (``mfu`` as a
fraction in ``run.details["mfu"]``, the memory table in ``run.details["memory_by_usage"]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from pytest_accelperf.ingest.base import IngestError, clip, parse_int, parse_quantity, slug
from pytest_accelperf.ingest.hf import HEADER as HF_HEADER
from pytest_accelperf.ingest.hf import parse_blocks, run_from_block
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.run import Run, RunDetails

# The title is stripped in code: "(\S.*?)\s*$" backtracked quadratically on a long line.
_HEADING = re.compile(r"^#{1,6}\s+(\S.*)$")
_LNC = re.compile(r"Logical NeuronCore config = (\d+)")
_SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")
_BATCH = re.compile(r"batch\s*(\d+)", re.IGNORECASE)
SUMMARY_HEADER = ["Group", "Name", "Value"]
MEMORY_HEADER = ["ND Idx", "NC Idx", "Usage Type", "Amount"]
#: Groups whose values are text (versions, instance type), kept as strings.
TEXT_GROUPS = ("system",)
#: What this parser reads, for the errors of a file it cannot (:func:`.parse_file`).
EXPECTS = ("the Markdown/text profile report of neuron-profile (the tables of `neuron-profile "
           "view --output-format summary-text`, one '# heading' section per run), optionally "
           "with Hugging Face Trainer '***** train metrics *****' blocks")
#: Summary metrics without which a section is not a usable profile.
REQUIRED = ("total_time", "model_flops", "hardware_flops", "mfu_estimated_percent",
            "hbm_read_bytes", "hbm_write_bytes")


@dataclass
class Profile:
    """One profiler summary: metrics in base units, text fields, memory by usage type."""

    line: int
    metrics: dict[str, float] = field(default_factory=dict)
    dimensions: dict[str, str] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # "nd0:nc0" -> usage
    memory_line: int = 0
    logical_cores: int | None = None


def _cells(raw: str, source: str, line: int) -> list[str]:
    stripped = raw.strip()
    if not stripped.endswith("|"):
        raise IngestError(source, line, f"table row does not end with '|' (truncated?): "
                                        f"{stripped[:60]!r}")
    return [c.strip() for c in stripped[1:-1].split("|")]


def _bold(cell: str) -> bool:
    return cell.startswith("**") and cell.endswith("**") and len(cell) > 4


def _plain(cell: str) -> str:
    return cell.replace("**", "").strip()


def _add(profile: Profile, group: str, name: str, value: str, source: str, line: int,
         seen: dict[str, int]) -> None:
    if name in seen:
        raise IngestError(source, line, f"metric {clip(name)} appears twice in this summary "
                                        f"(first at line {seen[name]})")
    seen[name] = line
    profile.groups[name] = group
    if group in TEXT_GROUPS:
        profile.text[name] = value
        return
    q = parse_quantity(value, source, line, name)
    profile.metrics[name] = q.value
    profile.dimensions[name] = q.dimension


def _summary_rows(rows: list[tuple[int, str]], profile: Profile, source: str) -> None:
    group: str | None = None
    seen: dict[str, int] = {}
    for line, raw in rows:
        cells = _cells(raw, source, line)
        if len(cells) != 3:
            raise IngestError(source, line, f"summary row has {len(cells)} cells, expected 3 "
                                            f"(Group | Name | Value): truncated or malformed")
        first, second, third = cells
        if first and not _bold(first) and _bold(second):  # a group's first row
            group = first
            _add(profile, group, _plain(second), _plain(third), source, line, seen)
        elif _bold(first) and not third:  # continues the current group
            if group is None:
                raise IngestError(source, line, f"metric {_plain(first)[:80]} comes before any "
                                                f"group row (reordered table?)")
            _add(profile, group, _plain(first), _plain(second), source, line, seen)
        else:
            raise IngestError(source, line, f"summary row is neither '| group | **name** | "
                                            f"value |' nor '| **name** | value | |': "
                                            f"{raw.strip()[:80]!r}")


def _memory_rows(rows: list[tuple[int, str]], profile: Profile, source: str) -> None:
    for line, raw in rows:
        cells = _cells(raw, source, line)
        if len(cells) != 4:
            raise IngestError(source, line, f"memory row has {len(cells)} cells, expected 4 "
                                            f"(ND Idx | NC Idx | Usage Type | Amount)")
        nd, nc, usage, amount = cells[0], cells[1], cells[2], _plain(cells[3])
        if not (nd.isascii() and nd.isdigit() and nc.isascii() and nc.isdigit()):
            raise IngestError(source, line, f"memory row: ND/NC index {clip(nd, 20)}/"
                                            f"{clip(nc, 20)} is not a number")
        q = parse_quantity(amount, source, line, f"memory {clip(usage)}")
        if q.dimension != "bytes":
            raise IngestError(source, line, f"memory {clip(usage)}: {clip(amount)} is not a "
                                            f"size in bytes")
        usages = profile.memory.setdefault(f"nd{nd}:nc{nc}", {})
        if usage in usages:
            raise IngestError(source, line, f"memory usage type {clip(usage)} appears twice")
        usages[usage] = round(q.value)


def _table(rows: list[tuple[int, str]], profile: Profile, source: str) -> None:
    (hline, header), *rest = rows
    if not rest or not _SEPARATOR.match(rest[0][1].strip()):
        raise IngestError(source, hline, "table has no '| --- |' line under its header")
    names = [_plain(c) for c in _cells(header, source, hline)]
    body = rest[1:]
    if names == SUMMARY_HEADER:
        if profile.metrics or profile.text:
            raise IngestError(source, hline, f"a second summary table in one section (the "
                                             f"first at line {profile.line})")
        profile.line = hline
        _summary_rows(body, profile, source)
    elif names == MEMORY_HEADER or (len(names) == 4 and not any(names)):
        profile.memory_line = hline
        _memory_rows(body, profile, source)
    elif len(names) == 4 and names[0].isdigit() and names[1].isdigit():
        # Pasted without its header (seed 001's batch 48): the first row is data.
        profile.memory_line = hline
        _memory_rows([(hline, header), *body], profile, source)
    else:
        raise IngestError(source, hline, f"unknown table header {clip(str(names))}; expected "
                                         f"{SUMMARY_HEADER} or {MEMORY_HEADER}")


@dataclass
class _Section:
    title: str
    line: int
    lines: list[str] = field(default_factory=list)


def _sections(text: str) -> list[_Section]:
    sections = [_Section("", 1)]
    for i, raw in enumerate(text.splitlines(), start=1):
        m = _HEADING.match(raw)
        if m and not raw.startswith("#" * 7):
            sections.append(_Section(m.group(1).rstrip(), i))
        else:
            sections[-1].lines.append(raw)
    return sections


def parse_profile(lines: list[str], first_line: int, source: str) -> Profile | None:
    """The profiler tables among ``lines``, or None when there are none."""
    profile = Profile(line=0)
    table: list[tuple[int, str]] = []
    found = False
    for i, raw in enumerate([*lines, ""]):
        lineno = first_line + i
        if raw.lstrip().startswith("|"):
            table.append((lineno, raw))
            continue
        if table:
            _table(table, profile, source)
            found, table = True, []
        m = _LNC.search(raw)
        if m:
            profile.logical_cores = parse_int(m.group(1), source, lineno,
                                              "Logical NeuronCore config")
    if not found:
        return None
    missing = [k for k in REQUIRED if k not in profile.metrics]
    if missing:
        raise IngestError(source, profile.line or first_line,
                          f"profiler summary lacks {', '.join(missing)} (truncated?)")
    for core, usages in profile.memory.items():
        if "Total" not in usages:
            raise IngestError(source, profile.memory_line, f"memory table of {core} has no "
                                                            f"'Total' row (truncated?)")
        parts = sum(v for k, v in usages.items() if k != "Total")
        # The printed amounts are rounded to 3 decimals of their unit; 1% is far beyond that.
        if abs(parts - usages["Total"]) > 0.01 * usages["Total"]:
            raise IngestError(source, profile.memory_line, f"memory table of {core}: the usage "
                                                            f"types sum to {parts} bytes but its "
                                                            f"Total is {usages['Total']} (a row "
                                                            f"missing or misread?)")
    return profile


def _environment(profile: Profile | None) -> Environment:
    if profile is None:
        return Environment.from_json({"platform": "hf-trainer", "packages": {}})
    instance = profile.text.get("instance_type", "unknown")
    packages = {f"neuron-{k.removesuffix('_version')}": v for k, v in profile.text.items()
                if k.endswith("_version")}
    return Environment.from_json({"platform": f"neuron-{instance}", "device_kind": instance,
                                  "device_count": len(profile.memory) or None,
                                  "packages": packages})


def _run(section: _Section, source: str) -> Run | None:
    first = section.line + 1
    hf_blocks = [b for b in parse_blocks(section.lines, source, first) if b.split == "train"]
    profile = parse_profile(section.lines, first, source)
    if not hf_blocks and profile is None:
        return None
    if len(hf_blocks) > 1:
        raise IngestError(source, hf_blocks[1].line, "two train metrics blocks in one "
                                                     "section: give each run its own heading")
    title = section.title or "untitled"
    m = _BATCH.search(title)
    batch = parse_int(m.group(1), source, section.line, "the heading's batch") if m else None
    case_id = slug(title)
    if hf_blocks:
        run = run_from_block(hf_blocks[0], source, case_id, batch_hint=batch)
    else:
        assert profile is not None
        if profile.metrics["total_time"] <= 0:  # the run's one step time
            raise IngestError(source, profile.line, f"total_time is "
                                                    f"{profile.metrics['total_time']:g} s: a "
                                                    f"profiled execution takes time")
        run = Run(case_id=case_id, samples_per_step=batch or 0,
                  step_times=[profile.metrics["total_time"]],
                  details={"source": f"{source}:{profile.line}"})
    run = replace(run, environment=_environment(profile)).noted(section=title)
    if profile is not None:
        details: RunDetails = {
            "profile": dict(profile.metrics), "profile_dimensions": dict(profile.dimensions),
            "profile_text": dict(profile.text),
            "mfu": profile.metrics["mfu_estimated_percent"] / 100,
            "profile_step_time": profile.metrics["total_time"]}
        if profile.logical_cores is not None:
            details["logical_neuroncores"] = profile.logical_cores
        if profile.memory:
            details["memory_by_usage"] = {core: {k: v for k, v in u.items() if k != "Total"}
                                          for core, u in profile.memory.items()}
            run = replace(run, memory_source="neuron_profile", memory_per_device={
                core: u["Total"] for core, u in profile.memory.items()})
        run = replace(run, flops_per_step=profile.metrics["model_flops"],
                      n_devices=max(1, len(profile.memory))).noted(**details)
    return run


def parse_neuron_report(text: str, source: str = "<text>") -> list[Run]:
    """One run per section (``# heading``) holding a profiler summary or Trainer metrics."""
    runs: list[Run] = []
    seen: dict[str, int] = {}
    for section in _sections(text):
        if section.title == "" and not any(HF_HEADER.match(x) or x.lstrip().startswith("|")
                                           for x in section.lines):
            continue
        run = _run(section, source)
        if run is None:
            continue
        if run.case_id in seen:
            raise IngestError(source, section.line, f"section {clip(section.title)} repeats "
                                                    f"the heading of line {seen[run.case_id]}")
        seen[run.case_id] = section.line
        runs.append(run)
    if not runs:
        raise IngestError(source, 0, f"no profiler summary table or train metrics block "
                                     f"found; the neuron parser expects {EXPECTS}")
    return runs
