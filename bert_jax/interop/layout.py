"""The parameter layout every format shares: the name table, the parameter-tree helpers, the layer stacking.

Parameters here are the inner parameter tree (what `TrainState.params` holds, i.e. `variables["params"]`); files
hold float32 numpy arrays in the unrolled layout (`layer_{i}/...`). `host_params` also accepts boxed
(nn.LogicallyPartitioned) trees, a {"params": ...} wrapper, jax.Arrays (sharded ones are gathered: call it on every
process) and scanned layers (model.scan_layers: `layers/...` with a leading layer axis), which it unstacks
(`unstack_layers`; `stack_layers` is the way back, for a scanned model started from a file).
Vocabulary padding: the model's vocab_size may exceed the tokenizer's (tokenization.padded_vocab_size);
`resize_vocab` drops the padding rows, or adds them (zero embeddings, MLM bias = the smallest real bias, so the
padding ids start as unlikely as the least likely real token and an imported model's MLM loss barely moves).
The formats: bert_jax.interop.huggingface, bert_jax.interop.tf_checkpoint, bert_jax.interop.flax_files; which one a
path holds, and loading any of them: bert_jax.interop.pretrained; a checkpoint's export: bert_jax.interop.export.
"""

import dataclasses
import json
import os

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors import numpy as safetensors_numpy

from bert_jax import fileio
from bert_jax import model as model_lib
from bert_jax.data import tokenization

VOCAB_FILE = "vocab.txt"  # the WordPiece vocabulary beside HuggingFace weights and original TF checkpoints
VOCAB_ROWS = ("embeddings/word_embeddings/embedding", "mlm_output_bias")
# Parameters absent from encoder-only checkpoints (BertModel, sentence-transformers): initialised on import.
HEADS = ("pooler", "mlm_transform", "mlm_layer_norm", "mlm_output_bias", "nsp_head")
# Our BertConfig size fields -> their names in HF config.json and the original bert_config.json.
HF_SIZE_FIELDS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
                  "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
                  "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size"}


# ---------------------------------------------------------------------------------------------------------------
# The name table: our path, HF name, original TF name, and whether HF / TF store it transposed relative to ours.

