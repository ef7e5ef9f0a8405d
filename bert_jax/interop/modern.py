"""transformers' ModernBERT and bert_jax.modern: the config (`config_from_transformers`, `transformers_config`), the
weights both ways (`params_from_transformers`, `params_to_transformers`), as numpy arrays by transformers' tensor
names (ModernBertForMaskedLM's state dict), `import_hf` (a transformers ModernBERT directory, for --config.init),
and `export_hf` and `export_hf_task`, directories transformers loads.

transformers keeps query, key and value as one matrix (`Wqkv`, [3 * hidden, hidden]: query rows, then key, then
value, each heads x head_dim) and the GeGLU's input and gate as one (`Wi`, [2 * intermediate, hidden]: input rows,
then gate); a PyTorch Linear weight is our kernel transposed. The decoder is tied to the word embeddings.
"""

import os

import jax
import numpy as np
from safetensors import numpy as safetensors_numpy

from bert_jax import modern
from bert_jax.data import tokenization
from bert_jax.interop import huggingface
from bert_jax.interop import layout

MODEL_TYPE = "modernbert"  # config.json's model_type
VOCAB_ROWS = ("embeddings/embedding", "mlm_output_bias")  # as bert_jax.interop.layout.VOCAB_ROWS for BERT

# ModernBertConfig fields that must hold for its model to be ours (the rest are defaults we do not model).
_REQUIRED = {"norm_bias": False, "attention_bias": False, "mlp_bias": False, "decoder_bias": True,
             "classifier_bias": False, "hidden_activation": "gelu", "classifier_activation": "gelu"}


def transformers_config(config: modern.ModernConfig) -> dict:
    """config.json fields of ModernBertConfig for `config` (the architecture; token ids and the rest default)."""
    return {"model_type": MODEL_TYPE, "architectures": ["ModernBertForMaskedLM"],
            "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
            "intermediate_size": config.intermediate_size,
            "max_position_embeddings": config.max_position_embeddings,
            "local_attention": config.local_attention,
            "global_attn_every_n_layers": config.global_attn_every_n_layers,
            "global_rope_theta": config.global_rope_theta, "local_rope_theta": config.local_rope_theta,
            "norm_eps": config.norm_eps, "embedding_dropout": config.dropout_rate,
            "mlp_dropout": config.dropout_rate, "attention_dropout": config.attention_dropout_rate,
            "initializer_range": config.initializer_range, "classifier_pooling": config.classifier_pooling,
            "classifier_dropout": config.dropout_rate, "tie_word_embeddings": True, **_REQUIRED}


def config_from_transformers(values: dict, where: str = "config.json") -> modern.ModernConfig:
    """A ModernConfig from ModernBertConfig's fields (`values`, e.g. config.json's; `where` names it in errors)."""
    for name, required in _REQUIRED.items():
        if values.get(name, required) != required:
            raise ValueError(f"{where}: {name}={values[name]!r} is not supported (bert_jax.modern has "
                             f"{name}={required!r})")
    if values.get("layer_types") is not None:
        every = values.get("global_attn_every_n_layers", 3)
        expected = ["full_attention" if i % every == 0 else "sliding_attention"
                    for i in range(values["num_hidden_layers"])]
        if list(values["layer_types"]) != expected:
            raise ValueError(f"{where}: layer_types {values['layer_types']} are not every {every}th layer global")
    rope = values.get("rope_parameters") or {}
    thetas = {kind: (rope.get(kind) or {}).get("rope_theta") for kind in ("full_attention", "sliding_attention")}
    for kind, parameters in rope.items():
        if (parameters or {}).get("rope_type", "default") != "default":
            raise ValueError(f"{where}: rope_parameters.{kind}.rope_type={parameters['rope_type']!r} is not "
                             "supported (only 'default')")
    return modern.modern_config(
        vocab_size=values["vocab_size"], hidden_size=values["hidden_size"], num_layers=values["num_hidden_layers"],
        num_heads=values["num_attention_heads"], intermediate_size=values["intermediate_size"],
        max_position_embeddings=values.get("max_position_embeddings", 8192),
        local_attention=values.get("local_attention", 128),
        global_attn_every_n_layers=values.get("global_attn_every_n_layers", 3),
        global_rope_theta=float(thetas["full_attention"] or values.get("global_rope_theta", 160000.0)),
        local_rope_theta=float(thetas["sliding_attention"] or values.get("local_rope_theta", 10000.0)),
        norm_eps=values.get("norm_eps", 1e-5), dropout_rate=float(values.get("embedding_dropout", 0.0)),
        attention_dropout_rate=float(values.get("attention_dropout", 0.0)),
        initializer_range=values.get("initializer_range", 0.02),
        classifier_pooling=values.get("classifier_pooling", "cls"))


