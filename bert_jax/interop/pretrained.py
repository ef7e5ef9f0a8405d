"""Pretrained weights into bert_jax, whatever their format: `load_pretrained` recognises it by its files
(`checkpoint_format`) and calls the format's module; the dispatch alone lives here.

The result is (BertConfig, params, ImportReport), params the inner parameter tree as float32 numpy arrays
(bert_jax.interop.layout's layout and name table). The formats, one module each:
- HuggingFace (bert_jax.interop.huggingface.import_hf): config.json beside model.safetensors (sharded too) or a
  pytorch_model.bin (read weights-only: a pickle that needs more is refused, never executed).
- Original TF checkpoints (bert_jax.interop.tf_checkpoint.import_tf): bert_model.ckpt.* + bert_config.json +
  vocab.txt; the original "gelu" (the tanh approximation) becomes our "gelu_tanh".
- Ours (bert_jax.interop.flax_files.load_flax): export_flax's directory.
Heads an encoder-only checkpoint lacks are initialised and reported. Vocabulary padding: `load_pretrained(...,
vocab_size=N)` adds rows (layout.resize_vocab). Exports: huggingface.export_hf, flax_files.export_flax, and
bert_jax.interop.export for a checkpoint. Paths are local files.
bert_jax.interop.init_architecture reads the same files for --config.init's architecture. `init_params` is the one
--config.init loader of both jobs: a bert_jax checkpoint or any format above, the parameters a model takes from it
born sharded.
"""

import dataclasses
import os

from absl import logging
from flax import traverse_util
import jax
import numpy as np

from bert_jax import arch as arch_lib
from bert_jax import checkpoint as checkpoint_lib
from bert_jax import fileio
from bert_jax.data import tokenization
from bert_jax.interop import flax_files
from bert_jax.interop import huggingface
from bert_jax.interop import layout
from bert_jax.interop import tf_checkpoint
from bert_jax.interop.flax_files import FLAX_CONFIG
from bert_jax.interop.huggingface import HF_CONFIG, HF_PICKLE, HF_WEIGHTS
from bert_jax.interop.layout import VOCAB_ROWS, ImportReport


def checkpoint_format(path: str) -> str:
    """"bert_jax" (export_flax), "huggingface" or "tf_checkpoint", recognised by the files at `path`."""
    is_dir = os.path.isdir(path)
    if is_dir and os.path.exists(os.path.join(path, FLAX_CONFIG)):
        return "bert_jax"
    if (is_dir and os.path.exists(os.path.join(path, HF_CONFIG))) or path.endswith(
            (".safetensors", ".bin", ".pt", ".pth", ".index.json")):
        return "huggingface"
    if (any(name.endswith(".index") for name in os.listdir(path)) if is_dir
            else os.path.exists(tf_checkpoint.tf_prefix(path) + ".index")):
        return "tf_checkpoint"
    looked_for = (f"{FLAX_CONFIG} (export_flax), {HF_CONFIG} with {HF_WEIGHTS} / {HF_PICKLE} (HuggingFace), "
                  "NAME.index + NAME.data-* (original TF checkpoint)")
    if not os.path.exists(path) and not os.path.exists(path + ".index"):
        raise FileNotFoundError(f"{path} does not exist; load_pretrained reads {looked_for}")
    raise ValueError(f"{path}: no known checkpoint format; looked for {looked_for}")


def saved_tokenizer(directory: str) -> str | None:
    """`directory` if a Tokenizer.save() wrote into it (our exports, fine-tuned directories)."""
    return directory if fileio.exists(fileio.join(directory, tokenization.CONFIG_FILE)) else None