def name_table(num_layers: int):
    def dense(ours, hf, tf):
        return [(f"{ours}/kernel", f"{hf}.weight", f"{tf}/kernel", True, False),
                (f"{ours}/bias", f"{hf}.bias", f"{tf}/bias", False, False)]

    def norm(ours, hf, tf):
        return [(f"{ours}/scale", f"{hf}.weight", f"{tf}/gamma", False, False),
                (f"{ours}/bias", f"{hf}.bias", f"{tf}/beta", False, False)]

    rows = [(f"embeddings/{name}/embedding", f"bert.embeddings.{name}.weight", f"bert/embeddings/{name}", False, False)
            for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
    rows += norm("embeddings/LayerNorm", "bert.embeddings.LayerNorm", "bert/embeddings/LayerNorm")
    for i in range(num_layers):
        ours, hf, tf = f"layer_{i}", f"bert.encoder.layer.{i}", f"bert/encoder/layer_{i}"
        for name in ("query", "key", "value"):
            rows += dense(f"{ours}/attention/{name}", f"{hf}.attention.self.{name}", f"{tf}/attention/self/{name}")
        rows += dense(f"{ours}/attention/output", f"{hf}.attention.output.dense", f"{tf}/attention/output/dense")
        rows += norm(f"{ours}/attention_layer_norm", f"{hf}.attention.output.LayerNorm",
                     f"{tf}/attention/output/LayerNorm")
        rows += dense(f"{ours}/intermediate", f"{hf}.intermediate.dense", f"{tf}/intermediate/dense")
        rows += dense(f"{ours}/output", f"{hf}.output.dense", f"{tf}/output/dense")
        rows += norm(f"{ours}/output_layer_norm", f"{hf}.output.LayerNorm", f"{tf}/output/LayerNorm")
    rows += dense("pooler", "bert.pooler.dense", "bert/pooler/dense")
    rows += dense("mlm_transform", "cls.predictions.transform.dense", "cls/predictions/transform/dense")
    rows += norm("mlm_layer_norm", "cls.predictions.transform.LayerNorm", "cls/predictions/transform/LayerNorm")
    rows += [("mlm_output_bias", "cls.predictions.bias", "cls/predictions/output_bias", False, False),
             ("nsp_head/kernel", "cls.seq_relationship.weight", "cls/seq_relationship/output_weights", True, True),
             ("nsp_head/bias", "cls.seq_relationship.bias", "cls/seq_relationship/output_bias", False, False)]
    return rows


def _is_head(path: str) -> bool:
    return path.split("/")[0] in HEADS


# ---------------------------------------------------------------------------------------------------------------
# The parameter tree.

def dummy_inputs():
    ids = np.zeros((1, 2), np.int32)
    return ids, np.ones_like(ids), ids, np.zeros((1, 1), np.int32)


def expected_shapes(config: model_lib.BertConfig) -> dict:
    """{"layer_0/attention/query/kernel": (768, 768), ...} for `config`, without allocating anything.

    Always the unrolled layout (`layer_{i}`): files hold that layout whatever config.scan_layers says.
    """
    config = dataclasses.replace(config, scan_layers=False)
    abstract = jax.eval_shape(lambda: model_lib.BertForPreTraining(config).init(jax.random.key(0), *dummy_inputs()))
    flat = traverse_util.flatten_dict(nn.meta.unbox(abstract)["params"], sep="/")
    return {path: tuple(leaf.shape) for path, leaf in flat.items()}


def init_params(config: model_lib.BertConfig, seed: int = 0) -> dict:
    """Freshly initialised parameters (numpy, float32), as the model's own init gives them for `seed`."""
    variables = model_lib.BertForPreTraining(config).init(jax.random.key(seed), *dummy_inputs())
    return jax.tree.map(np.asarray, nn.meta.unbox(variables)["params"])


def init_some_params(config: model_lib.BertConfig, paths, seed: int = 0) -> dict:
    """init_params(config, seed)'s values at `paths` only ({"mlm_transform/kernel": array, ...}), compiled as one
    program that computes nothing else: a source's missing heads, without initialising the encoder it replaces."""
    def init(key):
        params = nn.meta.unbox(model_lib.BertForPreTraining(config).init(key, *dummy_inputs()))["params"]
        flat = traverse_util.flatten_dict(params, sep="/")
        return {path: flat[path] for path in paths}
    return jax.tree.map(np.asarray, jax.jit(init)(jax.random.key(seed)))


def host_params(params) -> dict:
    """The flat {path: float32 numpy} tree of any accepted parameter form, scanned layers (model.scan_layers:
    `layers/...` with a leading layer axis) unstacked into the unrolled `layer_{i}/...` layout files use."""
    params = nn.meta.unbox(params)
    if isinstance(params, dict) and set(params) == {"params"}:
        params = params["params"]

    def to_numpy(leaf):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        return np.asarray(leaf, dtype=np.float32)

    flat = {path: to_numpy(leaf) for path, leaf in traverse_util.flatten_dict(params, sep="/").items()}
    if any(path.startswith(model_lib.SCANNED_LAYERS + "/") for path in flat):
        flat = traverse_util.flatten_dict(unstack_layers(unflatten(flat)), sep="/")
    return flat


def check_params(flat: dict, config: model_lib.BertConfig, where: str) -> None:
    wanted = expected_shapes(config)
    missing, extra = sorted(set(wanted) - set(flat)), sorted(set(flat) - set(wanted))
    if missing or extra:
        raise ValueError(f"{where}: the parameters do not fit the BertConfig: missing {missing[:5]}, unexpected "
                         f"{extra[:5]}. Fix: pass the BertConfig the parameters were made with")
    for path, shape in wanted.items():
        if tuple(flat[path].shape) != shape:
            raise ValueError(f"{where}: parameter {path} has shape {tuple(flat[path].shape)} but the BertConfig "
                             f"implies {shape}. Fix: pass the BertConfig the parameters were made with")


def check_head_width(kernel, head: str, width: int, caller: str) -> None:
    """That a fine-tuned model's head `head` has a kernel (None: absent) of `width` outputs, as its labels say; else
    the error every architecture's task export gives."""
    if kernel is None or kernel.shape[1] != width:
        raise ValueError(f"{caller}: the parameters have no {head} of {width} outputs ({head}/kernel: "
                         f"{None if kernel is None else kernel.shape}). Fix: pass a fine-tuned model's parameters "
                         "and its labels.json")


def unflatten(flat: dict) -> dict:
    return traverse_util.unflatten_dict(flat, sep="/")


def resize_vocab(flat: dict, rows: int, names: tuple[str, str] = VOCAB_ROWS) -> dict:
    """Drops padding rows, or adds them (zero embeddings, MLM bias = the smallest real bias); see the module doc.
    `names`: the word embeddings' and the MLM bias's paths (bert_jax.modern's differ from BERT's)."""
    flat = dict(flat)
    embedding, bias = flat[names[0]], flat[names[1]]
    if rows <= embedding.shape[0]:
        flat[names[0]], flat[names[1]] = embedding[:rows], bias[:rows]
    else:
        extra = rows - embedding.shape[0]
        flat[names[0]] = np.concatenate([embedding, np.zeros((extra, embedding.shape[1]), np.float32)])
        flat[names[1]] = np.concatenate([bias, np.full((extra,), bias.min(), np.float32)])
    return flat


def check_sizes(sizes: dict, where: str, names: dict) -> None:
    """Raises one error naming `where` and its fields (names: our field -> the file's) if the sizes cannot describe
    a BERT model. BertConfig.validate would name --config.model flags, which the user never set."""
    problems = [f"{names[field]}={value!r} is not a positive integer" for field, value in sizes.items()
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0]
    if not problems and sizes["hidden_size"] % sizes["num_heads"]:
        problems.append(f"{names['num_heads']}={sizes['num_heads']} does not divide "
                        f"{names['hidden_size']}={sizes['hidden_size']}")
    if problems:
        raise ValueError(f"{where} is not a consistent BERT config: {'; '.join(problems)}. Fix: correct that file "
                         "(or use the config that belongs to these weights)")


# ---------------------------------------------------------------------------------------------------------------
# Scanned layers (model.scan_layers) <-> the unrolled layout of files and of the model without scan_layers.

def stack_layers(params, num_layers: int) -> dict:
    """Unrolled parameters (`layer_0` ... `layer_{n-1}`) -> the scan_layers layout (`layers`, leading layer axis),
    for the params tree (or a {"params": ...} wrapper) of numpy or jax arrays (unboxed: nn.meta.unbox)."""
    if set(params) == {"params"}:
        return {"params": stack_layers(params["params"], num_layers)}
    names = sorted((name for name in params if model_lib.is_unrolled_layer(name)), key=lambda name: int(name[6:]))
    if names != [f"layer_{index}" for index in range(num_layers)]:
        raise ValueError(f"stack_layers: expected layer_0 ... layer_{num_layers - 1}, found {names or 'none'} "
                         f"(scanned parameters already? they hold '{model_lib.SCANNED_LAYERS}')")
    stack = np.stack if all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(params[names[0]])) else jnp.stack
    stacked = jax.tree.map(lambda *leaves: stack(leaves), *(params[name] for name in names))
    rest = {name: value for name, value in params.items() if name not in names}
    return {**rest, model_lib.SCANNED_LAYERS: stacked}


