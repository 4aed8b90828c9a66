"""Where a report is written: regular files atomically, anything else in place, never replaced.

The writer itself first (:mod:`pytest_accelperf.report.writing`), on paths of every kind
made under ``tmp_path``: a private device node (``/dev/full``'s numbers, made with
``mknod`` where the tests run as root), FIFOs, a Unix socket, symlinks, and descriptors
named ``/dev/fd/N`` (which the writer duplicates; nothing is written to the machine's own
``/dev``). Then real sessions, with a suite's own numpy backend (milliseconds a case):
each output that cannot be written fails the session with one line naming the option, the
path and the OS error, and ``--accelperf-json=/dev/stdout`` keeps pytest's output, both
redirected to a file and piped.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NUMPY_SGD

from pytest_accelperf.cli import main
from pytest_accelperf.gate.outputs import write_outputs
from pytest_accelperf.report.writing import (
    OutputError,
    append_output,
    readable_back,
    stream_fd,
    write_output,
)
from unit.report.test_reports import _settings, synthetic_report

FULL = os.makedev(1, 7)  # /dev/full: every write fails with ENOSPC


def _full_node(path: Path) -> Path:
    """A character device node with /dev/full's numbers at ``path`` (root only; skipped
    where the filesystem does not allow device nodes)."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, FULL)
        os.close(os.open(path, os.O_WRONLY))
    except PermissionError as exc:  # a container without CAP_MKNOD, or a nodev mount
        pytest.skip(f"no device node here: {exc}")
    return path


def _is_char_device(path: Path) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == FULL


class _FifoReader:
    """A reader of the FIFO ``path`` in a thread: ``text()`` is all it read until the
    writer closed. The FIFO is held open for reading (non-blocking) from the start, so a
    writer never finds it without a reader, whenever the thread gets to its own open."""

    def __init__(self, path: Path) -> None:
        self._hold = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._data = b""
        self._thread = threading.Thread(target=self._read, args=(path,), daemon=True)
        self._thread.start()

    def _read(self, path: Path) -> None:
        with open(path, "rb") as fh:  # blocks until a writer opens
            self._data = fh.read()

    def text(self, timeout: float = 30) -> str:
        self._thread.join(timeout)
        os.close(self._hold)
        assert not self._thread.is_alive(), "the FIFO was never written and closed"
        return self._data.decode()


# -- the writer --------------------------------------------------------------------------------
def test_a_new_path_is_created_with_its_directories_and_the_umask_s_mode(
        tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "r.json"
    write_output(path, "{}\n", option="--accelperf-json")
    umask = os.umask(0)
    os.umask(umask)
    assert path.read_text() == "{}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_an_existing_file_is_replaced_atomically_and_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "r.md"
    path.write_text("old\n")
    path.chmod(0o600)  # the user's choice: a private report
    inode = path.stat().st_ino
    write_output(path, "new\n", option="--accelperf-markdown")
    assert path.read_text() == "new\n"
    assert path.stat().st_ino != inode  # renamed over, not rewritten in place
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.md"]  # no temporary left


def test_a_symlink_stays_a_link_and_its_target_is_written(tmp_path: Path) -> None:
    target = tmp_path / "real" / "r.json"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "r.json"
    link.symlink_to(target)
    write_output(link, "new\n", option="--accelperf-json")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"
    dangling = tmp_path / "d.json"
    dangling.symlink_to(tmp_path / "made" / "d.json")
    write_output(dangling, "made\n", option="--accelperf-json")
    assert dangling.is_symlink() and (tmp_path / "made" / "d.json").read_text() == "made\n"


def test_descriptor_names_are_found_by_name_and_through_links(tmp_path: Path) -> None:
    assert stream_fd("-") == 1
    assert stream_fd("/dev/stdout") == 1
    assert stream_fd("/dev/stderr") == 2
    assert stream_fd("/dev/fd/7") == 7
    assert stream_fd("/proc/self/fd/5") == 5
    assert stream_fd(f"/proc/{os.getpid()}/fd/3") == 3
    hop = tmp_path / "hop"
    hop.symlink_to("/dev/fd/9")
    link = tmp_path / "out.json"
    link.symlink_to(hop)
    assert stream_fd(link) == 9
    assert stream_fd(tmp_path / "plain.json") is None
    assert stream_fd(f"/proc/{os.getpid() + 1}/fd/3") is None  # another process's


@pytest.mark.parametrize("spelling", ["/dev/fd/{fd}", "/proc/self/fd/{fd}", "link"])
def test_an_open_descriptor_is_written_at_its_offset_and_not_replaced(
        tmp_path: Path, spelling: str) -> None:
    """What ``pytest ... --accelperf-json=/dev/stdout > log`` needs: the report goes after
    what the descriptor already wrote, the file is the same file, and it stays open."""
    path = tmp_path / "log"
    with path.open("w") as log:
        log.write("before\n")
        log.flush()
        inode = path.stat().st_ino
        name = spelling.format(fd=log.fileno())
        if spelling == "link":
            (tmp_path / "r.json").symlink_to(f"/dev/fd/{log.fileno()}")
            name = str(tmp_path / "r.json")
        write_output(Path(name), "report\n", option="--accelperf-json")
        log.write("after\n")
    assert path.read_text() == "before\nreport\nafter\n"
    assert path.stat().st_ino == inode


def test_a_descriptor_that_is_not_open_is_an_error() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)  # a number certainly free
    with pytest.raises(OutputError) as exc:
        write_output(Path(f"/dev/fd/{fd}"), "x", option="--accelperf-json")
    assert str(exc.value) == f"cannot write /dev/fd/{fd}: [Errno 9] Bad file descriptor"


