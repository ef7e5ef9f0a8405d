"""GLUE in one command: `python -m bert_jax.main --mode=glue --config=configs/glue.py --workdir=W
--config.init=CHECKPOINT --config.data_dir=glue_data` fine-tunes a checkpoint on every GLUE task (or glue.tasks),
chooses each task's learning rate on dev, and writes the table a pretrained encoder is judged by.

The protocol (configs/glue.py; the BERT paper's by default): every (task, learning rate, seed) of glue.tasks x
glue.learning_rates x glue.seeds is one normal fine-tuning run (bert_jax.finetune, with its checkpoints and resume)
in W/TASK/lr{RATE}_seed{SEED}; once it ends, its fine-tuned model is scored on the task's dev splits with GLUE's
official metrics (bert_jax.tasks.glue_metrics) and the scores are written beside it (glue_scores.json), which marks
the run finished. Rerunning the command after a crash or preemption resumes the interrupted run and skips the
finished ones. Per task the learning rate with the best median (over seeds) primary metric on dev is chosen, and its
medians are the task's row. glue.from_mnli lists tasks (ModernBERT's and MosaicBERT's RTE, MRPC, STS-B) that start
from the chosen MNLI run's fine-tuned encoder instead of --config.init.

The table (W/glue.json, W/glue.md, and the log) has the average of the primary metrics with WNLI left out and MNLI
counted twice (matched and mismatched), as the BERT paper's, beside published rows with their source and split.
glue.submission also writes the GLUE server's test-set files (W/submission/*.tsv) from each task's chosen run.
"""

import dataclasses
import json
import statistics
import time

from absl import logging
import ml_collections
import numpy as np

from bert_jax import fileio
from bert_jax import finetune
from bert_jax import job_config
from bert_jax.data import finetune_data
from bert_jax.data import glue as glue_data
from bert_jax.tasks import glue_metrics
from bert_jax.tasks import glue_published

# Beside a run's checkpoints once it is finished: {"scores": {dev split: {metric: value}}, "seconds": its wall time,
# training and scoring}.
SCORES_FILE = "glue_scores.json"
TABLE_JSON, TABLE_MARKDOWN = "glue.json", "glue.md"
SUBMISSION_DIR = "submission"
# The table's columns, the BERT paper's Table 1 order: (key as glue_metrics and the published rows name it, title,
# task, dev split). MNLI has two.
COLUMNS = (("mnli_m", "MNLI-m", "mnli", "dev_matched"), ("mnli_mm", "MNLI-mm", "mnli", "dev_mismatched"),
           ("qqp", "QQP", "qqp", "dev"), ("qnli", "QNLI", "qnli", "dev"), ("sst2", "SST-2", "sst2", "dev"),
           ("cola", "CoLA", "cola", "dev"), ("stsb", "STS-B", "stsb", "dev"), ("mrpc", "MRPC", "mrpc", "dev"),
           ("rte", "RTE", "rte", "dev"), ("wnli", "WNLI", "wnli", "dev"))


@dataclasses.dataclass(frozen=True)
class Run:
    task: str
    learning_rate: float
    seed: int

    @property
    def name(self) -> str:
        return f"lr{self.learning_rate:g}_seed{self.seed}"

    def directory(self, workdir: str) -> str:
        return fileio.join(fileio.join(workdir, self.task), self.name)


def plan(config) -> list[Run]:
    """Every run of the protocol, MNLI's first where glue.from_mnli starts other tasks from it."""
    glue = config.glue
    rates = [float(rate) for rate in finetune_data.split_names(glue.learning_rates)]
    seeds = [int(seed) for seed in finetune_data.split_names(glue.seeds)]
    names = glue_data.parse_tasks(glue.tasks)
    if glue.from_mnli:
        names = tuple(sorted(names, key=lambda name: name != "mnli"))
    return [Run(name, rate, seed) for name in names for rate in rates for seed in seeds]


