"""What every downstream task is: its name, the file formats it reads, its head, and what it does with the
held-out outputs. bert_jax.tasks registers the tasks; each lives in its own module of this package."""

from typing import Any, ClassVar

import flax.linen as nn
import numpy as np


class Task:
    """A task's labelled examples, tokenized, with their class names, and the behaviour that differs between tasks.

    A subclass sets the class attributes and implements `read` and `head`; it keeps the held-out data its scores
    need (the sentences, the windows) as its own fields. bert_jax.finetune runs one loop over any task, calling only
    what this class declares.
    """
    name: ClassVar[str]  # the one name: configs/finetune.py:task=NAME, WORKDIR/finetuned/task.json, --task=NAME
    description: ClassVar[str]  # what the head does, for log lines
    formats: ClassVar[tuple[str, ...]]  # the data.format values (file formats) this task reads
    # train.encoder values this task's head takes (see bert_jax.model.TOKEN_ENCODERS)
    encoders: ClassVar[tuple[str, ...]] = ("tuned",)
    # The training loss (bert_jax.steps.LOSSES): cross-entropy over the classes, or "squared_error" of one output.
    loss: ClassVar[str] = "cross_entropy"
    # What the held-out scores are computed from: "labels" (each position's most likely label, int32), "logits"
    # (float32) or None (no scores beyond the loop's eval loss and accuracy).
    eval_output: ClassVar[str | None] = None

    def __init__(self, names: list[str], train_encoded: dict, train_labels: np.ndarray,
                 eval_encoded: dict | None = None, eval_labels: np.ndarray | None = None):
        self.names = names  # class (tag) names in id order
        self.train_encoded = train_encoded
        self.train_labels = train_labels
        self.eval_encoded = eval_encoded
        self.eval_labels = eval_labels

    @classmethod
    def read(cls, config, tokenizer) -> "Task":
        """The task's examples from config.data's files, tokenized and labelled."""
        raise NotImplementedError

    @classmethod
    def head(cls, model_config, num_labels: int, encoder: str = "tuned") -> nn.Module:
        """The model with this task's head over `num_labels` classes; `encoder` (train.encoder) picks its inputs.
        `model_config` is any architecture's config (bert_jax.arch), whose architecture builds the model: the task
        chooses which of its task models."""
        raise NotImplementedError

    def model(self, model_config, encoder: str = "tuned") -> nn.Module:
        return self.head(model_config, len(self.names), encoder)

    def held_out_scores(self, outputs: np.ndarray, data) -> tuple[dict[str, float], Any]:
        """(scores, predictions) from the held-out rows' `eval_output`s, in row order; ({}, None) by default."""
        del outputs, data
        return {}, None

    def write_predictions(self, workdir: str, predicted) -> None:
        """Writes `held_out_scores`' predictions under `workdir`; nothing by default."""
        del workdir, predicted
