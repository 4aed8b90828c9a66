"""The hf backend trained directly: a tiny GPT-2 causal LM made from a config (nothing
downloaded), on synthetic tokens through ``DataCollatorForLanguageModeling(mlm=False)``
with a word-level tokenizer built here, trained by a real ``transformers.Trainer``
through the plugin's callback, on the CPU. Each test shares the module's trainings where
it can; each training takes 1.5-3 s on this machine (none is marked slow: the marker is for
tests of 10 s or more; the module's 20 tests take 21 s serial at load 5-10)."""

from __future__ import annotations

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
    TrainerCallback,
)

from pytest_accelperf import AccelperfWarning  # noqa: E402
from pytest_accelperf.backends.hf.backend import BACKEND  # noqa: E402
from pytest_accelperf.backends.measure.common import TaskError  # noqa: E402
from pytest_accelperf.backends.protocol import TrainResult  # noqa: E402
from pytest_accelperf.checks.program import check_program  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.hf import TrainerTask  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.records.verdict import Tolerances, Verdict  # noqa: E402

STEPS, WARMUP, BATCH, SEQ, VOCAB = 6, 1, 8, 32, 256
CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)


def gpt2(case: Case, **kw: Any) -> Any:
    """A 2-layer GPT-2 from its config: 64 wide, 2 heads, a 256-token vocabulary."""
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                        bos_token_id=1, eos_token_id=1, **kw)
    return GPT2LMHeadModel(config)


def tokenizer() -> Any:
    """A word-level tokenizer of the 256 tokens ``t0`` ... ``t255``, built here."""
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = WhitespaceSplit()  # type: ignore[assignment]
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1")