# Tensors a ModernBertModel checkpoint (the encoder alone) lacks, made on import as ModernForMaskedLM's init makes
# them (seeded): the prediction head and the decoder bias.
_HEAD_TENSORS = ("head.dense.weight", "head.norm.weight", "decoder.bias")


def import_hf(path: str, *, seed: int = 0, check_vocab: bool = True):
    """(ModernConfig, params, ImportReport) from a transformers ModernBERT directory or weights file: any ModernBert*
    class's state dict (a ModernBertModel's names lack "model."). The masked-LM head's tensors (`head.*`, a task
    model's head has the same shapes, `decoder.bias`) are read where present, else initialised with `seed` and
    reported; a task model's `classifier` is ignored. A vocab.txt beside config.json, else a tokenizer.json, is the
    tokenizer, its entries checked against the embedding rows."""
    path = os.fspath(path)
    config_path = huggingface.hf_config_path(path)
    config = config_from_transformers(layout.read_json(config_path), config_path)
    raw, weights_file = huggingface.read_hf_weights(path)
    tensors = {(f"model.{name}" if name.split(".")[0] in ("embeddings", "layers", "final_norm") else name): value
               for name, value in raw.items()}
    report = layout.ImportReport(source=weights_file, format="huggingface")
    shapes = _tensor_shapes(config)
    for name, shape in shapes.items():
        if name not in tensors:
            if name not in _HEAD_TENSORS:
                raise ValueError(f"{weights_file}: tensor {name} is missing (looked for it with and without the "
                                 "'model.' prefix); it is part of every ModernBERT encoder")
            report.initialized.append(name)
        elif tuple(np.shape(tensors[name])) != shape:
            raise ValueError(f"{weights_file}: tensor {name} has shape {tuple(np.shape(tensors[name]))} but "
                             f"{config_path} implies {shape}. Fix: use the config that belongs to these weights")
    if report.initialized:
        fresh = params_to_transformers(_init_params(config, seed), config)
        tensors.update({name: fresh[name] for name in report.initialized})
        report.notes.append(f"initialised {len(report.initialized)} head tensors absent in the source (seed {seed})")
    report.ignored = sorted(set(tensors) - set(shapes) - {"decoder.weight"})
    params = params_from_transformers(tensors, config)
    vocab_file = huggingface.tokenizer_beside(config_path)
    if vocab_file is not None:
        report.vocab_file = vocab_file
        entries = tokenization.load_tokenizer(vocab_file).vocab_size
        if check_vocab and entries > config.vocab_size:
            raise ValueError(f"{vocab_file} has {entries} entries but {config_path} has vocab_size="
                             f"{config.vocab_size}: not this model's vocabulary")
    return config, params, report


