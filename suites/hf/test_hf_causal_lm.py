"""A transformers causal LM trained by transformers' ``Trainer`` under the gate.

The model is ``LlamaForCausalLM`` made from a small ``LlamaConfig`` by
``AutoModelForCausalLM.from_config`` (2 layers, 64 wide,
grouped-query attention: a config, no downloaded weights), trained as transformers'
language-modelling example trains one: texts tokenized, concatenated and cut into blocks
(``group_texts``), ``DataCollatorForLanguageModeling(mlm=False)`` setting the labels, and
``TrainingArguments`` with a warm-up and a cosine schedule. The texts are synthetic and
the tokenizer is a word-level one built here: nothing is downloaded.

Three cases: batch 8 with SDPA attention (transformers' default), batch 16 in two
micro-batches of accumulation (``gradient_accumulation_steps`` driven by the case's
``grad_accum``), and batch 8 with eager attention.
"""

from __future__ import annotations

import random
from itertools import chain
from typing import Any

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import (
    AutoModelForCausalLM,
    DataCollatorForLanguageModeling,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from pytest_accelperf import Case, CaseRunner, cases
from pytest_accelperf.hf import TrainerTask

VOCAB, BLOCK = 512, 64
WORDS = [f"w{i}" for i in range(VOCAB - 3)]


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer of the synthetic corpus' words and three special tokens."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {w: i + 3 for i, w in enumerate(WORDS)}
    model = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    model.pre_tokenizer = WhitespaceSplit()  # type: ignore[assignment]
    return PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>",
                                   bos_token="<s>", eos_token="</s>")


TOKENIZER = tokenizer()


def texts(n: int = 400, seed: int = 0) -> list[str]:
    """Synthetic lines of text: 20-120 words drawn from the vocabulary."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(20, 120))) for _ in range(n)]


def group_texts(examples: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
    """The language-modelling example's ``group_texts``: all texts concatenated and cut
    into blocks of ``BLOCK`` tokens (the remainder dropped)."""
    concatenated = {k: list(chain(*examples[k])) for k in examples}
    total = (len(concatenated["input_ids"]) // BLOCK) * BLOCK
    return {k: [t[i:i + BLOCK] for i in range(0, total, BLOCK)]
            for k, t in concatenated.items()}


def train_dataset(case: Case) -> list[dict[str, list[int]]]:
    tokenized = dict(TOKENIZER(texts()))
    blocks = group_texts({k: tokenized[k] for k in ("input_ids", "attention_mask")})
    return [dict(zip(blocks, values, strict=True)) for values in zip(*blocks.values(),
                                                                       strict=True)]


def model(case: Case) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=BLOCK, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    return AutoModelForCausalLM.from_config(config,
                                            attn_implementation=case.params.get("attn", "sdpa"))


def args(case: Case) -> dict[str, Any]:
    return {"per_device_train_batch_size": case.batch // case.grad_accum,
            "learning_rate": 3e-3, "warmup_steps": 2, "lr_scheduler_type": "cosine",
            "weight_decay": 0.01}


@cases(Case(backend="hf", batch=8, steps=10, warmup=2, accels=("cpu", "gpu")),
       Case(backend="hf", batch=16, grad_accum=2, steps=10, warmup=2, accels=("cpu", "gpu")),
       Case(backend="hf", batch=8, steps=10, warmup=2, label="eager", accels=("cpu", "gpu"),
            params={"attn": "eager"}))
def test_hf_causal_lm(accelperf: CaseRunner) -> None:
    task = TrainerTask(model=model, args=args, train_dataset=train_dataset,
                       data_collator=DataCollatorForLanguageModeling(TOKENIZER, mlm=False))
    result = accelperf.train(task)
    assert result.run.outcome == "ok"
