"""HuggingFace transformers BERT: config.json in (`config_from_hf`) and out (`hf_config`), weights in (`import_hf`)
and out (`export_hf`, with the tokenizer files).

- Out: a directory that transformers' BertForPreTraining / AutoModel / AutoTokenizer load offline: config.json,
  model.safetensors with HF's tensor names (a PyTorch Linear weight is our kernel transposed), tokenizer files.
  The vocabulary padding rows are dropped (pretrained.load_pretrained(..., vocab_size=N) adds them back).
- In: config.json beside model.safetensors (sharded too) or a pytorch_model.bin. A pickle is read with
  `torch.load(weights_only=True)` only: one that needs anything more is refused, never executed. Heads an
  encoder-only checkpoint lacks are initialised and reported.
Parameters and the name table: bert_jax.interop.layout. Paths are local files.
"""

import json
import os
import re
import zipfile

import jax
import numpy as np
from safetensors import numpy as safetensors_numpy

from bert_jax import model as model_lib
from bert_jax.data import tokenization
from bert_jax.interop import layout
from bert_jax.interop.layout import HF_SIZE_FIELDS, VOCAB_FILE, VOCAB_ROWS

HF_WEIGHTS, HF_CONFIG = "model.safetensors", "config.json"
HF_PICKLE = "pytorch_model.bin"
TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
# HF hidden_act -> ours. gelu_new, gelu_pytorch_tanh and gelu_fast are one formula: the tanh approximation.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}


# ---------------------------------------------------------------------------------------------------------------
# Config.

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
    layout.check_sizes(sizes, where, HF_SIZE_FIELDS)
    try:
        return model_lib.BertConfig(
            **sizes, hidden_act=HF_ACTIVATIONS[act], dropout_rate=values.get("hidden_dropout_prob", 0.1),
            attention_dropout_rate=values.get("attention_probs_dropout_prob", 0.1),
            initializer_range=values.get("initializer_range", 0.02),
            layer_norm_eps=values.get("layer_norm_eps", 1e-12)).validate()
    except ValueError as error:  # BertConfig's field, read from this file
        raise ValueError(f"{where}: {error}") from None


def hf_config_path(path: str) -> str:
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config_path = os.path.join(directory, HF_CONFIG)
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{config_path} does not exist; the BERT config.json must sit beside the weights")
    return config_path


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


# ---------------------------------------------------------------------------------------------------------------
# Export.

def tokenizer_beside(config_path: str) -> str | None:
    """The tokenizer of a HuggingFace model directory (its config.json's): vocab.txt, else tokenizer.json (a
    ModernBERT's BPE, say), else None."""
    for name in (VOCAB_FILE, tokenization.TOKENIZER_JSON_FILE):
        path = os.path.join(os.path.dirname(config_path), name)
        if os.path.exists(path):
            return path
    return None


def export_hf_tokenizer(tokenizer, output_dir: str, max_length: int) -> None:
    special = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
                       tokenizer.convert_ids_to_tokens([tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id,
                                                        tokenizer.sep_id, tokenizer.mask_id])))
    with open(os.path.join(output_dir, VOCAB_FILE), "w", encoding="utf-8") as file:
        file.writelines(word + "\n" for word in tokenizer.vocab_words)
    # BertTokenizer is transformers' tokenizers-backed (fast) class; its defaults (clean_text, Chinese-character
    # split, strip_accents following do_lower_case, 100-character words) are the original BERT's, as ours are.
    layout.write_json(os.path.join(output_dir, "tokenizer_config.json"),
                      {"tokenizer_class": "BertTokenizer", "do_lower_case": tokenizer.do_lower_case,
                       "tokenize_chinese_chars": True, "strip_accents": None, "model_max_length": max_length,
                       **special})
    layout.write_json(os.path.join(output_dir, "special_tokens_map.json"), special)


