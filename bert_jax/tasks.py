"""The downstream tasks bert_jax fine-tunes for, and what differs between them: how examples are read and labelled,
which head the model has, and how held-out predictions are scored and written.

- sequence: sentence / sentence-pair classification (CSV/TSV/TFDS; labels [rows]);
- tokens: token classification from CoNLL files (labels [rows, length], conll.IGNORE where nothing is scored);
- qa: extractive question answering from SQuAD JSON (labels [rows, 2]: the answer's first and last piece).

bert_jax.finetune runs the one training loop over any of them.
"""

import dataclasses
from typing import Any

from absl import logging
import flax.linen as nn
import numpy as np

from bert_jax import fileio
from bert_jax import model as model_lib
from bert_jax.data import conll
from bert_jax.data import finetune_data
from bert_jax.data import squad

KINDS = ("sequence", "tokens", "qa")
PREDICTIONS_FILE = "eval_predictions.txt"  # tagging: WORKDIR/eval_predictions.txt, data.eval_file's layout
QA_PREDICTIONS_FILE = "predictions.json"  # question answering: {question id: answer}, the official format


@dataclasses.dataclass
class Task:
    """The labelled examples, tokenized, with their class names: sentences' classes (labels [rows]), or, for CoNLL
    files, words' tags (labels [rows, length], conll.IGNORE where nothing is scored)."""
    names: list[str]  # class (tag) names in id order
    train_encoded: dict
    train_labels: np.ndarray
    eval_encoded: dict | None = None
    eval_labels: np.ndarray | None = None
    eval_sentences: list[conll.Sentence] | None = None  # tagging: the held-out sentences, for entity scores
    eval_rows: conll.Rows | None = None  # tagging: which words each held-out row holds
    kind: str = "sequence"  # one of KINDS; "qa": labels [rows, 2] (answer start, end piece; 0: no answer)
    eval_examples: list[squad.Example] | None = None  # qa: the held-out questions
    eval_windows: squad.Windows | None = None  # qa: which question and passage pieces each held-out row holds

    @property
    def tagging(self) -> bool:
        return self.kind == "tokens"


def read_task(config, tokenizer) -> Task:
    data = config.data
    if data.format == "conll":
        return _read_tagging_task(config, tokenizer)
    if data.format == "squad":
        return _read_qa_task(config, tokenizer)
    train_examples = finetune_data.read_examples(data.train_file, data)
    names = finetune_data.label_names(train_examples, data)
    logging.info("%d classes (id: name): %s", len(names), ", ".join(f"{i}: {n}" for i, n in enumerate(names)))
    task = Task(names, finetune_data.encode_examples(tokenizer, train_examples, data.max_seq_length),
                 finetune_data.label_ids(train_examples, names))
    if data.eval_file:
        eval_examples = finetune_data.read_examples(data.eval_file, data, field="data.eval_file")
        task.eval_labels = finetune_data.label_ids(eval_examples, names)
        task.eval_encoded = finetune_data.encode_examples(tokenizer, eval_examples, data.max_seq_length)
    return task


def _read_tagging_task(config, tokenizer) -> Task:
    data = config.data
    train_sentences = conll.read_conll(data.train_file)
    tags = sorted({tag for sentence in train_sentences for tag in sentence.tags})
    names = finetune_data.split_names(data.label_names) or tags
    if set(tags) - set(names):
        raise ValueError(f"--config.data.train_file={data.train_file} has tags {sorted(set(tags) - set(names))} that "
                         f"--config.data.label_names={data.label_names!r} does not name. Fix: name every tag, or "
                         "leave label_names empty (the training file's tags, sorted)")
    logging.info("%d tags (id: name): %s", len(names), ", ".join(f"{i}: {n}" for i, n in enumerate(names)))
    ids = {name: index for index, name in enumerate(names)}
    rows = conll.encode(tokenizer, train_sentences, ids, data.max_seq_length)
    logging.info("%d training sentences in %d rows of data.max_seq_length=%d", len(train_sentences),
                 len(rows.labels), data.max_seq_length)
    task = Task(names, rows.arrays(), rows.labels, kind="tokens")
    if data.eval_file:
        sentences = conll.read_conll(data.eval_file, field="data.eval_file")
        unknown = sorted({tag for sentence in sentences for tag in sentence.tags} - set(names))
        if unknown:
            raise ValueError(f"--config.data.eval_file={data.eval_file} has tags {unknown} that the training file "
                             f"{data.train_file} never uses: the two files' tag sets differ. Fix: files of one tag "
                             "set (IOB1 or IOB2 alike), or name every tag in --config.data.label_names")
        task.eval_rows = conll.encode(tokenizer, sentences, ids, data.max_seq_length)
        task.eval_encoded, task.eval_labels = task.eval_rows.arrays(), task.eval_rows.labels
        task.eval_sentences = sentences
    return task


