"""Fine-tuning (sentence / sentence-pair classification, token classification, extractive question answering) and
feature extraction, from any BERT checkpoint.

`finetune(config, workdir)` trains the task's model (bert_jax.tasks: which examples, labels, head and held-out
scores) with its cross-entropy loss on the loop pretraining runs (bert_jax.loop), with the same guarantees: periodic
asynchronous checkpoints in WORKDIR/checkpoints (config.checkpoint), resume after a crash or SIGTERM exactly where it
stopped (parameters, optimizer state, dropout key and input position), integrity checks and set-aside, judged and
verified checkpoints, rewinds. It reports train loss/accuracy and the held-out scores to the log,
WORKDIR/metrics.jsonl and TensorBoard, writes the held-out predictions, and saves the final parameters with Orbax to WORKDIR/finetuned/state (the layout of a pretraining checkpoint step, so
`checkpoint.restore_params` and `--config.init` read it back on any mesh), beside task.json (the head),
labels.json (class names in id order), model_config.json and the tokenizer.

`extract_features(config, workdir)` writes one embedding per input text, in input order, to a .npy file.

Both take a config from `bert_jax.job_config.prepare` and start from `config.init`: a bert_jax checkpoint
(pretraining or fine-tuned) or, through `bert_jax.interop.pretrained.load_pretrained`, a HuggingFace / original-TF
checkpoint or a Flax export, whose architecture (and tokenizer, unless data.vocab_file is set) `prepare` gave the
config. Only the encoder and pooler are read (their names are shared with
BertForPreTraining, see bert_jax.model); the head always starts fresh.
Examples are held in memory as numpy arrays (GLUE-sized data fits easily) and every process reads them all,
then feeds its own rows of each global batch.
"""

import dataclasses
import json
import math
import os
from typing import Any

from absl import logging
from etils import epath
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import arch as arch_lib
from bert_jax import checkpoint as checkpoint_lib
from bert_jax.data import conll
from bert_jax import divergence
from bert_jax.data import finetune_data
from bert_jax import fileio
from bert_jax import optim
from bert_jax.interop import init_architecture
from bert_jax.interop import pretrained
from bert_jax import sharding as sharding_lib
from bert_jax import tasks
from bert_jax.data import tokenization
from bert_jax import loop
from bert_jax.loop import TrainResult
from bert_jax.train import Setup, TrainState, apply_gradients, init_inputs

FINETUNED_SUBDIR = "finetuned"
LABELS_FILE = "labels.json"
TASK_FILE = "task.json"  # beside labels.json: {"task": one of tasks.NAMES, "encoder": train.encoder}, the head



# Model and parameters: from scratch, from a bert_jax checkpoint, or from a HuggingFace / original checkpoint.

@dataclasses.dataclass
class ModelSource:
    """The architecture to build and, for a foreign checkpoint, its parameters on the host."""
    model_config: Any  # the architecture's config (bert_jax.arch)
    host_params: Any = None
    description: str = "scratch"


def model_source(config) -> ModelSource:
    """The model to build, config.model (which bert_jax.job_config.prepare gave --config.init's architecture), and,
    for a HuggingFace / original-TF / Flax-export init, its parameters on the host."""
    model_config = arch_lib.config_of(config.model)
    if not config.init or checkpoint_lib.is_checkpoint(config.init):
        return ModelSource(model_config, None, config.init or "scratch")
    _, params, report = pretrained.load_pretrained(config.init)
    logging.info("read %s with bert_jax.interop.pretrained: %s", config.init, report)
    return ModelSource(model_config, params, config.init)


def load_params(config, model: nn.Module, source: ModelSource, mesh, rules, rng):
    """Parameters of `model`, born sharded: encoder and pooler from `config.init` if set, the rest fresh from rng.

    Returns (params, shardings). Call under `jax.set_mesh(mesh)`.
    """
    # The run's setup without an optimizer: the same shapes, shardings and initialisation as a training run's.
    setup = Setup.build(model, optax.identity(), None, mesh, rules, init_inputs(config.data.max_seq_length))
    loaded = _read_init(config, source, setup)  # first: an --config.init that does not fit fails before any compile
    return setup.create_state(rng, loaded).params, setup.shardings.params