def run_config(config, run: Run, init: str):
    """The fine-tuning config of one run: configs/glue.py's fields, the task's files in GLUE's layout, and the run's
    learning rate, seed and starting checkpoint."""
    task = glue_data.TASKS[run.task]
    tuned = ml_collections.ConfigDict(config.to_dict())
    del tuned["glue"], tuned["data_dir"]
    tuned.task = "regression" if task.label_names is None else "sequence"
    data = tuned.data
    data.format, data.glue_task = "glue", run.task
    data.train_file = glue_data.split_path(config.data_dir, run.task, task.train_split)
    data.eval_file = glue_data.split_path(config.data_dir, run.task, task.dev_splits[0])
    data.label_names = ",".join(task.label_names or ())
    tuned.optim.learning_rate, tuned.train.seed, tuned.init = run.learning_rate, run.seed, init
    return tuned


def _read_json(path: str):
    with fileio.open_file(path) as file:
        return json.load(file)


def _write_json(path: str, value) -> None:
    """Written whole, then renamed: a stop in the middle never leaves a half file that reads as a finished run."""
    fileio.write_json(path + ".tmp", value)
    fileio.rename(path + ".tmp", path)


def dev_scores(task: str, dev: dict, checkpoint: str, config) -> dict[str, dict[str, float]]:
    """{dev split: GLUE's metrics} of the fine-tuned model in `checkpoint` on `dev` ({split: examples})."""
    logits = finetune.predict(checkpoint, list(dev.values()), config)
    return {split: glue_metrics.scores(task, _predictions(task, split_logits), _gold(task, examples))
            for (split, examples), split_logits in zip(dev.items(), logits)}


def _predictions(task: str, logits: np.ndarray) -> np.ndarray:
    return logits[:, 0] if glue_data.TASKS[task].label_names is None else np.argmax(logits, -1)


def _gold(task: str, examples) -> np.ndarray:
    names = glue_data.TASKS[task].label_names
    if names is None:
        return np.asarray([float(label) for label in examples.labels], np.float32)
    return np.asarray([names.index(label) for label in examples.labels], np.int64)


class _Progress:
    """The run in hand out of all, its steps, and an ETA from the seconds per step of the runs trained so far."""

    def __init__(self, runs: list[Run]):
        self.total, self.seconds, self.steps = len(runs), 0.0, 0

    def start(self, index: int, run: Run, num_steps: int, steps_left: int) -> None:
        rate = self.seconds / self.steps if self.steps else None
        eta = time.strftime("%H:%M:%S", time.gmtime(rate * steps_left)) if rate else "after the first run"
        logging.info("GLUE run %d/%d: %s, learning rate %g, seed %d, %d steps; ETA of the runs left %s", index + 1,
                     self.total, run.task, run.learning_rate, run.seed, num_steps, eta)

    def finished(self, num_steps: int, seconds: float) -> None:
        self.steps += num_steps
        self.seconds += seconds


def _num_steps(config, task: str) -> int:
    """A run's steps, as train.finetuning_optimizer counts them (for the ETA; the run reads its file itself)."""
    train = config.train
    if train.num_steps:
        return train.num_steps
    count = len(glue_data.read_split(config.data_dir, task, glue_data.TASKS[task].train_split).labels)
    return int(np.ceil(train.num_epochs * count / train.batch_size))