def unstack_layers(params) -> dict:
    """The scan_layers layout (`layers` with a leading layer axis) -> unrolled `layer_{i}` parameters; unrolled
    parameters are returned unchanged."""
    if set(params) == {"params"}:
        return {"params": unstack_layers(params["params"])}
    if model_lib.SCANNED_LAYERS not in params:
        return params
    stacked = params[model_lib.SCANNED_LAYERS]
    num_layers = jax.tree.leaves(stacked)[0].shape[0]
    rest = {name: value for name, value in params.items() if name != model_lib.SCANNED_LAYERS}
    return {**rest, **{f"layer_{index}": jax.tree.map(lambda leaf, i=index: leaf[i], stacked)
                       for index in range(num_layers)}}


# ---------------------------------------------------------------------------------------------------------------
# Files every format reads or writes.

def read_json(path: str) -> dict:
    try:
        with fileio.open_file(path) as file:
            values = json.load(file)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: holds a JSON {type(values).__name__}, not a config object")
    return values


def write_json(path: str, value: dict) -> None:
    with open(path, "w", encoding="utf-8") as file:
        json.dump(value, file, indent=2)
        file.write("\n")


def read_safetensors(path: str) -> dict:
    try:
        return safetensors_numpy.load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable safetensors file ({error}). Fix: pass a model.safetensors "
                         "written by safetensors, or a pytorch_model.bin") from None