def _read_init(config, source: ModelSource, setup: Setup) -> dict:
    """The encoder and pooler parameters `config.init` gives (none without one), sharded as `setup`'s."""
    if not config.init:
        return {}
    abstract, shardings = setup.abstract.params, setup.shardings.params
    pretrained_parameter = arch_lib.of(source.model_config).is_pretrained_parameter
    names = [name for name in abstract if pretrained_parameter(name)]
    if source.host_params is None:
        names = _check_checkpoint_fits(config.init, {name: abstract[name] for name in names})
        loaded, where = checkpoint_lib.restore_params(config.init, {name: abstract[name] for name in names},
                                                      {name: shardings[name] for name in names})
    else:
        loaded, where = _place_host_params(source.host_params, abstract, shardings, names, config.init), config.init
    logging.info("initialised %s from %s; fresh: %s", sorted(loaded), where, sorted(set(abstract) - set(loaded)))
    return loaded


def _check_checkpoint_fits(path: str, abstract) -> list[str]:
    """Names the first parameter the bert_jax checkpoint lacks or holds in another shape, before reading any.
    Returns the top-level names to read: all of `abstract`'s, less a pooler the checkpoint does not have (a token
    classifier's or question answerer's), which then starts fresh."""
    directory = checkpoint_lib.step_directory(path)  # a checkpoints directory: its latest complete step
    saved = checkpoint_lib.state_metadata(str(directory))["train_state"]["params"]
    if "pooler" in abstract and "pooler" not in saved:
        logging.warning("--config.init=%s has no pooler: it starts fresh", path)
        abstract = {name: value for name, value in abstract.items() if name != "pooler"}
    fix = "Fix: set --config.model.* to the architecture the checkpoint was trained with"
    for key_path, leaf in jax.tree_util.tree_leaves_with_path(abstract):
        name = ".".join(str(key.key) for key in key_path)
        node = saved
        for key in key_path:
            node = node.get(key.key) if hasattr(node, "get") else None
            if node is None:
                raise ValueError(f"--config.init={path!r}: {directory} has no parameter {name}. {fix}")
        if tuple(node.shape) != tuple(leaf.shape):
            raise ValueError(f"--config.init={path!r}: {name} has shape {tuple(node.shape)} in {directory} but "
                             f"{tuple(leaf.shape)} in this model. {fix}")
    return list(abstract)


def _place_host_params(host_params, abstract, shardings, names, path):
    """Host arrays of a foreign checkpoint -> sharded arrays (each process reads only its own slices)."""
    host_params = host_params.get("params", host_params)
    missing = [name for name in names if name not in host_params]
    if [name for name in missing if name != "pooler"]:
        raise ValueError(f"--config.init={path!r}: the converted checkpoint lacks {missing}; it has "
                         f"{sorted(host_params)}")
    if missing:
        logging.warning("--config.init=%s has no pooler: it starts fresh", path)
    placed = {}
    for name in (n for n in names if n in host_params):
        def put(key_path, target, sharding, tree=host_params[name]):
            value = tree
            for key in key_path:
                value = value[key.key]
            value = np.asarray(value, np.float32)
            if value.shape != target.shape:
                raise ValueError(f"--config.init={path!r}: {name}{jax.tree_util.keystr(key_path)} has shape "
                                 f"{value.shape}, the model wants {target.shape}")
            return jax.make_array_from_callback(target.shape, sharding, lambda index: value[index])
        placed[name] = jax.tree_util.tree_map_with_path(put, abstract[name], shardings[name])
    return placed


# ---------------------------------------------------------------------------------------------------------------
# Steps: pure functions, jitted with shardings by the loops below.

