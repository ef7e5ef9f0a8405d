"""Shared test configuration: the tiny preset, shrunk further so that every test compiles in seconds."""

import json
import os

import flax.linen as nn
import jax
import numpy as np
import optax

from bert_jax.data import input_pipeline
from bert_jax import finetune as finetune_lib
from bert_jax import job_config
from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax import pretraining
from bert_jax import sharding as sharding_lib
from bert_jax import steps as steps_lib
from bert_jax import train
from configs import pretrain

TINY_VOCAB = 512  # divisible by every tensor-axis size tested, so the vocab dimension really is sharded
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "google_bert")


def tiny_config(mesh_shape=(1, 1, 1), dropout=False, vocab_size=TINY_VOCAB, **train_overrides):
    config = pretrain.get_config("size=tiny,data=synthetic")
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh_shape
    config.model.vocab_size = vocab_size
    config.model.max_position_embeddings = 64
    if not dropout:
        config.model.dropout_rate = 0.0
        config.model.attention_dropout_rate = 0.0
    config.optim.learning_rate = 1e-3
    config.optim.warmup_steps = 2
    # One schedule whatever train.num_steps a test sets: tests of the same mesh, shapes and dropout then compile
    # the same step, which the run's compilation cache serves after the first (tests/compile_cache.py).
    config.optim.schedule_steps = 100
    config.data.max_seq_length = 32
    config.data.max_predictions_per_seq = 5
    config.train.batch_size = 16
    config.train.num_steps = 10
    config.train.log_every = 5
    for key, value in train_overrides.items():
        config.train[key] = value
    return config


def tiny_modern_config(mesh_shape=(1, 1, 1), **train_overrides):
    """tiny_config's shapes and optimizer for the modern encoder (arch=modern): 2 layers, a global and a local one
    whose window (8: 4 rows each side) is shorter than the 32-token rows."""
    config = tiny_config(mesh_shape, **train_overrides)
    modern = pretrain.get_config("size=tiny,data=synthetic,arch=modern")
    modern.model.vocab_size, modern.model.max_position_embeddings = config.model.vocab_size, 64
    modern.model.local_attention = 8
    for section in ("mesh", "optim", "data", "train"):
        modern[section] = config[section]
    return modern


def train_steps(config, devices, steps):
    """`steps` jitted train steps of `config` on one synthetic batch (seed 3) over `devices`.

    Returns the losses, the final train state and the step's StableHLO text (what the model traced into)."""
    mesh = sharding_lib.create_mesh(config.mesh, devices)
    rules = sharding_lib.logical_rules(config.mesh)
    model = train.pretraining_model(config.model)
    tx, schedule = optim.create_optimizer(config.optim, config.train.num_steps)
    batch = next(input_pipeline.synthetic_batches(
        batch_size=config.train.batch_size, max_seq_length=config.data.max_seq_length,
        max_predictions_per_seq=config.data.max_predictions_per_seq, vocab_size=config.model.vocab_size, seed=3))
    losses = []
    with jax.set_mesh(mesh):
        state, shardings = train.create_train_state(model, tx, mesh, rules, jax.random.key(0),
                                                    config.data.max_seq_length, config.data.max_predictions_per_seq)
        step = train.jit_train_step(steps_lib.make_train_step(model, tx, schedule, rules, mesh), shardings, mesh, rules)
        global_batch = sharding_lib.make_global_batch(batch, sharding_lib.batch_sharding(mesh, rules))
        lowered = step.lower(state, global_batch, jax.random.key(1))
        compiled = lowered.compile()
        for _ in range(steps):
            state, metrics = compiled(state, global_batch, jax.random.key(1))
            losses.append(float(metrics["loss"]))
    return np.asarray(losses), state, lowered.as_text()


def write_pretraining_records(path, *, num_records, seed, max_seq_length=32, max_predictions_per_seq=5,
                              vocab_size=TINY_VOCAB, masked=True):
    """A TFRecord file of `num_records` synthetic instances in the original google-research/bert layout: the
    masked layout (static masks) or, with masked=False, the unmasked one (the pipeline masks it dynamically).

    Small shapes (32 tokens, 5 predictions, ids below TINY_VOCAB) that tiny_config trains on in a fraction of the
    time the 128-token, 30522-word fixtures in tests/fixtures/google_bert take. Returns `path` as a str."""
    from bert_jax import record_framing  # pylint: disable=import-outside-toplevel
    from bert_jax.data import instances, tfrecord  # pylint: disable=import-outside-toplevel
    batch = input_pipeline.synthetic_batch(np.random.default_rng(seed), batch_size=num_records,
                                           max_seq_length=max_seq_length,
                                           max_predictions_per_seq=max_predictions_per_seq, vocab_size=vocab_size)
    writer = record_framing.TFRecordWriter(str(path))
    for row in range(num_records):
        length = int(batch["input_mask"][row].sum())
        count = int(batch["masked_lm_weights"][row].sum())
        positions = batch["masked_lm_positions"][row, :count].tolist()
        labels = batch["masked_lm_ids"][row, :count].tolist()
        input_ids = batch["input_ids"][row, :length].copy()
        if not masked:  # the original tokens back in place of the [MASK]s
            input_ids[positions] = labels
        instance = instances.TrainingInstance(
            input_ids=input_ids.tolist(), segment_ids=batch["segment_ids"][row, :length].tolist(),
            masked_lm_positions=positions if masked else None, masked_lm_ids=labels if masked else None,
            next_sentence_label=int(batch["next_sentence_labels"][row]))
        writer.write(tfrecord.serialize_example(instance, max_seq_length=max_seq_length,
                                                max_predictions_per_seq=max_predictions_per_seq))
    writer.close()
    return str(path)