def as_tokenizer(tokenizer):
    if tokenizer is None or isinstance(tokenizer, tokenization.Tokenizer):
        return tokenizer
    return tokenization.load_tokenizer(os.fspath(tokenizer))


# ---------------------------------------------------------------------------------------------------------------
# Imports: a source's tensors, named by a column of the name table, into our tree.

@dataclasses.dataclass
class ImportReport:
    """What an import did: where from, which parameters were initialised (absent there), what was not used."""

    source: str
    format: str  # "huggingface", "tf_checkpoint" or "bert_jax"
    initialized: list = dataclasses.field(default_factory=list)  # our parameter paths, initialised from `seed`
    ignored: list = dataclasses.field(default_factory=list)  # tensors in the source that were not used
    vocab_file: str | None = None  # the tokenizer beside the weights (a path load_tokenizer accepts), if any
    notes: list = dataclasses.field(default_factory=list)

    def __str__(self):
        ignored = ", ".join(self.ignored[:8]) + (f" and {len(self.ignored) - 8} more" if len(self.ignored) > 8 else "")
        return "\n".join([f"imported {self.format} weights from {self.source}",
                          f"initialised (absent in the source): {', '.join(self.initialized) or 'none'}",
                          f"ignored: {ignored or 'none'}", f"vocab file: {self.vocab_file or 'none'}", *self.notes])


def vocab_entries(vocab_file: str) -> int:
    # As the original load_vocab reads it: one entry per line, id = line number.
    with open(vocab_file, encoding="utf-8") as file:
        lines = file.read().split("\n")
    return len(lines) - (lines[-1] == "")


def assemble(config, tensors: dict, *, kind: str, where: str, config_name: str, vocab_file, check_vocab: bool,
             seed: int, report: ImportReport):
    """Our flat params from source tensors named by the table's `kind` column, checking shapes and the vocab."""
    column, transposed = (1, 3) if kind == "hf" else (2, 4)
    wanted = expected_shapes(config)
    flat, used, missing = {}, set(), []
    sizes = (f"vocab_size={config.vocab_size}, hidden_size={config.hidden_size}, intermediate_size="
             f"{config.intermediate_size}, max_position_embeddings={config.max_position_embeddings}, "
             f"type_vocab_size={config.type_vocab_size}")
    for row in name_table(config.num_layers):
        ours, name = row[0], row[column]
        if name not in tensors:
            missing.append(ours)
            if not _is_head(ours):
                raise ValueError(f"{where}: tensor {name} is missing" + (" (looked for it with and without the "
                                 "'bert.' prefix)" if kind == "hf" else "") + "; it is part of every BERT encoder")
            continue
        value = np.asarray(tensors[name], np.float32)
        expected = wanted[ours][::-1] if row[transposed] else wanted[ours]
        if tuple(value.shape) != tuple(expected):
            raise ValueError(f"{where}: tensor {name} has shape {tuple(value.shape)} but {config_name} ({sizes}) "
                             f"implies {tuple(expected)}. Fix: use the config that belongs to these weights")
        flat[ours] = value.T if row[transposed] else value
        used.add(name)
    if missing:
        flat.update(init_some_params(config, missing, seed))
        report.initialized = missing
        report.notes.append(f"initialised {len(missing)} head parameters absent in the source (seed {seed})")
    report.ignored = sorted(set(tensors) - used)
    if vocab_file is not None:
        report.vocab_file = vocab_file
        entries, rows = vocab_entries(vocab_file), config.vocab_size
        if check_vocab and entries != rows:
            raise ValueError(f"{vocab_file} has {entries} entries but the word embeddings "
                             f"({name_table(0)[0][column]}) have {rows} rows. Fix: use the vocab that belongs "
                             "to these weights, or pass check_vocab=False to import them as they are")
    return unflatten(flat)
