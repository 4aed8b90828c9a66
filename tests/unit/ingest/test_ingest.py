"""The outside-log parsers on the seed files themselves, and on broken variants of them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_accelperf.errors import UserError
from pytest_accelperf.ingest import (
    EXPECTS,
    PARSERS,
    IngestError,
    parse_cerebras_log,
    parse_file,
    parse_hf_trainer,
    parse_neuron_report,
    select_run,
)

ROOT = Path(__file__).resolve().parents[3]
NEURON = ROOT / "suites" / "neuron" / "data" / "001_trainium_neuron_profile.md"
CEREBRAS = ROOT / "suites" / "cerebras" / "data" / "003_cerebras_bert_large.log"
GIB, MIB = 2**30, 2**20


@pytest.fixture(scope="module")
def neuron_runs() -> dict[str, object]:
    return {r.case_id: r for r in parse_file(NEURON, "neuron")}


def test_neuron_report_sections(neuron_runs: dict[str, object]) -> None:
    assert list(neuron_runs) == ["baseline", "batch-16", "batch-32", "batch32-cc-optim",
                                 "batch-48", "batch-64-swap", "batch-4", "batch-2"]


def test_neuron_batch16_matches_the_file() -> None:
    run = select_run(parse_file(NEURON, "neuron"), "Batch 16", str(NEURON))
    # HF Trainer block (seed lines 134-144)
    assert run.samples_per_step == 16
    assert run.samples_per_second == pytest.approx(16 * 5.898)
    assert run.losses == [0.2154] and run.loss_steps == [1500]
    assert run.details["eval_loss"] == 0.1337
    assert run.details["hf_metrics"]["train_runtime"] == pytest.approx(4 * 60 + 14.32)
    assert run.details["hf_metrics"]["total_flos"] == 1470300 * 2**30
    # profiler summary
    prof = run.details["profile"]
    assert run.flops_per_step == pytest.approx(1.073e12)
    assert prof["hardware_flops"] == pytest.approx(1.287e12)
    assert prof["total_time"] == pytest.approx(73.37e-3)
    assert prof["hbm_read_bytes"] == pytest.approx(6.481 * GIB)
    assert prof["hbm_write_bytes"] == pytest.approx(4.055 * GIB)
    assert prof["dma_transfer_total_bytes"] == pytest.approx(7.352 * GIB)
    assert prof["dma_transfer_count"] == 21501
    assert run.details["mfu"] == pytest.approx(0.1594)
    assert run.memory_per_device == {"nd0:nc0": round(6.056 * GIB)}
    assert run.details["memory_by_usage"]["nd0:nc0"]["Tensor"] == round(34.35 * MIB)
    assert run.details["memory_by_usage"]["nd0:nc0"]["dma rings Syncill"] == round(127.049 * MIB)
    assert run.environment.device_kind == "trn1.2xlarge"
    assert (run.environment.packages or {})["neuron-compiler"] == "2.21.18209.0+043b1bf7"
    assert run.details["logical_neuroncores"] == 2


def test_neuron_baseline_and_profile_only_sections(neuron_runs: dict[str, object]) -> None:
    base = neuron_runs["baseline"]
    assert base.details["profile"]["event_count"] == 488839  # type: ignore[attr-defined]
    assert base.details["profile"]["sync_engine_active_time"] == pytest.approx(322.1e-6)  # type: ignore[attr-defined]
    assert base.details["profile"]["vector_engine_active_time_percent"] == 37.8  # type: ignore[attr-defined]
    assert base.memory_per_device == {"nd0:nc0": round(5.472 * GIB)}  # type: ignore[attr-defined]
    b2 = neuron_runs["batch-2"]
    assert b2.step_times == [pytest.approx(39.79e-3)]  # type: ignore[attr-defined]
    assert b2.samples_per_step == 2 and b2.memory_per_device == {}  # type: ignore[attr-defined]
    b48 = neuron_runs["batch-48"]  # its memory table was pasted without a header
    assert b48.memory_per_device["nd0:nc0"] == pytest.approx(9.412 * GIB)  # type: ignore[attr-defined]
    assert b48.loss_steps == [501]  # type: ignore[attr-defined]  # ceil(8000/48) * 3 epochs


def test_cerebras_log_matches_the_file() -> None:
    runs = {r.samples_per_step: r for r in parse_file(CEREBRAS, "cerebras")}
    assert sorted(runs) == [512, 1024, 2048]
    r = runs[1024]
    assert r.details["section"] == "Batch size 1024"
    assert r.loss_steps == list(range(100, 1001, 100))
    assert r.losses[0] == 9.48438 and r.losses[-1] == 7.10938
    assert r.step_times[0] == pytest.approx(1024 / 4979.03)
    assert r.details["rates"][4] == 4863.20
    assert r.details["global_rate"] == 4888.79
    assert r.compile_time == pytest.approx(46.326)  # 06:10:41,144 -> 06:11:27,470
    assert r.details["programming_time"] == pytest.approx(232.797)  # 06:11:27,474 -> 06:15:20,271
    assert r.details["total_samples"] == 1024000
    assert r.details["total_time"] == 209.45877985
    assert runs[512].compile_time == pytest.approx(913.577)  # 02:46:11,160 -> 03:01:24,737
    assert runs[2048].details["rates"][0] == 6846.25


def test_hf_trainer_block_alone() -> None:
    text = NEURON.read_text().split("# Batch 32\n", 1)[1]
    run = parse_hf_trainer(text, "x.log")[0]
    assert run.samples_per_step == 32 and run.losses == [0.2553] and run.loss_steps == [750]


def test_hf_short_run_gives_an_interval_not_a_wrong_step_count() -> None:
    text = ("***** train metrics *****\n  train_loss = 1.0\n  train_runtime = 0:00:02.06\n"
            "  train_samples_per_second = 62033.414\n  train_steps_per_second = 969.272\n")
    run = parse_hf_trainer(text, "short.log")[0]
    assert run.details["train_steps"] is None
    low, high = run.details["train_steps_estimate"]
    assert low < 1996.7 < high and high - low < 10


# -- malformed variants: a clear error naming file and line, never a number ---------------
def _neuron_error(text: str) -> IngestError:
    with pytest.raises(IngestError) as info:
        parse_neuron_report(text, "bad.md")
    return info.value


def test_neuron_unknown_unit() -> None:
    text = NEURON.read_text().replace("| 4.334 **GiB**  ", "| 4.334 **GB**   ", 1)
    err = _neuron_error(text)
    assert err.line == 29 and "hbm_read_bytes" in str(err) and "unknown unit 'GB'" in str(err)
    assert str(err).startswith("bad.md:29: ")


def test_neuron_truncated_row() -> None:
    lines = NEURON.read_text().splitlines()
    err = _neuron_error("\n".join([*lines[:28], lines[28][:60]]))
    assert err.line == 29 and "truncated" in str(err)


def test_neuron_truncated_at_a_row_boundary() -> None:
    lines = NEURON.read_text().splitlines()
    err = _neuron_error("\n".join(lines[:20]))
    assert "lacks" in str(err) and "mfu_estimated_percent" in str(err) and err.line == 7


def test_neuron_memory_table_without_total() -> None:
    lines = NEURON.read_text().splitlines()
    err = _neuron_error("\n".join(lines[:126]))  # drops "| 0 | 0 | Total | 5.472 GiB |"
    assert "no 'Total' row" in str(err) and err.line == 103


def test_neuron_reordered_table() -> None:
    lines = NEURON.read_text().splitlines()
    lines[8], lines[9] = lines[9], lines[8]  # a continuation row before the first group row
    err = _neuron_error("\n".join(lines))
    assert err.line == 9 and "before any group row" in str(err)


def test_neuron_memory_row_lost() -> None:
    lines = NEURON.read_text().splitlines()
    del lines[116]  # "tensor 1.224 GiB": the rows no longer add up to Total
    err = _neuron_error("\n".join(lines))
    assert "sum to" in str(err) and err.line == 103


def _cerebras_error(text: str) -> IngestError:
    with pytest.raises(IngestError) as info:
        parse_cerebras_log(text, "bad.log")
    return info.value


def test_cerebras_truncated() -> None:
    text = CEREBRAS.read_text()
    cut = text[:text.index("Saving checkpoint at step 1000")]
    err = _cerebras_error(cut)
    assert "ends without 'Processed" in str(err) and "truncated" in str(err)


def test_cerebras_reordered_steps() -> None:
    lines = CEREBRAS.read_text().splitlines()
    i = next(n for n, x in enumerate(lines) if "Step=200," in x)
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    err = _cerebras_error("\n".join(lines))
    assert err.line in (i + 1, i + 2) and ("reordered" in str(err))


def test_cerebras_unknown_rate_unit() -> None:
    text = CEREBRAS.read_text().replace("Rate=4928.06 samples/sec", "Rate=4928.06 samples/min")
    err = _cerebras_error(text)
    assert "unknown unit 'samples/min'" in str(err) and err.line > 0


def test_cerebras_samples_disagree() -> None:
    text = CEREBRAS.read_text().replace("Processed 1024000 sample(s)",
                                        "Processed 1000000 sample(s)")
    err = _cerebras_error(text)
    assert "batch 1024 x last step 1000 = 1024000" in str(err)


def test_hf_unknown_flos_suffix_and_duplicates() -> None:
    block = ("***** train metrics *****\n  total_flos = 1470300TF\n")
    with pytest.raises(IngestError, match=r"x.log:2: total_flos: '1470300TF'"):
        parse_hf_trainer(block, "x.log")
    dup = ("***** train metrics *****\n  train_loss = 1.0\n  train_loss = 2.0\n")
    with pytest.raises(IngestError, match=r"x\.log:3: train_loss appears twice"):
        parse_hf_trainer(dup, "x.log")
    short = "***** train metrics *****\n  train_loss = 1.0\n"
    with pytest.raises(IngestError, match=r"x\.log:1: .*lacks train_runtime"):
        parse_hf_trainer(short, "x.log")


def test_select_run_names_the_choices() -> None:
    runs = parse_file(CEREBRAS, "cerebras")
    with pytest.raises(IngestError, match="pick one with section=: 'Batch size 1024'"):
        select_run(runs, None, "c.log")
    with pytest.raises(IngestError, match="no run 'Batch size 4096'"):
        select_run(runs, "Batch size 4096", "c.log")


# -- files that are not the log a parser reads: one IngestError, never another exception ---
HF_BLOCK = ("***** train metrics *****\n  train_loss = 1.0\n  train_runtime = 0:04:14.32\n"
            "  train_samples_per_second = 94.369\n  train_steps_per_second = 5.898\n")
SAMPLES = {"neuron": NEURON.read_bytes(), "cerebras": CEREBRAS.read_bytes(),
           "hf-trainer": NEURON.read_bytes()}  # the neuron report holds Trainer blocks


def _ingest_error(path: Path, parser: str) -> str:
    with pytest.raises(IngestError) as info:
        parse_file(path, parser)
    message = str(info.value)
    assert isinstance(info.value, UserError) and "\n" not in message, message
    return message


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_a_file_that_is_not_text_names_the_file_the_parser_and_what_it_reads(
        parser: str, tmp_path: Path) -> None:
    """Seen: a Neuron profile that was not UTF-8 crashed with UnicodeDecodeError in
    parse_file; an empty file read as 'no table found'. Each is one line naming the file,
    what it is instead and what the parser reads."""
    wants = f"; the {parser} parser expects {EXPECTS[parser]}"
    assert EXPECTS[parser]
    cases = {
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR": "not a text file (byte 0x89 at offset 0 is not "
                                               "UTF-8)",
        b"Batch 16: caf\xe9 latin-1\n": "not a text file (byte 0xe9 at offset 13 is not UTF-8)",
        b"# Batch 16\n\x00\x00\x01": "not a text file (a NUL byte at offset 11)",
        SAMPLES[parser][:100] + "\u2192".encode()[:2]: "not a text file (it ends inside a UTF-8 "
                                                       "character at offset 100: truncated?)",
        b"": "the file is empty",
        b" \n\n\t\n": "the file is only whitespace (5 bytes)",
    }
    for data, said in cases.items():
        path = tmp_path / "x.md"
        path.write_bytes(data)
        assert _ingest_error(path, parser) == f"{path}: {said}{wants}"
    path.write_bytes("# Batch 16\n".encode("utf-16"))
    assert _ingest_error(path, parser) == (f"{path}: UTF-16 text (its byte-order mark){wants}: "
                                           f"save it as UTF-8 (iconv -f UTF-16 -t UTF-8)")
    # What the parser finds nothing in names what it reads too.
    path.write_bytes(b"just some text\n")
    assert _ingest_error(path, parser).endswith(wants)
    # A UTF-8 byte-order mark (Windows editors write one) is not part of the text.
    path.write_bytes(b"\xef\xbb\xbf" + SAMPLES[parser])
    sample = NEURON if parser != "cerebras" else CEREBRAS
    assert [(r.case_id, r.step_times, r.losses) for r in parse_file(path, parser)] == [
        (r.case_id, r.step_times, r.losses) for r in parse_file(sample, parser)]


def test_an_unknown_parser_name_is_a_user_error_naming_the_parsers() -> None:
    """It was a bare ValueError."""
    with pytest.raises(IngestError) as info:
        parse_file(NEURON, "neuronx")
    assert isinstance(info.value, UserError)
    assert str(info.value) == ("parser='neuronx': no such parser; the parsers are cerebras, "
                               "hf-trainer, neuron (or pass a function (text, source) -> "
                               "list[Run])")


def test_numbers_out_of_range_are_ingest_errors() -> None:
    """Seen while fuzzing: a memory of 1e999 GiB (OverflowError), a day 00 in a timestamp
    (strptime's ValueError), a Rate of 0 (ZeroDivisionError), train_steps_per_second = 0
    (ZeroDivisionError), a batch size of 5000 digits (int()'s digit limit), a total_flos
    beyond a float (OverflowError). Each is an IngestError naming its line."""
    neuron = NEURON.read_text()
    cerebras = CEREBRAS.read_text()
    broken = [
        (parse_neuron_report, neuron.replace("| 5.472 **GiB**   |", "| 1e999 **GiB**   |", 1),
         r"bad:\d+: memory 'Total' is inf: not a finite number"),
        (parse_cerebras_log, cerebras.replace("2024-04-10 06:09:56", "2024-04-00 06:09:56", 1),
         r"bad:\d+: timestamp 2024-04-00 06:09:56,\d+ is not a date and time"),
        (parse_cerebras_log, cerebras.replace("Rate=4979.03 samples/sec", "Rate=0 samples/sec",
                                              1),
         r"bad:\d+: Rate: 0 'samples/sec' is no rate of a run that trained"),
        (parse_cerebras_log, cerebras.replace("Effective batch size is 1024.",
                                              f"Effective batch size is {'9' * 5000}.", 1),
         r"bad:\d+: Effective batch size: '9{24}'... is out of range"),
        (parse_hf_trainer, HF_BLOCK.replace("= 5.898", "= 0"),
         r"bad:5: train_steps_per_second is 0: a training's rate and runtime are positive"),
        (parse_hf_trainer, HF_BLOCK + f"  total_flos = {'9' * 400}GF\n",
         r"bad:6: total_flos: '9{80}'... is out of range"),
    ]
    for parse, text, pattern in broken:
        assert text != (neuron if parse is parse_neuron_report else cerebras)
        with pytest.raises(IngestError, match=pattern):
            parse(text, "bad")


def test_a_huge_single_line_is_read_in_linear_time_and_quoted_short() -> None:
    """A log that is one line of megabytes (a binary blob decoded, a log without
    newlines): two patterns backtracked quadratically on such lines (a heading's
    '(\\S.*?)\\s*$', a number's '\\d+\\.?\\d*'): 14 s for a line of 40,000 characters, days for
    megabytes. Now each parser reads a 1 MB line in well under a second, and its error
    quotes at most a few hundred characters of it."""
    n = 1_000_000
    lines = ["# a" + " " * n + "b", "1" * n + "x",
             "2024-04-10 06:09:56,046 INFO:   " + " " * n + "x",
             "***** train metrics *****\n  train_loss = " + "1" * n + "x",
             "| Group | Name | Value |\n| --- | --- | --- |\n| g | **n** | " + "9" * n + "x |",
             "|" * n, "ab c " * (n // 5)]
    for parser, parse in PARSERS.items():
        for text in lines:
            t0 = time.perf_counter()
            try:
                parse(text, "huge")
            except IngestError as exc:
                assert len(str(exc)) <= 520 and "\n" not in str(exc), (parser, str(exc)[:200])
            assert time.perf_counter() - t0 < 2.0, (parser, text[:40])


def _fuzzed(draw: Any, sample: bytes) -> bytes:
    """``sample`` truncated at a random byte, or with random bytes put in, or random bytes
    altogether, or a number of it made huge, zero or negative."""
    kind = draw(st.sampled_from(["truncate", "insert", "random", "number"]))
    if kind == "truncate":
        return sample[:draw(st.integers(0, len(sample)))]
    if kind == "random":
        return bytes(draw(st.binary(max_size=400)))
    at = draw(st.integers(0, len(sample)))
    if kind == "insert":
        return sample[:at] + bytes(draw(st.binary(min_size=1, max_size=8))) + sample[at:]
    digit = sample.find(b"1", at)
    value = draw(st.sampled_from([b"0", b"-1", b"1e999", b"9" * 400, b"nan"]))
    return sample[:digit] + value + sample[digit + 1:] if digit >= 0 else sample


@pytest.mark.parametrize("parser", sorted(PARSERS))
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_exception_but_an_ingest_error_escapes_a_parser(parser: str, data: Any,
                                                           tmp_path: Path) -> None:
    """Whatever bytes the file holds (a real sample truncated anywhere, random bytes put
    in it, random bytes alone, a number made huge, zero or negative), parsing it gives
    runs or one IngestError on one line, never another exception."""
    path = tmp_path / "fuzzed.log"
    path.write_bytes(data.draw(st.composite(_fuzzed)(SAMPLES[parser])))
    try:
        runs = parse_file(path, parser)
    except IngestError as exc:
        assert "\n" not in str(exc) and len(str(exc)) <= len(str(path)) + 520
    else:
        assert runs and all(r.step_times and all(t > 0 for t in r.step_times) for r in runs)
