"""``accelperf baselines show | diff | accept | prune``: the baseline store, read, compared
with another store or a report, added to from a report, and rid of cases pytest no longer
collects. Everything written goes through the store (:mod:`pytest_accelperf.store.baselines`)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pytest_accelperf.cli.common import CliError, read_file
from pytest_accelperf.errors import ConfigError, UserError
from pytest_accelperf.stats.units import fmt_value
from pytest_accelperf.store.baselines import (
    BaselineError,
    BaselineStore,
    case_key,
    check_block,
    module_key,
    read,
)
from pytest_accelperf.store.fields import Fields
from pytest_accelperf.store.jsonfile import gc_paused

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from pytest_accelperf.report.data import CaseRecord, SessionReport

# `show` and `diff` over a store import the store's reader and the fields they read
# (HEADLINE), nothing else: pytest, the options table, the reports, the runs and the
# checks are imported by the commands and the helpers that use them.

# -- the store, its blocks and their headline numbers ------------------------------------------
def default_store() -> Path:
    """``[tool.accelperf] baselines`` of ``./pyproject.toml``, else ``baselines``; read
    through the options table, without pytest."""
    from pytest_accelperf.gate.options import BY_KEY, read_table

    try:
        table = read_table(Path.cwd())
    except ConfigError as exc:
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


#: What ``show`` and ``diff`` read of a block (:func:`_headline`): only these fields are
#: validated (whole blocks: ``accelperf baselines check``, the gate and every writer).
HEADLINE = Fields(("outcome", "samples_per_second", "step_time.median", "input.median",
                   "loss.final", "memory.peak", "compile_time", "max_batch.value",
                   "recorded_at"))
#: What ``show`` reads of a block: the headline, and the machines with timing in it
#: (:mod:`pytest_accelperf.store.machines`: the recorder's name, or the environment it is
#: derived from, and the others' hosts).
SHOWN = Fields((*HEADLINE.paths, "machine", "environment.host_cpu", "environment.cpu_isa",
                "machines.environment.host_cpu"))
#: ``show --machine``: also each machine's headline timing, for that machine's columns.
SHOWN_MACHINES = Fields((*SHOWN.paths, "machines.samples_per_second",
                         "machines.step_time.median", "machines.input.median",
                         "machines.compile_time", "machines.recorded_at"))


def store_files(root: Path, platform: str | None = None, *, invalid_blocks: bool = False,
                fields: Fields | None = None
                ) -> list[tuple[str, str, Mapping[str, Mapping[str, object]]]]:
    """``[(platform, module key, {case key: block})]`` of every baseline file under
    ``root``; a CliError that lists every file that does not parse and every invalid block
    (each naming its file, line, case and field), or, with ``invalid_blocks``, those blocks
    as they are. With ``fields``, only those fields of each block are read and validated
    (:class:`~pytest_accelperf.store.fields.Fields`)."""
    errors: list[str] = []
    with gc_paused():  # a tree of JSON has no cycles to collect (see gc_paused)
        out = list(iter_store(root, platform, errors, invalid_blocks=invalid_blocks,
                              fields=fields))
    if errors:
        raise CliError("\n".join(errors))
    return out


def iter_store(root: Path, platform: str | None, errors: list[str], *,
               invalid_blocks: bool = False, fields: Fields | None = None
               ) -> Iterator[tuple[str, str, Mapping[str, Mapping[str, object]]]]:
    """:func:`store_files` one file at a time, so that a caller that keeps only a summary
    of each holds one file in memory; the errors are appended to ``errors`` (raise them
    when the walk is done). The blocks are those the schema accepts (the store's read,
    :func:`pytest_accelperf.store.baselines.read`: whole, or with ``fields`` only those
    fields); with ``invalid_blocks`` the invalid ones too, as they are, and no error for
    them."""
    yield from _read_files(_store_paths(root, platform), errors,
                           invalid_blocks=invalid_blocks, fields=fields)


def _store_paths(root: Path, platform: str | None) -> list[tuple[str, Path, Path]]:
    """``[(platform, its directory, file)]`` of every baseline file under ``root``, in the
    order of the walk (platform, then path)."""
    return [(name, root / name, path) for name in _platforms(root, platform)
            for path in sorted((root / name).rglob("*.json")) if path.is_file()]


def _read_files(paths: Sequence[tuple[str, Path, Path]], errors: list[str], *,
                invalid_blocks: bool = False, fields: Fields | None = None
                ) -> Iterator[tuple[str, str, Mapping[str, Mapping[str, object]]]]:
    """:func:`iter_store` of these files (:func:`_store_paths`)."""
    for name, base, path in paths:
        try:
            bf = read(path, name, fields)
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


def store_blocks(root: Path, platform: str | None = None, fields: Fields | None = None
                 ) -> dict[tuple[str, str], Mapping[str, object]]:
    """``{(platform, nodeid): block}`` of every baseline file under ``root`` (a CliError
    naming every file or block that is invalid); with ``fields``, only those fields."""
    return {(name, f"{module}.py::{key}"): block
            for name, module, blocks in store_files(root, platform, fields=fields)
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
    from pytest_accelperf.checks.summary import summarize
    from pytest_accelperf.records.run import Run

    if record.block is not None:
        return record.block
    try:
        return summarize(Run.from_json(record.run)).to_json()
    except (TypeError, ValueError, KeyError) as exc:
        raise CliError(f"{record.nodeid}: the report's run cannot be read back ({exc!r}); "
                       f"re-run the case with --accelperf-update instead") from None


def _load(path: Path) -> list[CaseRecord]:
    return _load_report(path).records


def _load_report(path: Path) -> SessionReport:
    from pytest_accelperf.report.loading import ReportFileError, load_report

    try:
        return load_report(path)[0]
    except ReportFileError as exc:
        raise CliError(str(exc)) from None


def _machine_of(report: SessionReport, given: str | None) -> str:
    """The machine whose timing ``accept`` writes: ``--machine``, else the report's (the
    session's ``--accelperf-machine`` or default), else, for a report written before
    machines were named, the default name of the environment it ran in."""
    from pytest_accelperf.store.machines import default_machine, validate_machine

    name = given or report.machine or default_machine(report.environment.to_json())
    try:
        return validate_machine(name)
    except UserError as exc:
        raise CliError(str(exc).replace("--accelperf-machine", "--machine")) from None


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _section(block: Mapping[str, object], name: str) -> Mapping[str, object]:
    """The section ``name`` of a block (a mapping in a valid block); empty where absent."""
    part = block.get(name)
    # A JSON object is a dict: the check is the cheap one first (`show` asks it 50,000
    # times over a 10,000-case store; an ABC's isinstance is several times slower).
    return part if type(part) is dict or isinstance(part, Mapping) else {}


#: The headline numbers of a block, shown by `show` and compared by `diff`.
def _headline(block: Mapping[str, object]) -> list[tuple[str, float | str | None, str]]:
    step = _section(block, "step_time")
    loss = _section(block, "loss")
    memory = _section(block, "memory")
    max_batch = _section(block, "max_batch")
    outcome = block.get("outcome")
    return [
        ("outcome", outcome if isinstance(outcome, str) or outcome is None else str(outcome),
         ""),
        ("throughput", _num(block.get("samples_per_second")), "samples/s"),
        ("step time", _num(step.get("median")), "s"),
        ("input time", _num(_section(block, "input").get("median")), "s"),
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
    cells = [list(map(str.strip, map(str, row))) for row in rows]
    by_column = zip(*cells, strict=True) if cells else [() for _ in headers]
    widths = [max([len(h) + 2, *map(len, column)])
              for h, column in zip(headers, by_column, strict=True)]
    # One format per line (C-level), not a join of padded cells per row.
    layout = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(layout.format(*row).rstrip()
                     for row in [headers, ["-" * w for w in widths], *cells])


# -- baselines show ----------------------------------------------------------------------------
#: The headline numbers ``show`` has a column for (:func:`_headline`), in their order.
_SHOWN = ("outcome", "throughput", "step time", "final loss", "peak memory")


def _shown_cells(block: Mapping[str, object]) -> tuple[str, ...]:
    """The cells of :data:`_SHOWN` of a block, as :func:`_headline` and :func:`_fmt` give
    them (only those five: `show` makes a row of each of a store's cases)."""
    outcome = block.get("outcome")
    return (outcome if isinstance(outcome, str) else "-" if outcome is None else str(outcome),
            fmt_value(_num(block.get("samples_per_second")), "samples/s"),
            fmt_value(_num(_section(block, "step_time").get("median")), "s"),
            fmt_value(_num(_section(block, "loss").get("final")), ""),
            fmt_value(_num(_section(block, "memory").get("peak")), "bytes"))


@dataclass
class _Machine:
    """What ``show`` says of one machine of a platform: its host, how many cases hold its
    timing, and of how many it recorded the shared sections."""

    host: str = ""
    cases: int = 0
    recorded: int = 0


def _host(env: object) -> str:
    return str(env.get("host_cpu") or "?") if isinstance(env, Mapping) else "?"


#: ``show`` reads a store of at least this many bytes in two processes, half the files
#: each (where the platform forks and has two cores): one pydantic parse of a file's bytes
#: holds the GIL, and a 10,000-case store of 5 machines is ~50 MB.
PARALLEL_BYTES = 16 * 2**20


@dataclass
class _ShowPart:
    """What ``show`` makes of some of a store's files: the rows, the machines of each
    platform (:class:`_Machine`) and the errors."""

    rows: list[tuple[str, ...]]
    machines: dict[str, dict[str, _Machine]]
    errors: list[str]


def _show_part(paths: Sequence[tuple[str, Path, Path]], patterns: Sequence[str],
               machine: str | None) -> _ShowPart:
    """The rows of these files (:func:`_store_paths`), one file at a time: only the rows
    are kept, not every block; a tree of JSON has no cycles, so the collector is paused
    for the walk (see gc_paused).

    The machines are counted by set: the blocks of a store name a few sets of machines
    (the recorder and those with timing), so each set is worked out once, at its first
    block, which also gives a machine first seen there its host, and then counted."""
    from pytest_accelperf.store.block import TIMING_SECTIONS
    from pytest_accelperf.store.machines import recorder, view

    timing = frozenset(TIMING_SECTIONS)
    compiled = [compile_pattern(p) for p in patterns]
    part = _ShowPart([], {}, [])
    rows = part.rows
    # {platform: {(recorder, its others, top-level timing): [blocks, machines, cell]}}
    sets: dict[str, dict[tuple[str, tuple[str, ...], bool], list[Any]]] = {}
    with gc_paused():
        for platform, module, blocks in _read_files(
                paths, part.errors, fields=SHOWN_MACHINES if machine else SHOWN):
            known = part.machines.setdefault(platform, {})
            counted = sets.setdefault(platform, {})
            for key, block in blocks.items():
                nodeid = f"{module}.py::{key}"
                if compiled and not any(matches(p, nodeid) for p in compiled):
                    continue
                own = recorder(block)
                others = block.get("machines")
                listed = tuple(others) if type(others) is dict else ()
                # machines_of(block), without asking recorder() again
                found = counted.get(which := (own, listed, not timing.isdisjoint(block)))
                if found is None:
                    found = counted[which] = [0, *_new_set(known, block, own, which[2])]
                found[0] += 1
                shown, when = block, block.get("recorded_at", "-")
                if machine is not None:  # that machine's timing, and when it was recorded
                    seen = view(block, machine)
                    shown, when = seen.block, seen.timing_recorded_at or "-"
                rows.append((platform, nodeid, *_shown_cells(shown), found[2], str(when)))
    for platform, counted in sets.items():
        known = part.machines[platform]
        for (own, _, _), (count, names, _) in counted.items():
            for name in names:
                known[name].cases += count
            known[own].recorded += count
    return part


def _new_set(known: dict[str, _Machine], block: Mapping[str, object], own: str,
             has_timing: bool) -> tuple[list[str], str]:
    """``(its machines, their count as shown)`` of the first block of a set of machines
    (:func:`_show_part`); each machine not seen before is added to ``known`` with its
    host, from this block: the recorder's from its environment, another's from its entry
    of ``machines``."""
    others = block.get("machines")
    names = sorted(others) if type(others) is dict else []
    if own not in names and has_timing:
        names = sorted([*names, own])
    for name in names:
        if name not in known:
            env = block.get("environment") if name == own else (
                others.get(name, {}).get("environment") if isinstance(others, Mapping) else None)
            known[name] = _Machine(host=_host(env))
    if own not in known:
        known[own] = _Machine(host=_host(block.get("environment")))
    return names, str(len(names))


def _show_parts(paths: list[tuple[str, Path, Path]], patterns: Sequence[str],
                machine: str | None) -> list[_ShowPart]:
    """:func:`_show_part` of every file: in this process, or, for a store of
    :data:`PARALLEL_BYTES` or more, the files of the first half of the bytes here and the
    rest in a forked process, at once (the parts in the walk's order, so that they merge
    as one walk's)."""
    import multiprocessing
    import os
    import threading

    sizes = [path.stat().st_size for _, _, path in paths]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    # Forked only from a process of one thread (a fork copies no other thread's state).
    if sum(sizes) < PARALLEL_BYTES or cores < 2 or len(paths) < 2 \
            or threading.active_count() > 1 \
            or "fork" not in multiprocessing.get_all_start_methods():
        return [_show_part(paths, patterns, machine)]
    half, total, cut = sum(sizes) / 2, 0, len(paths) - 1
    for i, size in enumerate(sizes[:-1]):
        total += size
        if total >= half:
            cut = i + 1
            break
    # The validator built here, once: the forked process inherits it.
    (SHOWN_MACHINES if machine else SHOWN).build()
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    reader = context.Process(target=_send_part, args=(sender, paths[cut:], patterns, machine),
                             daemon=True)
    reader.start()  # the second half, there
    sender.close()
    try:
        first = _show_part(paths[:cut], patterns, machine)
        second = receiver.recv()
    except EOFError:
        reader.join()
        raise RuntimeError(f"the process that read half of the store exited with status "
                           f"{reader.exitcode} before it sent its rows") from None
    except BaseException:
        reader.terminate()
        raise
    finally:
        reader.join()
        receiver.close()
    if isinstance(second, BaseException):
        raise second
    return [first, second]


def _send_part(sender: Connection, paths: Sequence[tuple[str, Path, Path]],
               patterns: Sequence[str], machine: str | None) -> None:
    """:func:`_show_part` in the forked process of :func:`_show_parts`, sent back whole, or
    the exception it raised (one that cannot be pickled, as a RuntimeError naming it)."""
    try:
        part: _ShowPart | Exception = _show_part(paths, patterns, machine)
    except Exception as exc:
        part = exc
    try:
        sender.send(part)
    except Exception:  # an exception that does not pickle
        sender.send(RuntimeError(repr(part)))
    finally:
        sender.close()


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:

    root = _store_root(args.baselines)
    for pattern in args.patterns:
        compile_pattern(pattern)  # a bad pattern is an error before any file is read
    machine = _machine_option(args.machine)
    parts = _show_parts(_store_paths(root, args.platform), args.patterns, machine)
    errors = [e for part in parts for e in part.errors]
    if errors:
        raise CliError("\n".join(errors))
    rows = [row for part in parts for row in part.rows]
    machines: dict[str, dict[str, _Machine]] = {}
    for part in parts:  # in the order of the walk: a machine's host is the first one seen
        for platform, known in part.machines.items():
            merged = machines.setdefault(platform, {})
            for name, m in known.items():
                into = merged.setdefault(name, _Machine())
                into.cases += m.cases
                into.recorded += m.recorded
                into.host = into.host or m.host
    rows.sort(key=lambda row: (row[0], row[1]))
    if not rows:
        wanted = f" matching {' '.join(args.patterns)}" if args.patterns else ""
        raise CliError(f"no baseline{wanted} in {root}")
    out.write(columns(rows, ("platform", "case", "outcome", "throughput", "step time",
                             "final loss", "peak memory", "machines", "recorded")) + "\n")
    for platform, known in sorted(machines.items()):
        if not known:
            continue
        out.write(f"machines of {platform} (cases with its timing; host CPU):\n")
        for name, m in sorted(known.items()):
            shared = f", recorded the shared sections of {m.recorded}" if m.recorded else ""
            out.write(f"  {name}: {m.cases} case(s){shared}; {m.host}\n")
    whose = f"; the timing shown is machine {machine}'s (- where it has none)" if machine else ""
    out.write(f"{len(rows)} case(s) in {root}{whose}\n")
    return 0


# -- baselines check ---------------------------------------------------------------------------
def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    """Every block of the store validated whole (the store's read, as the gate reads a
    baseline): exit 1 with every file that does not parse and every invalid block, each
    naming its file, line, case and field."""
    root = _store_root(args.baselines)
    files = cases = 0
    errors: list[str] = []
    with gc_paused():
        for _, _, blocks in iter_store(root, args.platform, errors):
            files += 1
            cases += len(blocks)
    if errors:
        raise CliError("\n".join(errors))
    out.write(f"{cases} case(s) in {files} file(s) valid in {root}\n")
    return 0


# -- baselines diff ----------------------------------------------------------------------------
#: What ``diff`` reads of a store's block: the headline, the machine that recorded it (its
#: name, or the environment it is derived from) and every other machine's headline timing.
DIFFED = Fields((*HEADLINE.paths, "machine", "environment.host_cpu", "environment.cpu_isa",
                 "machines.samples_per_second", "machines.step_time.median",
                 "machines.input.median", "machines.compile_time"))
#: The headline numbers that are timing, kept per machine (compared machine by machine).
_TIMING = frozenset({"throughput", "step time", "input time", "compile"})
#: The labels of :func:`_headline`, in its order.
_LABELS = tuple(label for label, _, _ in _headline({}))


def _side(path: Path, platform: str | None
          ) -> tuple[dict[tuple[str, str], Mapping[str, object]], str | None]:
    """The blocks of a store directory or of a JSON report; for a report, the machine
    whose timing it holds (its ``--accelperf-machine``, or the name derived from its host),
    each block named its (``machine``); None for a store."""
    from pytest_accelperf.report.loading import ReportFileError, check_stored_block

    if path.is_dir():
        return store_blocks(path, platform, DIFFED), None
    if not path.exists():
        raise CliError(f"{path}: neither a baseline store directory nor a JSON report")
    report = _load_report(path)
    machine = _machine_of(report, None)
    blocks: dict[tuple[str, str], Mapping[str, object]] = {}
    for i, record in enumerate(report.records):
        if platform is None or record.platform == platform:
            try:
                check_stored_block(path, i, record)
            except ReportFileError as exc:
                raise CliError(str(exc)) from None
            blocks[(record.platform, record.nodeid)] = {**_block_of(record), "machine": machine}
    return blocks, machine


def _compared(old: Mapping[str, object], new: Mapping[str, object], machines: Sequence[str],
              labelled: bool) -> Iterator[tuple[str, float | str | None, float | str | None,
                                                str]]:
    """``(metric, old value, new value, unit)`` of two blocks of a case: the shared
    numbers once, each timing number of each of ``machines`` (its view of each block,
    :func:`pytest_accelperf.store.machines.view`; ``metric [machine]`` where
    ``labelled``)."""
    from pytest_accelperf.store.machines import view

    views = [(m, _headline(view(old, m).block), _headline(view(new, m).block))
             for m in machines]
    for (label, a, unit), (_, b, _) in zip(_headline(old), _headline(new), strict=True):
        if label not in _TIMING:
            yield label, a, b, unit
            continue
        i = _LABELS.index(label)
        for machine, seen_old, seen_new in views:
            yield (f"{label} [{machine}]" if labelled else label, seen_old[i][1],
                   seen_new[i][1], unit)


def diff_rows(old: Mapping[tuple[str, str], Mapping[str, object]],
              new: Mapping[tuple[str, str], Mapping[str, object]], *, show_removed: bool,
              machine: str | None = None, report_machine: str | None = None
              ) -> tuple[list[tuple[str, ...]], int]:
    """Table rows of what differs between two sets of blocks, and how many were equal.

    Timing is compared machine by machine: ``machine``'s alone, else that of the report's
    machine (``report_machine``, where a side is a report), else that of every machine
    either block has timing of; a timing row names its machine (``throughput [ci]``) unless
    one machine, the recorder of both blocks, is compared."""
    from pytest_accelperf.store.machines import machines_of, recorder

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
        a_block, b_block = old[key], new[key]
        only = machine or report_machine
        machines = [only] if only else sorted(set(machines_of(a_block))
                                              | set(machines_of(b_block)))
        machines = machines or [recorder(a_block)]
        labelled = machine is not None or len(machines) > 1 or \
            machines[0] != recorder(a_block) or machines[0] != recorder(b_block)
        changed = False
        for label, a, b, unit in _compared(a_block, b_block, machines, labelled):
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


def _machine_option(machine: str | None) -> str | None:
    """``--machine NAME`` as a name the store keys timing by, or one line naming the fix."""
    from pytest_accelperf.store.machines import validate_machine

    if machine is not None:
        try:
            validate_machine(machine)
        except UserError as exc:
            raise CliError(str(exc).replace("--accelperf-machine", "--machine")) from None
    return machine


def cmd_diff(args: argparse.Namespace, out: TextIO) -> int:

    machine = _machine_option(args.machine)
    old, old_machine = _side(args.old, args.platform)
    new, new_machine = _side(args.new, args.platform)
    old_is_report, new_is_report = old_machine is not None, new_machine is not None
    # A report covers only the cases that ran: the store's others are not "removed".
    rows, same = diff_rows(old, new, show_removed=not (old_is_report or new_is_report),
                           machine=machine, report_machine=old_machine or new_machine)
    if old_is_report and not new_is_report:
        rows = [r for r in rows if r[1] != "(added)"]
    from tabulate import tabulate

    if rows:
        out.write(tabulate(rows, headers=("case", "metric", str(args.old), str(args.new),
                                          "change"), disable_numparse=True) + "\n")
    out.write(f"{len({r[0] for r in rows if r[0]})} case(s) differ, {same} equal\n")
    return 0


# -- baselines rewrite -------------------------------------------------------------------------
def cmd_rewrite(args: argparse.Namespace, out: TextIO) -> int:
    """Every file of the store written in this version's format (a file of an earlier
    schema, :data:`~pytest_accelperf.store.baselines.READABLE_VERSIONS`), its blocks
    unchanged (:meth:`~pytest_accelperf.store.baselines.BaselineStore.rewrite`)."""
    from pytest_accelperf.store.baselines import SCHEMA_VERSION

    root = _store_root(args.baselines)
    total = 0
    changed: list[Path] = []
    errors: list[str] = []
    for platform in _platforms(root, args.platform):
        paths = sorted(p for p in (root / platform).rglob("*.json") if p.is_file())
        total += len(paths)
        try:
            changed += BaselineStore(root, platform).rewrite(paths, dry_run=args.dry_run)
        except BaselineError as exc:
            changed += exc.written
            errors.append(str(exc))
    for path in changed:
        out.write(f"{'would rewrite' if args.dry_run else 'rewrote'} {path}\n")
    verb = "would be rewritten" if args.dry_run else "rewritten"
    out.write(f"{len(changed)} of {total} file(s) {verb} in the format of schema "
              f"{SCHEMA_VERSION} in {root}; their blocks unchanged\n")
    if errors:
        raise CliError("\n".join(errors))
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
    (:func:`pytest_accelperf.checks.recordable.unrecordable`: no failed outcome, reference check or
    non-finite loss) and as the store checks what it writes: a platform that is one safe
    path component, a node id under the rootdir, a block the schema accepts. A
    BaselineError or CliError says what is wrong.

    The report is an input anyone can hand over (a CI artifact): its node id and platform
    are checked before anything reads the case, then its block by the schema, and only
    then what :func:`unrecordable` reads."""
    # Where it would be written, first: an absolute or climbing node id or platform is
    # refused here, naming the field, before any other part of the case is read.
    from pytest_accelperf.checks.recordable import (
        clearable,
        not_cleared_by_a_baseline,
        unrecordable,
    )
    from pytest_accelperf.records.run import Run

    BaselineStore(root, record.platform).path_for(record.nodeid)
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
    from pytest_accelperf.checks.recordable import not_cleared_by_a_baseline, shared_unchanged
    from pytest_accelperf.report.loading import case_line

    report = _load_report(args.report)
    records = report.records
    machine = _machine_of(report, args.machine)
    if not args.case and not args.all:
        raise CliError("choose the cases to accept: --case PATTERN (repeatable; * and ? are "
                       "wildcards) or --all")
    chosen = records if args.all else select(records, args.case, args.report)
    root = _store_root(args.baselines)
    index = {id(r): i for i, r in enumerate(records)}
    by_platform: dict[str, dict[str, Mapping[str, object]]] = {}
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
        if args.machine or not block.get("machine"):  # a block of an update names its own
            block = {**block, "machine": machine}
        by_platform.setdefault(record.platform, {})[record.nodeid] = block
    if errors:
        raise CliError("\n".join(errors) + f"\nnothing was written to {root}")
    for record in chosen:
        stored = by_platform[record.platform][record.nodeid]
        verdicts = ", ".join(f"{c.metric} {c.verdict.value}" for c in record.checks
                             if c.verdict.value != "pass") or "all pass"
        throughput = _fmt(_num(stored.get("samples_per_second")), "samples/s")
        scope = (" (its timing only, where another machine recorded the block)"
                 if shared_unchanged(record.checks) else "")
        out.write(f"accept {record.nodeid} [{record.platform}]: {verdicts}; stores throughput "
                  f"{throughput}, outcome {stored.get('outcome')}, as machine "
                  f"{stored.get('machine')}"
                  f"{scope}\n")
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
            paths = BaselineStore(root, platform).write(
                blocks, timing_only={r.nodeid for r in chosen if shared_unchanged(r.checks)})
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
    pytest's rootdir, which they are relative to (:mod:`pytest_accelperf.collect.nodeids`)."""
    from pytest_accelperf.collect.nodeids import OUTPUT_ENV

    with tempfile.TemporaryDirectory(prefix="accelperf-prune-") as tmp:
        listing = Path(tmp) / "nodeids.json"
        cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
               "-p", "pytest_accelperf.collect.nodeids", *pytest_args]
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
        text = sys.stdin.read() if str(args.nodeids) == "-" else read_file(args.nodeids)
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
