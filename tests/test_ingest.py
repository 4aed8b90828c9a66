"""The outside-log parsers on the seed files themselves, and on broken variants of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_accelperf.ingest import (
    IngestError,
    parse_cerebras_log,
    parse_file,
    parse_hf_trainer,
    parse_neuron_report,
    select_run,
)

ROOT = Path(__file__).resolve().parents[1]
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
    assert run.extra["eval_loss"] == 0.1337
    assert run.extra["hf_metrics"]["train_runtime"] == pytest.approx(4 * 60 + 14.32)
    assert run.extra["hf_metrics"]["total_flos"] == 1470300 * 2**30
    # profiler summary
    prof = run.extra["profile"]
    assert run.flops_per_step == pytest.approx(1.073e12)
    assert prof["hardware_flops"] == pytest.approx(1.287e12)
    assert prof["total_time"] == pytest.approx(73.37e-3)
    assert prof["hbm_read_bytes"] == pytest.approx(6.481 * GIB)
    assert prof["hbm_write_bytes"] == pytest.approx(4.055 * GIB)
    assert prof["dma_transfer_total_bytes"] == pytest.approx(7.352 * GIB)
    assert prof["dma_transfer_count"] == 21501
    assert run.extra["mfu"] == pytest.approx(0.1594)
    assert run.memory_per_device == {"nd0:nc0": round(6.056 * GIB)}
    assert run.extra["memory_by_usage"]["nd0:nc0"]["Tensor"] == round(34.35 * MIB)
    assert run.extra["memory_by_usage"]["nd0:nc0"]["dma rings Syncill"] == round(127.049 * MIB)
    assert run.environment["device_kind"] == "trn1.2xlarge"
    assert run.environment["packages"]["neuron-compiler"] == "2.21.18209.0+043b1bf7"
    assert run.extra["logical_neuroncores"] == 2


def test_neuron_baseline_and_profile_only_sections(neuron_runs: dict[str, object]) -> None:
    base = neuron_runs["baseline"]
    assert base.extra["profile"]["event_count"] == 488839  # type: ignore[attr-defined]
    assert base.extra["profile"]["sync_engine_active_time"] == pytest.approx(322.1e-6)  # type: ignore[attr-defined]
    assert base.extra["profile"]["vector_engine_active_time_percent"] == 37.8  # type: ignore[attr-defined]
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
    assert r.extra["section"] == "Batch size 1024"
    assert r.loss_steps == list(range(100, 1001, 100))
    assert r.losses[0] == 9.48438 and r.losses[-1] == 7.10938
    assert r.step_times[0] == pytest.approx(1024 / 4979.03)
    assert r.extra["rates"][4] == 4863.20
    assert r.extra["global_rate"] == 4888.79
    assert r.compile_time == pytest.approx(46.326)  # 06:10:41,144 -> 06:11:27,470
    assert r.extra["programming_time"] == pytest.approx(232.797)  # 06:11:27,474 -> 06:15:20,271
    assert r.extra["total_samples"] == 1024000
    assert r.extra["total_time"] == 209.45877985
    assert runs[512].compile_time == pytest.approx(913.577)  # 02:46:11,160 -> 03:01:24,737
    assert runs[2048].extra["rates"][0] == 6846.25


def test_hf_trainer_block_alone() -> None:
    text = NEURON.read_text().split("# Batch 32\n", 1)[1]
    run = parse_hf_trainer(text, "x.log")[0]
    assert run.samples_per_step == 32 and run.losses == [0.2553] and run.loss_steps == [750]


def test_hf_short_run_gives_an_interval_not_a_wrong_step_count() -> None:
    text = ("***** train metrics *****\n  train_loss = 1.0\n  train_runtime = 0:00:02.06\n"
            "  train_samples_per_second = 62033.414\n  train_steps_per_second = 969.272\n")
    run = parse_hf_trainer(text, "short.log")[0]
    assert run.extra["train_steps"] is None
    low, high = run.extra["train_steps_estimate"]
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