def test_a_device_is_written_in_place_and_its_error_reported(tmp_path: Path) -> None:
    node = _full_node(tmp_path / "full")
    with pytest.raises(OutputError) as exc:
        write_output(node, "{}\n", option="--accelperf-json")
    assert exc.value.where == "--accelperf-json"
    assert str(exc.value) == f"cannot write {node}: [Errno 28] No space left on device"
    assert _is_char_device(node)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]
    with pytest.raises(OutputError, match=r"\[Errno 28\]"):
        append_output(node, "line\n", option="--accelperf-history")
    assert _is_char_device(node)


def test_a_fifo_is_written_to_its_reader_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    reader = _FifoReader(fifo)
    text = "x" * 200_000 + "\n"  # more than a pipe holds: the write must wait, not fail
    write_output(fifo, text, option="--accelperf-json")
    assert reader.text() == text
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_without_a_reader_is_an_error_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(OutputError) as exc:
        write_output(fifo, "{}\n", option="--accelperf-json")
    assert time.monotonic() - start < 5
    assert str(exc.value).startswith(f"cannot write {fifo}: [Errno {errno.ENXIO}] ")
    assert "a FIFO that nothing reads" in str(exc.value)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_unix_socket_is_sent_the_report(tmp_path: Path) -> None:
    path = tmp_path / "s"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(65536):
                got.append(chunk)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    write_output(path, "{}\n", option="--accelperf-json")
    thread.join(10)
    server.close()
    assert b"".join(got) == b"{}\n"
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_append_appends_to_a_file_and_creates_a_new_one(tmp_path: Path) -> None:
    path = tmp_path / "h" / "cpu-x8.jsonl"
    append_output(path, "1\n", option="--accelperf-history")
    append_output(path, "2\n", option="--accelperf-history")
    assert path.read_text() == "1\n2\n"


@pytest.mark.parametrize("kind", ["under a file", "a directory"])
def test_a_path_that_cannot_be_a_file_is_an_error(tmp_path: Path, kind: str) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir()
    path, code = ((tmp_path / "file" / "r.json", errno.ENOTDIR) if kind == "under a file"
                  else (tmp_path / "dir", errno.EISDIR))
    for write in (write_output, append_output):
        with pytest.raises(OutputError) as exc:
            write(path, "{}\n", option="--accelperf-json")
        assert str(exc.value) == f"cannot write {path}: [Errno {code}] {os.strerror(code)}"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes where the mode says it cannot")
