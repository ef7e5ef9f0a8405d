"""A job's config, made ready once: --config.init's architecture resolved, the data made, every field checked.

`prepare(config, workdir, mode)` is what the driver runs between parsing its flags and starting the job, and the
one function a library caller needs before calling a job (pretraining.train_and_evaluate, evaluate_checkpoint,
export_checkpoint, finetune.finetune, finetune.extract_features). It returns a new, locked config; the jobs take it
as it is: they neither resolve nor check it again, and nothing changes it afterwards.

The checks name the --config field and the fix. The files a config names are checked where they are first read
(bert_jax.data.input_pipeline), except the held-out files, checked here (training reads them only at its first
evaluation).
"""

import copy
import math
import re

import jax

from bert_jax import arch as arch_lib
from bert_jax import divergence
from bert_jax import fileio
from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax import sharding as sharding_lib
from bert_jax import tasks
from bert_jax.data import corpus
from bert_jax.data import finetune_data
from bert_jax.data import glue as glue_data
from bert_jax.data import instances
from bert_jax.data import packing
from bert_jax.interop import init_architecture
from bert_jax.train import DROPOUT_RNG_IMPLS

PRETRAINING_MODES = ("train", "eval", "export")  # with configs/pretrain.py
DOWNSTREAM_MODES = ("finetune", "features", "glue")  # with configs/finetune.py (glue: configs/glue.py)
MODES = PRETRAINING_MODES + DOWNSTREAM_MODES
POOLINGS = ("cls", "mean", "last4")  # features.pooling
_RECIPES = ("--mode=finetune/features take configs/finetune.py, the other modes configs/pretrain.py (and "
            "--mode=glue configs/glue.py)")


