"""To and from HuggingFace transformers, original google-research/bert TensorFlow checkpoints, and our own files.

Parameters here are the inner parameter tree (what `TrainState.params` holds, i.e. `variables["params"]`) as
float32 numpy arrays; boxed (nn.LogicallyPartitioned) trees, a {"params": ...} wrapper and jax.Arrays are accepted
too, and so are scanned layers (model.scan_layers: `layers/...` with a leading layer axis), which exports write
unrolled (`layer_{i}/...`, see model.unstack_layers); in a multi-process run call the exports on every process
(sharded arrays are gathered), process 0 writes.
Formats:
- HuggingFace (`export_hf` / `import_hf`): config.json, model.safetensors with HF's tensor names (a PyTorch Linear
  weight is our kernel transposed), tokenizer files. Reading a pytorch_model.bin uses `torch.load(weights_only=True)`
  only: a pickle that needs anything more is refused, never executed.
- Original TF checkpoints (`import_tf`): bert_model.ckpt.* + bert_config.json + vocab.txt. The original code's
  "gelu" is the tanh approximation, so its hidden_act "gelu" becomes our "gelu_tanh" (HF's own converter maps it to
  exact gelu, which moves every activation slightly).
- Ours (`export_flax` / `load_flax`): bert_jax_params.safetensors with "layer_0/attention/query/kernel" keys plus
  bert_jax_config.json (our BertConfig; not named bert_config.json, which is the original checkpoints' file).
`load_pretrained` recognises each of them. Vocabulary padding: the model's vocab_size may exceed the tokenizer's
(tokenization.padded_vocab_size); HF exports drop the padding rows, and `load_pretrained(..., vocab_size=N)` adds
them back: zero embedding rows, MLM bias rows equal to the smallest real bias (so the padding ids start as unlikely
as the least likely real token and the imported model's MLM loss barely moves). Paths are local files.
"""

import dataclasses
import json
import os
import re
import zipfile

import flax.linen as nn
from flax import traverse_util
import jax
import numpy as np
from safetensors import SafetensorError
from safetensors import numpy as safetensors_numpy

from bert_jax import model as model_lib
from bert_jax.data import tokenization

HF_WEIGHTS, HF_CONFIG = "model.safetensors", "config.json"
HF_PICKLE = "pytorch_model.bin"
FLAX_WEIGHTS, FLAX_CONFIG = "bert_jax_params.safetensors", "bert_jax_config.json"
TF_CONFIG, VOCAB_FILE = "bert_config.json", "vocab.txt"
# HF hidden_act -> ours. gelu_new, gelu_pytorch_tanh and gelu_fast are one formula: the tanh approximation.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}
TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
# The original modeling.py's "gelu" is 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))): our gelu_tanh.
TF_ACTIVATIONS = {"gelu": "gelu_tanh"}
# Parameters absent from encoder-only checkpoints (BertModel, sentence-transformers): initialised on import.
HEADS = ("pooler", "mlm_transform", "mlm_layer_norm", "mlm_output_bias", "nsp_head")
_VOCAB_ROWS = ("embeddings/word_embeddings/embedding", "mlm_output_bias")


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


# ---------------------------------------------------------------------------------------------------------------
# The name table: our path, HF name, original TF name, and whether HF / TF store it transposed relative to ours.

def _name_table(num_layers: int):
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


def _dummy_inputs():
    ids = np.zeros((1, 2), np.int32)
    return ids, np.ones_like(ids), ids, np.zeros((1, 1), np.int32)


def expected_shapes(config: model_lib.BertConfig) -> dict:
    """{"layer_0/attention/query/kernel": (768, 768), ...} for `config`, without allocating anything.

    Always the unrolled layout (`layer_{i}`): files hold that layout whatever config.scan_layers says.
    """
    config = dataclasses.replace(config, scan_layers=False)
    abstract = jax.eval_shape(lambda: model_lib.BertForPreTraining(config).init(jax.random.key(0), *_dummy_inputs()))
    flat = traverse_util.flatten_dict(nn.meta.unbox(abstract)["params"], sep="/")
    return {path: tuple(leaf.shape) for path, leaf in flat.items()}


def init_params(config: model_lib.BertConfig, seed: int = 0) -> dict:
    """Freshly initialised parameters (numpy, float32), as the model's own init gives them for `seed`."""
    variables = model_lib.BertForPreTraining(config).init(jax.random.key(seed), *_dummy_inputs())
    return jax.tree.map(np.asarray, nn.meta.unbox(variables)["params"])