def _logits(model, rules, params, batch, deterministic, rngs=None):
    with nn.logical_axis_rules(rules):
        return model.apply({"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                           deterministic=deterministic, rngs=rngs)["logits"]


def _labels_and_weights(batch):
    """(labels, weights): each row's weight (0 for padding rows) and, for token labels [batch, length], also 0 where
    nothing is scored (conll.IGNORE: [CLS], [SEP], a word's later pieces, padding)."""
    labels, weights = batch["label_ids"], batch["weights"]
    if labels.ndim == 2:
        weights = weights[:, None] * (labels != conll.IGNORE)
        labels = jnp.maximum(labels, 0)
    return labels, weights


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, schedule, rules):
    """`train_step(state, batch, rng) -> (state, metrics)`: weighted cross-entropy (over rows, or over the scored
    tokens), dropout from fold_in(rng, step)."""
    def loss_fn(params, batch, dropout_rng):
        logits = _logits(model, rules, params, batch, False, {"dropout": dropout_rng})
        labels, weights = _labels_and_weights(batch)
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        total = jnp.maximum(jnp.sum(weights), 1.0)
        loss = jnp.sum(weights * xent) / total
        correct = jnp.sum(weights * (jnp.argmax(logits, -1) == labels))
        return loss, {"loss": loss, "accuracy": correct / total}

    def train_step(state: TrainState, batch, rng):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, batch, jax.random.fold_in(rng, state.step))
        return apply_gradients(state, grads, tx, schedule, metrics)

    return train_step


def make_eval_step(model: nn.Module, rules):
    """`eval_step(params, batch) -> sums` of loss, correct predictions and real rows (padding rows weigh 0)."""
    def eval_step(params, batch):
        logits = _logits(model, rules, params, batch, True)
        labels, weights = _labels_and_weights(batch)
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        return {"loss_sum": jnp.sum(weights * xent), "correct": jnp.sum(weights * (jnp.argmax(logits, -1) == labels)),
                "count": jnp.sum(weights)}
    return eval_step


def make_logits_step(model: nn.Module, rules):
    """`logits_step(params, batch) -> logits` (float32), for question answering's span search on the host."""
    def logits_step(params, batch):
        return _logits(model, rules, params, batch, True).astype(jnp.float32)
    return logits_step


def make_predict_step(model: nn.Module, rules):
    """`predict_step(params, batch) -> [batch, length]` the most likely label of every position."""
    def predict_step(params, batch):
        return jnp.argmax(_logits(model, rules, params, batch, True), -1).astype(jnp.int32)
    return predict_step