def _read_qa_task(config, tokenizer) -> Task:
    """SQuAD questions as windows of [CLS] question [SEP] passage [SEP], labelled with the answer's first and last
    piece (both 0, [CLS], where the window holds no answer)."""
    data = config.data

    def read(path, field):
        examples = squad.read_squad(path, field, training=field == "data.train_file")
        unanswerable = sum(example.is_impossible for example in examples)
        if unanswerable and not data.version_2_with_negative:
            raise ValueError(f"--config.{field}={path} has {unanswerable} questions without an answer (SQuAD v2.0). "
                             "Fix: --config.data.version_2_with_negative=True")
        windows = squad.encode(tokenizer, examples, data.max_seq_length, data.doc_stride, data.max_query_length)
        logging.info("%s: %d questions in %d windows of data.max_seq_length=%d", path, len(examples),
                     len(windows.example), data.max_seq_length)
        return examples, windows, np.stack([windows.start_positions, windows.end_positions], -1).astype(np.int32)

    _, windows, labels = read(data.train_file, "data.train_file")
    task = Task([], windows.arrays(), labels, kind="qa")
    if data.eval_file:
        task.eval_examples, task.eval_windows, task.eval_labels = read(data.eval_file, "data.eval_file")
        task.eval_encoded = task.eval_windows.arrays()
    return task


def task_model(task: Task, model_config: model_lib.BertConfig, encoder: str = "tuned") -> nn.Module:
    """The model for the task's head; `encoder` (train.encoder) picks a token head's inputs."""
    if task.kind == "qa":
        return model_lib.BertForQuestionAnswering(model_config)
    if task.kind == "tokens":
        return model_lib.BertForTokenClassification(model_config, len(task.names), encoder=encoder)
    return model_lib.BertForSequenceClassification(model_config, len(task.names))


def held_out_scores(task: Task, outputs: np.ndarray, data) -> tuple[dict[str, float], Any]:
    """(scores, predictions) from the held-out rows' outputs, in row order: for tagging, the most likely tag of each
    position (entity precision, recall, F1; the tags per sentence and word); for question answering, the start and
    end scores (exact match, F1; squad.predict's answers, n best and null odds). Other tasks: ({}, None)."""
    if task.tagging:
        per_word = conll.words_of_rows(task.eval_rows, task.eval_sentences, outputs)
        predicted = [[task.names[label] for label in labels] for labels in per_word]
        return _entity_scores(task.eval_sentences, predicted), predicted
    if task.kind == "qa":
        predicted = squad.predict(task.eval_examples, task.eval_windows, outputs[:, 0], outputs[:, 1],
                                  data.n_best_size, data.max_answer_length, data.version_2_with_negative,
                                  data.null_score_diff_threshold)
        return _answer_scores(task.eval_examples, predicted[0]), predicted
    return {}, None


def write_predictions(workdir: str, task: Task, predicted) -> None:
    if task.tagging:
        path = fileio.join(workdir, PREDICTIONS_FILE)
        conll.write_predictions(path, task.eval_sentences, predicted)
        logging.info("held-out predictions (token, gold tag, predicted tag) written to %s", path)
        return
    answers, nbest, null_odds = predicted
    path = fileio.join(workdir, QA_PREDICTIONS_FILE)
    squad.write_predictions(path, answers)
    fileio.write_json(fileio.join(workdir, "nbest_predictions.json"), nbest)
    if null_odds:
        fileio.write_json(fileio.join(workdir, "null_odds.json"), null_odds)
    logging.info("held-out answers written to %s (and the n best of each to nbest_predictions.json)", path)


def _answer_scores(examples, answers) -> dict[str, float]:
    """Exact match and F1 (fractions) with the official SQuAD normalisation, the best over each question's answers."""
    scores = squad.evaluate(examples, answers)
    return {"eval_exact_match": float(scores["exact_match"]), "eval_f1": float(scores["f1"])}


def _entity_scores(sentences: list[conll.Sentence], predicted: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 as CoNLL's conlleval counts them (an entity counts only with its exact
    span and type), by seqeval, over IOB2 forms of both tag sequences."""
    from seqeval import metrics as seqeval_metrics  # pylint: disable=import-outside-toplevel
    gold = [conll.to_iob2(sentence.tags) for sentence in sentences]
    guess = [conll.to_iob2(tags) for tags in predicted]
    return {"eval_precision": float(seqeval_metrics.precision_score(gold, guess, zero_division=0)),
            "eval_recall": float(seqeval_metrics.recall_score(gold, guess, zero_division=0)),
            "eval_f1": float(seqeval_metrics.f1_score(gold, guess, zero_division=0))}
