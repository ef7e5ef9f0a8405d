"""Pretrained weights into bert_jax: HuggingFace transformers, original google-research/bert TF checkpoints, ours.

`load_pretrained` recognises each format by its files; the result is (BertConfig, params, ImportReport), params the
inner parameter tree as float32 numpy arrays (bert_jax.interop.export's layout and name table).
- HuggingFace (`import_hf`): config.json beside model.safetensors (sharded too) or a pytorch_model.bin. A pickle is
  read with `torch.load(weights_only=True)` only: one that needs anything more is refused, never executed.
- Original TF checkpoints (`import_tf`): bert_model.ckpt.* + bert_config.json + vocab.txt. The original code's
  "gelu" is the tanh approximation, so its hidden_act "gelu" becomes our "gelu_tanh" (HF's own converter maps it to
  exact gelu, which moves every activation slightly).
- Ours: export.export_flax's directory (export.load_flax).
Heads an encoder-only checkpoint lacks are initialised and reported. Vocabulary padding: `load_pretrained(...,
vocab_size=N)` adds rows: zero embeddings, MLM bias rows equal to the smallest real bias (so the padding ids start as
unlikely as the least likely real token and the imported model's MLM loss barely moves). Paths are local files.
bert_jax.interop.init_architecture reads the same files for --config.init's architecture.
"""

import dataclasses
import json
import os
import re
import zipfile

from flax import traverse_util
import numpy as np

from bert_jax.interop import export
from bert_jax import fileio
from bert_jax import model as model_lib
from bert_jax.data import tokenization
from bert_jax.interop.export import FLAX_CONFIG, HF_CONFIG, HF_PICKLE, HF_WEIGHTS, TF_CONFIG, VOCAB_FILE, VOCAB_ROWS

# HF hidden_act -> ours. gelu_new, gelu_pytorch_tanh and gelu_fast are one formula: the tanh approximation.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}
# The original modeling.py's "gelu" is 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))): our gelu_tanh.
TF_ACTIVATIONS = {"gelu": "gelu_tanh"}
# Parameters absent from encoder-only checkpoints (BertModel, sentence-transformers): initialised on import.
HEADS = ("pooler", "mlm_transform", "mlm_layer_norm", "mlm_output_bias", "nsp_head")
# Our BertConfig size fields -> their names in HF config.json and the original bert_config.json.
HF_SIZE_FIELDS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
                  "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
                  "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size"}


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


def _is_head(path: str) -> bool:
    return path.split("/")[0] in HEADS


def _read_pickle(path: str) -> dict:
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise ImportError(f"{path}: reading a PyTorch pickle needs torch (pip install torch); or convert the "
                          "file to safetensors") from None
    with open(path, "rb") as file:
        head = file.read(2)
    if not (zipfile.is_zipfile(path) or head[:1] == b"\x80"):
        raise ValueError(f"{path}: neither a safetensors file nor a PyTorch pickle (it starts with {head!r}). "
                         "Fix: pass a model.safetensors or a pytorch_model.bin")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # pylint: disable=broad-except  # torch raises UnpicklingError and RuntimeError
        needs = re.findall(r"GLOBAL [\w.]+", str(error)) or [str(error).splitlines()[0][:120]]
        raise ValueError(f"{path}: refused: this pickle needs more than tensors to load ({needs[0]}), and "
                         "unpickling it could run arbitrary code. Fix: convert it to safetensors where you trust it, "
                         "or get the model's model.safetensors") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors")
    return {name: value.float().numpy() for name, value in state.items() if hasattr(value, "numpy")}


def _read_hf_weights(path: str) -> tuple[dict, str]:
    """({name: array}, the file read) from an HF model directory or weights file (sharded ones included)."""
    if os.path.isdir(path):
        for name in (HF_WEIGHTS, HF_WEIGHTS + ".index.json", HF_PICKLE, HF_PICKLE + ".index.json"):
            if os.path.exists(os.path.join(path, name)):
                return _read_hf_weights(os.path.join(path, name))
        raise FileNotFoundError(f"{path}: no {HF_WEIGHTS}, {HF_PICKLE} or their .index.json in this directory")
    if path.endswith(".index.json"):
        with open(path, encoding="utf-8") as file:
            shards = sorted(set(json.load(file)["weight_map"].values()))
        tensors = {}
        for shard in shards:
            tensors.update(_read_hf_weights(os.path.join(os.path.dirname(path), shard))[0])
        return tensors, path
    if path.endswith(".safetensors"):
        return export.read_safetensors(path), path
    return _read_pickle(path), path


