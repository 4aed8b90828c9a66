"""A/B mode on a trainer's case (issue 45): a LightningModule trained by ``Trainer.fit``,
each arm's trainer held between optimizer steps while the other arm runs its block
(:mod:`pytest_accelperf.backends.measure.held`). Against a git revision, a planted host
sync fails the program check against the base arm's own program; under another Python
environment (``--accelperf-compare-python``), the verdict names Lightning's release in
both stacks."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from conftest import Suite

from e2e.test_ab_envs import _fake_release, _uv_or_skip
from e2e.test_ab_mode import committed
from pytest_accelperf.envs.cache import build_env, session_site

pytest.importorskip("lightning")
pytest.importorskip("transformers")

MODEL = '''
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


class LitAutoEncoder(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
        self.decoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 64))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = nn.functional.mse_loss(self.decoder(self.encoder(x)), x)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def loader(case):
    x = torch.randn(32 * case.batch, 64, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x), batch_size=case.batch)


# -- a Hugging Face Trainer's case: a tiny GPT-2 on synthetic tokens ---------------------------
# transformers is imported where the case builds its model and arguments: the Lightning
# test's session (-k test_fit) and its arm workers need not import it (2 s of CPU each).


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def gpt2(case):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128,
                                      n_positions=32))


def args(case):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir="unused", per_device_train_batch_size=case.batch,
                             learning_rate=1e-3, use_cpu=True)
'''

SUITE = '''
from model import LitAutoEncoder, Tokens, args, gpt2, loader
from pytest_accelperf import cases
from pytest_accelperf.hf import TrainerTask
from pytest_accelperf.lightning import LightningTask

@cases(backend="lightning", batch=[16], steps=6, warmup=2)
def test_fit(accelperf):
    accelperf.train(LightningTask(module=lambda case: LitAutoEncoder(), data=loader))

@cases(backend="hf", batch=[4], steps=6, warmup=2)
def test_train(accelperf):
    accelperf.train(TrainerTask(model=gpt2, args=args, train_dataset=Tokens()))
'''

#: Where these tests look: what each arm's trainer trained and what the verdicts name, not
#: the statistic (one process pair, few rounds, any load; see test_ab_envs.FAST).
FAST = ("--accel=cpu", "--accelperf-cpu-devices=1", "--accelperf-compare-rounds=4",
        "--accelperf-compare-processes=1", "--accelperf-compare-budget=1",
        "--accelperf-compare-tolerance=10", "--accelperf-max-foreign-load=64",
        "--accelperf-explain=off", "--accelperf-json=report.json")


@pytest.fixture
def repo(suite: Suite) -> Suite:
    return committed(suite, MODEL, SUITE)


def _check(suite: Suite, metric: str, backend: str = "lightning") -> dict[str, Any]:
    case = next(c for c in suite.report()["cases"] if c["case"]["backend"] == backend)
    check: dict[str, Any] = next(c for c in case["checks"] if c["metric"] == metric)
    return check


@pytest.mark.slow
def test_a_host_sync_planted_in_training_step_fails_against_the_base(repo: Suite) -> None:
    """One session, both arms' workers shared by a Lightning case (a ``.item()`` planted
    in its ``training_step``) and an unchanged Hugging Face Trainer case."""
    model = repo.pytester.path / "model.py"
    model.write_text(model.read_text().replace(
        "        return loss\n", "        self.seen = loss.item()\n        return loss\n", 1))
    result = repo.run(*FAST, "--accelperf-compare=HEAD", subprocess=True)
    result.assert_outcomes(failed=1, passed=1)
    program = _check(repo, "program")
    assert program["verdict"] == "regression" and program["data"]["mode"] == "ab", program
    assert "host syncs" in str(program["detail"]) and "model.py" in str(program["detail"])
    throughput = _check(repo, "throughput")
    blocks = throughput["data"]["blocks"]
    assert len(blocks["base"]) == len(blocks["head"]) >= 4, throughput  # both trainers held
    assert not list(Path(repo.pytester.path).glob("lightning_logs"))
    # transformers' Trainer.train held in both arms too: the same program, nothing left
    hf = _check(repo, "throughput", "hf")["data"]["blocks"]
    assert len(hf["base"]) == len(hf["head"]) >= 4, hf
    hf_program = _check(repo, "program", "hf")
    assert hf_program["verdict"] == "pass" and hf_program["data"]["mode"] == "ab", hf_program
    assert not (Path(repo.pytester.path) / "unused").exists()


@pytest.mark.slow
def test_a_lightning_release_under_another_python_is_named_in_the_verdict(
        repo: Suite, tmp_path_factory: pytest.TempPathFactory) -> None:
    _uv_or_skip()
    env = build_env([], over=session_site(), root=tmp_path_factory.mktemp("envs"))
    _fake_release(env.path, "lightning", "0.0.1")
    result = repo.run(*FAST, f"--accelperf-compare-python={env.python}", "-k", "test_fit",
                      subprocess=True)
    result.assert_outcomes(passed=1, deselected=1)
    throughput = _check(repo, "throughput")
    detail = str(throughput["detail"])
    assert f"stack: lightning 0.0.1 → {metadata.version('lightning')}" in detail, detail
    assert throughput["verdict"] in ("pass", "inconclusive"), throughput
    program = _check(repo, "program")
    assert program["verdict"] == "pass" and program["data"]["mode"] == "ab", program