def _tensor_shapes(config: modern.ModernConfig) -> dict:
    """ModernBertForMaskedLM's tensor shapes for `config`, the tied decoder weight left out."""
    hidden, inner, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    shapes = {"model.embeddings.tok_embeddings.weight": (vocab, hidden), "model.embeddings.norm.weight": (hidden,),
              "model.final_norm.weight": (hidden,), "head.dense.weight": (hidden, hidden),
              "head.norm.weight": (hidden,), "decoder.bias": (vocab,)}
    for index in range(config.num_layers):
        names = _layer_names(index)
        shapes.update({names["wqkv"]: (3 * hidden, hidden), names["wo"]: (hidden, hidden), names["mlp_norm"]: (hidden,),
                       names["wi"]: (2 * inner, hidden), names["mlp_wo"]: (hidden, inner)})
        if index:
            shapes[names["attn_norm"]] = (hidden,)
    return shapes


def _init_params(config: modern.ModernConfig, seed: int) -> dict:
    """ModernForMaskedLM's initial parameters as float32 numpy arrays (for the head tensors a checkpoint lacks)."""
    import flax.linen as nn  # pylint: disable=import-outside-toplevel
    ids = np.zeros((1, 8), np.int32)
    variables = jax.jit(modern.ModernForMaskedLM(config).init)(jax.random.key(seed), ids, np.ones_like(ids))
    return jax.tree.map(lambda value: np.asarray(value, np.float32), nn.meta.unbox(variables["params"]))


def _layer_names(index: int) -> dict:
    prefix = f"model.layers.{index}"
    return {"attn_norm": f"{prefix}.attn_norm.weight", "wqkv": f"{prefix}.attn.Wqkv.weight",
            "wo": f"{prefix}.attn.Wo.weight", "mlp_norm": f"{prefix}.mlp_norm.weight",
            "wi": f"{prefix}.mlp.Wi.weight", "mlp_wo": f"{prefix}.mlp.Wo.weight"}


def params_from_transformers(tensors: dict, config: modern.ModernConfig) -> dict:
    """ModernForMaskedLM parameters from ModernBertForMaskedLM's tensors (name -> array)."""
    def get(name):
        if name not in tensors:
            raise ValueError(f"ModernBERT weights: tensor {name!r} is missing")
        return np.asarray(tensors[name], np.float32)

    def kernel(weight):  # PyTorch Linear [out, in] -> our kernel [in, out]
        return {"kernel": np.ascontiguousarray(weight.T)}

    params = {"embeddings": {"embedding": get("model.embeddings.tok_embeddings.weight")},
              "embeddings_norm": {"scale": get("model.embeddings.norm.weight")},
              "final_norm": {"scale": get("model.final_norm.weight")},
              "mlm_transform": kernel(get("head.dense.weight")),
              "mlm_layer_norm": {"scale": get("head.norm.weight")},
              "mlm_output_bias": get("decoder.bias")}
    hidden, inner = config.hidden_size, config.intermediate_size
    for index in range(config.num_layers):
        names = _layer_names(index)
        qkv, wi = get(names["wqkv"]), get(names["wi"])
        if qkv.shape != (3 * hidden, hidden) or wi.shape != (2 * inner, hidden):
            raise ValueError(f"ModernBERT weights: layer {index}'s Wqkv {qkv.shape} or Wi {wi.shape} do not fit "
                             f"hidden_size={hidden}, intermediate_size={inner}")
        layer = {"attention": {"query": kernel(qkv[:hidden]), "key": kernel(qkv[hidden:2 * hidden]),
                               "value": kernel(qkv[2 * hidden:]), "output": kernel(get(names["wo"]))},
                 "mlp_norm": {"scale": get(names["mlp_norm"])},
                 "mlp_input": kernel(wi[:inner]), "mlp_gate": kernel(wi[inner:]),
                 "mlp_output": kernel(get(names["mlp_wo"]))}
        if index:
            layer["attention_norm"] = {"scale": get(names["attn_norm"])}
        params[f"layer_{index}"] = layer
    return params


