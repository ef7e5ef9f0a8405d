"""Fine-tuning (sentence / sentence-pair classification, token classification, extractive question answering) and
feature extraction, from any checkpoint of any architecture bert_jax.arch registers.

`finetune(config, workdir)` trains the task's model (bert_jax.tasks: which examples, labels, head and held-out
scores) with its cross-entropy loss on the loop pretraining runs (bert_jax.loop), with the same guarantees: periodic
asynchronous checkpoints in WORKDIR/checkpoints (config.checkpoint), resume after a crash or SIGTERM exactly where it
stopped (parameters, optimizer state, dropout key and input position), integrity checks and set-aside, judged and
verified checkpoints, rewinds. It reports train loss/accuracy and the held-out scores to the log,
WORKDIR/metrics.jsonl and TensorBoard, writes the held-out predictions, and saves the final parameters
(checkpoint.save_params) to WORKDIR/finetuned/state (the layout of a pretraining checkpoint step, so
`checkpoint.restore_params` and `--config.init` read it back on any mesh), beside task.json (the head),
labels.json (class names in id order), model_config.json and the tokenizer.

`extract_features(config, workdir)` writes one embedding per input text, in input order, to a .npy file.

Both take a config from `bert_jax.job_config.prepare` and start from `config.init`: a bert_jax checkpoint
(pretraining or fine-tuned) or, through `bert_jax.interop.pretrained.load_pretrained`, a HuggingFace / original-TF
checkpoint or a Flax export, whose architecture (and tokenizer, unless data.vocab_file is set) `prepare` gave the
config. Only the parameters the task model shares with the pretraining model are read (the architecture's
is_pretrained_parameter, bert_jax.arch: for BERT the encoder and pooler); the head always starts fresh. The job is
built as pretraining's: train.finetuning_setup, the steps of bert_jax.steps, one loop (bert_jax.loop), one
--config.init loader (bert_jax.interop.pretrained.init_params) and the checkpoint module's save.
Examples are held in memory as numpy arrays (GLUE-sized data fits easily) and every process reads them all,
then feeds its own rows of each global batch.
"""

import dataclasses
import json
import os
from typing import Any

from absl import logging
import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import arch as arch_lib
from bert_jax import checkpoint as checkpoint_lib
from bert_jax import divergence
from bert_jax import fileio
from bert_jax import loop
from bert_jax import sharding as sharding_lib
from bert_jax import tasks
from bert_jax.data import finetune_data
from bert_jax.data import tokenization
from bert_jax.interop import export
from bert_jax.interop import init_architecture
from bert_jax.interop import pretrained
from bert_jax.loop import TrainResult
from bert_jax.steps import (make_classification_eval_step, make_classification_train_step, make_features_step,
                            make_logits_step, make_predict_step)
from bert_jax.train import Setup, TrainState, finetuning_setup, inference_setup, sum_over_batches

FINETUNED_SUBDIR = "finetuned"
LABELS_FILE = "labels.json"
TASK_FILE = "task.json"  # beside labels.json: {"task": one of tasks.NAMES, "encoder": train.encoder}, the head


# Model and parameters: from scratch, or from --config.init (bert_jax.interop.pretrained.init_params).

@dataclasses.dataclass
class ModelSource:
    """The architecture to build, and where its pretrained parameters come from."""
    model_config: Any  # the architecture's config (bert_jax.arch)
    description: str = "scratch"


def model_source(config) -> ModelSource:
    """The model to build: config.model, which bert_jax.job_config.prepare gave --config.init's architecture."""
    return ModelSource(arch_lib.config_of(config.model), config.init or "scratch")


def load_params(config, model: nn.Module, source: ModelSource, mesh, rules, rng):
    """Parameters of `model`, born sharded: the pretrained ones from `config.init` if set, the rest fresh from rng.

    Returns (params, shardings). Call under `jax.set_mesh(mesh)`.
    """
    setup = inference_setup(model, mesh, rules, config.data.max_seq_length)
    loaded = _read_init(config, source, setup)  # first: an --config.init that does not fit fails before any compile
    return setup.create_state(rng, loaded).params, setup.shardings.params


def _read_init(config, source: ModelSource, setup: Setup) -> dict:
    """The parameters `config.init` gives the model (none without one): those its architecture's
    is_pretrained_parameter selects, sharded as `setup`'s."""
    if not config.init:
        return {}
    abstract = setup.abstract.params
    loaded, where = pretrained.init_params(config.init, source.model_config, abstract, setup.shardings.params,
                                           select=arch_lib.of(source.model_config).is_pretrained_parameter)
    logging.info("initialised %s from %s; fresh: %s", sorted(loaded), where, sorted(set(abstract) - set(loaded)))
    return loaded