def _host_params(params) -> dict:
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
        flat = traverse_util.flatten_dict(model_lib.unstack_layers(_unflatten(flat)), sep="/")
    return flat


def _check_params(flat: dict, config: model_lib.BertConfig, where: str) -> None:
    wanted = expected_shapes(config)
    missing, extra = sorted(set(wanted) - set(flat)), sorted(set(flat) - set(wanted))
    if missing or extra:
        raise ValueError(f"{where}: the parameters do not fit the BertConfig: missing {missing[:5]}, unexpected "
                         f"{extra[:5]}. Fix: pass the BertConfig the parameters were made with")
    for path, shape in wanted.items():
        if tuple(flat[path].shape) != shape:
            raise ValueError(f"{where}: parameter {path} has shape {tuple(flat[path].shape)} but the BertConfig "
                             f"implies {shape}. Fix: pass the BertConfig the parameters were made with")


def _unflatten(flat: dict) -> dict:
    return traverse_util.unflatten_dict(flat, sep="/")


def _resize_vocab(flat: dict, rows: int) -> dict:
    """Drops padding rows, or adds them (zero embeddings, MLM bias = the smallest real bias); see the module doc."""
    flat = dict(flat)
    embedding, bias = flat[_VOCAB_ROWS[0]], flat[_VOCAB_ROWS[1]]
    if rows <= embedding.shape[0]:
        flat[_VOCAB_ROWS[0]], flat[_VOCAB_ROWS[1]] = embedding[:rows], bias[:rows]
    else:
        extra = rows - embedding.shape[0]
        flat[_VOCAB_ROWS[0]] = np.concatenate([embedding, np.zeros((extra, embedding.shape[1]), np.float32)])
        flat[_VOCAB_ROWS[1]] = np.concatenate([bias, np.full((extra,), bias.min(), np.float32)])
    return flat


# ---------------------------------------------------------------------------------------------------------------
# Export.

def _as_tokenizer(tokenizer):
    if tokenizer is None or isinstance(tokenizer, tokenization.Tokenizer):
        return tokenizer
    return tokenization.load_tokenizer(os.fspath(tokenizer))


def hf_config(config: model_lib.BertConfig, vocab_size: int, pad_token_id: int = 0) -> dict:
    """The config.json of a transformers BertForPreTraining equivalent to `config` with `vocab_size` rows."""
    return {"architectures": ["BertForPreTraining"], "model_type": "bert", "vocab_size": vocab_size,
            "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
            "hidden_act": TO_HF_ACTIVATION[config.hidden_act], "hidden_dropout_prob": config.dropout_rate,
            "attention_probs_dropout_prob": config.attention_dropout_rate,
            "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
            "initializer_range": config.initializer_range, "layer_norm_eps": config.layer_norm_eps,
            "pad_token_id": pad_token_id, "position_embedding_type": "absolute", "tie_word_embeddings": True,
            "dtype": "float32"}


def _write_json(path: str, value: dict) -> None:
    with open(path, "w", encoding="utf-8") as file:
        json.dump(value, file, indent=2)
        file.write("\n")


def _export_hf_tokenizer(tokenizer, output_dir: str, max_length: int) -> None:
    special = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
                       tokenizer.convert_ids_to_tokens([tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id,
                                                        tokenizer.sep_id, tokenizer.mask_id])))
    with open(os.path.join(output_dir, VOCAB_FILE), "w", encoding="utf-8") as file:
        file.writelines(word + "\n" for word in tokenizer.vocab_words)
    # BertTokenizer is transformers' tokenizers-backed (fast) class; its defaults (clean_text, Chinese-character
    # split, strip_accents following do_lower_case, 100-character words) are the original BERT's, as ours are.
    _write_json(os.path.join(output_dir, "tokenizer_config.json"),
                {"tokenizer_class": "BertTokenizer", "do_lower_case": tokenizer.do_lower_case,
                 "tokenize_chinese_chars": True, "strip_accents": None, "model_max_length": max_length, **special})
    _write_json(os.path.join(output_dir, "special_tokens_map.json"), special)