def export_hf(params, bert_config: model_lib.BertConfig, output_dir: str, tokenizer=None,
              tokenizer_vocab_size: int | None = None) -> str:
    """Writes a directory that transformers' BertForPreTraining / AutoModel / AutoTokenizer load offline.

    `tokenizer` (a tokenization.Tokenizer or a path load_tokenizer accepts) adds vocab.txt + tokenizer_config.json
    (WordPiece only: a SentencePiece tokenizer is refused, see the error); its vocab_size, or else
    `tokenizer_vocab_size`, is the real vocabulary: embedding and MLM-bias rows beyond it (padding up to
    bert_config.vocab_size) are dropped. The tied decoder is not written, as
    transformers' own save_pretrained does not. Returns output_dir.
    """
    flat = layout.host_params(params)
    layout.check_params(flat, bert_config, "export_hf")
    tokenizer = layout.as_tokenizer(tokenizer)
    _require_wordpiece(tokenizer, "export_hf", "pass tokenizer=None and tokenizer_vocab_size=<its vocab_size>, "
                       "and ship the SentencePiece model (Tokenizer.save) beside the weights, or use "
                       "export_flax(..., tokenizer=...)")
    vocab_size = tokenizer.vocab_size if tokenizer is not None else tokenizer_vocab_size or bert_config.vocab_size
    if tokenizer is not None and tokenizer_vocab_size not in (None, tokenizer.vocab_size):
        raise ValueError(f"export_hf: tokenizer_vocab_size={tokenizer_vocab_size} but the tokenizer has "
                         f"{tokenizer.vocab_size} entries. Fix: pass one of them")
    if vocab_size > bert_config.vocab_size:
        raise ValueError(f"export_hf: the vocabulary has {vocab_size} entries but {VOCAB_ROWS[0]} has only "
                         f"{bert_config.vocab_size} rows (model.vocab_size). Fix: export with the tokenizer the "
                         "model was trained with")
    flat = layout.resize_vocab(flat, vocab_size)
    if jax.process_index() != 0:  # every process gathers (a collective), process 0 writes
        return output_dir
    os.makedirs(output_dir, exist_ok=True)
    tensors = {hf: np.ascontiguousarray(flat[ours].T if hf_transposed else flat[ours])
               for ours, hf, _, hf_transposed, _ in layout.name_table(bert_config.num_layers)}
    safetensors_numpy.save_file(tensors, os.path.join(output_dir, HF_WEIGHTS), metadata={"format": "pt"})
    layout.write_json(os.path.join(output_dir, HF_CONFIG),
                      hf_config(bert_config, vocab_size, tokenizer.pad_id if tokenizer is not None else 0))
    if tokenizer is not None:
        export_hf_tokenizer(tokenizer, output_dir, bert_config.max_position_embeddings)
    return output_dir


def _require_wordpiece(tokenizer, caller: str, fix: str) -> None:
    if tokenizer is not None and tokenizer.kind != "wordpiece":
        # transformers' SentencePiece tokenizer for BERT-likes (AlbertTokenizer) normalises quotes and accents its
        # own way: on the same .model it gave other ids than ours, so the exported model would see other inputs.
        raise ValueError(f"{caller}: the tokenizer is {tokenizer.kind}; only a WordPiece vocab is written as an HF "
                         f"tokenizer (one that transformers reproduces token for token). Fix: {fix}")


