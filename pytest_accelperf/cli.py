"""``accelperf``: the baseline store and saved reports, from the command line.

::

    accelperf baselines show [PATTERN ...]          what is stored, one row per case
    accelperf baselines diff OLD NEW                two stores, or a JSON report against a store
    accelperf baselines accept REPORT --case PAT    store cases of a CI report without re-running
    accelperf baselines prune [PYTEST ARGS ...]     drop cases that are no longer collected
    accelperf report REPORT --markdown/--html PATH  render a saved JSON report
    accelperf history changes DIR [--since REF]     change points over the run history
    accelperf bisect GOOD BAD -- NODEIDS [ARGS]     the first commit that made the cases worse
    accelperf schema baseline|report|history        the JSON Schema of a block, report or line

Paths are relative to the current directory. Node ids and baseline files are keyed relative
to the pytest rootdir; ``prune`` takes the node ids and that rootdir from a collection it runs
(``pytest --collect-only``), so it works from any directory. The store defaults to
``[tool.accelperf] baselines`` of ``./pyproject.toml``, else ``baselines/``. Everything
written goes through the store (:mod:`pytest_accelperf.baselines`): validated by the schema,
locked, atomic, inside the store. Exit status: 0 done, 1 an error (the message names the
file, line, case and fix), 2 a usage error; ``bisect`` has three more (its ``--help``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Literal, TextIO, cast

import pytest
from pydantic import ValidationError
from tabulate import tabulate

from pytest_accelperf.baselines import (
    BaselineError,
    BaselineStore,
    case_key,
    check_block,
    module_key,
    read,
)
from pytest_accelperf.bisection import show as bisect_show
from pytest_accelperf.bisection.commits import commit_range
from pytest_accelperf.bisection.driver import Settings, Status, Step, bisect
from pytest_accelperf.bisection.probe import own_option
from pytest_accelperf.errors import UserError, render
from pytest_accelperf.jsonfile import field_path, gc_paused
from pytest_accelperf.nodeids import OUTPUT_ENV
from pytest_accelperf.options import BY_KEY, read_pyproject_table
from pytest_accelperf.recordable import clearable, not_cleared_by_a_baseline, unrecordable
from pytest_accelperf.report.changes import (
    MAX_PVALUE,
    ChangePoint,
    ChangesError,
    Detection,
    analyse,
    since_order,
)
from pytest_accelperf.report.data import CaseRecord
from pytest_accelperf.report.history import HistoryError, read_history
from pytest_accelperf.report.html import ReportDependencyError, html_report
from pytest_accelperf.report.loading import ReportFileError, case_line, load_report
from pytest_accelperf.report.markdown import markdown
from pytest_accelperf.report.terminal import fmt_value
from pytest_accelperf.report.writing import OutputError, write_output
from pytest_accelperf.run import Run
from pytest_accelperf.schema import error_lines, json_schema, validate_block
from pytest_accelperf.summary import summarize


class CliError(UserError):
    """A failure to report as ``accelperf: error: ...`` with exit status 1."""


# -- shared helpers ----------------------------------------------------------------------------
def default_store() -> Path:
    """``[tool.accelperf] baselines`` of ``./pyproject.toml``, else ``baselines``."""
    try:
        table = read_pyproject_table(Path.cwd())
    except pytest.UsageError as exc:
        raise CliError(str(exc)) from None
    return Path(str(table.get("baselines") or BY_KEY["baselines"].default))


def _store_root(arg: Path | None) -> Path:
    root = arg if arg is not None else default_store()
    if not root.is_dir():
        raise CliError(f"no baseline store at {root}: pass --baselines DIR (the directory of "
                       f"pytest --accelperf-baselines, relative to the rootdir), or record "
                       f"one with pytest --accelperf-update")
    return root


def _platforms(root: Path, only: str | None) -> list[str]:
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if only is None:
        return names
    if only not in names:
        raise CliError(f"no platform {only!r} in {root}; it has: {', '.join(names) or 'none'}")
    return [only]


def store_files(root: Path, platform: str | None = None, *, invalid_blocks: bool = False
                ) -> list[tuple[str, str, dict[str, Any]]]:
    """``[(platform, module key, {case key: block})]`` of every baseline file under
    ``root``; a CliError that lists every file that does not parse and every invalid block
    (each naming its file, line, case and field), or, with ``invalid_blocks``, those blocks
    as they are."""
    errors: list[str] = []
    with gc_paused():  # a tree of JSON has no cycles to collect (see gc_paused)
        out = list(iter_store(root, platform, errors, invalid_blocks=invalid_blocks))
    if errors:
        raise CliError("\n".join(errors))
    return out


def iter_store(root: Path, platform: str | None, errors: list[str], *,
               invalid_blocks: bool = False) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """:func:`store_files` one file at a time, so that a caller that keeps only a summary
    of each holds one file in memory; the errors are appended to ``errors`` (raise them
    when the walk is done). The blocks are those the schema accepts (the store's read,
    :func:`pytest_accelperf.baselines.read`); with ``invalid_blocks`` the invalid ones too,
    as they are, and no error for them."""
    for name in _platforms(root, platform):
        base = root / name
        for path in sorted(base.rglob("*.json")):
            if not path.is_file():
                continue
            try:
                bf = read(path, name)
            except BaselineError as exc:
                errors.append(str(exc))
                continue
            module = path.relative_to(base).as_posix().removesuffix(".json")
            if invalid_blocks:
                blocks = {k: b.raw for k, b in bf.invalid.items()}
                blocks.update(bf.cases)
            else:
                errors.extend(b.message for b in bf.invalid.values())
                blocks = bf.cases
            yield name, module, blocks


def store_blocks(root: Path, platform: str | None = None
                 ) -> dict[tuple[str, str], dict[str, Any]]:
    """``{(platform, nodeid): block}`` of every baseline file under ``root`` (a CliError
    naming every file or block that is invalid)."""
    return {(name, f"{module}.py::{key}"): block
            for name, module, blocks in store_files(root, platform)
            for key, block in blocks.items()}


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``*`` and ``?`` are wildcards; everything else, brackets included, is literal (case
    ids are full of ``[``)."""
    parts = [".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern]
    return re.compile("".join(parts) + r"\Z")


def matches(pattern: re.Pattern[str], nodeid: str) -> bool:
    """A pattern matches a node id, its ``test[case]`` part, or the case id alone."""
    name = case_key(nodeid)
    case_id = name[name.find("[") + 1:-1] if name.endswith("]") and "[" in name else name
    return any(pattern.match(s) for s in (nodeid, name, case_id))


def _block_of(record: CaseRecord) -> dict[str, Any]:
    """What --accelperf-update would have stored for this record: its ``block`` when the
    session was an update, else ``summarize`` of the run the report carries in full."""
    if record.block is not None:
        return record.block
    try:
        return summarize(Run.from_json(record.run)).to_json()
    except (TypeError, ValueError, KeyError) as exc:
        raise CliError(f"{record.nodeid}: the report's run cannot be read back ({exc!r}); "
                       f"re-run the case with --accelperf-update instead") from None


def _stored_block(report: Path, index: int, record: CaseRecord) -> None:
    """A CliError naming the report, the line and the case where the block that the
    report's case stored is not one the schema accepts (as the store's own read refuses
    it, field by field)."""
    if record.block is None:
        return
    try:
        validate_block(record.block)
    except ValidationError as exc:
        shown = "; ".join(f"{field_path(loc) or 'the block'}: {msg}" if loc else msg
                          for loc, msg in error_lines(exc))
        raise CliError(f"{report}:{case_line(report, index)}: case {record.nodeid!r}: "
                       f"invalid baseline block: {shown}; the report was edited or written "
                       f"by another version: write one with pytest --accelperf-json=PATH"
                       ) from None


def _load(path: Path) -> list[CaseRecord]:
    try:
        return load_report(path)[0].records
    except ReportFileError as exc:
        raise CliError(str(exc)) from None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


#: The headline numbers of a block, shown by `show` and compared by `diff`.
def _headline(block: dict[str, Any]) -> list[tuple[str, float | str | None, str]]:
    step = block.get("step_time") or {}
    loss = block.get("loss") or {}
    memory = block.get("memory") or {}
    max_batch = block.get("max_batch") or {}
    return [
        ("outcome", block.get("outcome"), ""),
        ("throughput", _num(block.get("samples_per_second")), "samples/s"),
        ("step time", _num(step.get("median")), "s"),
        ("input time", _num((block.get("input") or {}).get("median")), "s"),
        ("final loss", _num(loss.get("final")), ""),
        ("peak memory", _num(memory.get("peak")), "bytes"),
        ("compile", _num(block.get("compile_time")), "sec"),
        ("max batch", _num(max_batch.get("value")), ""),
    ]


def _fmt(value: float | str | None, unit: str) -> str:
    if isinstance(value, str):
        return value
    if unit == "sec":  # seconds of compile, not milliseconds of a step
        return "-" if value is None else f"{value:.2f} s"
    return fmt_value(value, unit)


def columns(rows: Sequence[Sequence[str]], headers: Sequence[str]) -> str:
    """``rows`` of strings under ``headers``, as ``tabulate(rows, headers,
    disable_numparse=True)`` lays them out (its ``simple`` format: left-aligned columns two
    spaces apart, a column at least two wider than its header, a rule of dashes under the
    headers, no trailing spaces). Linear in the cells: tabulate infers each cell's type and
    strips colour codes, half the time of ``show`` over a 10,000-case store."""
    cells = [[str(cell).strip() for cell in row] for row in rows]
    widths = [len(h) + 2 for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


# -- baselines show ----------------------------------------------------------------------------
def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    root = _store_root(args.baselines)
    patterns = [compile_pattern(p) for p in args.patterns]
    rows = []
    errors: list[str] = []
    # One file at a time: only the rows are kept, not every block of the store; a tree of
    # JSON has no cycles, so the collector is paused for the walk (see gc_paused).
    with gc_paused():
        for platform, module, blocks in iter_store(root, args.platform, errors):
            for key, block in blocks.items():
                nodeid = f"{module}.py::{key}"
                if patterns and not any(matches(p, nodeid) for p in patterns):
                    continue
                head = {label: _fmt(value, unit) for label, value, unit in _headline(block)}
                rows.append((platform, nodeid, head["outcome"], head["throughput"],
                             head["step time"], head["final loss"], head["peak memory"],
                             str(block.get("recorded_at", "-"))))
    if errors:
        raise CliError("\n".join(errors))
    rows.sort(key=lambda row: (row[0], row[1]))
    if not rows:
        wanted = f" matching {' '.join(args.patterns)}" if args.patterns else ""
        raise CliError(f"no baseline{wanted} in {root}")
    out.write(columns(rows, ("platform", "case", "outcome", "throughput", "step time",
                             "final loss", "peak memory", "recorded")) + "\n")
    out.write(f"{len(rows)} case(s) in {root}\n")
    return 0


# -- baselines diff ----------------------------------------------------------------------------
def _side(path: Path, platform: str | None) -> tuple[dict[tuple[str, str], dict[str, Any]], bool]:
    """The blocks of a store directory or of a JSON report; True when it is a report."""
    if path.is_dir():
        return store_blocks(path, platform), False
    if not path.exists():
        raise CliError(f"{path}: neither a baseline store directory nor a JSON report")
    blocks = {}
    for i, record in enumerate(_load(path)):
        if platform is None or record.platform == platform:
            _stored_block(path, i, record)
            blocks[(record.platform, record.nodeid)] = _block_of(record)
    return blocks, True


def diff_rows(old: dict[tuple[str, str], dict[str, Any]],
              new: dict[tuple[str, str], dict[str, Any]], *, show_removed: bool
              ) -> tuple[list[tuple[str, ...]], int]:
    """Table rows of what differs between two sets of blocks, and how many were equal."""
    rows: list[tuple[str, ...]] = []
    same = 0
    for key in sorted(set(old) | set(new)):
        platform, nodeid = key
        name = f"{platform}:{nodeid}"
        if key not in old:
            rows.append((name, "(added)", "-", "-", ""))
            continue
        if key not in new:
            if show_removed:
                rows.append((name, "(removed)", "-", "-", ""))
            continue
        changed = False
        for (label, a, unit), (_, b, _) in zip(_headline(old[key]), _headline(new[key]),
                                               strict=True):
            if _fmt(a, unit) == _fmt(b, unit):
                continue
            change = ""
            if isinstance(a, float) and isinstance(b, float) and a:
                change = f"{(b / a - 1) * 100:+.1f}%"
            rows.append((name if not changed else "", label, _fmt(a, unit), _fmt(b, unit),
                         change))
            changed = True
        same += not changed
    return rows, same


def cmd_diff(args: argparse.Namespace, out: TextIO) -> int:
    old, old_is_report = _side(args.old, args.platform)
    new, new_is_report = _side(args.new, args.platform)
    # A report covers only the cases that ran: the store's others are not "removed".
    rows, same = diff_rows(old, new, show_removed=not (old_is_report or new_is_report))
    if old_is_report and not new_is_report:
        rows = [r for r in rows if r[1] != "(added)"]
    if rows:
        out.write(tabulate(rows, headers=("case", "metric", str(args.old), str(args.new),
                                          "change"), disable_numparse=True) + "\n")
    out.write(f"{len({r[0] for r in rows if r[0]})} case(s) differ, {same} equal\n")
    return 0


# -- baselines accept --------------------------------------------------------------------------
def select(records: list[CaseRecord], patterns: Sequence[str], report: Path
           ) -> list[CaseRecord]:
    """The records matched by ``patterns``; an unmatched pattern is an error listing what
    the report holds."""
    chosen: dict[str, CaseRecord] = {}
    for text in patterns:
        pattern = compile_pattern(text)
        hits = [r for r in records if matches(pattern, r.nodeid)]
        if not hits:
            have = ", ".join(case_key(r.nodeid) for r in records[:12])
            more = f" (and {len(records) - 12} more)" if len(records) > 12 else ""
            raise CliError(f"no case in {report} matches --case {text!r}; it has: "
                           f"{have or 'no cases'}{more}")
        chosen.update((r.nodeid, r) for r in hits)
    return [chosen[k] for k in sorted(chosen)]


def _acceptable(record: CaseRecord, root: Path) -> dict[str, Any]:
    """The block ``record`` would store, checked as the plugin checks what it records
    (:func:`pytest_accelperf.recordable.unrecordable`: no failed outcome, reference check or
    non-finite loss) and as the store checks what it writes: a platform that is one safe
    path component, a node id under the rootdir, a block the schema accepts. A
    BaselineError or CliError says what is wrong."""
    try:
        run = Run.from_json(record.run)
    except (TypeError, ValueError, KeyError) as exc:
        raise CliError(f"{record.nodeid}: the report's run cannot be read back ({exc!r}); "
                       f"re-run the case with --accelperf-update instead") from None
    block = _block_of(record)
    if record.block is not None:  # the schema first: what unrecordable reads is typed
        block = check_block(record.nodeid, block)
    why = unrecordable(run, record.checks, block)
    if why is not None:
        raise CliError(f"never stored as a baseline: {why}; fix the run, or leave the case "
                       f"out of --case")
    failed = [c for c in record.checks if c.failed]
    if failed and all(c.data.get("mode") == "ab" for c in failed):
        raise CliError(f"its only failure is the A/B comparison ({failed[0].detail}), which no "
                       f"baseline clears: A/B verdicts are not stored, the base revision is "
                       f"what changes them; leave the case out of --case")
    if failed and not clearable(failed):
        whys = "; ".join(f"{c.metric}: {not_cleared_by_a_baseline(c)}" for c in failed)
        raise CliError(f"no baseline clears its failure(s), so accepting it would change "
                       f"nothing: {whys}; leave the case out of --case")
    BaselineStore(root, record.platform).path_for(record.nodeid)
    return check_block(record.nodeid, block)


def cmd_accept(args: argparse.Namespace, out: TextIO) -> int:
    records = _load(args.report)
    if not args.case and not args.all:
        raise CliError("choose the cases to accept: --case PATTERN (repeatable; * and ? are "
                       "wildcards) or --all")
    chosen = records if args.all else select(records, args.case, args.report)
    root = _store_root(args.baselines)
    index = {id(r): i for i, r in enumerate(records)}
    by_platform: dict[str, dict[str, dict[str, Any]]] = {}
    errors: list[str] = []
    for record in chosen:
        try:
            block = _acceptable(record, root)
        except (BaselineError, CliError) as exc:
            line = case_line(args.report, index[id(record)])
            why = str(exc).removeprefix(f"{record.nodeid}: ")
            errors.append(f"{args.report}:{line}: case {record.nodeid!r} "
                          f"[{record.platform}]: {why}")
            continue
        by_platform.setdefault(record.platform, {})[record.nodeid] = block
    if errors:
        raise CliError("\n".join(errors) + f"\nnothing was written to {root}")
    for record in chosen:
        block = by_platform[record.platform][record.nodeid]
        verdicts = ", ".join(f"{c.metric} {c.verdict.value}" for c in record.checks
                             if c.verdict.value != "pass") or "all pass"
        throughput = _fmt(_num(block.get("samples_per_second")), "samples/s")
        out.write(f"accept {record.nodeid} [{record.platform}]: {verdicts}; stores throughput "
                  f"{throughput}, outcome {block.get('outcome')}\n")
        if any(c.failed and c.data.get("mode") == "ab" for c in record.checks):
            out.write("  note: its A/B throughput failure is not cleared by this (A/B "
                      "verdicts are not stored; the base revision changes them)\n")
        for c in record.checks:
            uncleared = not_cleared_by_a_baseline(c)
            if uncleared is not None and c.data.get("mode") != "ab":
                out.write(f"  note: its {c.metric} failure is not cleared by this: "
                          f"{uncleared}\n")
    if args.dry_run:
        out.write(f"dry run: {len(chosen)} case(s) not written\n")
        return 0
    for platform, blocks in sorted(by_platform.items()):
        try:
            paths = BaselineStore(root, platform).write(blocks)
        except BaselineError as exc:
            for path in exc.written:
                out.write(f"written {path}\n")
            raise CliError(str(exc)) from None
        for path in paths:
            out.write(f"written {path}\n")
    out.write(f"accepted {len(chosen)} case(s); review and commit the diff (git diff "
              f"{root})\n")
    return 0


# -- baselines prune ---------------------------------------------------------------------------
def collected_nodeids(pytest_args: Sequence[str]) -> tuple[set[str], Path]:
    """The node ids ``pytest --collect-only`` collects here (deselected ones included) and
    pytest's rootdir, which they are relative to (:mod:`pytest_accelperf.nodeids`)."""
    with tempfile.TemporaryDirectory(prefix="accelperf-prune-") as tmp:
        listing = Path(tmp) / "nodeids.json"
        cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
               "-p", "pytest_accelperf.nodeids", *pytest_args]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                              env={**os.environ, OUTPUT_ENV: str(listing)})
        if done.returncode not in (0, 5):  # 5: nothing collected
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise CliError(f"collection failed (exit {done.returncode}) for "
                           f"{' '.join(cmd[1:])}; nothing was pruned. Fix it, or pass "
                           f"--nodeids FILE.\n{tail}")
        try:
            data = json.loads(listing.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CliError(f"the collection by {' '.join(cmd[1:])} listed no node ids "
                           f"({exc}); nothing was pruned") from None
    return set(data["nodeids"]), Path(data["rootdir"])


#: Lines of ``pytest --collect-only -q`` output that are not node ids, though they may
#: hold ``::`` (a warning's location, an error's summary).
_NOT_A_NODEID = re.compile(r"\s|=|-|(ERROR|FAILED|XFAIL|XPASS|SKIPPED|PASSED|E) ")


def parse_nodeids(text: str) -> set[str]:
    """Node ids in ``pytest --collect-only -q`` output (or one per line): the lines that
    hold ``::``, less those indented or starting with a word of pytest's summaries. A node
    id may hold spaces (a case id such as ``test_x[a b]``)."""
    return {line.rstrip() for line in text.splitlines()
            if "::" in line and not _NOT_A_NODEID.match(line)}


def stale_cases(stored: Sequence[tuple[str, str, Sequence[str]]], collected: set[str],
                rootdir: Path | None) -> tuple[dict[str, list[str]], list[str]]:
    """``({platform: [stale nodeids]}, [modules left alone])`` of the stored
    ``(platform, module key, case keys)``.

    A case is stale when its module was collected but the case was not. With the
    ``rootdir`` the node ids are relative to (known when prune collected them itself), a
    case is also stale when its module's file is not there any more. Any other module that
    was not collected is left alone: the collection did not cover it.
    """
    pairs = {(module_key(n), case_key(n)) for n in collected}
    modules = {module for module, _ in pairs}
    stale: dict[str, list[str]] = {}
    untouched: set[str] = set()
    for platform, module, keys in sorted(stored):
        if module in modules:
            gone = [k for k in keys if (module, k) not in pairs]
        elif rootdir is not None and not any(
                (rootdir / p).exists() for p in (f"{module}.py", module)):
            gone = list(keys)
        else:
            untouched.add(module)
            continue
        stale.setdefault(platform, []).extend(f"{module}.py::{k}" for k in sorted(gone))
    return {k: v for k, v in stale.items() if v}, sorted(untouched)


def cmd_prune(args: argparse.Namespace, out: TextIO) -> int:
    root = _store_root(args.baselines)
    rootdir: Path | None = None
    if args.nodeids is not None:
        text = sys.stdin.read() if str(args.nodeids) == "-" else _read(args.nodeids)
        collected = parse_nodeids(text)
    else:
        collected, rootdir = collected_nodeids(args.pytest_args)
        if not root.resolve().is_relative_to(rootdir.resolve()):
            out.write(f"note: the store {root} is not under pytest's rootdir {rootdir}: only "
                      f"cases of collected modules are dropped, not those of modules whose "
                      f"file is gone\n")
            rootdir = None
    if not collected:
        raise CliError("no node ids collected: pass the test paths (accelperf baselines prune "
                       "suites/) or a --nodeids file from pytest --collect-only -q; nothing "
                       "was pruned")
    stored = [(platform, module, list(blocks))
              for platform, module, blocks in store_files(root, args.platform,
                                                          invalid_blocks=True)]
    stale, untouched = stale_cases(stored, collected, rootdir)
    for module in untouched:
        out.write(f"left alone (not collected here): {module}.py\n")
    count = sum(len(v) for v in stale.values())
    for platform, nodeids in sorted(stale.items()):
        for nodeid in nodeids:
            out.write(f"{'would drop' if args.dry_run else 'drop'} {nodeid} [{platform}]\n")
        if not args.dry_run:
            try:
                changed = BaselineStore(root, platform).remove(nodeids)
            except BaselineError as exc:
                raise CliError(str(exc)) from None
            for path in changed:
                state = "rewritten" if path.exists() else "deleted (no case left)"
                out.write(f"{state} {path}\n")
    verb = "would drop" if args.dry_run else "dropped"
    out.write(f"{verb} {count} case(s) no longer collected; {len(collected)} collected\n")
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc}") from None


