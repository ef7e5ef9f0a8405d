"""The qa task: extractive question answering from SQuAD v1.1 / v2.0 JSON, rows of [CLS] question [SEP] passage [SEP]
(windows of a long passage), labels [rows, 2] (the answer's first and last piece; both 0, [CLS], where the window
holds none); start and end scores on every token. Held out: exact match and F1, and the answers in
WORKDIR/predictions.json (the official format), with the n best of each and, for v2.0, the null odds."""

from typing import Any

from absl import logging
import flax.linen as nn
import numpy as np

from bert_jax import arch as arch_lib
from bert_jax import fileio
from bert_jax.data import squad
from bert_jax.tasks.base import Task

PREDICTIONS_FILE = "predictions.json"  # {question id: answer}, the official format
NBEST_FILE = "nbest_predictions.json"
NULL_ODDS_FILE = "null_odds.json"


class QuestionAnswering(Task):
    name = "qa"
    description = "question answering"
    formats = ("squad",)
    eval_output = "logits"

    def __init__(self, *args, eval_examples: list[squad.Example] | None = None,
                 eval_windows: squad.Windows | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples  # the held-out questions
        self.eval_windows = eval_windows  # which question and passage pieces each held-out row holds

    @classmethod
    def read(cls, config, tokenizer) -> "QuestionAnswering":
        data = config.data

        def read(path, field):
            examples = squad.read_squad(path, field, training=field == "data.train_file")
            unanswerable = sum(example.is_impossible for example in examples)
            if unanswerable and not data.version_2_with_negative:
                raise ValueError(f"--config.{field}={path} has {unanswerable} questions without an answer (SQuAD "
                                 "v2.0). Fix: --config.data.version_2_with_negative=True")
            windows = squad.encode(tokenizer, examples, data.max_seq_length, data.doc_stride, data.max_query_length)
            logging.info("%s: %d questions in %d windows of data.max_seq_length=%d", path, len(examples),
                         len(windows.example), data.max_seq_length)
            return examples, windows, np.stack([windows.start_positions, windows.end_positions], -1).astype(np.int32)

        _, windows, labels = read(data.train_file, "data.train_file")
        task = cls([], windows.arrays(), labels)
        if data.eval_file:
            task.eval_examples, task.eval_windows, task.eval_labels = read(data.eval_file, "data.eval_file")
            task.eval_encoded = task.eval_windows.arrays()
        return task

    @classmethod
    def head(cls, model_config, num_labels: int, encoder: str = "tuned") -> nn.Module:
        del num_labels, encoder  # a start and an end score; always "tuned" (`encoders`)
        return arch_lib.of(model_config).qa_model(model_config)

    def held_out_scores(self, outputs: np.ndarray, data) -> tuple[dict[str, float], Any]:
        """From the start and end scores: exact match, F1; squad.predict's answers, n best and null odds."""
        predicted = squad.predict(self.eval_examples, self.eval_windows, outputs[:, 0], outputs[:, 1],
                                  data.n_best_size, data.max_answer_length, data.version_2_with_negative,
                                  data.null_score_diff_threshold)
        return answer_scores(self.eval_examples, predicted[0]), predicted

    def write_predictions(self, workdir: str, predicted) -> None:
        answers, nbest, null_odds = predicted
        path = fileio.join(workdir, PREDICTIONS_FILE)
        squad.write_predictions(path, answers)
        fileio.write_json(fileio.join(workdir, NBEST_FILE), nbest)
        if null_odds:
            fileio.write_json(fileio.join(workdir, NULL_ODDS_FILE), null_odds)
        logging.info("held-out answers written to %s (and the n best of each to %s)", path, NBEST_FILE)


def answer_scores(examples, answers) -> dict[str, float]:
    """Exact match and F1 (fractions) with the official SQuAD normalisation, the best over each question's answers."""
    scores = squad.evaluate(examples, answers)
    return {"eval_exact_match": float(scores["exact_match"]), "eval_f1": float(scores["f1"])}