def _create_state(config, setup: Setup, source: ModelSource) -> TrainState:
    """A fresh TrainState: the parameters --config.init gives (the rest, and the head, fresh from train.seed) and a
    fresh optimizer state."""
    loaded = _read_init(config, source, setup)  # first: an --config.init that does not fit fails before any compile
    return setup.create_state(jax.random.split(jax.random.key(config.train.seed))[0], loaded)


def _write_model_files(output_dir: str, task: tasks.Task, encoder: str, model_config, tokenizer) -> None:
    """What --config.init=WORKDIR/finetuned and the export read beside the parameters: the head (which the
    parameters alone do not tell: a feature-based token head reads four layers), classes, architecture,
    vocabulary. Written by every run, so that no earlier run's files stay behind."""
    if jax.process_index() == 0:
        fileio.makedirs(output_dir)
        fileio.write_json(fileio.join(output_dir, TASK_FILE), {"task": task.name, "encoder": encoder})
        fileio.write_json(fileio.join(output_dir, LABELS_FILE), task.names)
        init_architecture.write_run_model_config(output_dir, model_config)
        tokenizer.save(output_dir)


# ---------------------------------------------------------------------------------------------------------------
# The jobs.

def _held_out(encoded: dict, labels, batch_size: int, rows):
    """The local batches of every held-out row once, in order (the last padded with rows of weight 0)."""
    for indices in finetune_data.ordered_batches(len(encoded["input_ids"]), batch_size):
        yield finetune_data.local_batch(encoded, labels, indices, rows)


class _FineTuning(loop.Job):
    """What fine-tuning adds to bert_jax.loop: its step and input, a fresh state from --config.init, the task's
    held-out scores (and its predictions, kept for the files written at the end), examples per second, its log line,
    the input at a step, and a judgement of the last step's parameters."""

    def __init__(self, config, task, setup: Setup, num_steps: int, source: ModelSource):
        self.config, self.task, self.setup, self.num_steps, self.source = config, task, setup, num_steps, source
        self.rows = sharding_lib.process_rows(setup.batch_sharding, config.train.batch_size)
        self.train_step = setup.jit_train_step(make_classification_train_step(setup.model, setup.tx, setup.schedule,
                                                                              setup.rules, task.loss))
        self.eval_step = setup.jit_eval_step(make_classification_eval_step(setup.model, setup.rules, task.loss))
        make_step = make_logits_step if task.eval_output == "logits" else make_predict_step
        self.predict_step = setup.jit_eval_step(make_step(setup.model, setup.rules))
        self.predicted = None  # the last evaluation's tags (per held-out sentence and word) or answers (qa)

    def batches(self, position: int = 0) -> finetune_data.TrainBatches:
        train = self.config.train
        return finetune_data.TrainBatches(self.task.train_encoded, self.task.train_labels, train.batch_size,
                                          train.seed, self.rows, position)

    def fresh_state(self) -> TrainState:
        return _create_state(self.config, self.setup, self.source)

    def eval_due(self, step: int) -> bool:
        eval_every = self.config.train.eval_every
        return bool(self.config.data.eval_file) and (step == self.num_steps or
                                                     (eval_every > 0 and step % eval_every == 0))

    def evaluate(self, params) -> dict[str, float]:
        task, batch_size, sharding = self.task, self.config.train.batch_size, self.setup.batch_sharding
        sums, _ = sum_over_batches(self.eval_step, params, _held_out(task.eval_encoded, task.eval_labels, batch_size,
                                                                     self.rows), sharding)
        scores = {"eval_loss": sums["loss_sum"] / sums["count"]}
        if "correct" in sums:  # classification (a regression has no accuracy)
            scores["eval_accuracy"] = sums["correct"] / sums["count"]
        if task.eval_output:
            outputs = _in_order(self.predict_step, params, task.eval_encoded, batch_size, sharding, self.rows)
            task_scores, self.predicted = task.held_out_scores(outputs, self.config.data)
            scores.update(task_scores)
        return scores

    def rates(self, steps_per_second: float) -> dict[str, float]:
        return {"examples_per_second": steps_per_second * self.config.train.batch_size}

    def log_line(self, step: int, num_steps: int, scalars: dict[str, float], steps_per_second: float) -> str:
        return f"step {step}/{num_steps} | " + " | ".join(f"{k} {v:.4g}" for k, v in scalars.items())

    def restart_input(self, step: int):
        return self.batches(position=step)  # one batch per step (no skips recorded without a position)

    def final_problem(self, params, batches) -> str | None:
        """None when the parameters after the last step give a healthy loss on the next training batch (without
        dropout); else what went wrong, in words."""
        sums = jax.device_get(self.eval_step(params, sharding_lib.make_global_batch(next(batches),
                                                                                    self.setup.batch_sharding)))
        loss = float(sums["loss_sum"]) / max(float(sums["count"]), 1.0)
        train = self.config.train
        return divergence.Monitor(train.spike_factor, train.spike_window).problem({"loss": loss})