def export_hf(params, bert_config: model_lib.BertConfig, output_dir: str, tokenizer=None,
              tokenizer_vocab_size: int | None = None) -> str:
    """Writes a directory that transformers' BertForPreTraining / AutoModel / AutoTokenizer load offline.

    `tokenizer` (a tokenization.Tokenizer or a path load_tokenizer accepts) adds vocab.txt + tokenizer_config.json
    (WordPiece only: a SentencePiece tokenizer is refused, see the error); its vocab_size, or else
    `tokenizer_vocab_size`, is the real vocabulary: embedding and MLM-bias rows beyond it (padding up to
    bert_config.vocab_size) are dropped. The tied decoder is not written, as
    transformers' own save_pretrained does not. Returns output_dir.
    """
    flat = _host_params(params)
    _check_params(flat, bert_config, "export_hf")
    tokenizer = _as_tokenizer(tokenizer)
    if tokenizer is not None and tokenizer.kind != "wordpiece":
        # transformers' SentencePiece tokenizer for BERT-likes (AlbertTokenizer) normalises quotes and accents its
        # own way: on the same .model it gave other ids than ours, so the exported model would see other inputs.
        raise ValueError(f"export_hf: the tokenizer is {tokenizer.kind}; only a WordPiece vocab is written as an HF "
                         "tokenizer (one that transformers reproduces token for token). Fix: pass tokenizer=None "
                         "and tokenizer_vocab_size=<its vocab_size>, and ship the SentencePiece model "
                         "(Tokenizer.save) beside the weights, or use export_flax(..., tokenizer=...)")
    vocab_size = tokenizer.vocab_size if tokenizer is not None else tokenizer_vocab_size or bert_config.vocab_size
    if tokenizer is not None and tokenizer_vocab_size not in (None, tokenizer.vocab_size):
        raise ValueError(f"export_hf: tokenizer_vocab_size={tokenizer_vocab_size} but the tokenizer has "
                         f"{tokenizer.vocab_size} entries. Fix: pass one of them")
    if vocab_size > bert_config.vocab_size:
        raise ValueError(f"export_hf: the vocabulary has {vocab_size} entries but {_VOCAB_ROWS[0]} has only "
                         f"{bert_config.vocab_size} rows (model.vocab_size). Fix: export with the tokenizer the "
                         "model was trained with")
    flat = _resize_vocab(flat, vocab_size)
    if jax.process_index() != 0:  # every process gathers (a collective), process 0 writes
        return output_dir
    os.makedirs(output_dir, exist_ok=True)
    tensors = {hf: np.ascontiguousarray(flat[ours].T if hf_transposed else flat[ours])
               for ours, hf, _, hf_transposed, _ in _name_table(bert_config.num_layers)}
    safetensors_numpy.save_file(tensors, os.path.join(output_dir, HF_WEIGHTS), metadata={"format": "pt"})
    _write_json(os.path.join(output_dir, HF_CONFIG),
                hf_config(bert_config, vocab_size, tokenizer.pad_id if tokenizer is not None else 0))
    if tokenizer is not None:
        _export_hf_tokenizer(tokenizer, output_dir, bert_config.max_position_embeddings)
    return output_dir


def export_flax(params, bert_config: model_lib.BertConfig, output_dir: str, tokenizer=None) -> str:
    """Writes our own format: bert_jax_params.safetensors (flattened tree, padding rows kept) and
    bert_jax_config.json (the BertConfig), plus the tokenizer (Tokenizer.save) when given. Returns output_dir."""
    flat = _host_params(params)
    _check_params(flat, bert_config, "export_flax")
    if jax.process_index() != 0:  # every process gathers (a collective), process 0 writes
        return output_dir
    os.makedirs(output_dir, exist_ok=True)
    safetensors_numpy.save_file({k: np.ascontiguousarray(v) for k, v in flat.items()},
                                os.path.join(output_dir, FLAX_WEIGHTS), metadata={"format": "bert_jax"})
    # The file holds unrolled layers (see _host_params), so the config written says so.
    _write_json(os.path.join(output_dir, FLAX_CONFIG), dataclasses.asdict(dataclasses.replace(bert_config,
                                                                                          scan_layers=False)))
    if tokenizer is not None:
        _as_tokenizer(tokenizer).save(output_dir)
    return output_dir


def load_flax(directory: str):
    """(BertConfig, params) from a directory written by export_flax."""
    config_path, weights_path = os.path.join(directory, FLAX_CONFIG), os.path.join(directory, FLAX_WEIGHTS)
    with open(config_path, encoding="utf-8") as file:
        values = json.load(file)
    unknown = set(values) - {field.name for field in dataclasses.fields(model_lib.BertConfig)}
    if unknown:
        raise ValueError(f"{config_path}: unknown fields {sorted(unknown)}; was it written by export_flax?")
    config = model_lib.BertConfig(**values).validate()
    flat = _read_safetensors(weights_path)
    _check_params(flat, config, weights_path)
    return config, _unflatten({k: v.astype(np.float32) for k, v in flat.items()})


