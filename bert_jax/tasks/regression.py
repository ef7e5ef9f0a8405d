"""The regression task: a sentence or sentence pair scored with one number (STS-B's similarity, 0 to 5), from the
same files as the sequence task; one output on the pooled vector (the sequence classifier with num_labels=1, as
transformers' *ForSequenceClassification with problem_type="regression"), trained with the squared error. Its
held-out scores: Pearson and Spearman correlation (glue_metrics, SciPy) and the mean squared error."""

from typing import Any

from absl import logging
import flax.linen as nn
import numpy as np

from bert_jax import arch as arch_lib
from bert_jax.data import finetune_data
from bert_jax.tasks import glue_metrics
from bert_jax.tasks.base import Task

SCORE = "score"  # the one output's name: labels.json, and the exported config's id2label


def _scores(examples: finetune_data.Examples, field: str) -> np.ndarray:
    values = []
    for row, label in enumerate(examples.labels):
        try:
            values.append(float(label))
        except ValueError:
            raise ValueError(f"{examples.source} (--config.{field}): row {row + 1} has the label {label!r}, not a "
                             "number; a regression reads a numeric score per row (--config.data.label_column). "
                             "Fix: the score column, or configs/finetune.py:task=sequence for classes") from None
    return np.asarray(values, np.float32)


class Regression(Task):
    name = "regression"
    description = "sequence regression"
    formats = finetune_data.FORMATS
    loss = "squared_error"
    eval_output = "logits"

    @classmethod
    def read(cls, config, tokenizer) -> "Regression":
        data = config.data
        train_examples = finetune_data.read_examples(data.train_file, data)
        labels = _scores(train_examples, "data.train_file")
        logging.info("%d training scores from %.4g to %.4g (mean %.4g)", len(labels), labels.min(), labels.max(),
                     labels.mean())
        task = cls([SCORE], finetune_data.encode_examples(tokenizer, train_examples, data.max_seq_length), labels)
        if data.eval_file:
            eval_examples = finetune_data.read_examples(data.eval_file, data, field="data.eval_file")
            task.eval_labels = _scores(eval_examples, "data.eval_file")
            task.eval_encoded = finetune_data.encode_examples(tokenizer, eval_examples, data.max_seq_length)
        return task

    @classmethod
    def head(cls, model_config, num_labels: int, encoder: str = "tuned") -> nn.Module:
        del num_labels, encoder  # one output; always "tuned" (`encoders`)
        return arch_lib.of(model_config).sequence_model(model_config, 1)

    def held_out_scores(self, outputs: np.ndarray, data) -> tuple[dict[str, float], Any]:
        """Pearson and Spearman correlation and the mean squared error of the predicted scores; the scores."""
        del data
        return correlations(outputs[:, 0], self.eval_labels), outputs[:, 0]


def correlations(predicted: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """eval_pearson and eval_spearman (glue_metrics' STS-B scores: SciPy's, 0 where a side is constant) and
    eval_mse."""
    scores = glue_metrics.scores("stsb", predicted, gold)
    return {"eval_pearson": scores["pearson"], "eval_spearman": scores["spearman"],
            "eval_mse": float(np.mean((predicted - gold) ** 2))}
