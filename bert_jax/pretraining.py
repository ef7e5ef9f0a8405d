"""The pretraining job on the one training loop (bert_jax.loop), and the eval and export modes.

`train_and_evaluate(config, workdir)` builds the model, mesh, optimizer and input from a config that
bert_jax.job_config.prepare made ready (--config.init's architecture, the data made for data.source=corpus, every
field checked), starts from the workdir's checkpoint, --config.init or scratch, and runs bert_jax.loop with what
pretraining adds: MLM/NSP evaluation, its throughput and log line.
"""

import dataclasses
import functools
from typing import Callable, Iterator

from absl import logging
import jax
import ml_collections

from bert_jax import arch as arch_lib
from bert_jax import checkpoint as checkpoint_lib
from bert_jax import fileio
from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from bert_jax.data import tokenization
from bert_jax.interop import export
from bert_jax.interop import init_architecture
from bert_jax.interop import layout
from bert_jax.interop import pretrained
from bert_jax import sharding as sharding_lib
from bert_jax import loop
from bert_jax.loop import TrainResult
from bert_jax.steps import make_eval_step
from bert_jax.train import Setup, pretraining_setup, sum_over_batches


def evaluate(eval_step, params, batches: Iterator, batch_sharding, num_batches: int | None) -> dict[str, float]:
    """Held-out metrics over `num_batches` global batches (None: the whole held-out set), with "eval_records", the
    number of records (instances) they cover.

    The metrics are weighted sums over weighted counts (see steps.make_eval_step), so padding rows count for
    nothing and the result is that of evaluating each record once, on any mesh and number of processes.
    """
    sums, count = sum_over_batches(eval_step, params, batches, batch_sharding, num_batches)
    if not count:
        raise ValueError("evaluation read no batch: the held-out data (--config.data.eval_input_files) is empty")
    records = int(round(sums["records"]))
    logging.info("evaluation: %d held-out records (%d masked tokens) in %d batches", records,
                 int(round(sums["mlm_weight"])), count)
    return dict(metrics_lib.summarize_eval(sums), eval_records=records)


@dataclasses.dataclass
class _Run:
    """Everything a pretraining job needs, built once from the config: the run's setup (model, mesh, optimizer,
    state shapes and shardings) and its input."""
    config: ml_collections.ConfigDict
    model_config: model_lib.BertConfig
    setup: Setup
    make_iterator: Callable[..., Iterator]  # (split=, seed=) -> the input pipeline's iterator

    # The setup's parts by name, as the steps take them.
    model = property(lambda self: self.setup.model)
    mesh = property(lambda self: self.setup.mesh)
    rules = property(lambda self: self.setup.rules)
    tx = property(lambda self: self.setup.tx)
    schedule = property(lambda self: self.setup.schedule)


def _require_prepared_data(config) -> None:
    if config.data.source == "corpus":
        raise ValueError("data.source='corpus': make the data first with bert_jax.job_config.prepare(config, "
                         "workdir, mode), as bert_jax.main does; it points the config at the TFRecords it writes")


def _build(config) -> _Run:
    from bert_jax.data import sources  # pylint: disable=import-outside-toplevel
    _require_prepared_data(config)
    setup = pretraining_setup(config)
    mesh = setup.mesh
    logging.info("mesh %s over %d devices (%s), %d processes", dict(mesh.shape), jax.device_count(),
                 jax.devices()[0].device_kind, jax.process_count())
    # The tokenizer, where known, bounds dynamic masking's random replacements (the model's vocab may be padded)
    # and tells whole-word masking which pieces continue a word.
    data = config.data
    tokenizer = tokenization.load_tokenizer(data.vocab_file) if data.vocab_file else None
    model_config = setup.model.config
    make_iterator = functools.partial(
        sources.make_iterator, data, batch_size=config.train.batch_size // jax.process_count(),
        vocab_size=model_config.vocab_size, process_index=jax.process_index(), process_count=jax.process_count(),
        tokenizer_vocab_size=tokenizer.vocab_size if tokenizer else None,
        whole_word_continuation=tokenizer.is_continuation if tokenizer else None,
        process_rows=sharding_lib.process_rows(setup.batch_sharding, config.train.batch_size))
    return _Run(config, model_config, setup, make_iterator)


def train_and_evaluate(config, workdir: str) -> TrainResult:
    """Runs (or resumes) the pretraining job described by `config` (from bert_jax.job_config.prepare) on
    bert_jax.loop: from the workdir's newest checkpoint, else --config.init, else scratch.

    On SIGTERM it saves a checkpoint at the current step and returns early (TrainResult.preempted_at_step).
    """
    run = _build(config)
    init_architecture.write_run_model_config(workdir, run.model_config)  # what a later --config.init of this run reads
    with jax.set_mesh(run.mesh):
        result, _, _ = loop.train(_Pretraining(run), run.setup, config, workdir)
    return result