def restore_checkpoint_params(checkpoint: str, bert_config: model_lib.BertConfig) -> dict:
    """The parameters of one of our Orbax checkpoints (a step or checkpoints directory), on this host's first
    device, for exporting from a single process."""
    from bert_jax import checkpoint as checkpoint_lib  # pylint: disable=import-outside-toplevel
    abstract = nn.meta.unbox(jax.eval_shape(
        lambda: model_lib.BertForPreTraining(bert_config).init(jax.random.key(0), *_dummy_inputs())))["params"]
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    params, _ = checkpoint_lib.restore_params(checkpoint, abstract, jax.tree.map(lambda _: device, abstract))
    return params


def export_checkpoint(checkpoint: str, bert_config: model_lib.BertConfig, output_dir: str, *, tokenizer=None,
                      tokenizer_vocab_size: int | None = None, export_format: str = "hf") -> str:
    """`--mode=export`: a checkpoint's parameters to `export_format` "hf" (export_hf) or "flax" (export_flax)."""
    if export_format not in ("hf", "flax"):
        raise ValueError(f"export_format={export_format!r}: choose 'hf' or 'flax'")
    params = restore_checkpoint_params(checkpoint, bert_config)
    if export_format == "flax":
        return export_flax(params, bert_config, output_dir, tokenizer=tokenizer)
    return export_hf(params, bert_config, output_dir, tokenizer=tokenizer, tokenizer_vocab_size=tokenizer_vocab_size)


# ---------------------------------------------------------------------------------------------------------------
# Import.

def _read_safetensors(path: str) -> dict:
    try:
        return safetensors_numpy.load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable safetensors file ({error}). Fix: pass a model.safetensors "
                         "written by safetensors, or a pytorch_model.bin") from None


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
        return _read_safetensors(path), path
    return _read_pickle(path), path


def _config_from_hf(values: dict, where: str) -> model_lib.BertConfig:
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
    return model_lib.BertConfig(
        vocab_size=field("vocab_size"), hidden_size=field("hidden_size"), num_layers=field("num_hidden_layers"),
        num_heads=field("num_attention_heads"), intermediate_size=field("intermediate_size"),
        hidden_act=HF_ACTIVATIONS[act], max_position_embeddings=field("max_position_embeddings"),
        type_vocab_size=values.get("type_vocab_size", 2), dropout_rate=values.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=values.get("attention_probs_dropout_prob", 0.1),
        initializer_range=values.get("initializer_range", 0.02),
        layer_norm_eps=values.get("layer_norm_eps", 1e-12)).validate()


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
    wanted = expected_shapes(config)
    flat, used, missing = {}, set(), []
    sizes = (f"vocab_size={config.vocab_size}, hidden_size={config.hidden_size}, intermediate_size="
             f"{config.intermediate_size}, max_position_embeddings={config.max_position_embeddings}, "
             f"type_vocab_size={config.type_vocab_size}")
    for row in _name_table(config.num_layers):
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
        fresh = traverse_util.flatten_dict(init_params(config, seed), sep="/")
        flat.update({path: fresh[path] for path in missing})
        report.initialized = missing
        report.notes.append(f"initialised {len(missing)} head parameters absent in the source (seed {seed})")
    report.ignored = sorted(set(tensors) - used)
    if vocab_file is not None:
        report.vocab_file = vocab_file
        entries, rows = _vocab_entries(vocab_file), config.vocab_size
        if check_vocab and entries != rows:
            raise ValueError(f"{vocab_file} has {entries} entries but the word embeddings "
                             f"({_name_table(0)[0][column]}) have {rows} rows. Fix: use the vocab that belongs to "
                             "these weights, or pass check_vocab=False to import them as they are")
    return _unflatten(flat)


def import_hf(path: str, *, seed: int = 0, check_vocab: bool = True):
    """(BertConfig, params, ImportReport) from a HuggingFace BERT directory or weights file.

    Full BertForPreTraining checkpoints, or encoder-only BertModel ones (keys with or without "bert."): heads they
    lack (pooler, MLM transform and bias, NSP) are initialised from the model's init with `seed` and listed in the
    report. config.json must sit beside the weights; a vocab.txt there is checked against the embedding rows.
    """
    path = os.fspath(path)
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config_path = os.path.join(directory, HF_CONFIG)
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{config_path} does not exist; the BERT config.json must sit beside the weights")
    with open(config_path, encoding="utf-8") as file:
        config = _config_from_hf(json.load(file), config_path)
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