def run_glue(config, workdir: str) -> dict:
    """Runs (or resumes) the protocol of `config` (configs/glue.py, from bert_jax.job_config.prepare) in `workdir`;
    returns the table (glue.json's content), or {} when SIGTERM stopped a run (rerun the command to resume)."""
    runs = plan(config)
    steps = {task: _num_steps(config, task) for task in dict.fromkeys(run.task for run in runs)}
    progress, results, seconds, dev = _Progress(runs), {}, {}, {}
    for index, run in enumerate(runs):
        directory = run.directory(workdir)
        scores_path = fileio.join(directory, SCORES_FILE)
        if fileio.exists(scores_path):
            record = _read_json(scores_path)
            results[run], seconds[run] = record["scores"], record["seconds"]
            logging.info("GLUE run %d/%d: %s %s finished earlier: %s", index + 1, len(runs), run.task, run.name,
                         results[run])
            continue
        progress.start(index, run, steps[run.task], sum(steps[later.task] for later in runs[index:]
                                                        if later not in results))
        init = config.init
        if run.task in finetune_data.split_names(config.glue.from_mnli) and run.task != "mnli":
            init = fileio.join(chosen(config, "mnli", results).directory(workdir), finetune.FINETUNED_SUBDIR)
        start = time.perf_counter()
        prepared = job_config.prepare(run_config(config, run, init), directory, "finetune")
        result = finetune.finetune(prepared, directory)
        if result.preempted_at_step is not None and result.preempted_at_step < steps[run.task]:
            logging.info("GLUE stopped by SIGTERM in %s %s; rerun the same command to resume", run.task, run.name)
            return {}
        progress.finished(steps[run.task], time.perf_counter() - start)
        if run.task not in dev:  # read once per task, for all its runs
            dev[run.task] = {split: glue_data.read_split(config.data_dir, run.task, split)
                             for split in glue_data.TASKS[run.task].dev_splits}
        results[run] = dev_scores(run.task, dev[run.task], fileio.join(directory, finetune.FINETUNED_SUBDIR), config)
        seconds[run] = time.perf_counter() - start
        _write_json(scores_path, {"scores": results[run], "seconds": seconds[run]})
        if index + 1 == len(runs) or runs[index + 1].task != run.task:
            for line in format_table(table(config, results, seconds))[:4]:
                logging.info("GLUE so far: %s", line)
    summary = table(config, results, seconds)
    _write_json(fileio.join(workdir, TABLE_JSON), summary)
    with fileio.open_file(fileio.join(workdir, TABLE_MARKDOWN), "w") as file:
        file.write("\n".join(markdown(summary)) + "\n")
    for line in format_table(summary):
        logging.info("GLUE: %s", line)
    if config.glue.submission:
        write_submission(config, workdir, summary)
    return summary


def _median_scores(runs_scores: list[dict]) -> dict[str, dict[str, float]]:
    return {split: {metric: statistics.median(scores[split][metric] for scores in runs_scores)
                    for metric in runs_scores[0][split]} for split in runs_scores[0]}


def _primary(task: str, scores: dict[str, dict[str, float]]) -> float:
    return scores[glue_data.TASKS[task].dev_splits[0]][glue_metrics.primary(task)]


def chosen(config, task: str, results: dict) -> Run:
    """The run of `task` whose learning rate has the best median primary metric on dev (the first such rate on a
    tie), and of its seeds the one nearest that median."""
    by_rate = {}
    for run, scores in results.items():
        if run.task == task:
            by_rate.setdefault(run.learning_rate, []).append((run, scores))
    if not by_rate:
        raise ValueError(f"no finished {task} run to choose from")
    best = max(by_rate, key=lambda rate: statistics.median(_primary(task, s) for _, s in by_rate[rate]))
    median = statistics.median(_primary(task, s) for _, s in by_rate[best])
    return min(by_rate[best], key=lambda pair: abs(_primary(task, pair[1]) - median))[0]


def table(config, results: dict, seconds: dict) -> dict:
    """glue.json: per task the chosen learning rate, its median dev scores and every run's; the average; each
    task's seconds (its runs' training and scoring, as each run measured them); the published rows; the
    protocol."""
    tasks = {}
    for task in dict.fromkeys(run.task for run in results):
        run = chosen(config, task, results)
        same = [scores for other, scores in results.items() if other.task == task
                and other.learning_rate == run.learning_rate]
        tasks[task] = {"learning_rate": run.learning_rate, "seeds": len(same), "chosen_run": run.name,
                       "dev": _median_scores(same),
                       "runs": {other.name: scores for other, scores in results.items() if other.task == task}}
    cells = {key: 100 * tasks[task]["dev"][split][glue_metrics.primary(task)]
             for key, _, task, split in COLUMNS if task in tasks}
    averaged = [key for key in cells if key != "wnli"]
    return {"model": config.init or "scratch", "split": "dev", "tasks": tasks, "cells": cells,
            "average": glue_metrics.average(cells) if averaged else None, "averaged_columns": len(averaged),
            "seconds": {task: sum(value for run, value in seconds.items() if run.task == task) for task in tasks},
            "published": [dataclasses.asdict(row) for row in glue_published.PUBLISHED_ROWS],
            "protocol": {"learning_rates": config.glue.learning_rates, "seeds": config.glue.seeds,
                         "epochs": config.train.num_epochs, "num_steps": config.train.num_steps,
                         "batch_size": config.train.batch_size, "warmup_proportion": config.optim.warmup_proportion,
                         "from_mnli": config.glue.from_mnli}}