def test_an_unwritable_directory_is_an_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(OutputError, match=r"\[Errno 13\] Permission denied"):
            write_output(locked / "r.json", "{}\n", option="--accelperf-json")
    finally:
        locked.chmod(0o700)


def test_the_step_summary_error_names_the_variable_and_the_markdown_is_still_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "file" / "summary.md"))
    report = synthetic_report()
    lines = write_outputs(report, _settings(tmp_path, markdown=tmp_path / "pr.md"), tmp_path)
    assert lines == ["accelperf: Markdown summary written to pr.md"]
    assert report.errors == [f"$GITHUB_STEP_SUMMARY: cannot write {tmp_path}/file/summary.md: "
                             f"[Errno 20] Not a directory"]


def test_the_history_error_names_the_option_path_and_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    report = synthetic_report()
    write_outputs(report, _settings(tmp_path, history=tmp_path / "file" / "h"), tmp_path)
    assert report.errors == [f"--accelperf-history: cannot write {tmp_path}/file/h: "
                             f"[Errno 20] Not a directory"]


# -- the CLI -----------------------------------------------------------------------------------
def test_accelperf_report_writes_through_the_same_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    Path("r.json").write_text(json.dumps(synthetic_report().to_json(1), default=str))
    with open("log", "w") as log:
        log.write("before\n")
        log.flush()
        status = main(["report", "r.json", "--markdown", f"/dev/fd/{log.fileno()}"])
    assert status == 0
    text = Path("log").read_text()
    assert text.startswith("before\n## accelperf\n")  # kept, then the summary after it
    (tmp_path / "file").write_text("")
    status = main(["report", "r.json", "--markdown", "file/pr.md"])
    assert status == 1
    assert capsys.readouterr().err == (
        "accelperf: error: --markdown: cannot write file/pr.md: [Errno 20] Not a directory\n")


# -- sessions ----------------------------------------------------------------------------------
CONFTEST = NUMPY_SGD + '''

from pytest_accelperf.backends import BackendSpec


def pytest_accelperf_backends(config):
    return [BackendSpec("numpy-sgd", backend=NumpySGD(), requires=("numpy",))]
'''

SUITE = '''
from pytest_accelperf import Case, cases

@cases(Case(backend="numpy-sgd", batch=8, steps=5, warmup=1))
def test_fit(accelperf):
    accelperf.train({"dim": 8, "out": 4, "lr": 0.05})
'''


@pytest.fixture
def project(pytester: pytest.Pytester, host_lock_of_its_own: Path) -> Iterator[pytest.Pytester]:
    # Nor is a measurement compared with another's: the sessions take a host lock of their
    # own (conftest.host_lock_of_its_own); waiting for the one the other xdist worker's
    # trainings hold was most of these tests' time (two of them 21 and 26 s of wall, 1 s
    # of CPU, in a quick loop at load 9; "62 s under -n 2" for one below).
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_fit=SUITE)
    # Only the writing is tested here: no timing verdict may fail a session.
    pytester.makepyprojecttoml("[tool.accelperf]\nthroughput_tolerance = 1000.0\n"
                               "max_probe_spread = 1000.0\nmax_step_spread = 1000.0\n"
                               "max_foreign_load = 64.0\n")
    yield pytester


#: A case without a baseline fails; recording it passes, so the exit status is the outputs'.
ARGS = ("-p", "no:cacheprovider", "--accelperf-update")


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*ARGS, *args)


def _json_in(lines: list[str]) -> dict[str, object]:
    """The JSON report printed among pytest's lines (indented: from ``{`` to ``}``)."""
    # Once in a full run at load 5 no line was "{" alone: shown whole if it happens again.
    assert "{" in lines, "\n".join(lines)
    start = lines.index("{")
    end = lines.index("}", start)
    data: dict[str, object] = json.loads("\n".join(lines[start:end + 1]))
    return data