def prepare(config, workdir: str, mode: str, command_line=()):
    """The config the job `mode` runs, as a locked copy (`config` is not changed).

    In order: WORKDIR created (if it is not a directory yet); the architecture (and tokenizer) of the checkpoint
    --config.init names, except for the fields named in `command_line` (config paths such as "model.hidden_size",
    which must agree with it; see init_architecture.resolve_init_architecture); the whole config checked for this
    many devices and processes; then, for pretraining from a corpus, WORKDIR/data made or reused
    (bert_jax.data.workdir.prepare: every process calls it, process 0 writes), which points the config at its
    TFRecords and tokenizer; last, the checks that read files (the tokenizer against the model, the held-out
    TFRecords' layout).
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: choose one of {MODES}")
    _check_workdir(workdir)
    if mode == "export" and is_finetuning_recipe(config):  # a fine-tuned directory: its own architecture, tokenizer
        config = copy.deepcopy(config)
        config.lock()
        return config
    if is_finetuning_recipe(config) != (mode in DOWNSTREAM_MODES):
        raise ValueError(f"--config is {'not ' if mode in DOWNSTREAM_MODES else ''}the fine-tuning recipe but "
                         f"--mode={mode}: " + _RECIPES)
    try:
        config = init_architecture.resolve_init_architecture(copy.deepcopy(config), command_line)
        validate(config, mode)
    except (KeyError, AttributeError) as error:  # a field of the other recipe
        raise ValueError(f"--config has no field {error} for --mode={mode}: " + _RECIPES) from None
    if mode in PRETRAINING_MODES and config.data.source == "corpus":
        # Imported here: it imports TensorFlow, which the other jobs never need before they start.
        from bert_jax.data import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
        config = workdir_lib.prepare(config, workdir)
    _check_files(config, mode)
    config.lock()
    return config


def is_finetuning_recipe(config) -> bool:
    """configs/finetune.py's config (it alone has a features section), not configs/pretrain.py's."""
    return "features" in config


def validate(config, mode: str, num_devices: int | None = None, process_count: int | None = None) -> None:
    """Checks the whole config for the job `mode` on `num_devices` devices in `process_count` processes (default:
    this run's), with errors that name the field and the fix. Reads no file."""
    num_devices = jax.device_count() if num_devices is None else num_devices
    process_count = jax.process_count() if process_count is None else process_count
    if mode in PRETRAINING_MODES:
        _validate_pretraining(config, num_devices, process_count, mode)
    elif mode in DOWNSTREAM_MODES:
        _validate_downstream(config, num_devices, process_count, mode)
    else:
        raise ValueError(f"mode={mode!r}: choose one of {MODES}")


def model_config(model):
    """The config of `config.model`'s architecture (bert_jax.arch: a BertConfig, or for arch="modern" a
    bert_jax.modern.ModernConfig), its errors naming the --config.model flag."""
    try:
        return arch_lib.config_of(model)
    except ValueError as error:
        message = str(error)
        raise ValueError(f"--config.model.{message}" if re.match(r"\w+=", message) else
                         f"--config.model: {message}") from None


def validate_dropout_rng(choice: str) -> None:
    if choice != "auto" and choice not in DROPOUT_RNG_IMPLS:
        raise ValueError(f"--config.train.dropout_rng={choice!r}: choose auto or one of {list(DROPOUT_RNG_IMPLS)}")


def _data_parallel(config, num_devices: int) -> tuple[int, tuple[str, ...], tuple[int, ...]]:
    """(devices a batch is split over, the mesh axes they are, the mesh shape)."""
    mesh_shape = sharding_lib.mesh_shape(config.mesh, num_devices)
    rules = dict(sharding_lib.logical_rules(config.mesh))
    if "batch" not in rules:
        raise ValueError("--config.mesh.rules has no rule for the logical axis 'batch'")
    batch_axes = rules["batch"] or ()
    batch_axes = (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
    return math.prod(mesh_shape[sharding_lib.MESH_AXES.index(axis)] for axis in batch_axes), batch_axes, mesh_shape


def _validate_pretraining(config, num_devices: int, process_count: int, mode: str) -> None:
    """`mode`: "train" needs training data, "eval" held-out data only, "export" neither."""
    bert_config = model_config(config.model)
    optim.validate(config.optim, config.train.num_steps)
    data_parallel, batch_axes, mesh_shape = _data_parallel(config, num_devices)
    train = config.train
    if train.num_steps <= 0:
        raise ValueError(f"--config.train.num_steps={train.num_steps}: must be positive")
    if train.log_every <= 0:
        raise ValueError(f"--config.train.log_every={train.log_every}: must be positive")
    if train.batch_size <= 0 or train.batch_size % data_parallel:
        raise ValueError(f"--config.train.batch_size={train.batch_size} must be a positive multiple of the "
                         f"{data_parallel} data-parallel devices (mesh axes {batch_axes} of mesh "
                         f"{dict(zip(sharding_lib.MESH_AXES, mesh_shape))})")
    if train.batch_size % process_count:
        raise ValueError(f"--config.train.batch_size={train.batch_size} must be divisible by the "
                         f"{process_count} processes")
    per_replica = train.batch_size // data_parallel
    if per_replica % config.optim.grad_accum_steps:
        raise ValueError(f"--config.optim.grad_accum_steps={config.optim.grad_accum_steps} must divide the "
                         f"per-device batch train.batch_size/{data_parallel} = {per_replica}")
    _validate_profile(train)
    _validate_checkpointing(config.checkpoint)
    divergence.validate_config(train)
    validate_dropout_rng(train.dropout_rng)
    _validate_pretraining_data(config, bert_config, mode)


def _validate_profile(train) -> None:
    if train.profile_start_step < 0 or train.profile_steps <= 0:
        raise ValueError(f"--config.train.profile_start_step={train.profile_start_step} must be >= 0 (0: no trace) "
                         f"and --config.train.profile_steps={train.profile_steps} positive")


def _validate_checkpointing(ckpt) -> None:
    if ckpt.every_steps < 0:
        raise ValueError(f"--config.checkpoint.every_steps={ckpt.every_steps}: must be >= 0 (0: save only at the "
                         "end and on SIGTERM)")
    if ckpt.max_to_keep <= 0:
        raise ValueError(f"--config.checkpoint.max_to_keep={ckpt.max_to_keep}: must be positive")
    for field in ("restore_step", "skip_batches", "max_rewinds", "rewind_skip_batches"):
        if ckpt[field] < 0:
            raise ValueError(f"--config.checkpoint.{field}={ckpt[field]}: must be >= 0")
    if ckpt.skip_batches and not ckpt.restore_step:
        raise ValueError(f"--config.checkpoint.skip_batches={ckpt.skip_batches} needs --config.checkpoint."
                         "restore_step=STEP, the checkpoint the skip starts from (so that rerunning the same command "
                         "after a preemption does not skip again)")


def _validate_pretraining_data(config, bert_config: model_lib.BertConfig, mode: str) -> None:
    data, train, ckpt = config.data, config.train, config.checkpoint
    # Held-out data: its files, or the workdir's held-out documents (data=corpus, made before the run).
    held_out_every = data.get("eval_every_nth_document", 0)
    has_eval_data = bool(data.eval_input_files) or (data.source == "corpus" and held_out_every > 0)
    if mode == "train" and ckpt.keep_best and not has_eval_data:
        raise ValueError("--config.checkpoint.keep_best=True ranks checkpoints by eval loss: set "
                         "--config.data.eval_input_files, or --config.checkpoint.keep_best=False")
    if mode == "train" and has_eval_data and (train.eval_every <= 0 or train.eval_steps <= 0):
        raise ValueError(f"--config.train.eval_every={train.eval_every} and --config.train.eval_steps="
                         f"{train.eval_steps} must be positive when there is held-out data to evaluate on")
    if mode == "eval":
        if data.source == "synthetic" and train.eval_steps <= 0:
            raise ValueError(f"--config.train.eval_steps={train.eval_steps}: synthetic data has no end, so --mode=eval "
                             "evaluates that many batches; set it positive")
        if data.source == "corpus" and held_out_every <= 0:
            raise ValueError(f"--mode=eval needs held-out data, but --config.data.eval_every_nth_document="
                             f"{held_out_every} holds out no document: set it positive, or evaluate "
                             "TFRecords with --config.data.source=tfrecord --config.data.eval_input_files=GLOB")
        if data.source == "tfrecord" and not data.eval_input_files:
            raise ValueError("--mode=eval needs held-out data: set --config.data.eval_input_files=GLOB[,GLOB...] "
                             "(--config.data.input_files is not needed)")
    if data.max_seq_length > bert_config.max_position_embeddings:
        raise ValueError(f"--config.data.max_seq_length={data.max_seq_length} exceeds "
                         f"model.max_position_embeddings={bert_config.max_position_embeddings}")
    if not 0 < data.max_predictions_per_seq <= data.max_seq_length:
        raise ValueError(f"--config.data.max_predictions_per_seq={data.max_predictions_per_seq} must be in "
                         f"[1, data.max_seq_length={data.max_seq_length}]")
    if data.source not in ("corpus", "synthetic", "tfrecord"):
        raise ValueError(f"--config.data.source={data.source!r}: choose 'corpus', 'synthetic' or 'tfrecord'")
    if data.source == "corpus" and not data.corpus:
        raise ValueError("--config.data.source=corpus needs --config.data.corpus (file globs, tfds:NAME or demo)")
    if data.source == "corpus" and data.corpus_format not in corpus.TEXT_FORMATS:
        raise ValueError(f"--config.data.corpus_format={data.corpus_format!r}: choose one of {corpus.TEXT_FORMATS}")
    if data.source == "corpus" and not (isinstance(data.corpus_field, str) and data.corpus_field):
        raise ValueError(f"--config.data.corpus_field={data.corpus_field!r}: name the JSON Lines field or the "
                         "Parquet / CSV column that holds each record's text (default 'text')")
    if data.instances not in instances.INSTANCE_KINDS:
        raise ValueError(f"--config.data.instances={data.instances!r}: choose one of {instances.INSTANCE_KINDS} "
                         "(MLM-only 'rows' or 'fragments' for a model without an NSP head)")
    if mode == "train" and data.source == "tfrecord" and not data.input_files:
        raise ValueError("--config.data.source=tfrecord needs --config.data.input_files=GLOB[,GLOB...]")
    packing.validate_config(data)


def _validate_downstream(config, num_devices: int, process_count: int, mode: str) -> None:
    def fail(field, problem):
        value = config
        for part in field.split("."):
            value = value[part]
        raise ValueError(f"--config.{field}={value!r}: {problem}")

    bert_config = model_config(config.model)
    optim.validate(config.optim, config.train.num_steps or 10**9)
    if config.optim.grad_accum_steps != 1:
        fail("optim.grad_accum_steps", "fine-tuning does not accumulate gradients; set 1 (or lower batch_size)")
    if not 0.0 <= config.optim.warmup_proportion < 1.0:
        fail("optim.warmup_proportion", "must be in [0, 1)")
    data_parallel, batch_axes, _ = _data_parallel(config, num_devices)
    train, data = config.train, config.data
    if train.batch_size <= 0 or train.batch_size % math.lcm(data_parallel, process_count):
        fail("train.batch_size", f"must be a positive multiple of the {data_parallel} data-parallel devices (mesh "
             f"axes {batch_axes}) and of the {process_count} processes")
    if train.num_steps < 0:
        fail("train.num_steps", "must be >= 0 (0: train.num_epochs passes over the data)")
    if train.num_steps == 0 and train.num_epochs <= 0:
        fail("train.num_epochs", "must be positive when train.num_steps is 0")
    if train.log_every <= 0:
        fail("train.log_every", "must be positive")
    if train.eval_every < 0:
        fail("train.eval_every", "must be >= 0 (0: evaluate only at the end)")
    _validate_profile(train)
    divergence.validate_config(train)
    validate_dropout_rng(train.dropout_rng)
    if mode == "glue":
        _validate_glue(config)
    if mode in ("finetune", "glue"):  # the same checkpoints as pretraining (bert_jax.loop)
        _validate_checkpointing(config.checkpoint)
        if config.checkpoint.keep_best and not data.eval_file:
            fail("checkpoint.keep_best", "ranks checkpoints by eval loss: set --config.data.eval_file, or "
                 "--config.checkpoint.keep_best=False")
    if data.max_seq_length > bert_config.max_position_embeddings:
        raise ValueError(f"--config.data.max_seq_length={data.max_seq_length} exceeds the model's "
                         f"max_position_embeddings={bert_config.max_position_embeddings}")
    if not data.vocab_file:
        fail("data.vocab_file", "set it to the vocab.txt / .model / tokenizer directory the model was trained with")
    _validate_task(config, fail)
    architecture = arch_lib.of(bert_config)
    if mode == "features" and architecture.features_model(bert_config) is None:
        raise ValueError(f"--mode={mode} reads BERT models; --config.init={config.init} is "
                         f"{architecture.description} (arch={architecture.name}), which --mode=finetune takes. "
                         "Fix: a BERT checkpoint for --mode=features")
    if config.train.encoder in model_lib.TOKEN_ENCODERS and config.train.encoder not in architecture.token_encoders:
        fail("train.encoder", f"{architecture.description} (arch={architecture.name}) is fine-tuned whole. "
             f"Fix: --config.train.encoder={architecture.token_encoders[0]}")
    _validate_token_encoder(config, bert_config, fail)
    if data.format == "glue" and data.glue_task not in glue_data.BENCHMARK:
        fail("data.glue_task", f"data.format=glue reads a GLUE task's own files: choose one of "
             f"{', '.join(glue_data.BENCHMARK)}")
    if data.format == "conll":  # token classification: words and tags, no columns
        _validate_tagging(config, mode, fail)
        return
    if data.format == "squad":  # extractive question answering: SQuAD JSON, no columns
        _validate_question_answering(config, mode, fail)
        return
    columns = finetune_data.split_names(data.text_columns)
    if not 1 <= len(columns) <= 2:
        fail("data.text_columns", "name one column (single sentence) or two, comma-separated (sentence pair)")
    if data.max_seq_length < len(columns) + 2:
        fail("data.max_seq_length", f"must leave room for at least one token besides [CLS]/[SEP] "
             f"(>= {len(columns) + 2})")
    if mode == "glue":
        return  # each run's files and columns are its GLUE task's (bert_jax.glue.run_config)
    if mode == "finetune":
        if not data.train_file:
            fail("data.train_file", "set a CSV/TSV file or tfds:NAME:SPLIT to fine-tune on")
        if not data.label_column:
            fail("data.label_column", "name the column that holds the class")
    else:
        if not config.features.input_file:
            fail("features.input_file", "set the CSV/TSV/.txt file or tfds:NAME:SPLIT whose texts to embed")
        if config.features.pooling not in POOLINGS:
            fail("features.pooling", f"choose one of {POOLINGS}")
        if config.features.pooling == "last4" and bert_config.num_layers < 4:
            raise ValueError(f"--config.features.pooling='last4' needs at least 4 layers; the model has "
                             f"{bert_config.num_layers}. Fix: pooling cls or mean")


def _validate_glue(config) -> None:
    """configs/glue.py's section and GLUE's directory, every file the runs will read there present."""
    if "glue" not in config:
        raise ValueError("--mode=glue takes configs/glue.py (its glue section: tasks, learning rates, seeds)")
    names = glue_data.parse_tasks(config.glue.tasks)
    for field, parse in (("learning_rates", float), ("seeds", int)):
        values = finetune_data.split_names(config.glue[field])
        try:
            parsed = [parse(value) for value in values]
        except ValueError:
            parsed = []
        if not parsed or (field == "learning_rates" and min(parsed) <= 0):
            raise ValueError(f"--config.glue.{field}={config.glue[field]!r}: give a comma list of "
                             f"{'positive numbers' if parse is float else 'integers'}")
    from_mnli = finetune_data.split_names(config.glue.from_mnli)
    if from_mnli and "mnli" not in names:
        raise ValueError(f"--config.glue.from_mnli={config.glue.from_mnli!r} starts tasks from the MNLI run, but "
                         f"--config.glue.tasks={config.glue.tasks!r} has no mnli. Fix: add mnli, or leave from_mnli "
                         "empty")
    if [name for name in from_mnli if name not in names]:
        raise ValueError(f"--config.glue.from_mnli={config.glue.from_mnli!r} names tasks that --config.glue.tasks="
                         f"{config.glue.tasks!r} does not run")
    if not config.data_dir:
        raise ValueError("--config.data_dir is empty: set it to GLUE's directory (CoLA/, SST-2/, ..., as "
                         "download_glue_data.py writes it)")
    for name in names:
        task = glue_data.TASKS[name]
        for split in (task.train_split, *task.dev_splits, *(task.test_splits if config.glue.submission else ())):
            path = glue_data.split_path(config.data_dir, name, split)
            if not fileio.exists(path):
                raise FileNotFoundError(f"--config.data_dir={config.data_dir}: GLUE's {task.name} {split} file {path} "
                                        "does not exist. Fix: the directory download_glue_data.py writes, or "
                                        f"--config.glue.tasks without {name}")


def _validate_task(config, fail) -> None:
    """config.task is a registered task, and data.format a file format it reads."""
    if config.task not in tasks.NAMES:
        fail("task", f"choose one of {tasks.NAMES} (configs/finetune.py:task=NAME)")
    formats = tuple(dict.fromkeys(form for task in tasks.TASKS.values() for form in task.formats))
    if config.data.format not in formats:
        fail("data.format", f"choose one of {formats}")
    task = tasks.TASKS[config.task]
    if config.data.format not in task.formats:
        reader = next(other.name for other in tasks.TASKS.values() if config.data.format in other.formats)
        fail("data.format", f"task={task.name} reads {task.formats}, and this is a format of task={reader}. Fix: "
             f"configs/finetune.py:task={reader} for {reader} files, or a format of task={task.name}")


def _validate_token_encoder(config, bert_config: model_lib.BertConfig, fail) -> None:
    encoder = config.train.encoder
    if encoder not in model_lib.TOKEN_ENCODERS:
        fail("train.encoder", f"choose one of {model_lib.TOKEN_ENCODERS}")
    if encoder not in tasks.task_class(config.task).encoders:
        fail("train.encoder", "a frozen encoder's per-token features serve token classification only "
             "(task=tokens, data.format=conll). Fix: --config.train.encoder=tuned")
    if encoder == "frozen_last4" and bert_config.num_layers < 4:
        fail("train.encoder", f"needs at least 4 layers; the model has {bert_config.num_layers}. Fix: a deeper "
             "model (--config.model.num_layers or --config.init), or --config.train.encoder=tuned")


def _validate_tagging(config, mode: str, fail) -> None:
    if mode != "finetune":
        fail("data.format", "--mode=features embeds texts (CSV/TSV/.txt/tfds), not CoNLL files")
    if config.data.max_seq_length < 3:
        fail("data.max_seq_length", "must leave room for a word besides [CLS] and [SEP] (>= 3)")
    if not config.data.train_file:
        fail("data.train_file", "set the CoNLL file (a token and its tag per line) to fine-tune on")


def _validate_question_answering(config, mode: str, fail) -> None:
    data = config.data
    if mode != "finetune":
        fail("data.format", "--mode=features embeds texts (CSV/TSV/.txt/tfds), not SQuAD files")
    if not data.train_file:
        fail("data.train_file", "set the SQuAD v1.1 / v2.0 JSON file to fine-tune on")
    if data.max_query_length < 1:
        fail("data.max_query_length", "must be >= 1")
    if data.max_query_length + 3 >= data.max_seq_length:
        fail("data.max_query_length", f"leaves no room for the passage in data.max_seq_length={data.max_seq_length} "
             "([CLS] question [SEP] passage [SEP]). Fix: a smaller max_query_length or a larger max_seq_length")
    if data.doc_stride < 1:
        fail("data.doc_stride", "must be >= 1 (passage pieces between the starts of two windows)")
    for field in ("n_best_size", "max_answer_length"):
        if data[field] < 1:
            fail(f"data.{field}", "must be >= 1")


def _check_files(config, mode: str) -> None:
    """The checks that read files: the downstream tokenizer against the model's rows; the held-out TFRecords."""
    if mode in DOWNSTREAM_MODES:
        from bert_jax.data import tokenization  # pylint: disable=import-outside-toplevel
        data = config.data
        entries = tokenization.load_tokenizer(data.vocab_file, do_lower_case=data.do_lower_case).vocab_size
        if entries > config.model.vocab_size:
            raise ValueError(f"--config.data.vocab_file={data.vocab_file!r} has {entries} entries but the model has "
                             f"model.vocab_size={config.model.vocab_size} rows. Fix: the vocab the model was "
                             "pretrained with, or a larger --config.model.vocab_size")
    elif mode in ("train", "eval") and config.data.source == "tfrecord" and config.data.eval_input_files:
        # Now, not at the first evaluation, which training reaches only after train.eval_every steps.
        from bert_jax.data import input_pipeline  # pylint: disable=import-outside-toplevel
        input_pipeline.check_eval_files(config.data, mode=mode)


def _check_workdir(path: str) -> None:
    if fileio.exists(path) and not fileio.isdir(path):
        raise ValueError(f"--workdir={path} is a file; pass a directory (a new one, or a run's to resume it)")
    try:
        fileio.makedirs(path)
    except OSError as error:
        raise ValueError(f"--workdir={path}: cannot create the directory ({error.strerror or error}); pass a "
                         "directory you can write to") from None
