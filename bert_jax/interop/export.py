"""From bert_jax to HuggingFace transformers and to our own files; the formats and name table
bert_jax.interop.pretrained reads back.

Parameters here are the inner parameter tree (what `TrainState.params` holds, i.e. `variables["params"]`) as
float32 numpy arrays; boxed (nn.LogicallyPartitioned) trees, a {"params": ...} wrapper and jax.Arrays are accepted
too, and so are scanned layers (model.scan_layers: `layers/...` with a leading layer axis), which exports write
unrolled (`layer_{i}/...`, see model.unstack_layers); in a multi-process run call the exports on every process
(sharded arrays are gathered), process 0 writes.
Formats:
- HuggingFace (`export_hf`; read by pretrained.import_hf): config.json, model.safetensors with HF's tensor names (a
  PyTorch Linear weight is our kernel transposed), tokenizer files.
- Ours (`export_flax` / `load_flax`): bert_jax_params.safetensors with "layer_0/attention/query/kernel" keys plus
  bert_jax_config.json (our BertConfig; not named bert_config.json, which is the original checkpoints' file).
Vocabulary padding: the model's vocab_size may exceed the tokenizer's (tokenization.padded_vocab_size); HF exports
drop the padding rows (pretrained.load_pretrained(..., vocab_size=N) adds them back). Paths are local files.
"""
import dataclasses
import json
import os

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
TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
VOCAB_ROWS = ("embeddings/word_embeddings/embedding", "mlm_output_bias")


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
        flat = traverse_util.flatten_dict(model_lib.unstack_layers(unflatten(flat)), sep="/")
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


def unflatten(flat: dict) -> dict:
    return traverse_util.unflatten_dict(flat, sep="/")


def resize_vocab(flat: dict, rows: int) -> dict:
    """Drops padding rows, or adds them (zero embeddings, MLM bias = the smallest real bias); see the module doc."""
    flat = dict(flat)
    embedding, bias = flat[VOCAB_ROWS[0]], flat[VOCAB_ROWS[1]]
    if rows <= embedding.shape[0]:
        flat[VOCAB_ROWS[0]], flat[VOCAB_ROWS[1]] = embedding[:rows], bias[:rows]
    else:
        extra = rows - embedding.shape[0]
        flat[VOCAB_ROWS[0]] = np.concatenate([embedding, np.zeros((extra, embedding.shape[1]), np.float32)])
        flat[VOCAB_ROWS[1]] = np.concatenate([bias, np.full((extra,), bias.min(), np.float32)])
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
    check_params(flat, bert_config, "export_hf")
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
        raise ValueError(f"export_hf: the vocabulary has {vocab_size} entries but {VOCAB_ROWS[0]} has only "
                         f"{bert_config.vocab_size} rows (model.vocab_size). Fix: export with the tokenizer the "
                         "model was trained with")
    flat = resize_vocab(flat, vocab_size)
    if jax.process_index() != 0:  # every process gathers (a collective), process 0 writes
        return output_dir
    os.makedirs(output_dir, exist_ok=True)
    tensors = {hf: np.ascontiguousarray(flat[ours].T if hf_transposed else flat[ours])
               for ours, hf, _, hf_transposed, _ in name_table(bert_config.num_layers)}
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
    check_params(flat, bert_config, "export_flax")
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


def read_safetensors(path: str) -> dict:
    try:
        return safetensors_numpy.load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable safetensors file ({error}). Fix: pass a model.safetensors "
                         "written by safetensors, or a pytorch_model.bin") from None


def load_flax(directory: str):
    """(BertConfig, params) from a directory written by export_flax."""
    config_path, weights_path = os.path.join(directory, FLAX_CONFIG), os.path.join(directory, FLAX_WEIGHTS)
    with open(config_path, encoding="utf-8") as file:
        values = json.load(file)
    # Exports of earlier versions name the CPU matmul choice, which no longer exists; it never changed the weights.
    values.pop("matmul", None)
    unknown = set(values) - {field.name for field in dataclasses.fields(model_lib.BertConfig)}
    if unknown:
        raise ValueError(f"{config_path}: unknown fields {sorted(unknown)}; was it written by export_flax?")
    config = model_lib.BertConfig(**values).validate()
    flat = read_safetensors(weights_path)
    check_params(flat, config, weights_path)
    return config, unflatten({k: v.astype(np.float32) for k, v in flat.items()})


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