def config_from_hf(values: dict, where: str) -> model_lib.BertConfig:
    def field(name):
        if name not in values:
            raise ValueError(f"{where}: field {name!r} is missing; a BERT config.json has it")
        return values[name]

    for name, wanted in (("model_type", "bert"), ("position_embedding_type", "absolute"), ("is_decoder", False)):
        if values.get(name, wanted) != wanted:
            raise ValueError(f"{where}: field {name!r} is {values[name]!r}; only {wanted!r} is supported")
    act = field("hidden_act")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"{where}: field 'hidden_act' is {act!r}; supported: {sorted(HF_ACTIVATIONS)}")
    sizes = {ours: field(theirs) for ours, theirs in HF_SIZE_FIELDS.items() if ours != "type_vocab_size"}
    sizes["type_vocab_size"] = values.get("type_vocab_size", 2)
    _check_sizes(sizes, where, HF_SIZE_FIELDS)
    return model_lib.BertConfig(
        **sizes, hidden_act=HF_ACTIVATIONS[act], dropout_rate=values.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=values.get("attention_probs_dropout_prob", 0.1),
        initializer_range=values.get("initializer_range", 0.02),
        layer_norm_eps=values.get("layer_norm_eps", 1e-12)).validate()


def _check_sizes(sizes: dict, where: str, names: dict) -> None:
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


def read_json(path: str) -> dict:
    try:
        with fileio.open_file(path) as file:
            values = json.load(file)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: holds a JSON {type(values).__name__}, not a config object")
    return values


def hf_config_path(path: str) -> str:
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config_path = os.path.join(directory, HF_CONFIG)
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{config_path} does not exist; the BERT config.json must sit beside the weights")
    return config_path


def config_from_tf(config_path: str) -> model_lib.BertConfig:
    """The original bert_config.json: HF's field names, and "gelu" meaning the tanh approximation."""
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{config_path} does not exist. Fix: pass bert_config_json=.../bert_config.json")
    values = read_json(config_path)
    act = values.get("hidden_act")
    if act not in TF_ACTIVATIONS:
        raise ValueError(f"{config_path}: field 'hidden_act' is {act!r}; the original BERT checkpoints use 'gelu'")
    return config_from_hf(dict(values, hidden_act="gelu_new", model_type="bert"), config_path)


def config_from_ours(config_path: str) -> model_lib.BertConfig:
    """A BertConfig written as JSON by bert_jax (export_flax's bert_jax_config.json, a run's model_config.json)."""
    values = read_json(config_path)
    values.pop("matmul", None)  # named by earlier versions; it never changed the weights
    fields = {field.name for field in dataclasses.fields(model_lib.BertConfig)}
    if set(values) - fields:
        raise ValueError(f"{config_path}: unknown fields {sorted(set(values) - fields)}; it is not a bert_jax "
                         "model config")
    _check_sizes({field: values.get(field, getattr(model_lib.BertConfig, field)) for field in HF_SIZE_FIELDS},
                 config_path, {field: field for field in HF_SIZE_FIELDS})
    try:
        return model_lib.BertConfig(**values).validate()
    except ValueError as error:  # validate names the --config.model flag; here the field is the file's
        raise ValueError(f"{config_path}: {str(error).replace('--config.model.', '')}") from None


def _normalize_hf_name(name: str) -> str:
    # BertModel checkpoints (sentence-transformers among them) lack the "bert." prefix; old ones say gamma/beta.
    if name.split(".")[0] in ("embeddings", "encoder", "pooler"):
        name = "bert." + name
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))


def _vocab_entries(vocab_file: str) -> int:
    # As the original load_vocab reads it: one entry per line, id = line number.
    with open(vocab_file, encoding="utf-8") as file:
        lines = file.read().split("\n")
    return len(lines) - (lines[-1] == "")


