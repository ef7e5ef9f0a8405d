"""The sequence task: sentence / sentence-pair classification from CSV/TSV/.txt files or a TFDS dataset (a GLUE task,
say), labels [rows]; a classifier on the pooled [CLS] vector. Its held-out score is the loop's eval accuracy."""

from absl import logging
import flax.linen as nn

from bert_jax import arch as arch_lib
from bert_jax.data import finetune_data
from bert_jax.tasks.base import Task


class SequenceClassification(Task):
    name = "sequence"
    description = "sequence classification"
    formats = finetune_data.FORMATS

    @classmethod
    def read(cls, config, tokenizer) -> "SequenceClassification":
        data = config.data
        train_examples = finetune_data.read_examples(data.train_file, data)
        names = finetune_data.label_names(train_examples, data)
        logging.info("%d classes (id: name): %s", len(names), ", ".join(f"{i}: {n}" for i, n in enumerate(names)))
        task = cls(names, finetune_data.encode_examples(tokenizer, train_examples, data.max_seq_length),
                   finetune_data.label_ids(train_examples, names))
        if data.eval_file:
            eval_examples = finetune_data.read_examples(data.eval_file, data, field="data.eval_file")
            task.eval_labels = finetune_data.label_ids(eval_examples, names)
            task.eval_encoded = finetune_data.encode_examples(tokenizer, eval_examples, data.max_seq_length)
        return task

    @classmethod
    def head(cls, model_config, num_labels: int, encoder: str = "tuned") -> nn.Module:
        del encoder  # always "tuned" (`encoders`)
        return arch_lib.of(model_config).sequence_model(model_config, num_labels)