def _published_value(values: dict, key: str):
    # A source with one MNLI column (ModernBERT's Table 5) is shown under MNLI-m.
    return values.get(key, values.get("mnli") if key == "mnli_m" else None)


def _rows(summary: dict) -> list[list[str]]:
    def cell(value):
        return "-" if value is None else f"{value:.1f}"

    rows = [["this model", "dev", *[cell(summary["cells"].get(key)) for key, *_ in COLUMNS],
             cell(summary["average"])]]
    for published in summary["published"]:
        rows.append([published["name"], published["split"],
                     *[cell(_published_value(published["values"], key)) for key, *_ in COLUMNS],
                     cell(published["average"])])
    return rows


HEADER = ["model", "split", *[title for _, title, _, _ in COLUMNS], "Avg"]


def format_table(summary: dict) -> list[str]:
    """The table as aligned text lines: the header, our row, the published rows, then how to read them."""
    rows = [HEADER, *_rows(summary)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.rjust(width) if i else cell.ljust(width) for i, (cell, width) in
                       enumerate(zip(row, widths))) for row in rows]
    lines.append(f"Avg: the mean of the columns but WNLI (MNLI's two both counted), as the BERT paper's; this "
                 f"model's over its {summary['averaged_columns']} columns")
    lines.append(_seconds_line(summary))
    lines += [f"{published['name']}: {published['source']}" for published in summary["published"]]
    return lines


def _seconds_line(summary: dict) -> str:
    return "Seconds per task (its runs, training and scoring): " + ", ".join(
        f"{task} {value:.0f}" for task, value in summary["seconds"].items())


def markdown(summary: dict) -> list[str]:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(summary)]
    lines += ["", "Metrics (x100): MNLI, QNLI, SST-2, RTE, WNLI accuracy; QQP and MRPC F1; STS-B Spearman; CoLA "
                  "Matthews correlation. Avg leaves out WNLI and counts MNLI-m and MNLI-mm, as the BERT paper's. A "
                  "test row (GLUE's server) and a dev row are not the same measurement.",
              f"This model: {summary['model']}, GLUE dev, each task's learning rate chosen on dev from "
              f"{summary['protocol']['learning_rates']} (seeds {summary['protocol']['seeds']}: the median).",
              _seconds_line(summary), ""]
    lines += [f"- {published['name']} ({published['split']}): {published['source']}"
              for published in summary["published"]]
    return lines


def write_submission(config, workdir: str, summary: dict) -> list[str]:
    """The GLUE server's files (W/submission/NAME.tsv: `index<TAB>prediction`) from each task's chosen run, and AX's
    from MNLI's. Returns their paths."""
    directory = fileio.join(workdir, SUBMISSION_DIR)
    fileio.makedirs(directory)
    written = []
    for task, row in summary["tasks"].items():
        checkpoint = fileio.join(fileio.join(fileio.join(workdir, task), row["chosen_run"]), finetune.FINETUNED_SUBDIR)
        tests = [(source, split) for source in ((task, "ax") if task == "mnli" else (task,))
                 for split in glue_data.TASKS[source].test_splits]
        example_sets = [glue_data.read_split(config.data_dir, source, split) for source, split in tests]
        names = glue_data.TASKS[task].label_names
        for (source, split), examples, logits in zip(tests, example_sets,
                                                      finetune.predict(checkpoint, example_sets, config)):
            predicted = _predictions(task, logits)
            path = fileio.join(directory, glue_data.TASKS[source].submission_files[split])
            with fileio.open_file(path, "w") as file:
                file.write("index\tprediction\n")
                for index, value in zip(examples.ids, predicted):
                    # STS-B's server takes scores in [0, 5]; the classes are written by name.
                    text = f"{min(max(float(value), 0.0), 5.0):.3f}" if names is None else names[int(value)]
                    file.write(f"{index}\t{text}\n")
            written.append(path)
    logging.info("GLUE submission files: %s", ", ".join(written))
    return written