def load_pretrained(path: str, *, vocab_size: int | None = None, seed: int = 0, check_vocab: bool = True):
    """(BertConfig, params, ImportReport) from any supported format, recognised by its files: our export_flax
    directory, a HuggingFace directory or weights file, or an original TF checkpoint (directory or prefix). A
    transformers ModernBERT (config.json's model_type) gives (bert_jax.modern.ModernConfig, its params, report).

    `vocab_size` resizes the vocabulary rows: larger adds padding rows (zero embeddings, MLM bias = the smallest
    real bias), e.g. tokenization.padded_vocab_size(real size) for a model to pretrain further; smaller is refused.
    """
    path = os.fspath(path)
    kind = checkpoint_format(path)
    if kind == "bert_jax":
        config, params = flax_files.load_flax(path)
        report = ImportReport(source=path, format=kind, vocab_file=saved_tokenizer(path))
    elif kind == "huggingface":
        model_type = layout.read_json(huggingface.hf_config_path(path)).get("model_type")
        config, params, report = arch_lib.for_transformers(model_type).import_transformers(
            path, seed=seed, check_vocab=check_vocab)
    else:
        config, params, report = tf_checkpoint.import_tf(path, seed=seed, check_vocab=check_vocab)
    if vocab_size is not None and vocab_size != config.vocab_size:
        if vocab_size < config.vocab_size:
            raise ValueError(f"load_pretrained: vocab_size={vocab_size} is smaller than the {config.vocab_size} rows "
                             f"of {VOCAB_ROWS[0]}; rows are only added, never dropped")
        report.notes.append(f"vocabulary padded from {config.vocab_size} to {vocab_size} rows")
        params = layout.unflatten(layout.resize_vocab(traverse_util.flatten_dict(params, sep="/"), vocab_size,
                                                      arch_lib.of(config).vocab_rows))
        config = dataclasses.replace(config, vocab_size=vocab_size)
    return config, params, report


def init_params(path: str, model_config, abstract, shardings, select=None) -> tuple[dict, str]:
    """(parameters, where they were read) for --config.init=`path`, placed as `shardings` (each process reads
    only its own slices of a foreign checkpoint): the top-level names of `abstract` (the model's parameter shapes)
    that `select(name)` keeps (None: all of them; fine-tuning passes its architecture's is_pretrained_parameter).

    A bert_jax checkpoint is checked against `abstract` before anything is read (the first parameter it lacks or
    holds in another shape is named). Any other format is read by load_pretrained with `model_config`'s vocabulary
    rows (padded where the model's are more), its notes logged, in the model's layout (scanned layers stacked).
    A selected parameter that the architecture lets start fresh (optional_pretrained_parameters) and the checkpoint
    lacks is left out, with a warning.
    """
    architecture = arch_lib.of(model_config)
    names = [name for name in abstract if select is None or select(name)]
    optional = architecture.optional_pretrained_parameters if select is not None else ()
    if checkpoint_lib.is_checkpoint(path):
        names = _check_checkpoint_fits(path, {name: abstract[name] for name in names}, optional)
        return checkpoint_lib.restore_params(path, {name: abstract[name] for name in names},
                                             {name: shardings[name] for name in names})
    _, params, report = load_pretrained(path, vocab_size=model_config.vocab_size)
    for note in report.notes:
        logging.info("--config.init: %s", note)
    if report.initialized:
        logging.warning("--config.init: %s has no %s; initialised afresh", path, ", ".join(report.initialized))
    params = architecture.stack_layers(params, model_config)  # imports are unrolled (layer_0, layer_1, ...)
    return _place_host_params(params, abstract, shardings, names, path, optional), path


def _check_checkpoint_fits(path: str, abstract, optional) -> list[str]:
    """Names the first parameter the bert_jax checkpoint lacks or holds in another shape, before reading any.
    Returns the top-level names to read: all of `abstract`'s, less those of `optional` the checkpoint does not
    have, which then start fresh."""
    directory = checkpoint_lib.step_directory(path)  # a checkpoints directory: its latest complete step
    saved = checkpoint_lib.state_metadata(str(directory))["train_state"]["params"]
    for name in [name for name in optional if name in abstract and name not in saved]:
        logging.warning("--config.init=%s has no %s: it starts fresh", path, name)
        abstract = {key: value for key, value in abstract.items() if key != name}
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


def _place_host_params(host_params, abstract, shardings, names, path, optional):
    """Host arrays of a foreign checkpoint -> sharded arrays (each process reads only its own slices)."""
    host_params = host_params.get("params", host_params)
    missing = [name for name in names if name not in host_params]
    if [name for name in missing if name not in optional]:
        raise ValueError(f"--config.init={path!r}: the converted checkpoint lacks {missing}; it has "
                         f"{sorted(host_params)}")
    for name in missing:
        logging.warning("--config.init=%s has no %s: it starts fresh", path, name)
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