def _assemble(config, tensors: dict, *, kind: str, where: str, config_name: str, vocab_file, check_vocab: bool,
              seed: int, report: ImportReport):
    """Our flat params from source tensors named by the table's `kind` column, checking shapes and the vocab."""
    column, transposed = (1, 3) if kind == "hf" else (2, 4)
    wanted = export.expected_shapes(config)
    flat, used, missing = {}, set(), []
    sizes = (f"vocab_size={config.vocab_size}, hidden_size={config.hidden_size}, intermediate_size="
             f"{config.intermediate_size}, max_position_embeddings={config.max_position_embeddings}, "
             f"type_vocab_size={config.type_vocab_size}")
    for row in export.name_table(config.num_layers):
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
        fresh = traverse_util.flatten_dict(export.init_params(config, seed), sep="/")
        flat.update({path: fresh[path] for path in missing})
        report.initialized = missing
        report.notes.append(f"initialised {len(missing)} head parameters absent in the source (seed {seed})")
    report.ignored = sorted(set(tensors) - used)
    if vocab_file is not None:
        report.vocab_file = vocab_file
        entries, rows = _vocab_entries(vocab_file), config.vocab_size
        if check_vocab and entries != rows:
            raise ValueError(f"{vocab_file} has {entries} entries but the word embeddings "
                             f"({export.name_table(0)[0][column]}) have {rows} rows. Fix: use the vocab that belongs "
                             "to these weights, or pass check_vocab=False to import them as they are")
    return export.unflatten(flat)


def import_hf(path: str, *, seed: int = 0, check_vocab: bool = True):
    """(BertConfig, params, ImportReport) from a HuggingFace BERT directory or weights file.

    Full BertForPreTraining checkpoints, or encoder-only BertModel ones (keys with or without "bert."): heads they
    lack (pooler, MLM transform and bias, NSP) are initialised from the model's init with `seed` and listed in the
    report. config.json must sit beside the weights; a vocab.txt there is checked against the embedding rows.
    """
    path = os.fspath(path)
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config_path = hf_config_path(path)
    config = config_from_hf(read_json(config_path), config_path)
    raw, weights_file = _read_hf_weights(path)
    tensors = {_normalize_hf_name(name): value for name, value in raw.items()}
    report = ImportReport(source=weights_file, format="huggingface")
    if config.hidden_act == "gelu_tanh":
        report.notes.append("hidden_act: HF's tanh-approximated gelu is our gelu_tanh")
    decoder, decoder_bias = tensors.get("cls.predictions.decoder.weight"), tensors.get("cls.predictions.decoder.bias")
    embeddings = tensors.get("bert.embeddings.word_embeddings.weight")
    if decoder is not None and embeddings is not None and not np.array_equal(decoder, embeddings):
        raise ValueError(f"{weights_file}: tensor cls.predictions.decoder.weight differs from "
                         "bert.embeddings.word_embeddings.weight; this model ties them, so it cannot hold an "
                         "untied decoder")
    if decoder_bias is not None:
        tensors.setdefault("cls.predictions.bias", decoder_bias)
        if not np.array_equal(tensors["cls.predictions.bias"], decoder_bias):
            raise ValueError(f"{weights_file}: tensor cls.predictions.decoder.bias differs from cls.predictions.bias"
                             "; transformers ties them, so one of them is stale")
    vocab_file = os.path.join(directory, VOCAB_FILE)
    params = _assemble(config, tensors, kind="hf", where=weights_file, config_name=config_path,
                       vocab_file=vocab_file if os.path.exists(vocab_file) else None, check_vocab=check_vocab,
                       seed=seed, report=report)
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    report.ignored = [name for name in report.ignored if name not in tied]
    return config, params, report


def tf_prefix(path: str) -> str:
    if os.path.isdir(path):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        latest = tf.train.latest_checkpoint(path)
        if latest:
            return latest
        indexes = sorted(name[:-len(".index")] for name in os.listdir(path) if name.endswith(".index"))
        if len(indexes) != 1:
            raise FileNotFoundError(f"{path}: expected one TF checkpoint (NAME.index + NAME.data-*), found "
                                    f"{indexes or 'none'}. Fix: pass the prefix, e.g. {path}/bert_model.ckpt")
        return os.path.join(path, indexes[0])
    for suffix in (".index", ".meta"):
        if path.endswith(suffix):
            return path[:-len(suffix)]
    return re.sub(r"\.data-\d+-of-\d+$", "", path)