def finetune(config, workdir: str) -> TrainResult:
    """Fine-tunes the task's model as `config` (from bert_jax.job_config.prepare) describes, on bert_jax.loop: from
    the workdir's newest checkpoint (WORKDIR/checkpoints), else --config.init, else scratch. Returns the last logged
    metrics (with the held-out scores); on SIGTERM it saves a checkpoint and returns early
    (TrainResult.preempted_at_step). WORKDIR/finetuned is written once the run ends with healthy parameters."""
    tokenizer = tokenization.load_tokenizer(config.data.vocab_file, do_lower_case=config.data.do_lower_case)
    source = model_source(config)
    task = tasks.read_task(config, tokenizer)
    setup, num_steps = finetuning_setup(config, task)
    _log_setup(setup, source)
    output_dir = fileio.join(workdir, FINETUNED_SUBDIR)
    with jax.set_mesh(setup.mesh):
        job = _FineTuning(config, task, setup, num_steps, source)
        result, state, _ = loop.train(job, setup, config, workdir)
        if result.preempted_at_step is not None and result.preempted_at_step < num_steps:
            return result
        if not result.metrics and config.data.eval_file:  # a finished run, rerun: its scores again
            result.metrics = dict(job.evaluate(state.params), step=int(state.step))
        _write_model_files(output_dir, task, config.train.encoder, source.model_config, tokenizer)
        checkpoint_lib.save_params(output_dir, state.params)
    logging.info("fine-tuned parameters saved to %s (classes in %s)", output_dir, LABELS_FILE)
    if job.predicted is not None and jax.process_index() == 0:
        task.write_predictions(workdir, job.predicted)
    return result


def _log_setup(setup: Setup, source: ModelSource) -> None:
    logging.info("mesh %s over %d devices, %d processes; model %s; init from %s", dict(setup.mesh.shape),
                 jax.device_count(), jax.process_count(), source.model_config, source.description)


def _in_order(step, params, encoded: dict, batch_size: int, batch_sharding, rows) -> np.ndarray:
    """`step(params, batch)` over every row of `encoded` once, in order; its replicated outputs concatenated (the
    padding rows of the last batch dropped)."""
    blocks = []
    for indices in finetune_data.ordered_batches(len(encoded["input_ids"]), batch_size):
        local = finetune_data.local_batch(encoded, None, indices, rows)
        blocks.append(np.asarray(step(params, sharding_lib.make_global_batch(local, batch_sharding)))[indices >= 0])
    return np.concatenate(blocks)


def extract_features(config, workdir: str) -> str:
    """Writes one embedding per text of features.input_file, in input order, to a .npy; returns its path."""
    tokenizer = tokenization.load_tokenizer(config.data.vocab_file, do_lower_case=config.data.do_lower_case)
    source = model_source(config)
    examples = finetune_data.read_examples(config.features.input_file, config.data, with_labels=False,
                                           field="features.input_file")
    encoded = finetune_data.encode_examples(tokenizer, examples, config.data.max_seq_length)
    model = arch_lib.of(source.model_config).features_model(source.model_config)
    setup = inference_setup(model, sharding_lib.create_mesh(config.mesh), sharding_lib.logical_rules(config.mesh),
                            config.data.max_seq_length)
    _log_setup(setup, source)
    batch_size, mesh = config.train.batch_size, setup.mesh
    output = config.features.output or fileio.join(workdir, "features.npy")
    if not config.init:
        logging.warning("features from a randomly initialised model: set --config.init to a trained checkpoint")
    with jax.set_mesh(mesh):
        loaded = _read_init(config, source, setup)
        params = setup.create_state(jax.random.key(config.train.seed), loaded).params
        batch_sharding = setup.batch_sharding
        rows = sharding_lib.process_rows(batch_sharding, batch_size)
        # Replicated output: every process holds the whole [batch, width] block, so process 0 writes all rows.
        step = jax.jit(make_features_step(model, setup.rules, config.features.pooling),
                       in_shardings=(setup.shardings.params, batch_sharding),
                       out_shardings=NamedSharding(mesh, PartitionSpec()))
        features = _in_order(step, params, encoded, batch_size, batch_sharding, rows)
    if jax.process_index() == 0:
        directory = os.path.dirname(output) if not fileio.is_remote(output) else output.rsplit("/", 1)[0]
        if directory:
            fileio.makedirs(directory)
        with fileio.open_file(output, "wb") as f:
            np.save(f, features)
    logging.info("features (%s pooling) of %d texts from %s: %s %s -> %s", config.features.pooling,
                 len(features), examples.source, features.shape, features.dtype, output)
    return output