# -- report ------------------------------------------------------------------------------------
def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    try:
        report, _ = load_report(args.report)
    except ReportFileError as exc:
        raise CliError(str(exc)) from None
    hint = None
    if report.acceptable:
        cases = " ".join(f"--case '{case_key(r.nodeid)}'" for r in report.acceptable[:5])
        hint = f"accelperf baselines accept {args.report} {cases}"
    wrote = False
    if args.markdown is not None:
        text = markdown(report, accept_hint=hint)
        if str(args.markdown) == "-":
            out.write(text)
        else:
            _write(args.markdown, text, "--markdown")
            out.write(f"Markdown summary written to {args.markdown}\n")
        wrote = True
    if args.html is not None:
        history: list[dict[str, Any]] = []
        try:
            if args.history is not None:
                history = read_history(args.history, report.platform or None)
            text = html_report(report, history=history)
        except (HistoryError, ReportDependencyError) as exc:
            raise CliError(str(exc)) from None
        if str(args.html) == "-":
            out.write(text)
        else:
            _write(args.html, text, "--html")
            out.write(f"HTML report written to {args.html}\n")
        wrote = True
    if not wrote:
        out.write(markdown(report, accept_hint=hint))
    return 0


def _write(path: Path, text: str, option: str) -> None:
    """The writer of a session's reports (:mod:`pytest_accelperf.report.writing`), so that
    a path means the same to ``accelperf report`` as to pytest's options: a device, FIFO or
    descriptor written in place, a file atomically."""
    try:
        write_output(path, text, option=option)
    except OutputError as exc:
        raise CliError(render(exc)) from None


