"""Issue 30, part 6: every reader and every field, fed what a user might hand over.

The rule, for each: a clean result or one :class:`~pytest_accelperf.errors.UserError`
(``pytest.UsageError`` for options, which pytest prints as one line), never another
exception; and what was read is left as it was. Inputs: random bytes, a real file cut at
every kind of place, a real file with one byte changed; random values for every option
and every ``Case`` and step field.

Hypothesis runs derandomized with a fixed budget of examples (no database), so CI sees the
same inputs every run and stays within its time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Suite
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import UserError
from pytest_accelperf.gate.options import OPTIONS, Settings
from pytest_accelperf.ingest import PARSERS, parse_file
from pytest_accelperf.report.history import read_history
from pytest_accelperf.report.loading import load_report
from pytest_accelperf.store.baselines import BaselineStore

REPO = Path(__file__).resolve().parents[2]
BUDGET = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))


def damaged(sample: bytes) -> st.SearchStrategy[bytes]:
    """Random bytes; ``sample`` cut anywhere; ``sample`` with one byte replaced."""
    n = len(sample)
    return st.one_of(
        st.binary(max_size=400),
        st.integers(0, n).map(lambda k: sample[:k]),
        st.tuples(st.integers(0, max(n - 1, 0)), st.integers(0, 255)).map(
            lambda p: sample[:p[0]] + bytes([p[1]]) + sample[p[0] + 1:]),
    )


def clean_or_user_error(read: Callable[[], Any]) -> None:
    with contextlib.suppress(UserError):
        read()


def test_the_baseline_store_reads_damaged_files_as_one_error_and_leaves_them(
        tmp_path: Path) -> None:
    sample = (REPO / "baselines/cpu-x8/suites/torch/test_torch_gpt.json").read_bytes()
    nodeid = "suites/torch/test_torch_gpt.py::test_torch_gpt[torch-nomesh-b8]"
    path = tmp_path / "cpu-x8/suites/torch/test_torch_gpt.json"
    path.parent.mkdir(parents=True)

    # reading never rewrites the store: fuzz_reader checks the file after each read
    fuzz_reader(path, sample, lambda: BaselineStore(tmp_path, "cpu-x8").get(nodeid))


def test_a_damaged_json_report_and_history_are_one_error_each(suite: Suite) -> None:
    suite.write('''
        from tinytask import make_task
        from pytest_accelperf import cases

        @cases(backend="jax", batch=[16], steps=3, warmup=1)
        def test_small(accelperf):
            accelperf.train(make_task(accelperf.case))
    ''')
    suite.run("--accelperf-update", "--accelperf-json=report.json",
              "--accelperf-history=history").assert_outcomes(passed=1)
    root = suite.pytester.path
    report, history = root / "report.json", root / "history/cpu-x8.jsonl"
    samples = {report: report.read_bytes(), history: history.read_bytes()}
    readers: dict[Path, Callable[[], Any]] = {
        report: lambda: load_report(report),
        history: lambda: read_history(history.parent, "cpu-x8"),
    }
    for path, sample in samples.items():
        fuzz_reader(path, sample, readers[path])


def fuzz_reader(path: Path, sample: bytes, reader: Callable[[], Any]) -> None:
    """Write damaged copies of ``sample`` to ``path``; ``reader`` reads each cleanly or
    raises one user error, and leaves the file as it was."""
    @BUDGET
    @given(damaged(sample))
    def read(data: bytes) -> None:
        path.write_bytes(data)
        clean_or_user_error(reader)
        assert path.read_bytes() == data

    read()


SAMPLES = {
    "neuron": REPO / "suites/neuron/data/001_trainium_neuron_profile.md",
    "cerebras": REPO / "suites/cerebras/data/003_cerebras_bert_large.log",
}


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_each_ingest_parser_reads_damaged_logs_as_one_error(parser: str,
                                                             tmp_path: Path) -> None:
    sample_path = SAMPLES.get(parser)
    sample = sample_path.read_bytes() if sample_path else b'{"loss": 1.0, "step": 1}\n'
    path = tmp_path / "log.txt"

    fuzz_reader(path, sample, lambda: parse_file(path, parser))


ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
    st.text(max_size=20), st.lists(st.integers(-3, 9), max_size=4),
    st.tuples(st.integers(-3, 9), st.integers(-3, 9)),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@pytest.mark.parametrize("option", [o.key for o in OPTIONS])
def test_every_option_takes_any_value_as_a_setting_or_one_usage_error(
        option: str, tmp_path: Path) -> None:
    @BUDGET
    @given(ANY_VALUE)
    def resolve(value: Any) -> None:
        with contextlib.suppress(pytest.UsageError, UserError):
            Settings.resolve(lambda name: None, lambda name: None, tmp_path,
                             table={option: value}, invocation_dir=tmp_path)

    resolve()


CASE_FIELDS = [name for name in Case.__dataclass_fields__ if name not in ("backend", "batch")]


@pytest.mark.parametrize("field", ["batch", *CASE_FIELDS])
def test_every_case_field_takes_any_value_as_a_case_or_one_user_error(field: str) -> None:
    @BUDGET
    @given(ANY_VALUE)
    def make(value: Any) -> None:
        kwargs: dict[str, Any] = {"backend": "jax", "batch": 8, field: value}
        try:
            case = Case(**kwargs)
        except UserError:
            return
        json.dumps(case.to_json())  # a case that was made is stored as JSON
        assert case.id

    make()


def test_every_step_field_takes_any_value_as_a_step_or_one_user_error() -> None:
    from pytest_accelperf.jax import JaxStep

    fine = {"init": lambda key: {"w": 0.0}, "step": lambda s, b: (s, {}),
            "make_batch": lambda i: {"x": i}}
    steps: list[tuple[type, dict[str, Any]]] = [(JaxStep, fine)]
    try:
        import torch

        from pytest_accelperf.torch import TorchStep
        steps.append((TorchStep, {"step": lambda batch: torch.zeros(()),
                                  "make_batch": lambda i: torch.zeros(2),
                                  "model": torch.nn.Linear(2, 1)}))
    except ImportError:  # torch is optional
        pass
    for kind, base in steps:
        for name in base:
            fuzz_field(lambda value, kind=kind, base=base, name=name:
                       kind(**{**base, name: value}))


def fuzz_field(make: Callable[[Any], Any]) -> None:
    """``make(value)`` for any value: a result, or one user error."""
    @BUDGET
    @given(ANY_VALUE)
    def run(value: Any) -> None:
        clean_or_user_error(lambda: make(value))

    run()


# -- issue 36: a JSON report is an input anyone can hand over ------------------------------------

#: Values every field of a case is mutated to: wrong types, paths that climb or are absolute
#: (a node id, a platform), numbers that are no measurement.
MUTATED: tuple[Any, ...] = (None, True, -1, 1e308, "", "/abs/x.py::t", "../../up.py::t",
                            "/tmp/evil", [], {}, [1, "a"], {"a": {"b": None}})


def _fields(record: dict[str, Any]) -> list[tuple[str, ...]]:
    """Every field of a case record, and every field one level inside those that are
    objects (the run, the block, the case, the baseline), as key paths."""
    out: list[tuple[str, ...]] = []
    for key, value in record.items():
        out.append((key,))
        if isinstance(value, dict):
            out.extend((key, inner) for inner in value)
    return out


def _mutated(report: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(report))
    where = out["cases"][0]
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    return out


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time: a file written, even
    with the bytes it had, shows as changed (reading every file's bytes twice a command
    was a sixth of this test's time)."""
    out: dict[str, tuple[int, int]] = {}
    for p in root.rglob("*"):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.slow