def _saved_head(checkpoint: str) -> tuple[str, str]:
    """(task name, train.encoder) of a fine-tuned directory: its task.json, or (written before task.json existed)
    a tuned token classifier when the parameters have no pooler, else a sequence classifier."""
    path = fileio.join(checkpoint, TASK_FILE)
    if fileio.exists(path):
        with fileio.open_file(path) as file:
            head = json.load(file)
        if head.get("task") not in tasks.NAMES:
            raise ValueError(f"{path}: task {head.get('task')!r} is none of {tasks.NAMES}; the directory was not "
                             "written by --mode=finetune")
        return head["task"], head.get("encoder", "tuned")
    saved = checkpoint_lib.state_metadata(str(checkpoint_lib.step_directory(checkpoint)))["train_state"]["params"]
    return ("sequence" if "pooler" in saved else "tokens"), "tuned"


def _saved_model(checkpoint: str) -> tuple[list[str], Any, tuple[str, str]]:
    """(class names, architecture config, (task name, train.encoder)) of a fine-tuned directory."""
    labels_path = fileio.join(checkpoint, LABELS_FILE)
    if not fileio.exists(labels_path):
        raise FileNotFoundError(f"--checkpoint={checkpoint} has no {LABELS_FILE}: with configs/finetune.py, "
                                "--mode=export takes a fine-tuned directory (WORKDIR/finetuned)")
    with fileio.open_file(labels_path) as file:
        names = json.load(file)
    model_config = init_architecture.recorded_config(fileio.join(checkpoint, init_architecture.RUN_MODEL_CONFIG))
    return names, model_config, _saved_head(checkpoint)


def predict(checkpoint: str, example_sets: list[finetune_data.Examples], config) -> list[np.ndarray]:
    """The logits ([rows, outputs], float32, in order) of the fine-tuned model in `checkpoint` (a WORKDIR/finetuned
    directory: its head, parameters and tokenizer) for each of `example_sets`, read and compiled once, sharded over
    config.mesh in batches of config.train.batch_size rows of config.data.max_seq_length tokens. Every process
    calls it; each gets all rows."""
    names, model_config, (name, encoder) = _saved_model(checkpoint)
    model = tasks.head_model(name, model_config, len(names), encoder)
    tokenizer = tokenization.load_tokenizer(checkpoint)
    setup = inference_setup(model, sharding_lib.create_mesh(config.mesh), sharding_lib.logical_rules(config.mesh),
                            config.data.max_seq_length)
    batch_size = config.train.batch_size
    with jax.set_mesh(setup.mesh):
        params, _ = checkpoint_lib.restore_params(checkpoint, setup.abstract.params, setup.shardings.params)
        step = setup.jit_eval_step(make_logits_step(model, setup.rules))
        rows = sharding_lib.process_rows(setup.batch_sharding, batch_size)
        return [_in_order(step, params, finetune_data.encode_examples(tokenizer, examples, config.data.max_seq_length),
                          batch_size, setup.batch_sharding, rows) for examples in example_sets]


def export_finetuned(workdir: str, checkpoint: str = "", export_format: str = "hf", output: str = "") -> str:
    """`--mode=export` with configs/finetune.py: a fine-tuned directory (default WORKDIR/finetuned) as a HuggingFace
    directory (default WORKDIR/export/hf) that AutoModelForSequenceClassification, AutoModelForTokenClassification or
    AutoModelForQuestionAnswering loads, with its labels and tokenizer."""
    if export_format != "hf":
        raise ValueError(f"--export_format={export_format}: a fine-tuned classifier exports to 'hf' only (its "
                         "directory is already bert_jax's own format, which --config.init reads)")
    checkpoint = checkpoint or fileio.join(workdir, FINETUNED_SUBDIR)
    output = output or fileio.join(fileio.join(workdir, "export"), export_format)
    names, model_config, (name, encoder) = _saved_model(checkpoint)
    if encoder != "tuned":
        raise ValueError(f"--checkpoint={checkpoint}: its {TASK_FILE} says train.encoder={encoder}, a head on the "
                         "last four layers that transformers' BertForTokenClassification cannot represent, so it does "
                         "not export; use the directory as it is (bert_jax's own format, which --config.init reads), "
                         "or fine-tune with --config.train.encoder=tuned to export")
    ids = np.zeros((1, 8), np.int32)
    params = export.restore_model_params(checkpoint, tasks.head_model(name, model_config, len(names)), ids, ids, ids)
    tokenizer = tokenization.load_tokenizer(checkpoint)
    arch_lib.of(model_config).export(params, model_config, output, tokenizer=tokenizer, task=name, label_names=names)
    logging.info("%s model exported for transformers", tasks.task_class(name).description)
    return output