def params_to_transformers(params: dict, config: modern.ModernConfig) -> dict:
    """ModernBertForMaskedLM's tensors (name -> float32 array) from ModernForMaskedLM parameters; from a task model's
    (bert_jax.modern's ModernFor*), its ModernBert*For* class's: `classifier` in place of the decoder."""
    def weight(dense):
        return np.ascontiguousarray(np.asarray(dense["kernel"], np.float32).T)

    params = modern.unstack_layers(params, config)
    embedding = np.asarray(params["embeddings"]["embedding"], np.float32)
    tensors = {"model.embeddings.tok_embeddings.weight": embedding,
               "model.embeddings.norm.weight": np.asarray(params["embeddings_norm"]["scale"], np.float32),
               "model.final_norm.weight": np.asarray(params["final_norm"]["scale"], np.float32),
               "head.dense.weight": weight(params["mlm_transform"]),
               "head.norm.weight": np.asarray(params["mlm_layer_norm"]["scale"], np.float32)}
    if "mlm_output_bias" in params:  # the masked LM's decoder; a task model has a classifier instead
        tensors.update({"decoder.weight": embedding,
                        "decoder.bias": np.asarray(params["mlm_output_bias"], np.float32)})
    if "classifier" in params:
        tensors.update({"classifier.weight": weight(params["classifier"]),
                        "classifier.bias": np.asarray(params["classifier"]["bias"], np.float32)})
    for index in range(config.num_layers):
        layer, names = params[f"layer_{index}"], _layer_names(index)
        attention = layer["attention"]
        tensors[names["wqkv"]] = np.concatenate([weight(attention[name]) for name in ("query", "key", "value")])
        tensors[names["wo"]] = weight(attention["output"])
        tensors[names["mlp_norm"]] = np.asarray(layer["mlp_norm"]["scale"], np.float32)
        tensors[names["wi"]] = np.concatenate([weight(layer["mlp_input"]), weight(layer["mlp_gate"])])
        tensors[names["mlp_wo"]] = weight(layer["mlp_output"])
        if index:
            tensors[names["attn_norm"]] = np.asarray(layer["attention_norm"]["scale"], np.float32)
    return tensors


def export_hf(params, config: modern.ModernConfig, output_dir: str, tokenizer=None) -> str:
    """Writes a directory that transformers' AutoModelForMaskedLM (and the sequence, token and question-answering
    Auto classes, their heads initialised there) load offline as ModernBERT: config.json, model.safetensors (the
    tied decoder not written, as transformers' save_pretrained does not) and, given `tokenizer` (WordPiece, or a
    path load_tokenizer accepts), its files: tokenizer.json beside vocab.txt and tokenizer_config.json. The
    tokenizer's size is the real vocabulary: rows beyond it (model.vocab_size's padding) are dropped. Returns
    output_dir."""
    return _export(params, config, output_dir, tokenizer, {})


# A fine-tuned task (bert_jax.tasks' names) -> the transformers class that has its head.
TASK_CLASSES = {"sequence": "ModernBertForSequenceClassification", "tokens": "ModernBertForTokenClassification",
                "qa": "ModernBertForQuestionAnswering", "regression": "ModernBertForSequenceClassification"}


def export_hf_task(params, config: modern.ModernConfig, output_dir: str, task: str, label_names: list[str],
                   tokenizer) -> str:
    """A fine-tuned modern model (task `task`, TASK_CLASSES) as a directory the matching transformers Auto class
    loads, head and all, with its labels (config.json's id2label / label2id; none for "qa") and `tokenizer`'s
    files, as export_hf writes them. Returns output_dir."""
    kernel = params["classifier"]["kernel"] if "classifier" in params else None
    layout.check_head_width(kernel, "classifier", 2 if task == "qa" else len(label_names), "export_hf_task")
    extra = {"architectures": [TASK_CLASSES[task]]}
    if task == "regression":  # one output, transformers' MSE loss
        extra["problem_type"] = "regression"
    if task != "qa":
        extra.update(id2label={str(index): name for index, name in enumerate(label_names)},
                     label2id={name: index for index, name in enumerate(label_names)})
    return _export(params, config, output_dir, tokenizer, extra)


