"""Ingest measurements taken outside the plugin into runs that the checks treat like any other.

Parsers (each ``(text, source) -> list[Run]``, raising :class:`IngestError` naming
``file:line`` on anything it cannot read with certainty):

``neuron``
    Neuron profiler summaries with optional Hugging Face Trainer metrics, one run per
    ``# heading`` section (:mod:`.neuron`, seed 001);
``hf-trainer``
    Hugging Face ``Trainer`` train metrics blocks (:mod:`.hf`);
``cerebras``
    Cerebras run logs, one run per ``Effective batch size is N.`` (:mod:`.cerebras`, seed 003).

In a suite, ``accelperf.ingest(path_or_command, parser=...)`` parses (or runs and parses)
and checks the run against the baseline as ``accelperf.train`` does::

    @cases(Case(backend="external", batch=1024, label="bert-large"))
    def test_cerebras(accelperf):
        accelperf.ingest(LOG, parser="cerebras", section="Batch size 1024")
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_accelperf.ingest import cerebras, hf, neuron
from pytest_accelperf.ingest.base import IngestError
from pytest_accelperf.ingest.cerebras import parse_cerebras_log
from pytest_accelperf.ingest.hf import parse_hf_trainer
from pytest_accelperf.ingest.neuron import parse_neuron_report
from pytest_accelperf.records.run import Run

Parser = Callable[[str, str], list[Run]]

PARSERS: dict[str, Parser] = {
    "neuron": parse_neuron_report,
    "hf-trainer": parse_hf_trainer,
    "cerebras": parse_cerebras_log,
}
#: What each parser reads: said when a file is not that at all (empty, not text).
EXPECTS: dict[str, str] = {
    "neuron": neuron.EXPECTS,
    "hf-trainer": hf.EXPECTS,
    "cerebras": cerebras.EXPECTS,
}

__all__ = [
    "EXPECTS",
    "PARSERS",
    "IngestError",
    "Parser",
    "decode",
    "parse_cerebras_log",
    "parse_file",
    "parse_hf_trainer",
    "parse_neuron_report",
    "run_command",
    "select_run",
]


def get_parser(parser: str | Parser) -> tuple[str, Parser]:
    """``(name, function)`` of a registered parser name, or of a parser function; an
    unknown name is an :class:`IngestError` naming the parsers there are."""
    if callable(parser):
        return getattr(parser, "__name__", "custom"), parser
    try:
        return parser, PARSERS[parser]
    except (KeyError, TypeError):  # TypeError: an unhashable value given as the name
        raise IngestError(f"parser={parser!r}", 0,
                          f"no such parser; the parsers are {', '.join(sorted(PARSERS))} "
                          f"(or pass a function (text, source) -> list[Run])") from None


def parse_file(path: str | os.PathLike[str], parser: str | Parser) -> list[Run]:
    """The runs in the file at ``path``; errors name the file and line. A file that is
    empty, not text (a NUL byte, bytes that are not UTF-8) or UTF-16 is an
    :class:`IngestError` naming the file, the parser and what it reads."""
    name, parse = get_parser(parser)
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise IngestError(str(p), 0, f"cannot read: {exc.strerror or exc}") from None
    return parse(decode(data, str(p), name), str(p))


def decode(data: bytes, source: str, parser: str) -> str:
    """``data`` as text (UTF-8, a byte-order mark dropped), or an :class:`IngestError` that
    says what the file is instead and what the parser reads."""
    expects = EXPECTS.get(parser, "text")
    wants = f"the {parser} parser expects {expects}"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # what PowerShell's '>' writes
        raise IngestError(source, 0, f"UTF-16 text (its byte-order mark); {wants}: save it as "
                                     f"UTF-8 (iconv -f UTF-16 -t UTF-8)")
    if not data.strip():
        what = "empty" if not data else f"only whitespace ({len(data)} bytes)"
        raise IngestError(source, 0, f"the file is {what}; {wants}")
    # A NUL byte is valid UTF-8 but in no tool's log: a binary file (a profile's .ntff).
    # Whichever of it and a byte that is not UTF-8 comes first is the one named.
    nul = data.find(b"\0")
    try:
        text = data.decode("utf-8-sig")
        why = ""
    except UnicodeDecodeError as exc:
        at = exc.start
        if exc.reason == "unexpected end of data":
            why = f"it ends inside a UTF-8 character at offset {at}: truncated?"
        else:
            why = f"byte 0x{data[at]:02x} at offset {at} is not UTF-8"
        if 0 <= nul < at:
            why = ""
    if nul >= 0 and not why:
        why = f"a NUL byte at offset {nul}"
    if why:
        raise IngestError(source, 0, f"not a text file ({why}); {wants}")
    return text


def select_run(runs: list[Run], section: str | None, source: str) -> Run:
    """The run whose ``details["section"]`` (or ``case_id``) is ``section``; the only run
    when ``section`` is None."""
    labels = [str(r.details.get("section", r.case_id)) for r in runs]
    if section is None:
        if len(runs) == 1:
            return runs[0]
        raise IngestError(source, 0, f"{len(runs)} runs in this log; pick one with "
                                     f"section=: {', '.join(repr(x) for x in labels)}")
    for run, label in zip(runs, labels, strict=True):
        if section in (label, run.case_id):
            return run
    raise IngestError(source, 0, f"no run {section!r}; have {', '.join(repr(x) for x in labels)}")


def run_command(command: Sequence[str], log: str | os.PathLike[str] | None,
                workdir: Path, timeout: float | None) -> tuple[Path, int, str]:
    """Run ``command``; return the log to parse (``log``, or its captured stdout+stderr
    written to ``workdir``), its exit status and the last lines of its output."""
    workdir.mkdir(parents=True, exist_ok=True)
    captured = workdir / "output.log"
    with captured.open("w", encoding="utf-8") as out:
        try:
            proc = subprocess.run(list(command), stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout or None, check=False, cwd=workdir)
            status = proc.returncode
        except subprocess.TimeoutExpired:
            status = -1
    tail = "\n".join(captured.read_text(encoding="utf-8", errors="replace")
                     .splitlines()[-20:])
    return (Path(log) if log is not None else captured), status, tail
