"""--mode=glue end to end on two tiny tasks in GLUE's own layout (SST-2, and STS-B as regression) with a two-value
learning-rate grid: the table, its files and the submission; killed in the middle and rerun, it finishes only what
was missing, and the table equals an uninterrupted run's."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax import glue
from bert_jax import job_config
from bert_jax.data import glue as glue_data
from bert_jax.data import tokenization
from bert_jax.data import vocabulary
from configs import glue as glue_configs
from tests import helpers

FILLER = "the a movie film plot was is and but this that with it".split()


def _sentiment(rng, count):
    """SST-2 rows: the label is whether the sentence holds "great" (else "awful")."""
    rows = []
    for _ in range(count):
        label = int(rng.integers(2))
        words = list(rng.choice(FILLER, size=int(rng.integers(3, 8))))
        words.insert(int(rng.integers(len(words) + 1)), "great" if label else "awful")
        rows.append((" ".join(words), str(label)))
    return rows


def _similarity(rng, count):
    """STS-B rows: the score is 1.25 x the times "same" appears in the pair."""
    rows = []
    for _ in range(count):
        marks = rng.integers(0, 3, size=2)
        texts = []
        for mark in marks:
            words = list(rng.choice(FILLER, size=int(rng.integers(3, 7))))
            words[:0] = ["same"] * int(mark)
            texts.append(" ".join(words))
        rows.append((*texts, f"{1.25 * marks.sum():.2f}"))
    return rows


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    rng = np.random.default_rng(0)
    data_dir = str(root / "glue_data")
    splits = {"sst2": (_sentiment(rng, 256), _sentiment(rng, 64)), "stsb": (_similarity(rng, 256),
                                                                              _similarity(rng, 64))}
    for task, (train, dev) in splits.items():
        glue_data.write_split(data_dir, task, "train", train)
        glue_data.write_split(data_dir, task, "dev", dev)
        glue_data.write_split(data_dir, task, "test", [(str(i), *row[:-1]) for i, row in enumerate(dev[:10])])
    texts = [text for train, dev in splits.values() for row in train + dev for text in row[:-1]]
    vocab = vocabulary.train_wordpiece(texts, vocab_size=60, output_dir=str(root / "vocab"), min_frequency=1)
    return {"data_dir": data_dir, "vocab": str(root / "vocab"), "rows": tokenization.padded_vocab_size(
        vocab.vocab_size)}


def _flags(glue_dir):
    return {"data_dir": glue_dir["data_dir"], "glue.tasks": "sst2,stsb", "glue.learning_rates": "1e-3,3e-4",
            "glue.submission": True, "data.vocab_file": glue_dir["vocab"], "data.max_seq_length": 24,
            "model.vocab_size": glue_dir["rows"], "model.max_position_embeddings": 32, "model.dropout_rate": 0.0,
            "model.attention_dropout_rate": 0.0, "train.num_steps": 40, "train.log_every": 10,
            "checkpoint.every_steps": 5}


def _config(glue_dir):
    config = glue_configs.get_config("size=tiny")
    for name, value in _flags(glue_dir).items():
        section, _, field = name.rpartition(".")
        (config[section] if section else config)[field] = value
    return config


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def uninterrupted(glue_dir, tmp_path_factory):
    """The command run once, start to end (both tests read it: tests/xdist_scheduling.py keeps them on one
    worker), with its log lines."""
    workdir = str(tmp_path_factory.mktemp("uninterrupted") / "glue")
    handler, root = _Lines(), logging.getLogger()
    level, root.level = root.level, logging.INFO
    root.addHandler(handler)
    try:
        summary = glue.run_glue(job_config.prepare(_config(glue_dir), workdir, "glue"), workdir)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return workdir, summary, "\n".join(handler.lines)


def test_glue_runs_every_task_and_grid_point_and_writes_the_table(uninterrupted):
    workdir, summary, log = uninterrupted
    assert sorted(os.listdir(workdir)) == ["glue.json", "glue.md", "sst2", "stsb", "submission"]
    assert sorted(os.listdir(os.path.join(workdir, "sst2"))) == ["lr0.0003_seed0", "lr0.001_seed0"]
    assert "GLUE run 1/4: sst2, learning rate 0.001, seed 0, 40 steps; ETA of the runs left after the first run" in log
    assert "GLUE run 2/4: sst2, learning rate 0.0003, seed 0, 40 steps; ETA of the runs left 00:" in log
    # Both tasks learn (chance: 0.5 accuracy, 0 correlation), and each keeps its better learning rate on dev.
    for task, metric, floor in (("sst2", "accuracy", 0.9), ("stsb", "spearman", 0.8)):
        row = summary["tasks"][task]
        best = max(row["runs"].values(), key=lambda scores: scores["dev"][metric])
        assert row["dev"] == best and row["dev"]["dev"][metric] >= floor, row
    assert summary["cells"] == {"sst2": 100 * summary["tasks"]["sst2"]["dev"]["dev"]["accuracy"],
                                "stsb": 100 * summary["tasks"]["stsb"]["dev"]["dev"]["spearman"]}
    assert summary["average"] == pytest.approx(sum(summary["cells"].values()) / 2)
    assert json.load(open(os.path.join(workdir, "glue.json"), encoding="utf-8")) == summary
    table = glue.format_table(summary)
    assert table[0].split() == ["model", "split", "MNLI-m", "MNLI-mm", "QQP", "QNLI", "SST-2", "CoLA", "STS-B",
                                "MRPC", "RTE", "WNLI", "Avg"]
    assert table[1].split()[:4] == ["this", "model", "dev", "-"]
    assert table[2].split() == ["BERT-base", "test", "84.6", "83.4", "71.2", "90.5", "93.5", "52.1", "85.8", "88.9",
                                "66.4", "-", "79.6"]
    markdown = open(os.path.join(workdir, "glue.md"), encoding="utf-8").read()
    assert "| ModernBERT-base | dev | 89.1 | - | 92.1 | 93.9 | 96.0 | 65.1 | 91.8 | 92.2 | 87.4 | - | 88.4 |" in markdown
    # The GLUE server's files, from each task's chosen run.
    sst2 = open(os.path.join(workdir, "submission", "SST-2.tsv"), encoding="utf-8").read().splitlines()
    assert sst2[0] == "index\tprediction" and [line.split("\t")[0] for line in sst2[1:]] == [str(i) for i in range(10)]
    assert {line.split("\t")[1] for line in sst2[1:]} <= {"0", "1"}
    stsb = [float(line.split("\t")[1]) for line in
            open(os.path.join(workdir, "submission", "STS-B.tsv"), encoding="utf-8").read().splitlines()[1:]]
    assert len(stsb) == 10 and all(0.0 <= score <= 5.0 for score in stsb)


@pytest.mark.slow  # a driver subprocess killed in its second run, then the rerun
def test_killed_in_the_middle_then_rerun_finishes_only_what_was_missing_with_the_same_table(glue_dir, uninterrupted,
                                                                                               tmp_path, caplog):
    """SST-2 alone, killed in its second run and rerun: its table is the uninterrupted run's SST-2 part (a task's
    runs do not depend on the others')."""
    _, expected, _ = uninterrupted
    config = _config(glue_dir)
    config.glue.tasks, config.glue.submission = "sst2", False

    workdir = str(tmp_path / "interrupted")
    flags = [f"--config.{name}={value}" for name, value in _flags(glue_dir).items()]
    flags += ["--config.glue.tasks=sst2", "--config.glue.submission=False"]
    command = [sys.executable, "-m", "bert_jax.main", "--mode=glue", f"--config={helpers.ROOT}/configs/glue.py:size=tiny",
               f"--workdir={workdir}", *flags]
    process = subprocess.Popen(command, cwd=helpers.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    second = os.path.join(workdir, "sst2", "lr0.0003_seed0")
    try:
        deadline = time.time() + 240
        while not os.path.isdir(os.path.join(second, "checkpoints", "5")) and process.poll() is None:
            assert time.time() < deadline, "the second run never saved a checkpoint"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    assert os.path.exists(os.path.join(workdir, "sst2", "lr0.001_seed0", glue.SCORES_FILE))
    assert not os.path.exists(os.path.join(second, glue.SCORES_FILE)), "the kill came after the second run ended"

    with caplog.at_level(logging.INFO):
        summary = glue.run_glue(job_config.prepare(config, workdir, "glue"), workdir)
    assert "GLUE run 1/2: sst2 lr0.001_seed0 finished earlier" in caplog.text
    assert "resumed from" in caplog.text  # the second run went on from its checkpoint, not from the start
    assert summary["tasks"] == {"sst2": expected["tasks"]["sst2"]}
    assert summary["cells"] == {"sst2": expected["cells"]["sst2"]}