class _Pretraining(loop.Job):
    """What pretraining adds to bert_jax.loop: its step and input, a fresh state from --config.init or scratch,
    MLM/NSP evaluation on the held-out records, sequences, tokens and MFU per second, its log line, and a new input
    stream when a checkpoint's position cannot be restored."""

    def __init__(self, run: _Run):
        config = run.config
        self.run = run
        self.num_steps = config.train.num_steps
        self.train_step = run.setup.pretraining_step(config.optim.grad_accum_steps)
        self.eval_step = run.setup.jit_eval_step(make_eval_step(run.model, run.rules))
        self.flops_per_step = metrics_lib.model_flops_per_sequence(
            run.model_config, config.data.max_seq_length, config.data.max_predictions_per_seq
        ) * config.train.batch_size
        self.peak = metrics_lib.peak_flops_per_device(jax.devices()[0], config.train.peak_flops_per_device)
        self.peak *= jax.device_count()

    def batches(self) -> Iterator:
        return self.run.make_iterator(split="train", seed=self.run.config.train.seed)

    def fresh_state(self):
        run, config = self.run, self.run.config
        params = None
        if config.init:  # every parameter: nothing is initialised at random (Setup.create_state)
            params, source = pretrained.init_params(config.init, run.model_config, run.setup.abstract.params,
                                                    run.setup.shardings.params)
            logging.info("initialised parameters from %s (--config.init); optimizer and step start afresh", source)
        return run.setup.create_state(jax.random.split(jax.random.key(config.train.seed))[0], params)

    def on_start(self, state) -> None:
        num_params = sum(x.size for x in jax.tree.leaves(state.params))
        logging.info("model: %s, %s parameters", self.run.model_config, f"{num_params:,}")

    def eval_due(self, step: int) -> bool:
        train = self.run.config.train
        return bool(self.run.config.data.eval_input_files) and (step % train.eval_every == 0 or
                                                                step == train.num_steps)

    def evaluate(self, params) -> dict[str, float]:
        train = self.run.config.train
        return evaluate(self.eval_step, params, self.run.make_iterator(split="eval", seed=train.seed),
                        self.run.setup.batch_sharding, train.eval_steps)

    def rates(self, steps_per_second: float) -> dict[str, float]:
        config = self.run.config
        rates = {"sequences_per_second": steps_per_second * config.train.batch_size}
        rates["tokens_per_second"] = rates["sequences_per_second"] * config.data.max_seq_length
        if self.peak:
            rates["mfu"] = self.flops_per_step * steps_per_second / self.peak
        return rates

    def log_line(self, step: int, num_steps: int, scalars: dict[str, float], steps_per_second: float) -> str:
        return metrics_lib.log_line(step, num_steps, scalars, steps_per_second)

    def restart_input(self, step: int):
        return self.run.make_iterator(split="train", seed=self.run.config.train.seed + step)


def evaluate_checkpoint(config, workdir: str, checkpoint: str = "") -> dict[str, float]:
    """`--mode=eval`: held-out MLM loss/accuracy/perplexity and NSP loss/accuracy of a checkpoint's parameters.

    `checkpoint` is a step directory or a checkpoints directory (its latest step); default WORKDIR/checkpoints.
    Reads the whole held-out set, each record once (data.eval_input_files, or the workdir's held-out split for
    data=corpus; the synthetic source has no end, so train.eval_steps batches of it), and needs no training data.
    Results, with the number of records evaluated (eval_records), go to the log, to WORKDIR/eval_metrics.jsonl and
    to TensorBoard under WORKDIR/tensorboard_eval.
    """
    run = _build(config)  # needs held-out data only (job_config checked it for mode "eval")
    checkpoint = checkpoint or fileio.join(workdir, checkpoint_lib.CHECKPOINT_SUBDIR)
    setup = run.setup
    with jax.set_mesh(run.mesh):
        params, source = checkpoint_lib.restore_params(checkpoint, setup.abstract.params, setup.shardings.params)
        step = int(source.rstrip("/").rsplit("/", 1)[-1]) if source.rstrip("/").rsplit("/", 1)[-1].isdigit() else 0
        batch_sharding = setup.batch_sharding
        eval_step = setup.jit_eval_step(make_eval_step(run.model, run.rules))
        num_batches = config.train.eval_steps if config.data.source == "synthetic" else None
        results = evaluate(eval_step, params, run.make_iterator(split="eval", seed=config.train.seed),
                           batch_sharding, num_batches)
    writer = metrics_lib.MetricWriter(workdir, tensorboard_subdir="tensorboard_eval",
                                      jsonl_name="eval_metrics.jsonl")
    writer.write(step, dict(results))
    writer.close()
    logging.info("eval of %s: %s", source,
                 " | ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in results.items()))
    return dict(results, step=step)


def export_checkpoint(config, workdir: str, checkpoint: str = "", export_format: str = "hf", output: str = "") -> str:
    """`--mode=export`: a checkpoint's parameters (default: the workdir's latest) as HuggingFace or Flax files.

    The tokenizer is the run's (data.vocab_file, or the one the workdir's data step trained), so the export carries
    the vocabulary the model was trained with, and the vocab padding is removed.
    """
    _require_prepared_data(config)  # the tokenizer and the padded vocab size are the data step's
    tokenizer = tokenization.load_tokenizer(config.data.vocab_file) if config.data.vocab_file else None
    checkpoint = checkpoint or fileio.join(workdir, checkpoint_lib.CHECKPOINT_SUBDIR)
    output = output or fileio.join(fileio.join(workdir, "export"), export_format)
    architecture = arch_lib.of(config.model)
    if export_format not in architecture.export_formats:
        raise ValueError(f"--export_format={export_format}: --config.model.arch={architecture.name!r} exports "
                         f"{' or '.join(architecture.export_formats)}; use --export_format="
                         f"{architecture.export_formats[0]}")
    model_config = architecture.config(config.model)
    params = export.restore_model_params(checkpoint, architecture.pretraining_model(model_config),
                                         *layout.dummy_inputs())
    return architecture.export(params, model_config, output, tokenizer=tokenizer, export_format=export_format)