def tokens(case: Case, examples: int = 64) -> list[dict[str, list[int]]]:
    """Synthetic token sequences, as a tokenized dataset holds them (no labels: the
    collator sets them)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, VOCAB, (examples, SEQ), generator=gen)
    return [{"input_ids": row.tolist()} for row in ids]


COLLATOR = DataCollatorForLanguageModeling(tokenizer(), mlm=False)


class Logged(TrainerCallback):  # type: ignore[misc]
    """The trainer's own logs (``logging_steps=1``): its loss and learning rate."""

    def __init__(self) -> None:
        self.logs: list[dict[str, float]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.logs.append(dict(logs))


def task(model: Any = gpt2, **args: Any) -> TrainerTask:
    fields = {"per_device_train_batch_size": BATCH, "learning_rate": 1e-3,
              "warmup_steps": 2, **args}
    return TrainerTask(model=model, args=fields, train_dataset=tokens,
                       data_collator=COLLATOR)


def case(**kw: Any) -> Case:
    return Case(backend="hf", batch=BATCH, steps=STEPS, warmup=WARMUP, **kw)


def train(the_task: TrainerTask, the_case: Case | None = None) -> TrainResult:
    result = BACKEND.train(the_case or case(), the_task, CPU)
    assert isinstance(result, TrainResult)
    return result


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every training of this module runs here, on one torch thread (a shared 2-core
    machine): nothing may be left behind."""
    path = tmp_path_factory.mktemp("hf-cwd")
    before, threads = Path.cwd(), torch.get_num_threads()
    os.chdir(path)
    torch.set_num_threads(1)
    try:
        yield path
    finally:
        os.chdir(before)
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def plain(workdir: Path) -> TrainResult:
    return train(task())


@pytest.fixture(scope="module")
def again(workdir: Path) -> TrainResult:
    return train(task())


def test_steps_times_and_the_schedules_learning_rate(plain: TrainResult) -> None:
    run = plain.run
    assert run.outcome == "ok", run.message
    assert len(run.step_times) == STEPS and all(t > 0 for t in run.step_times)
    assert len(run.losses) == WARMUP + STEPS
    # the linear schedule with 2 warm-up steps over max_steps = 7, as each step used it
    assert run.metrics["lr"] == pytest.approx([0, 5e-4, 1e-3, 8e-4, 6e-4, 4e-4, 2e-4])
    assert len(run.inputs.wall_times) == STEPS == len(run.inputs.times)
    assert len(run.probe_times) == STEPS and run.probe_kind.startswith("torch-cpu")
    assert run.tokens_per_step == BATCH * SEQ
    # the trainer's own time: each step less its training_step and optimizer step
    assert run.trainer_times is not None and len(run.trainer_times) == STEPS
    assert all(0 <= t < s for t, s in zip(run.trainer_times, run.step_times, strict=True))


def test_memory_flops_and_program_as_the_torch_backend_counts(plain: TrainResult) -> None:
    run = plain.run
    assert run.memory_source == "mem_tracker"
    params = sum(p.numel() for p in gpt2(case()).parameters())
    assert run.memory_per_device["cpu:0"] > 4 * 4 * params  # params, grads, AdamW's two
    assert run.memory_growth is not None and run.memory_growth["bytes_per_step"] == 0
    # 3 x the forward's 2 FLOPs per weight and token, give or take attention and the
    # embedding (a gather, no FLOPs)
    dense = params - VOCAB * 64 - SEQ * 64
    assert run.flops_per_step is not None
    assert 1.0 < run.flops_per_step / (6 * dense * BATCH * SEQ) < 1.5
    program = run.program
    assert program is not None and program["source"] == "torch"
    sites = program["host_sync_sites"]
    # the trainer's own reads (its NaN filter of each step's loss), named in its loop,
    # not in the plugin; the gate's read of the loss is not counted
    assert any("transformers/trainer.py in Trainer._run_epoch" in s for s in sites), sites
    assert not any("pytest_accelperf" in s for s in sites), sites


def test_numerics_fingerprint_stable_and_covers_the_trainer_state(
        plain: TrainResult, again: TrainResult) -> None:
    first = plain.run.params_fingerprint
    assert first == again.run.params_fingerprint
    assert plain.run.losses == again.run.losses
    state = {k for k, leaf in first.items() if leaf.get("state")}
    assert state == {"optimizer/step", "scheduler/last_epoch", "trainer/global_step"}
    assert first["trainer/global_step"]["sample"] == [WARMUP + STEPS]
    assert "transformer.h.0.attn.c_attn.weight" in first


def test_the_loss_is_the_trainers_own_with_accumulation(workdir: Path) -> None:
    """With gradient accumulation (the case's grad_accum) and the trainer logging every
    step, each step's loss is the one the trainer logged: the sum of its micro-batches'
    (each normalized by the step's label count)."""
    logged = Logged()
    the_task = TrainerTask(model=gpt2, args={"per_device_train_batch_size": BATCH // 2,
                                             "logging_steps": 1, "learning_rate": 1e-3},
                           train_dataset=tokens, data_collator=COLLATOR, callbacks=[logged])
    result = train(the_task, case(grad_accum=2))
    run = result.run
    assert run.outcome == "ok", run.message
    assert run.case_id == "hf-nomesh-ga2-b8"
    assert len(run.step_times) == STEPS and len(run.losses) == WARMUP + STEPS
    logs = logged.logs[-(WARMUP + STEPS):]
    assert run.losses == pytest.approx([log["loss"] for log in logs], rel=1e-6)
    assert run.metrics["lr"] == pytest.approx([log["learning_rate"] for log in logs])
    assert run.params_fingerprint["trainer/global_step"]["sample"] == [WARMUP + STEPS]
    # logging every step reads the loss on the host: the program shows the trainer's sync
    assert run.program is not None
    assert any("_maybe_log_save_evaluate" in s for s in run.program["host_sync_sites"])


def test_gradient_checkpointing_is_a_program_regression(plain: TrainResult,
                                                        workdir: Path) -> None:
    # transformers 5.24's name for gradient_checkpointing (the old name warns)
    checkpointed = train(task(activation_checkpointing=True)).run
    assert checkpointed.outcome == "ok", checkpointed.message
    assert checkpointed.losses == pytest.approx(plain.run.losses, rel=1e-5)
    result = check_program(_block(checkpointed.program), _block(plain.run.program),
                           Tolerances(), comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION, result
    assert checkpointed.flops_per_step is not None and plain.run.flops_per_step is not None
    assert 1.2 < checkpointed.flops_per_step / plain.run.flops_per_step < 1.5


class Printing(transformers.Trainer):  # type: ignore[misc]
    """A user's Trainer that prints each micro-batch's loss: a host sync in their code."""

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.printed = loss.item()  # a debug line: the loss read on the host
        return loss


def test_a_sync_in_the_users_trainer_is_named_at_their_line(plain: TrainResult,
                                                            workdir: Path) -> None:
    the_task = TrainerTask(model=gpt2, args={"per_device_train_batch_size": BATCH,
                                             "learning_rate": 1e-3, "warmup_steps": 2},
                           train_dataset=tokens, data_collator=COLLATOR,
                           trainer_class=Printing)
    planted = train(the_task).run
    assert planted.outcome == "ok", planted.message
    assert planted.losses == plain.run.losses  # the same training, one read more
    result = check_program(_block(planted.program), _block(plain.run.program),
                           Tolerances(), comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION, result
    assert planted.program is not None
    # Named at the user's lines: the print, and the model's own read (its mask helper)
    # at the user's call into it, the innermost frame outside transformers.
    sites = sorted(s.split("test_backend.py in ")[1] for s in planted.program["host_sync_sites"]
                   if "test_backend.py" in s)
    assert sites == ["Printing.compute_loss: loss = super().compute_loss(model, inputs, *args, "
                     "**kwargs)", "Printing.compute_loss: self.printed = loss.item()"], sites


def test_a_short_dataset_is_cycled_and_said(workdir: Path) -> None:
    short = TrainerTask(model=gpt2, args={"per_device_train_batch_size": BATCH},
                        train_dataset=lambda c: tokens(c, examples=20), data_collator=COLLATOR)
    with pytest.warns(AccelperfWarning, match="holds 20 example") as said:
        run = train(short).run
    assert run.outcome == "ok" and len(run.step_times) == STEPS
    assert [str(w.message) for w in said] == [
        "TrainerTask.train_dataset holds 20 example(s), 3 batch(es) of "
        "per_device_train_batch_size 8, the case 7 (warm-up + steps x "
        "gradient_accumulation_steps): the Trainer began a new epoch after each 3 (the "
        "dataset cycled: its loader iterated again, its end-of-epoch work inside the step "
        "that followed); the last batch of each epoch holds 4 example(s), not 8 "
        "(dataloader_drop_last=True drops it)"]


def test_a_model_instance_is_trained_from_its_own_state(plain: TrainResult,
                                                         workdir: Path) -> None:
    """A model given as an instance: the counting training is undone (its state_dict put
    back), so the measured run starts where the plain one (made by a function) did."""
    transformers.set_seed(42)  # what the gate gives the factory: TrainingArguments.seed
    made = train(task(model=gpt2(case()))).run
    assert made.outcome == "ok", made.message
    assert made.losses == plain.run.losses


def test_fits_against_the_declared_capacity(plain: TrainResult, workdir: Path) -> None:
    peak = plain.run.memory_per_device["cpu:0"]
    for capacity, fits in ((2 * peak, True), (peak // 2, False)):
        fit = BACKEND.fits(case(memory_capacity=capacity), task(), CPU)
        assert (fit.fits, fit.required_bytes, fit.capacity_bytes) == (fits, peak, capacity)


def test_a_global_batch_unlike_the_case_is_one_line(workdir: Path) -> None:
    with pytest.raises(TaskError) as error:
        train(task(per_device_train_batch_size=4))
    assert str(error.value) == (
        f"TrainerTask.model GPT2LMHeadModel (transformers {transformers.__version__}): "
        "the global batch is 4 (per_device_train_batch_size 4 x "
        "gradient_accumulation_steps 1 x 1 process(es)), but hf-nomesh-b8 declares "
        "batch=8: make per_device_train_batch_size 8 (from accelperf.case.batch), or the "
        "case's batch 4")


def test_a_model_without_labels_is_one_line_naming_the_collator(workdir: Path) -> None:
    def no_labels(features: list[dict[str, list[int]]]) -> dict[str, Any]:
        return {"input_ids": torch.tensor([f["input_ids"] for f in features])}

    with pytest.raises(TaskError) as error:
        train(TrainerTask(model=gpt2, args={"per_device_train_batch_size": BATCH},
                          train_dataset=tokens, data_collator=no_labels))
    assert str(error.value) == (
        f"TrainerTask.model GPT2LMHeadModel (transformers {transformers.__version__}) "
        "returned no loss: the batches made by TrainerTask.data_collator no_labels "
        f"({__file__}:{no_labels.__code__.co_firstlineno}) hold input_ids and no "
        "'labels': give a collator that sets them (for a causal LM, "
        "DataCollatorForLanguageModeling(tokenizer, mlm=False)), or labels in the dataset's "
        "examples")


def test_a_timeout_ends_the_trainers_loop_at_a_step_boundary(workdir: Path) -> None:
    run = BACKEND.train(case(), task(), CPU, timeout=1e-9).run
    assert run.outcome == "timeout" and len(run.losses) == 1
    assert run.message.startswith("exceeded the 1e-09 s timeout after 1 of 7 steps")


def test_nothing_is_left_in_the_working_directory(plain: TrainResult,
                                                  workdir: Path) -> None:
    assert list(workdir.iterdir()) == []


def _block(program: object) -> dict[str, Any]:
    return {"outcome": "ok", "environment": {}, "program": program}
