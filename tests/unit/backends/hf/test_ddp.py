"""transformers' ``Trainer`` over DDP in 2 ranks launched by the plugin, on the CPU (gloo):
a tiny GPT-2 made from its config, trained as written; accelerate reads the launcher's
torchelastic-style environment. One module-scoped 2-rank training (slow)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tokenizers import Tokenizer  # noqa: E402
from tokenizers.models import WordLevel  # noqa: E402
from tokenizers.pre_tokenizers import WhitespaceSplit  # noqa: E402
from transformers import (  # noqa: E402
    DataCollatorForLanguageModeling,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
)

from pytest_accelperf.backends import get_backend  # noqa: E402
from pytest_accelperf.backends.hf.ddp import RANKS  # noqa: E402
from pytest_accelperf.backends.measure.common import TaskError  # noqa: E402
from pytest_accelperf.backends.procs.ranks import train_in_ranks  # noqa: E402
from pytest_accelperf.backends.protocol import TrainResult  # noqa: E402
from pytest_accelperf.checks.program import check_program  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.hf import TrainerTask  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.records.verdict import Tolerances, Verdict  # noqa: E402

pytestmark = pytest.mark.slow

WORLD, BATCH, STEPS, WARMUP, SEQ, VOCAB = 2, 8, 3, 1, 16, 64
CPU = Accelerator(name="cpu", platform="cpu-x2", device_kind="cpu", device_count=2)


def gpt2(case: Case) -> Any:
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                        bos_token_id=1, eos_token_id=1)
    return GPT2LMHeadModel(config)


def tokens(case: Case) -> list[dict[str, list[int]]]:
    ids = torch.randint(2, VOCAB, (64, SEQ), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": row.tolist()} for row in ids]


def collator() -> Any:
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = WhitespaceSplit()  # type: ignore[assignment]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1")
    return DataCollatorForLanguageModeling(fast, mlm=False)


def task(per_device: int = BATCH // WORLD, **args: Any) -> TrainerTask:
    return TrainerTask(model=gpt2, args={"per_device_train_batch_size": per_device, **args},
                       train_dataset=tokens, data_collator=collator())


def ddp_case() -> Case:
    return Case(backend="hf", batch=BATCH, steps=STEPS, warmup=WARMUP, world_size=WORLD)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The training runs here (the ranks start in this directory): nothing may be left."""
    path = tmp_path_factory.mktemp("hf-ddp-cwd")
    before = Path.cwd()
    os.chdir(path)
    try:
        yield path
    finally:
        os.chdir(before)


@pytest.fixture(scope="module")
def ddp(workdir: Path) -> TrainResult:
    return train_in_ranks(RANKS, ddp_case(), task(), CPU, timeout=300)


@pytest.fixture(scope="module")
def logging_every_step(workdir: Path) -> TrainResult:
    """``logging_steps=1``, as many examples write it: at each log the Trainer gathers the
    loss from every rank and reads it on the host."""
    return train_in_ranks(RANKS, ddp_case(), task(logging_steps=1), CPU, timeout=300)


def test_the_spec_names_these_ranks() -> None:
    spec = get_backend("hf")
    assert spec.spans_ranks(WORLD) and spec.load_ranks() is RANKS


def test_trains_the_trainers_ddp_over_two_ranks(ddp: TrainResult, workdir: Path) -> None:
    run = ddp.run
    assert run.outcome == "ok", run.message
    assert run.n_devices == WORLD and sorted(run.memory_per_device) == ["rank0", "rank1"]
    assert len(run.step_times) == STEPS
    assert len(run.losses) == WARMUP + STEPS and all(math.isfinite(x) for x in run.losses)
    ranks = run.details["ranks"]
    assert ranks[0]["local_losses"] != ranks[1]["local_losses"]  # each rank its own share
    program = run.program
    assert program is not None
    # DDP's gradient bucket all-reduce, and the Trainer's own of the step's token count
    # (average_tokens_across_devices), both seen at the dispatcher
    assert program["ops"]["c10d.allreduce_[f32]"] == 1  # type: ignore[typeddict-item]
    assert program["collectives"]["all_reduce"]["count"] == 2  # type: ignore[typeddict-item]
    assert list(workdir.iterdir()) == []


def test_a_per_device_batch_unlike_the_case_is_one_line(workdir: Path) -> None:
    with pytest.raises(TaskError, match=r"the global batch is 16 .* x 2 process"):
        train_in_ranks(RANKS, ddp_case(), task(per_device=BATCH), CPU, timeout=300)


def test_logging_every_step_over_ddp_is_a_program_regression(
        ddp: TrainResult, logging_every_step: TrainResult) -> None:
    before, after = ddp.run.program, logging_every_step.run.program
    assert before is not None and after is not None
    assert after["collectives"]["all_gather"]["count"] == \
        before["collectives"]["all_gather"]["count"] + 2  # type: ignore[typeddict-item]
    result = check_program({"outcome": "ok", "environment": {}, "program": after},
                           {"outcome": "ok", "environment": {}, "program": before},
                           Tolerances(), comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION, result
    assert "all_gather" in result.detail and "host syncs" in result.detail
