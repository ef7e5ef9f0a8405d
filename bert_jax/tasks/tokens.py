"""The tokens task: token classification (NER, say) from CoNLL files, labels [rows, length] (conll.IGNORE where
nothing is scored: [CLS], [SEP], a word's later pieces, padding); a classifier on every token's vector. Held out:
entity precision, recall and F1 as conlleval counts them, and the predicted tags in WORKDIR/eval_predictions.txt."""

from typing import Any

from absl import logging
import flax.linen as nn
import numpy as np

from bert_jax import arch as arch_lib
from bert_jax import fileio
from bert_jax import model as model_lib
from bert_jax.data import conll
from bert_jax.data import finetune_data
from bert_jax.tasks.base import Task

PREDICTIONS_FILE = "eval_predictions.txt"  # WORKDIR/eval_predictions.txt, data.eval_file's layout


class TokenClassification(Task):
    name = "tokens"
    description = "token classification"
    formats = ("conll",)
    encoders = model_lib.TOKEN_ENCODERS
    eval_output = "labels"

    def __init__(self, *args, eval_sentences: list[conll.Sentence] | None = None,
                 eval_rows: conll.Rows | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_sentences = eval_sentences  # the held-out sentences, for entity scores
        self.eval_rows = eval_rows  # which words each held-out row holds

    @classmethod
    def read(cls, config, tokenizer) -> "TokenClassification":
        data = config.data
        train_sentences = conll.read_conll(data.train_file)
        tags = sorted({tag for sentence in train_sentences for tag in sentence.tags})
        names = finetune_data.split_names(data.label_names) or tags
        if set(tags) - set(names):
            raise ValueError(f"--config.data.train_file={data.train_file} has tags {sorted(set(tags) - set(names))} "
                             f"that --config.data.label_names={data.label_names!r} does not name. Fix: name every "
                             "tag, or leave label_names empty (the training file's tags, sorted)")
        logging.info("%d tags (id: name): %s", len(names), ", ".join(f"{i}: {n}" for i, n in enumerate(names)))
        ids = {name: index for index, name in enumerate(names)}
        rows = conll.encode(tokenizer, train_sentences, ids, data.max_seq_length)
        logging.info("%d training sentences in %d rows of data.max_seq_length=%d", len(train_sentences),
                     len(rows.labels), data.max_seq_length)
        task = cls(names, rows.arrays(), rows.labels)
        if data.eval_file:
            sentences = conll.read_conll(data.eval_file, field="data.eval_file")
            unknown = sorted({tag for sentence in sentences for tag in sentence.tags} - set(names))
            if unknown:
                raise ValueError(f"--config.data.eval_file={data.eval_file} has tags {unknown} that the training "
                                 f"file {data.train_file} never uses: the two files' tag sets differ. Fix: files of "
                                 "one tag set (IOB1 or IOB2 alike), or name every tag in --config.data.label_names")
            task.eval_rows = conll.encode(tokenizer, sentences, ids, data.max_seq_length)
            task.eval_encoded, task.eval_labels = task.eval_rows.arrays(), task.eval_rows.labels
            task.eval_sentences = sentences
        return task

    @classmethod
    def head(cls, model_config, num_labels: int, encoder: str = "tuned") -> nn.Module:
        return arch_lib.of(model_config).token_model(model_config, num_labels, encoder)

    def held_out_scores(self, outputs: np.ndarray, data) -> tuple[dict[str, float], Any]:
        """From the most likely tag of each position: entity precision, recall, F1; the tags per sentence and word."""
        del data
        per_word = conll.words_of_rows(self.eval_rows, self.eval_sentences, outputs)
        predicted = [[self.names[label] for label in labels] for labels in per_word]
        return entity_scores(self.eval_sentences, predicted), predicted

    def write_predictions(self, workdir: str, predicted) -> None:
        path = fileio.join(workdir, PREDICTIONS_FILE)
        conll.write_predictions(path, self.eval_sentences, predicted)
        logging.info("held-out predictions (token, gold tag, predicted tag) written to %s", path)


def entity_scores(sentences: list[conll.Sentence], predicted: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 as CoNLL's conlleval counts them (an entity counts only with its exact
    span and type), by seqeval, over IOB2 forms of both tag sequences."""
    from seqeval import metrics as seqeval_metrics  # pylint: disable=import-outside-toplevel
    gold = [conll.to_iob2(sentence.tags) for sentence in sentences]
    guess = [conll.to_iob2(tags) for tags in predicted]
    return {"eval_precision": float(seqeval_metrics.precision_score(gold, guess, zero_division=0)),
            "eval_recall": float(seqeval_metrics.recall_score(gold, guess, zero_division=0)),
            "eval_f1": float(seqeval_metrics.f1_score(gold, guess, zero_division=0))}