def test_a_session_whose_outputs_are_full_devices_fails_naming_each_and_keeps_the_nodes(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = project.path / "nodes"
    nodes.mkdir()
    json_node, md_node, summary_node = (_full_node(nodes / n) for n in ("j", "m", "s"))
    (project.path / "history").mkdir()
    history_node = _full_node(project.path / "history" / "cpu-x8.jsonl")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary_node))
    result = _run(project, f"--accelperf-json={json_node}", f"--accelperf-markdown={md_node}",
                  "--accelperf-history=history")
    assert result.ret == 1
    enospc = "[Errno 28] No space left on device"
    errors = [line for line in result.outlines if line.startswith("accelperf: ERROR: ")]
    assert sorted(errors) == sorted([
        f"accelperf: ERROR: --accelperf-json: cannot write {json_node}: {enospc}",
        f"accelperf: ERROR: --accelperf-markdown: cannot write {md_node}: {enospc}",
        f"accelperf: ERROR: $GITHUB_STEP_SUMMARY: cannot write {summary_node}: {enospc}",
        f"accelperf: ERROR: --accelperf-history: cannot write {history_node}: {enospc}",
    ])
    for claim in ("JSON report written", "Markdown summary", "history appended"):
        result.stdout.no_fnmatch_line(f"*{claim}*")
    for node in (json_node, md_node, summary_node, history_node):
        assert _is_char_device(node)
    assert sorted(p.name for p in nodes.iterdir()) == ["j", "m", "s"]


def test_a_session_writes_its_json_to_a_fifo_s_reader(project: pytest.Pytester) -> None:
    fifo = project.path / "r.json"
    os.mkfifo(fifo)
    reader = _FifoReader(fifo)
    result = _run(project, "--accelperf-json=r.json")
    assert result.ret == 0
    assert json.loads(reader.text())["exit_status"] == 0
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_session_fails_on_a_fifo_nobody_reads(project: pytest.Pytester) -> None:
    os.mkfifo(project.path / "r.json")
    result = _run(project, "--accelperf-json=r.json")
    assert result.ret == 1
    assert (f"accelperf: ERROR: --accelperf-json: cannot write {project.path}/r.json: "
            f"[Errno 6] No such device or address (a FIFO that nothing reads: start its "
            f"reader first)") in result.outlines
    assert stat.S_ISFIFO(os.lstat(project.path / "r.json").st_mode)


@pytest.mark.slow  # 18 s under -n 2 (2026-11-29)
def test_a_session_writes_through_a_symlink(project: pytest.Pytester) -> None:
    target = project.path / "reports" / "r.json"
    target.parent.mkdir()
    target.write_text("old")
    (project.path / "r.json").symlink_to(target)
    result = _run(project, "--accelperf-json=r.json")
    assert result.ret == 0
    assert (project.path / "r.json").is_symlink()
    assert json.loads(target.read_text())["exit_status"] == 0


def test_a_json_report_that_cannot_be_written_fails_the_session(
        project: pytest.Pytester) -> None:
    (project.path / "file").write_text("")
    result = _run(project, "--accelperf-json=file/r.json")
    assert result.ret == 1
    result.assert_outcomes(passed=1)
    assert (f"accelperf: ERROR: --accelperf-json: cannot write {project.path}/file/r.json: "
            f"[Errno 20] Not a directory") in result.outlines
    result.stdout.no_fnmatch_line("*Traceback*")
    result.stdout.no_fnmatch_line("*JSON report written*")


def test_json_to_dev_stdout_redirected_to_a_file_keeps_pytest_s_output(
        project: pytest.Pytester) -> None:
    # runpytest_subprocess sends the child's stdout to a file: `pytest ... > file`.
    result = project.runpytest_subprocess(*ARGS, "--accelperf-json=/dev/stdout")
    assert result.ret == 0, result.stderr.str()
    lines = result.outlines
    report = _json_in(lines)
    assert report["exit_status"] == 0 and len(report["cases"]) == 1  # type: ignore[arg-type]
    # pytest's own lines, before the report and after it
    assert any("test session starts" in line for line in lines[:lines.index("{")])
    assert any("1 passed" in line for line in lines[lines.index("}"):])
    assert "accelperf: JSON report written to /dev/stdout" in lines