def make_features_step(model: nn.Module, rules, pooling: str):
    """`features_step(params, batch) -> [batch, width]` float32 embeddings (see features.pooling)."""
    def features_step(params, batch):
        with nn.logical_axis_rules(rules):
            outputs = model.apply({"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                                  deterministic=True)
        if pooling == "cls":
            return outputs["sequence_output"][:, 0].astype(jnp.float32)
        if pooling == "mean":
            mask = batch["input_mask"][..., None].astype(jnp.float32)
            total = jnp.sum(outputs["sequence_output"].astype(jnp.float32) * mask, axis=1)
            return total / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
        return jnp.concatenate([outputs["hidden_states"][-k][:, 0] for k in range(1, 5)], -1).astype(jnp.float32)
    return features_step


# ---------------------------------------------------------------------------------------------------------------
# The jobs.

def _setup(config):
    """(tokenizer, ModelSource, mesh, rules) of a config bert_jax.job_config.prepare returned."""
    tokenizer = tokenization.load_tokenizer(config.data.vocab_file, do_lower_case=config.data.do_lower_case)
    source = model_source(config)
    mesh = sharding_lib.create_mesh(config.mesh)
    rules = sharding_lib.logical_rules(config.mesh)
    logging.info("mesh %s over %d devices, %d processes; model %s; init from %s", dict(mesh.shape),
                 jax.device_count(), jax.process_count(), source.model_config, source.description)
    return tokenizer, source, mesh, rules


def _evaluate(eval_step, params, encoded, labels, batch_size, batch_sharding, rows) -> dict[str, float]:
    totals = None
    for indices in finetune_data.ordered_batches(len(labels), batch_size):
        local = finetune_data.local_batch(encoded, labels, indices, rows)
        batch = sharding_lib.make_global_batch(local, batch_sharding)
        sums = eval_step(params, batch)
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    totals = {k: float(v) for k, v in jax.device_get(totals).items()}
    return {"eval_loss": totals["loss_sum"] / totals["count"], "eval_accuracy": totals["correct"] / totals["count"]}


def _create_optimizer(config, num_examples: int):
    """(tx, schedule, num_steps): train.num_steps, or train.num_epochs over the examples; warmup in proportion to
    the steps the schedule spans (optim.schedule_steps, or num_steps)."""
    train = config.train
    num_steps = train.num_steps or math.ceil(train.num_epochs * num_examples / train.batch_size)
    optim_config = ml_collections.ConfigDict(config.optim.to_dict())
    optim_config.warmup_steps = config.optim.warmup_steps or int(
        config.optim.warmup_proportion * optim.schedule_span(config.optim, num_steps))
    frozen = arch_lib.of(config.model).is_pretrained_parameter if config.train.encoder != "tuned" else None
    tx, schedule = optim.create_optimizer(optim_config, num_steps, frozen=frozen)
    logging.info("%d training examples, %d steps of %d (%.2f epochs), warmup %d steps", num_examples, num_steps,
                 train.batch_size, num_steps * train.batch_size / num_examples, optim_config.warmup_steps)
    return tx, schedule, num_steps


def _write_model_files(output_dir: str, task: tasks.Task, encoder: str, model_config,
                       tokenizer) -> None:
    """What --config.init=WORKDIR/finetuned and the export read beside the parameters: the head (which the
    parameters alone do not tell: a feature-based token head reads four layers), classes, architecture,
    vocabulary. Written by every run, so that no earlier run's files stay behind."""
    if jax.process_index() == 0:
        fileio.makedirs(output_dir)
        fileio.write_json(fileio.join(output_dir, TASK_FILE), {"task": task.name, "encoder": encoder})
        fileio.write_json(fileio.join(output_dir, LABELS_FILE), task.names)
        init_architecture.write_run_model_config(output_dir, model_config)
        tokenizer.save(output_dir)


def _create_state(config, setup: Setup, source) -> TrainState:
    """A fresh TrainState: the parameters --config.init gives (the rest, and the head, fresh from train.seed) and a
    fresh optimizer state."""
    loaded = _read_init(config, source, setup)  # first: an --config.init that does not fit fails before any compile
    return setup.create_state(jax.random.split(jax.random.key(config.train.seed))[0], loaded)


class _FineTuning(loop.Job):
    """What fine-tuning adds to bert_jax.loop: its step and input, a fresh state from --config.init, the task's
    held-out scores (and its predictions, kept for the files written at the end), examples per second, its log line,
    the input at a step, and a judgement of the last step's parameters."""

    def __init__(self, config, task, setup: Setup, num_steps: int, rows, source):
        self.config, self.task, self.setup, self.num_steps, self.rows = config, task, setup, num_steps, rows
        self.source = source
        self.train_step = setup.jit_train_step(make_train_step(setup.model, setup.tx, setup.schedule, setup.rules))
        self.eval_step = setup.jit_eval_step(make_eval_step(setup.model, setup.rules))
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
        task, batch_size = self.task, self.config.train.batch_size
        scores = _evaluate(self.eval_step, params, task.eval_encoded, task.eval_labels, batch_size,
                           self.setup.batch_sharding, self.rows)
        if task.eval_output:
            outputs = _in_order(self.predict_step, params, task.eval_encoded, batch_size, self.setup.batch_sharding,
                                self.rows)
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
    # Data, model and optimizer.
    tokenizer, source, mesh, rules = _setup(config)
    task = tasks.read_task(config, tokenizer)
    tx, schedule, num_steps = _create_optimizer(config, len(task.train_labels))
    model = task.model(source.model_config, config.train.encoder)
    setup = Setup.build(model, tx, schedule, mesh, rules, init_inputs(config.data.max_seq_length))
    output_dir = fileio.join(workdir, FINETUNED_SUBDIR)
    with jax.set_mesh(mesh):
        rows = sharding_lib.process_rows(setup.batch_sharding, config.train.batch_size)
        job = _FineTuning(config, task, setup, num_steps, rows, source)
        result, state, batches = loop.train(job, setup, config, workdir)
        if result.preempted_at_step is not None and result.preempted_at_step < num_steps:
            return result
        if not result.metrics and config.data.eval_file:  # a finished run, rerun: its scores again
            result.metrics = dict(job.evaluate(state.params), step=int(state.step))
        _write_model_files(output_dir, task, config.train.encoder, source.model_config, tokenizer)
        with ocp.Checkpointer(checkpoint_lib.tree_handler()) as saver:
            saver.save(epath.Path(output_dir) / checkpoint_lib.STATE_ITEM,
                       args=ocp.args.PyTreeSave({"train_state": {"params": state.params}}), force=True)
    logging.info("fine-tuned parameters saved to %s (classes in %s)", output_dir, LABELS_FILE)
    if job.predicted is not None and jax.process_index() == 0:
        task.write_predictions(workdir, job.predicted)
    return result


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
    tokenizer, source, mesh, rules = _setup(config)
    examples = finetune_data.read_examples(config.features.input_file, config.data, with_labels=False,
                                           field="features.input_file")
    encoded = finetune_data.encode_examples(tokenizer, examples, config.data.max_seq_length)
    model = arch_lib.of(source.model_config).features_model(source.model_config)
    batch_size = config.train.batch_size
    output = config.features.output or fileio.join(workdir, "features.npy")
    if not config.init:
        logging.warning("features from a randomly initialised model: set --config.init to a trained checkpoint")
    with jax.set_mesh(mesh):
        params, shardings = load_params(config, model, source, mesh, rules, jax.random.key(config.train.seed))
        batch_sharding = sharding_lib.batch_sharding(mesh, rules)
        rows = sharding_lib.process_rows(batch_sharding, batch_size)
        # Replicated output: every process holds the whole [batch, width] block, so process 0 writes all rows.
        step = jax.jit(make_features_step(model, rules, config.features.pooling),
                       in_shardings=(shardings, batch_sharding), out_shardings=NamedSharding(mesh, PartitionSpec()))
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


def export_finetuned(workdir: str, checkpoint: str = "", export_format: str = "hf", output: str = "") -> str:
    """`--mode=export` with configs/finetune.py: a fine-tuned directory (default WORKDIR/finetuned) as a HuggingFace
    directory (default WORKDIR/export/hf) that AutoModelForSequenceClassification, AutoModelForTokenClassification or
    AutoModelForQuestionAnswering loads, with its labels and tokenizer."""
    from bert_jax.interop import export  # pylint: disable=import-outside-toplevel
    if export_format != "hf":
        raise ValueError(f"--export_format={export_format}: a fine-tuned classifier exports to 'hf' only (its "
                         "directory is already bert_jax's own format, which --config.init reads)")
    checkpoint = checkpoint or fileio.join(workdir, FINETUNED_SUBDIR)
    output = output or fileio.join(fileio.join(workdir, "export"), export_format)
    labels_path = fileio.join(checkpoint, LABELS_FILE)
    if not fileio.exists(labels_path):
        raise FileNotFoundError(f"--checkpoint={checkpoint} has no {LABELS_FILE}: with configs/finetune.py, "
                                "--mode=export takes a fine-tuned directory (WORKDIR/finetuned)")
    with fileio.open_file(labels_path) as file:
        names = json.load(file)
    model_config = init_architecture.recorded_config(fileio.join(checkpoint, init_architecture.RUN_MODEL_CONFIG))
    name, encoder = _saved_head(checkpoint)
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