def export_hf_classifier(params, bert_config: model_lib.BertConfig, output_dir: str, label_names: list[str],
                         tokenizer, problem_type: str | None = None) -> str:
    """A fine-tuned model as a directory that transformers loads offline with `tokenizer`'s files:
    AutoModelForQuestionAnswering for parameters with `qa_outputs` (bert_jax's BertForQuestionAnswering; no
    labels), else AutoModelForTokenClassification (no pooler: BertForTokenClassification) or
    AutoModelForSequenceClassification, with the label map (config.json's id2label / label2id) and, given, its
    `problem_type` ("regression": one output, transformers' MSE loss). Returns output_dir."""
    flat = layout.host_params(params)
    head = "qa_outputs" if "qa_outputs/kernel" in flat else "classifier"
    pooled = any(path.startswith("pooler/") for path in flat) and head == "classifier"
    kernel = flat.get(f"{head}/kernel")
    layout.check_head_width(kernel, head, 2 if head == "qa_outputs" else len(label_names), "export_hf_classifier")
    tokenizer = layout.as_tokenizer(tokenizer)
    _require_wordpiece(tokenizer, "export_hf_classifier", "a model fine-tuned with a SentencePiece tokenizer stays in "
                       "bert_jax's format (WORKDIR/finetuned, which --config.init reads)")
    if jax.process_index() != 0:
        return output_dir
    os.makedirs(output_dir, exist_ok=True)
    tensors = {f"{head}.weight": np.ascontiguousarray(kernel.T), f"{head}.bias": flat[f"{head}/bias"]}
    for ours, hf, _, hf_transposed, _ in layout.name_table(bert_config.num_layers):
        if ours.split("/")[0] in layout.HEADS and not (ours.startswith("pooler/") and pooled):
            continue
        value = flat[ours][:tokenizer.vocab_size] if ours == layout.VOCAB_ROWS[0] else flat[ours]
        tensors[hf] = np.ascontiguousarray(value.T if hf_transposed else value)
    safetensors_numpy.save_file(tensors, os.path.join(output_dir, HF_WEIGHTS), metadata={"format": "pt"})
    config = hf_config(bert_config, tokenizer.vocab_size, tokenizer.pad_id)
    config["architectures"] = [{"qa_outputs": "BertForQuestionAnswering"}.get(head) or (
        "BertForSequenceClassification" if pooled else "BertForTokenClassification")]
    if label_names:
        config["id2label"] = {str(index): name for index, name in enumerate(label_names)}
        config["label2id"] = {name: index for index, name in enumerate(label_names)}
    if problem_type:
        config["problem_type"] = problem_type
    layout.write_json(os.path.join(output_dir, HF_CONFIG), config)
    export_hf_tokenizer(tokenizer, output_dir, bert_config.max_position_embeddings)
    return output_dir


# ---------------------------------------------------------------------------------------------------------------
# Import.

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


def read_hf_weights(path: str) -> tuple[dict, str]:
    """({name: array}, the file read) from an HF model directory or weights file (sharded ones included)."""
    if os.path.isdir(path):
        for name in (HF_WEIGHTS, HF_WEIGHTS + ".index.json", HF_PICKLE, HF_PICKLE + ".index.json"):
            if os.path.exists(os.path.join(path, name)):
                return read_hf_weights(os.path.join(path, name))
        raise FileNotFoundError(f"{path}: no {HF_WEIGHTS}, {HF_PICKLE} or their .index.json in this directory")
    if path.endswith(".index.json"):
        with open(path, encoding="utf-8") as file:
            shards = sorted(set(json.load(file)["weight_map"].values()))
        tensors = {}
        for shard in shards:
            tensors.update(read_hf_weights(os.path.join(os.path.dirname(path), shard))[0])
        return tensors, path
    if path.endswith(".safetensors"):
        return layout.read_safetensors(path), path
    return _read_pickle(path), path


def _normalize_hf_name(name: str) -> str:
    # BertModel checkpoints (sentence-transformers among them) lack the "bert." prefix; old ones say gamma/beta.
    if name.split(".")[0] in ("embeddings", "encoder", "pooler"):
        name = "bert." + name
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))


def import_hf(path: str, *, seed: int = 0, check_vocab: bool = True):
    """(BertConfig, params, ImportReport) from a HuggingFace BERT directory or weights file.

    Full BertForPreTraining checkpoints, or encoder-only BertModel ones (keys with or without "bert."): heads they
    lack (pooler, MLM transform and bias, NSP) are initialised from the model's init with `seed` and listed in the
    report. config.json must sit beside the weights; a vocab.txt there is checked against the embedding rows.
    """
    path = os.fspath(path)
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config_path = hf_config_path(path)
    config = config_from_hf(layout.read_json(config_path), config_path)
    raw, weights_file = read_hf_weights(path)
    tensors = {_normalize_hf_name(name): value for name, value in raw.items()}
    report = layout.ImportReport(source=weights_file, format="huggingface")
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
    params = layout.assemble(config, tensors, kind="hf", where=weights_file, config_name=config_path,
                             vocab_file=vocab_file if os.path.exists(vocab_file) else None, check_vocab=check_vocab,
                             seed=seed, report=report)
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    report.ignored = [name for name in report.ignored if name not in tied]
    return config, params, report