@pytest.mark.slow  # 21 s under -n 2 (2026-11-29)
def test_json_to_dev_stdout_after_a_line_of_ours_mid_run_starts_on_its_own_line(
        project: pytest.Pytester) -> None:
    """A line the plugin writes while a test runs (a wait for the host lock, beside another
    session) left pytest's reporter believing its line was ended: the progress of the test
    after it stayed open, and the report began after its "[100%]" (``.  [100%]{``): seen
    in CI beside the other xdist worker. The line is written here as the wait writes it."""
    project.makeconftest(CONFTEST + """

import pytest as _pytest


@_pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    from pytest_accelperf.gate.session import say

    say(item.config, "accelperf: a line of ours, mid-run")
    return (yield)
""")
    result = project.runpytest_subprocess(*ARGS, "--accelperf-json=/dev/stdout")
    assert result.ret == 0, result.stderr.str()
    lines = result.outlines
    assert "accelperf: a line of ours, mid-run" in lines
    report = _json_in(lines)
    assert report["exit_status"] == 0


@pytest.mark.slow  # 62 s under -n 2 (2026-11-29)
def test_json_to_stdout_through_a_pipe(project: pytest.Pytester) -> None:
    """``pytest -p no:terminal --accelperf-json=- | jq``: stdout is the report alone."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *ARGS, "-p", "no:terminal", "--accelperf-json=-"],
        cwd=project.path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["exit_status"] == 0


def test_json_to_a_descriptor_of_its_own(project: pytest.Pytester) -> None:
    """``pytest --accelperf-json=/dev/fd/3 3>&1 >log | jq``: the report through a pipe of its
    own, pytest's output where it was."""
    read_end, write_end = os.pipe()
    with subprocess.Popen(
            [sys.executable, "-m", "pytest", *ARGS, f"--accelperf-json=/dev/fd/{write_end}"],
            cwd=project.path, pass_fds=(write_end,), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True) as child:
        os.close(write_end)  # the child's copy is the only writer: EOF when it exits
        with os.fdopen(read_end) as pipe:
            report = json.loads(pipe.read())
        out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    assert report["exit_status"] == 0
    assert "1 passed" in out and "{" not in out


@pytest.mark.slow  # 67 s under -n 2 (2026-11-29)
def test_no_accept_command_names_a_report_that_cannot_be_read_back(
        project: pytest.Pytester, tmp_path: Path) -> None:
    """A report written to a descriptor (or a FIFO, a device) is gone once read: the failure
    message and the Markdown offer the re-run with --accelperf-update instead of
    ``accelperf baselines accept /dev/fd/N``."""
    assert _run(project).ret == 0  # records the baseline
    path = project.path / "baselines" / "cpu-x8" / "test_fit.json"
    data = json.loads(path.read_text())
    for block in data["cases"].values():  # a baseline that claims a tenth of the loss
        loss = block["loss"]
        loss["checkpoints"] = [[step, value / 10] for step, value in loss["checkpoints"]]
        loss["final"] /= 10
    path.write_text(json.dumps(data))
    with open(tmp_path / "log", "w") as log:
        result = project.runpytest("-p", "no:cacheprovider", "--accelperf-markdown=pr.md",
                                   f"--accelperf-json=/dev/fd/{log.fileno()}")
    assert result.ret == 1
    assert json.loads((tmp_path / "log").read_text())["exit_status"] == 1
    rerun = "pytest 'test_fit.py::test_fit[numpy-sgd-nomesh-b8]' --accel=cpu --accelperf-update"
    result.stdout.fnmatch_lines(["If this change is intended, accept it with:", f"  {rerun}"])
    result.stdout.no_fnmatch_line("*accelperf baselines accept*")
    markdown = (project.path / "pr.md").read_text()
    assert rerun in markdown and "accelperf baselines accept" not in markdown


def test_readable_back(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("")
    assert readable_back(tmp_path / "file") and readable_back(tmp_path / "new.json")
    for path in ("-", "/dev/stdout", "/dev/fd/3", tmp_path / "fifo"):
        assert not readable_back(path)