def _export(params, config: modern.ModernConfig, output_dir: str, tokenizer, extra: dict) -> str:
    # Unrolled first (host_params knows BERT's scanned layout only), then float32 numpy on the host, gathered.
    nested = layout.unflatten(layout.host_params(modern.unstack_layers(params, config)))
    tokenizer = layout.as_tokenizer(tokenizer)
    if tokenizer is not None and tokenizer.kind not in ("wordpiece", tokenization.TokenizerJson.kind):
        raise ValueError(f"export_hf: a {tokenizer.kind} tokenizer cannot be written as transformers' tokenizer "
                         "files; export with a WordPiece vocabulary (data.tokenizer=wordpiece) or a tokenizer.json")
    vocab_size = tokenizer.vocab_size if tokenizer is not None else config.vocab_size
    if vocab_size > config.vocab_size:
        raise ValueError(f"export_hf: the tokenizer has {vocab_size} entries but the model only "
                         f"{config.vocab_size} rows (model.vocab_size)")
    tensors = params_to_transformers(nested, config)
    tensors.pop("decoder.weight", None)
    for name in ("model.embeddings.tok_embeddings.weight", "decoder.bias"):
        if name in tensors:
            tensors[name] = np.ascontiguousarray(tensors[name][:vocab_size])
    if jax.process_index() != 0:
        return output_dir
    os.makedirs(output_dir, exist_ok=True)
    safetensors_numpy.save_file(tensors, os.path.join(output_dir, huggingface.HF_WEIGHTS), metadata={"format": "pt"})
    values = dict(transformers_config(config), vocab_size=vocab_size, **extra)
    if tokenizer is not None:
        values.update(pad_token_id=tokenizer.pad_id, cls_token_id=tokenizer.cls_id, bos_token_id=tokenizer.cls_id,
                      sep_token_id=tokenizer.sep_id, eos_token_id=tokenizer.sep_id)
        _write_tokenizer(tokenizer, output_dir, config.max_position_embeddings)
    layout.write_json(os.path.join(output_dir, huggingface.HF_CONFIG), values)
    return output_dir


def _write_tokenizer(tokenizer, output_dir: str, max_length: int) -> None:
    """vocab.txt and tokenizer_config.json as the BERT export writes them, and tokenizer.json: the same WordPiece
    tokenizer as `tokenizers` builds it for transformers' BertTokenizerFast (clean text, CJK split, lower-case and
    accent strip as do_lower_case, [CLS] ... [SEP] around each text). A tokenizer.json tokenizer (a ModernBERT's
    BPE) is written as it came, with a tokenizer_config.json naming transformers' PreTrainedTokenizerFast."""
    from tokenizers import implementations  # pylint: disable=import-outside-toplevel
    if tokenizer.kind == tokenization.TokenizerJson.kind:
        tokenizer.save(output_dir)  # tokenizer.json, and our tokenizer_config.json, replaced below
        special = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
                           tokenizer.convert_ids_to_tokens([tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id,
                                                            tokenizer.sep_id, tokenizer.mask_id])))
        layout.write_json(os.path.join(output_dir, tokenization.CONFIG_FILE),
                          {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
                           "model_input_names": ["input_ids", "attention_mask"], **special})
        return
    huggingface.export_hf_tokenizer(tokenizer, output_dir, max_length)
    words = tokenizer.vocab_words
    backend = implementations.BertWordPieceTokenizer(
        {word: index for index, word in enumerate(words)}, unk_token=words[tokenizer.unk_id],
        sep_token=words[tokenizer.sep_id], cls_token=words[tokenizer.cls_id], pad_token=words[tokenizer.pad_id],
        mask_token=words[tokenizer.mask_id], lowercase=tokenizer.do_lower_case)
    backend.save(os.path.join(output_dir, "tokenizer.json"))