def import_tf(checkpoint_dir_or_prefix: str, bert_config_json: str | None = None, *, seed: int = 0,
              check_vocab: bool = True):
    """(BertConfig, params, ImportReport) from an original google-research/bert TensorFlow checkpoint.

    `checkpoint_dir_or_prefix`: the directory (bert_model.ckpt.* inside) or the prefix .../bert_model.ckpt.
    bert_config.json defaults to the one beside it; its hidden_act "gelu" means the original code's tanh
    approximation and becomes our "gelu_tanh". A missing pooler/MLM/NSP head is initialised (see import_hf);
    optimizer slots (adam_m, adam_v) and global_step are ignored.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    prefix = tf_prefix(os.fspath(checkpoint_dir_or_prefix))
    if not os.path.exists(prefix + ".index"):
        raise FileNotFoundError(f"{prefix}.index does not exist: {checkpoint_dir_or_prefix} is not an original "
                                "BERT checkpoint (bert_model.ckpt.index + bert_model.ckpt.data-*)")
    directory = os.path.dirname(prefix)
    config_path = bert_config_json or os.path.join(directory, TF_CONFIG)
    config = config_from_tf(config_path)
    reader = tf.train.load_checkpoint(prefix)
    tensors = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    report = ImportReport(source=prefix, format="tf_checkpoint", notes=[
        "hidden_act: the original BERT 'gelu' is the tanh approximation, imported as gelu_tanh"])
    vocab_file = os.path.join(directory, VOCAB_FILE)
    params = _assemble(config, tensors, kind="tf", where=prefix, config_name=config_path,
                       vocab_file=vocab_file if os.path.exists(vocab_file) else None, check_vocab=check_vocab,
                       seed=seed, report=report)
    return config, params, report


def checkpoint_format(path: str) -> str:
    """"bert_jax" (export_flax), "huggingface" or "tf_checkpoint", recognised by the files at `path`."""
    is_dir = os.path.isdir(path)
    if is_dir and os.path.exists(os.path.join(path, FLAX_CONFIG)):
        return "bert_jax"
    if (is_dir and os.path.exists(os.path.join(path, HF_CONFIG))) or path.endswith(
            (".safetensors", ".bin", ".pt", ".pth", ".index.json")):
        return "huggingface"
    if (any(name.endswith(".index") for name in os.listdir(path)) if is_dir
            else os.path.exists(tf_prefix(path) + ".index")):
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
    directory, a HuggingFace directory or weights file, or an original TF checkpoint (directory or prefix).

    `vocab_size` resizes the vocabulary rows: larger adds padding rows (zero embeddings, MLM bias = the smallest
    real bias), e.g. tokenization.padded_vocab_size(real size) for a model to pretrain further; smaller is refused.
    """
    path = os.fspath(path)
    kind = checkpoint_format(path)
    if kind == "bert_jax":
        config_from_ours(os.path.join(path, FLAX_CONFIG))  # its problems named as the file's fields
        config, params = export.load_flax(path)
        report = ImportReport(source=path, format=kind, vocab_file=saved_tokenizer(path))
    elif kind == "huggingface":
        config, params, report = import_hf(path, seed=seed, check_vocab=check_vocab)
    else:
        config, params, report = import_tf(path, seed=seed, check_vocab=check_vocab)
    if vocab_size is not None and vocab_size != config.vocab_size:
        if vocab_size < config.vocab_size:
            raise ValueError(f"load_pretrained: vocab_size={vocab_size} is smaller than the {config.vocab_size} rows "
                             f"of {VOCAB_ROWS[0]}; rows are only added, never dropped")
        report.notes.append(f"vocabulary padded from {config.vocab_size} to {vocab_size} rows")
        params = export.unflatten(export.resize_vocab(traverse_util.flatten_dict(params, sep="/"), vocab_size))
        config = dataclasses.replace(config, vocab_size=vocab_size)
    return config, params, report