def small_tfrecord_config(records, mesh_shape=(2, 2, 2), dropout=False, **train_overrides):
    """tiny_config reading the TFRecords of tests/_session.py's `small_records` (data.source=tfrecord)."""
    config = tiny_config(mesh_shape, dropout=dropout, **train_overrides)
    config.data.source = "tfrecord"
    config.data.input_files, config.data.eval_input_files = records["train"], records["eval"]
    config.data.shuffle_buffer = 64
    return config


def metrics_by_step(workdir, name="metrics.jsonl"):
    """step -> logged values (a resumed run leaves one line per step)."""
    lines = [json.loads(line) for line in open(os.path.join(workdir, name))]
    return {line["step"]: line for line in lines}


def state_on_mesh(config, mesh_shape):
    """`mesh_shape`: (data, fsdp, tensor) on one slice, or (dcn_data, data, fsdp, tensor)."""
    config.mesh.dcn_data, config.mesh.data, config.mesh.fsdp, config.mesh.tensor = (
        mesh_shape if len(mesh_shape) == 4 else (1, *mesh_shape))
    mesh = sharding_lib.create_mesh(config.mesh)
    rules = sharding_lib.logical_rules(config.mesh)
    model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
    tx, _ = optim.create_optimizer(config.optim, config.train.num_steps)
    return mesh, rules, model, tx


# The jobs as a library caller runs them: the config through bert_jax.job_config.prepare (as the driver does), then
# the job.

def run_pretraining(config, workdir):
    return pretraining.train_and_evaluate(job_config.prepare(config, workdir, "train"), workdir)


def run_eval(config, workdir, checkpoint=""):
    return pretraining.evaluate_checkpoint(job_config.prepare(config, workdir, "eval"), workdir, checkpoint)


def run_finetune(config, workdir):
    """The last logged metrics of a fine-tuning run (its held-out scores included)."""
    return finetune_lib.finetune(job_config.prepare(config, workdir, "finetune"), workdir).metrics


def run_features(config, workdir):
    return finetune_lib.extract_features(job_config.prepare(config, workdir, "features"), workdir)


def byte_level_bpe(texts, vocab_size, directory):
    """A tokenizer.json made as ModernBERT's is (a byte-level BPE, no prefix space, BERT's special tokens and
    [CLS] $A [SEP] template), trained on `texts` with `tokenizers`; returns its path."""
    from tokenizers import (Tokenizer, decoders, models, pre_tokenizers, processors,  # pylint: disable=C0415
                            trainers)
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "tokenizer.json")
    tokenizer.save(path)
    return path


def random_params(module, *args, seed=1, **kwargs):
    """Host weights of `module`'s parameter tree and shapes, its init traced for the shapes alone (nothing compiled:
    the init was often the costliest program of a test that needs weights but not the initialisers' values). Kernels,
    embeddings and biases N(0, 0.02), as the init draws kernels; norm scales 1 + N(0, 0.1), off their initial 1 and
    0 so that each shows in the results."""
    abstract = nn.meta.unbox(jax.eval_shape(lambda: module.init(jax.random.key(0), *args, **kwargs)))["params"]
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        noise = rng.standard_normal(leaf.shape)
        return (1 + 0.1 * noise if path[-1].key == "scale" else 0.02 * noise).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, abstract)


def first_step_gradients(opt_state, grad_norm, optim_config):
    """The first step's gradient, read back from AdamW's first moment.

    After one step mu = (1 - b1) * clip(g), and clip(g) = g * min(1, max_grad_norm / |g|), with |g| the grad_norm
    metric: so one compiled train step yields the loss, every gradient and the optimizer's steps, without compiling
    a separate gradient function per mesh.
    """
    [adam] = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
              if isinstance(s, optax.ScaleByAdamState)]
    scale = max(1.0, grad_norm / optim_config.max_grad_norm) / (1 - optim_config.b1)
    return jax.tree.map(lambda mu: np.asarray(mu, np.float64) * scale, adam.mu)