# -- history changes ---------------------------------------------------------------------------
def change_rows(changes: Sequence[ChangePoint]) -> list[tuple[str, ...]]:
    """Table rows of change points: case (named once for its rows), metric, levels,
    change, commit range, how sure."""
    rows: list[tuple[str, ...]] = []
    last = None
    for c in sorted(changes, key=lambda c: (c.platform, c.nodeid, c.first_after.order,
                                            c.metric)):
        name = f"{c.platform}:{c.nodeid}" if c.platform else c.nodeid
        change = c.change
        rows.append((name if name != last else "", c.metric, c.levels(),
                     "" if change is None else f"{change * 100:+.1f}%", c.commits, c.sure))
        last = name
    return rows


def cmd_history_changes(args: argparse.Namespace, out: TextIO) -> int:
    if not 0 < args.max_pvalue < 1:
        raise CliError(f"--max-pvalue {args.max_pvalue}: a p-value between 0 and 1, such "
                       f"as 0.001")
    try:
        found = analyse(args.directory, args.platform, Detection(max_pvalue=args.max_pvalue))
        if not found.sessions:
            raise CliError(f"{args.directory}: no history lines"
                           f"{f' of platform {args.platform}' if args.platform else ''}; "
                           f"write them with pytest --accelperf-history={args.directory}")
        changes = found.changes
        if args.since is not None:
            cut = since_order(found.sessions, args.since, Path.cwd())
            changes = [c for c in changes if c.first_after.order > cut]
    except (HistoryError, ChangesError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        out.write(json.dumps([c.to_json() for c in changes], indent=2) + "\n")
        return 0
    if changes:
        out.write(tabulate(change_rows(changes),
                           headers=("case", "metric", "before → after", "change", "commits",
                                    "how sure"), disable_numparse=True) + "\n")
    since = f" since {args.since}" if args.since is not None else ""
    out.write(f"{len(changes)} change point(s){since} in {found.cases} case(s) over "
              f"{len(found.sessions)} session(s) of {args.directory}\n")
    return 0


# -- bisect ------------------------------------------------------------------------------------
BISECT_EPILOG = f"""\
exit status: {Status.FOUND.value} the first bad commit was found; 1 an error in what was given \
(an unknown ref, GOOD not an ancestor of BAD, no node ids, a GOOD or BAD whose session does \
not run); 2 a usage error; {Status.BAD_NOT_BAD.value} BAD is not worse than GOOD (or only on \
a check the search cannot follow, such as input, which it names); \
{Status.GOOD_ALREADY_BAD.value} GOOD is already worse (BAD is faster); \
{Status.NOT_FOUND.value} not found: only commits that could not be tested are left between \
the last good and the first bad one (all are named); {Status.INTERRUPTED.value} interrupted \
(the worktrees are removed)."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the worktrees are removed on the way out


def cmd_bisect(args: argparse.Namespace, out: TextIO) -> int:
    pytest_args = [*args.nodeids, *args.pytest_args]
    nodeids = []
    for arg in pytest_args:
        if arg.startswith("-"):
            break
        nodeids.append(arg)
    if not nodeids:
        raise CliError("no node ids: pass the tests to bisect after --, e.g. accelperf "
                       "bisect v1.0 main -- tests/test_perf.py::test_step --accel=cpu")
    clash = own_option(pytest_args)
    if clash:
        raise CliError(clash)
    if not 0 < args.tolerance < 1:
        raise CliError(f"--tolerance {args.tolerance:g}: a relative change between 0 and 1, "
                       f"such as 0.01")
    if args.budget is not None and not args.budget > 0:
        raise CliError(f"--budget {args.budget:g}: seconds of A/B measurement per case, more "
                       f"than 0, such as 20")
    rng = commit_range(Path.cwd(), args.good, args.bad)
    settings = Settings(tuple(pytest_args), args.tolerance, args.budget)
    out.write(bisect_show.start_line(rng, settings.args) + "\n")
    out.flush()

    def progress(step: Step) -> None:
        out.write(bisect_show.step_line(step, rng) + "\n")
        out.flush()

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = bisect(rng, settings, progress)
    except KeyboardInterrupt:
        print("accelperf bisect: interrupted; its worktrees were removed", file=sys.stderr)
        return int(Status.INTERRUPTED)
    finally:
        signal.signal(signal.SIGTERM, previous)
    out.write("\n" + bisect_show.render(result))
    if args.json is not None:
        _write(args.json, json.dumps(result.to_json(), indent=2) + "\n", "--json")
    return int(result.status)


# -- schema ------------------------------------------------------------------------------------
def cmd_schema(args: argparse.Namespace, out: TextIO) -> int:
    kind = cast(Literal["baseline", "report", "history"], args.kind)
    out.write(json.dumps(json_schema(kind), indent=2, sort_keys=True) + "\n")
    return 0


# -- argument parsing --------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accelperf",
        description="pytest-accelperf: inspect, compare, accept and prune baselines; render "
                    "saved reports. Run it in the pytest rootdir.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def store_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--baselines", type=Path, metavar="DIR",
                       help="the baseline store (default: [tool.accelperf] baselines of "
                            "./pyproject.toml, else baselines/)")

    base = sub.add_parser("baselines", help="show, diff, accept or prune stored baselines")
    bsub = base.add_subparsers(dest="action", required=True, metavar="ACTION")

    show = bsub.add_parser("show", help="list stored cases with their headline numbers")
    store_arg(show)
    show.add_argument("--platform", help="only this platform (e.g. cpu-x8)")
    show.add_argument("patterns", nargs="*", metavar="PATTERN",
                      help="only cases matching (node id, test[case] or case id; * and ? "
                           "are wildcards)")
    show.set_defaults(func=cmd_show)

    diff = bsub.add_parser("diff", help="compare two stores, or a JSON report with a store")
    diff.add_argument("old", type=Path, metavar="OLD", help="a store directory or JSON report")
    diff.add_argument("new", type=Path, metavar="NEW", help="a store directory or JSON report")
    diff.add_argument("--platform", help="only this platform")
    diff.set_defaults(func=cmd_diff)

    accept = bsub.add_parser("accept", help="store cases of a JSON report as baselines, "
                                            "without re-running them")
    accept.add_argument("report", type=Path, metavar="REPORT",
                        help="a report written by pytest --accelperf-json")
    accept.add_argument("--case", action="append", default=[], metavar="PATTERN",
                        help="a case to accept (repeatable; node id, test[case] or case id; "
                             "* and ? are wildcards)")
    accept.add_argument("--all", action="store_true", help="accept every case of the report")
    accept.add_argument("--dry-run", action="store_true", help="say what would be written")
    store_arg(accept)
    accept.set_defaults(func=cmd_accept)

    prune = bsub.add_parser("prune", help="drop stored cases that pytest no longer collects")
    store_arg(prune)
    prune.add_argument("--platform", help="only this platform")
    prune.add_argument("--nodeids", type=Path, metavar="FILE",
                       help="node ids, one a line (pytest --collect-only -q output; - for "
                            "stdin), instead of collecting")
    prune.add_argument("--dry-run", action="store_true", help="say what would be dropped")
    prune.add_argument("pytest_args", nargs="*", metavar="PYTEST_ARG",
                       help="passed to pytest --collect-only -q (e.g. suites/)")
    prune.set_defaults(func=cmd_prune)

    report = sub.add_parser("report", help="render a saved JSON report as Markdown or HTML")
    report.add_argument("report", type=Path, metavar="REPORT",
                        help="a report written by pytest --accelperf-json")
    report.add_argument("--markdown", type=Path, metavar="PATH",
                        help="write the Markdown summary here (- for stdout)")
    report.add_argument("--html", type=Path, metavar="PATH",
                        help="write the HTML report with plots here (- for stdout; needs "
                             "matplotlib)")
    report.add_argument("--history", type=Path, metavar="DIR",
                        help="the --accelperf-history directory, for the trend plots and "
                             "their change points")
    report.set_defaults(func=cmd_report)

    history = sub.add_parser("history", help="change points over the --accelperf-history "
                                             "of runs")
    hsub = history.add_subparsers(dest="action", required=True, metavar="ACTION")
    changes = hsub.add_parser(
        "changes", help="list each change point: case, metric, before → after, the commit "
                        "range it lies in, and how sure",
        description="Change points of each case's throughput (step time), program fields "
                    "(FLOPs, bytes, collectives, callbacks, syncs, graphs, recompiles), peak "
                    "memory and final loss over the sessions of an --accelperf-history "
                    "directory, per environment fingerprint. A deterministic field's change "
                    "is exact; a measured one must hold 3 sessions and pass the "
                    "Mann-Whitney U test at --max-pvalue. The numbers of each file's lines "
                    "are cached in DIR/.accelperf-cache: a file only appended to has its new "
                    "lines validated, one edited is validated again in full.")
    changes.add_argument("directory", type=Path, metavar="DIR",
                         help="the --accelperf-history directory")
    changes.add_argument("--since", metavar="REF",
                         help="only change points after the first session of commit REF (a "
                              "commit, its prefix, or a ref git resolves here) or after the "
                              "date REF (2026-11-20, 2026-11-20T14:00)")
    changes.add_argument("--platform", help="only this platform's file (DIR/PLATFORM.jsonl)")
    changes.add_argument("--max-pvalue", type=float, default=MAX_PVALUE, metavar="P",
                         help=f"the largest p-value of a measured change (default "
                              f"{MAX_PVALUE})")
    changes.add_argument("--json", action="store_true",
                         help="print the change points as JSON")
    changes.set_defaults(func=cmd_history_changes)

    bis = sub.add_parser(
        "bisect", help="the first commit between GOOD and BAD that made the cases worse",
        usage="accelperf bisect [-h] [--tolerance T] [--budget S] [--json PATH]\n"
              "                        GOOD BAD -- NODEID [NODEID ...] [PYTEST_ARG ...]",
        description="Bisect the commits of GOOD..BAD on BAD's first-parent line, each "
                    "tested in a git worktree of its own (removed at the end, also on "
                    "Ctrl-C; the working tree, index and branches are not touched) by "
                    "running pytest NODEIDS PYTEST_ARGS there. GOOD's session records a "
                    "baseline; where BAD's compiled program (FLOPs, bytes, collectives, host "
                    "syncs, matmul dtypes, graph breaks, the compiler's memory plan) is "
                    "worse than GOOD's, the search is on those fields (exact: one session "
                    "per commit); where the programs agree, on A/B mode's timing "
                    "(--accelperf-compare=GOOD in each commit's worktree). A commit whose "
                    "session does not collect, import or run, or whose A/B interval cannot "
                    "tell which side of halfway it is on, is skipped as git bisect skip "
                    "does. Prints the first bad "
                    "commit, the evidence of each step, and the command that reproduces "
                    "the last decisive comparison.",
        epilog=BISECT_EPILOG)
    bis.add_argument("good", metavar="GOOD", help="a commit without the regression (an "
                                                  "ancestor of BAD on its first-parent line)")
    bis.add_argument("bad", metavar="BAD", help="a commit with it")
    bis.add_argument("nodeids", nargs="*", metavar="NODEID",
                     help="the tests to run at each commit, after --, then any pytest "
                          "arguments (--accel=cpu, -k EXPR, ...)")
    bis.add_argument("--tolerance", type=float, default=0.01, metavar="T",
                     help="A/B mode's tolerance when comparing BAD with GOOD (default "
                          "0.01); a commit between is bad when its interval lies above the "
                          "ratio halfway from GOOD to BAD's, good when below")
    bis.add_argument("--budget", type=float, metavar="S",
                     help="seconds of A/B measurement per case and commit (default: A/B "
                          "mode's, 20)")
    bis.add_argument("--json", type=Path, metavar="PATH",
                     help="also write the result (first bad commit, every step) as JSON")
    bis.set_defaults(func=cmd_bisect, pytest_args=[])

    schema = sub.add_parser("schema", help="print the JSON Schema of a baseline block, a "
                                           "JSON report or a history line")
    schema.add_argument("kind", choices=("baseline", "report", "history"),
                        help="baseline: one case's block in a baseline file; report: a "
                             "--accelperf-json report; history: one line of "
                             "--accelperf-history")
    schema.set_defaults(func=cmd_schema)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the ``accelperf`` console script; returns the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    after: list[str] = []
    if argv[:1] == ["bisect"] and "--" in argv:
        # What follows -- is pytest's, options included (argparse mishandles -- after an
        # option of a subcommand).
        cut = argv.index("--")
        argv, after = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if after:
        args.pytest_args = after
    stream = out if out is not None else sys.stdout
    try:
        status: int = args.func(args, stream)
    except UserError as exc:  # CliError, and any other mistake in what was given
        print(f"accelperf: error: {render(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `accelperf baselines show | head`: the reader had enough
        # Python flushes stdout again at exit and would report the pipe a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