def _tf_prefix(path: str) -> str:
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
    prefix = _tf_prefix(os.fspath(checkpoint_dir_or_prefix))
    if not os.path.exists(prefix + ".index"):
        raise FileNotFoundError(f"{prefix}.index does not exist: {checkpoint_dir_or_prefix} is not an original "
                                "BERT checkpoint (bert_model.ckpt.index + bert_model.ckpt.data-*)")
    directory = os.path.dirname(prefix)
    config_path = bert_config_json or os.path.join(directory, TF_CONFIG)
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{config_path} does not exist. Fix: pass bert_config_json=.../bert_config.json")
    with open(config_path, encoding="utf-8") as file:
        values = json.load(file)
    act = values.get("hidden_act")
    if act not in TF_ACTIVATIONS:
        raise ValueError(f"{config_path}: field 'hidden_act' is {act!r}; the original BERT checkpoints use 'gelu'")
    config = _config_from_hf(dict(values, hidden_act="gelu_new", model_type="bert"), config_path)
    reader = tf.train.load_checkpoint(prefix)
    tensors = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    report = ImportReport(source=prefix, format="tf_checkpoint", notes=[
        "hidden_act: the original BERT 'gelu' is the tanh approximation, imported as gelu_tanh"])
    vocab_file = os.path.join(directory, VOCAB_FILE)
    params = _assemble(config, tensors, kind="tf", where=prefix, config_name=config_path,
                       vocab_file=vocab_file if os.path.exists(vocab_file) else None, check_vocab=check_vocab,
                       seed=seed, report=report)
    return config, params, report


def load_pretrained(path: str, *, vocab_size: int | None = None, seed: int = 0, check_vocab: bool = True):
    """(BertConfig, params, ImportReport) from any supported format, recognised by its files: our export_flax
    directory, a HuggingFace directory or weights file, or an original TF checkpoint (directory or prefix).

    `vocab_size` resizes the vocabulary rows: larger adds padding rows (zero embeddings, MLM bias = the smallest
    real bias), e.g. tokenization.padded_vocab_size(real size) for a model to pretrain further; smaller is refused.
    """
    path = os.fspath(path)
    is_dir = os.path.isdir(path)
    looked_for = (f"{FLAX_CONFIG} (export_flax), {HF_CONFIG} with {HF_WEIGHTS} / {HF_PICKLE} (HuggingFace), "
                  "NAME.index + NAME.data-* (original TF checkpoint)")
    if is_dir and os.path.exists(os.path.join(path, FLAX_CONFIG)):
        config, params = load_flax(path)
        saved_tokenizer = os.path.exists(os.path.join(path, tokenization.CONFIG_FILE))
        report = ImportReport(source=path, format="bert_jax", vocab_file=path if saved_tokenizer else None)
    elif (is_dir and os.path.exists(os.path.join(path, HF_CONFIG))) or path.endswith(
            (".safetensors", ".bin", ".pt", ".pth", ".index.json")):
        config, params, report = import_hf(path, seed=seed, check_vocab=check_vocab)
    elif (any(name.endswith(".index") for name in os.listdir(path)) if is_dir
          else os.path.exists(_tf_prefix(path) + ".index")):
        config, params, report = import_tf(path, seed=seed, check_vocab=check_vocab)
    elif not os.path.exists(path) and not os.path.exists(path + ".index"):
        raise FileNotFoundError(f"{path} does not exist; load_pretrained reads {looked_for}")
    else:
        raise ValueError(f"{path}: no known checkpoint format; looked for {looked_for}")
    if vocab_size is not None and vocab_size != config.vocab_size:
        if vocab_size < config.vocab_size:
            raise ValueError(f"load_pretrained: vocab_size={vocab_size} is smaller than the {config.vocab_size} rows "
                             f"of {_VOCAB_ROWS[0]}; rows are only added, never dropped")
        report.notes.append(f"vocabulary padded from {config.vocab_size} to {vocab_size} rows")
        params = _unflatten(_resize_vocab(traverse_util.flatten_dict(params, sep="/"), vocab_size))
        config = dataclasses.replace(config, vocab_size=vocab_size)
    return config, params, report
