"""transformers' language-modelling example (``examples/pytorch/language-modeling/
run_clm.py``) under the gate, its parts taken as the script writes them:

* the model from scratch: ``CONFIG_MAPPING[model_type]()``, ``config.update_from_string(
  config_overrides)``, ``AutoModelForCausalLM.from_config(config)`` (``--model_type gpt2
  --config_overrides n_embd=64,n_layer=2,n_head=2,...``);
* the data: texts tokenized, then ``group_texts`` (concatenated, cut into blocks, labels a
  copy of the inputs), ``default_data_collator``;
* ``TrainingArguments`` parsed from the command line by ``HfArgumentParser``, as the script
  parses them (``--output_dir``, ``--do_train``, ``--per_device_train_batch_size``,
  ``--bf16``, ...).

Nothing is downloaded: the texts are synthetic and the tokenizer is a byte-level BPE
trained here on them (the script loads a pretrained one). ``ACCELPERF_HF_PLANT`` plants a
regression users hit (none when unset):

* ``checkpointing``: ``--gradient_checkpointing True``;
* ``eager``: ``from_config(config, attn_implementation="eager")`` in place of SDPA;
* ``bf16_off``: the command line without ``--bf16 True`` (precision off).
"""

from __future__ import annotations

import os
import random
from itertools import chain

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import (
    CONFIG_MAPPING,
    AutoModelForCausalLM,
    HfArgumentParser,
    PreTrainedTokenizerFast,
    TrainingArguments,
    default_data_collator,
)

from pytest_accelperf import Case, CaseRunner, cases
from pytest_accelperf.hf import TrainerTask

PLANT = os.environ.get("ACCELPERF_HF_PLANT", "none")
BLOCK = 128
CONFIG_OVERRIDES = f"n_embd=64,n_layer=2,n_head=2,n_positions={BLOCK},vocab_size=512"


def texts(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
             for _ in range(2000)]
    return [" ".join(rng.choices(words, k=rng.randint(30, 200))) for _ in range(n)]


def tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(texts(), trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


TOKENIZER = tokenizer()


def group_texts(examples):
    # run_clm.py's, as written (block_size = BLOCK)
    concatenated_examples = {k: list(chain(*examples[k])) for k in examples}
    total_length = len(concatenated_examples[list(examples.keys())[0]])  # noqa: RUF015
    total_length = (total_length // BLOCK) * BLOCK
    result = {
        k: [t[i : i + BLOCK] for i in range(0, total_length, BLOCK)]
        for k, t in concatenated_examples.items()
    }
    result["labels"] = result["input_ids"].copy()
    return result


def lm_dataset(case: Case) -> list[dict[str, list[int]]]:
    tokenized = dict(TOKENIZER(texts()))
    grouped = group_texts(tokenized)
    return [dict(zip(grouped, row, strict=True)) for row in zip(*grouped.values(), strict=True)]


def model(case: Case):
    config = CONFIG_MAPPING["gpt2"]()
    config.update_from_string(CONFIG_OVERRIDES)
    if PLANT == "eager":
        return AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return AutoModelForCausalLM.from_config(config)


def training_args(case: Case) -> TrainingArguments:
    argv = ["--output_dir", "/tmp/clm-out", "--do_train",
            "--per_device_train_batch_size", str(case.batch), "--learning_rate", "5e-4",
            "--warmup_steps", "2", "--lr_scheduler_type", "cosine", "--weight_decay", "0.01",
            "--use_cpu", "True"]  # bf16 on a CPU: transformers asks for use_cpu
    if PLANT != "bf16_off":
        argv += ["--bf16", "True"]
    if PLANT == "checkpointing":
        argv += ["--gradient_checkpointing", "True"]
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(argv)
    return args


@cases(backend="hf", batch=[8], steps=10, warmup=2)
def test_run_clm(accelperf: CaseRunner) -> None:
    task = TrainerTask(model=model, args=training_args, train_dataset=lm_dataset,
                       data_collator=default_data_collator, processing_class=TOKENIZER)
    assert accelperf.train(task).run.outcome == "ok"