@pytest.mark.usefixtures("host_lock_of_its_own")  # its two sessions' times are not judged
def test_every_field_of_a_reported_case_mutated_is_accepted_or_one_line_each(
        suite: Suite, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_accelperf import cli
    from pytest_accelperf.cli import main

    # One parser for the test's 3,600 commands: main() builds argparse's tree of every
    # command on each call (33 ms), which was 37 % of this test's CPU time; the parser is
    # the same each time, and what is fuzzed is what the commands make of the file.
    monkeypatch.setattr(cli, "build_parser", functools.cache(cli.build_parser))
    suite.write('''
        from tinytask import make_task
        from pytest_accelperf import cases

        @cases(backend="jax", batch=[16], steps=3, warmup=1)
        def test_small(accelperf):
            accelperf.train(make_task(accelperf.case))
    ''')
    root = suite.pytester.path
    # A recording's report (its cases carry the block stored, with the compact
    # fingerprint) and a check's (the block is made again from the run).
    suite.run("--accelperf-update", "--accelperf-json=update.json").assert_outcomes(passed=1)
    suite.run("--accelperf-json=check.json").assert_outcomes(passed=1)
    store = root / "store"
    # What is fuzzed is what the commands make of the file, not the disk's durability: an
    # accepted block's atomic write syncs the file and its directory, two fsyncs on this
    # ext4 disk that were 20 s of the test's wall time (1,570 writes, load 6).
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    calls = 0
    for name in ("update.json", "check.json"):
        report = json.loads((root / name).read_text())
        for path in _fields(report["cases"][0]):
            for value in MUTATED:
                edited = root / "edited.json"
                edited.write_text(json.dumps(_mutated(report, path, value)))
                # its time set long past: written again by a command, even within the
                # disk's clock tick of this write, it shows as changed
                os.utime(edited, ns=(0, 0))
                for argv in (["baselines", "accept", "--all", "--baselines", str(store),
                              str(edited)],
                             ["report", str(edited)]):
                    store.mkdir(exist_ok=True)
                    before = _tree(root)
                    status = main(argv)
                    calls += 1
                    out, err = capsys.readouterr()
                    what = f"{name}: {'.'.join(path)} = {value!r}: accelperf {argv[0]}"
                    assert status in (0, 1), what
                    assert "Traceback" not in out + err, what
                    after = _tree(root)
                    if status == 1:  # an error: one line per case, nothing written
                        assert err.startswith("accelperf: error: "), (what, err)
                        assert after == before, what
                        lines = err.strip().splitlines()
                        assert all(line.startswith((f"accelperf: error: {edited}",
                                                    str(edited), "nothing was written"))
                                   for line in lines) or len(lines) == 1, (what, err)
                    else:  # accepted: written under the store only
                        changed = {k for k in set(after) | set(before)
                                   if after.get(k) != before.get(k)}
                        assert all(k.startswith("store/") for k in changed), (what, changed)
                    if any(store.iterdir()):  # an empty store is as it was made
                        shutil.rmtree(store)
    assert calls > 300


INDEX_CONFIGS = {
    "pip.conf": b"[global]\nindex-url = https://mirror.example/simple/\n"
                b"extra-index-url = file:///opt/pypi/simple\n  file:///opt/more/simple\n"
                b"find-links = /opt/wheels\n[install]\nno-index = false\n",
    "uv.toml": b'index-url = "https://mirror.example/simple"\n'
               b'extra-index-url = ["file:///opt/pypi/simple"]\nfind-links = ["/opt/wheels"]\n'
               b'[[index]]\nname = "corp"\nurl = "https://corp.example/simple"\n'
               b'explicit = true\n',
    "pyproject.toml": b'[project]\nname = "x"\n[[tool.uv.index]]\nname = "m"\n'
                      b'url = "https://mirror.example/simple"\ndefault = true\n',
}


@pytest.mark.parametrize("name", sorted(INDEX_CONFIGS))
def test_index_configuration_reads_damaged_files_as_one_error(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip's and uv's configuration, as ``accelperf bisect --package`` reads it: indexes or
    one line naming the file (an EnvError), never another exception."""
    from pytest_accelperf.envs.indexes import configured_indexes

    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX",
                "UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_INDEX", "UV_EXTRA_INDEX_URL",
                "UV_FIND_LINKS", "UV_NO_INDEX", "UV_NO_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / name
    monkeypatch.setenv("PIP_CONFIG_FILE", str(path) if name == "pip.conf" else "/dev/null")
    monkeypatch.setenv("UV_CONFIG_FILE", str(path) if name == "uv.toml" else
                       str(tmp_path / "none.toml"))
    fuzz_reader(path, INDEX_CONFIGS[name], lambda: configured_indexes(cwd=tmp_path))


DEPENDENCY_FILES = {
    "requirements.txt": b"jax==0.8.3 \\\n    --hash=sha256:00\nnumpy>=1.26  # floor\n-r more.txt\n",
    "pyproject.toml": b'[project]\nname = "x"\ndependencies = ["jax==0.8.3"]\n'
                      b'[project.optional-dependencies]\ngpu = ["jax[cuda]"]\n'
                      b'[dependency-groups]\ndev = ["pytest", {include-group = "gpu"}]\n',
    "uv.lock": b'version = 1\n[[package]]\nname = "jax"\nversion = "0.8.3"\n',
    "Pipfile.lock": b'{"default": {"jax": {"version": "==0.8.3"}}}\n',
}


@pytest.mark.parametrize("name", sorted(DEPENDENCY_FILES))
def test_a_base_dependency_file_damaged_is_read_or_named(name: str) -> None:
    """A base revision's dependency file, damaged: its requirements, each part that cannot
    be read named with its line (envs.depfiles), never an exception."""
    from pytest_accelperf.envs.depfiles import dependency_change

    @BUDGET
    @given(damaged(DEPENDENCY_FILES[name]))
    def read(data: bytes) -> None:
        change = dependency_change({name: data}, {name: b"jax\n"}, lambda n: None)
        assert all(part.startswith(name) and "\n" not in part for part in change.unreadable)

    read()
