"""Our own files: `export_flax` writes bert_jax_params.safetensors (the flattened parameter tree, "layer_0/attention/
query/kernel" keys, vocabulary padding rows kept) and bert_jax_config.json (our BertConfig; not named
bert_config.json, which is the original checkpoints' file), plus the tokenizer (Tokenizer.save) when given;
`load_flax` reads them back. `config_from_ours` is the one parser of our BertConfig JSON: bert_jax_config.json and a
run's model_config.json (bert_jax.interop.init_architecture). Parameters: bert_jax.interop.layout. Paths are local
files.
"""

import dataclasses
import os

import jax
import numpy as np
from safetensors import numpy as safetensors_numpy

from bert_jax import model as model_lib
from bert_jax.interop import layout
from bert_jax.interop.layout import HF_SIZE_FIELDS

FLAX_WEIGHTS, FLAX_CONFIG = "bert_jax_params.safetensors", "bert_jax_config.json"


def config_from_ours(config_path: str) -> model_lib.BertConfig:
    """A BertConfig written as JSON by bert_jax (export_flax's bert_jax_config.json, a run's model_config.json)."""
    return config_from_values(layout.read_json(config_path), config_path)


def config_from_values(values: dict, config_path: str) -> model_lib.BertConfig:
    """A BertConfig of fields bert_jax wrote (config_from_ours' file, read); errors name `config_path`."""
    values = dict(values)
    values.pop("matmul", None)  # named by earlier versions; it never changed the weights
    fields = {field.name for field in dataclasses.fields(model_lib.BertConfig)}
    if set(values) - fields:
        raise ValueError(f"{config_path}: unknown fields {sorted(set(values) - fields)}; it is not a bert_jax "
                         "model config")
    layout.check_sizes({field: values.get(field, getattr(model_lib.BertConfig, field)) for field in HF_SIZE_FIELDS},
                        config_path, {field: field for field in HF_SIZE_FIELDS})
    try:
        return model_lib.BertConfig(**values).validate()
    except ValueError as error:  # validate names the field, the file's
        raise ValueError(f"{config_path}: {error}") from None


def export_flax(params, bert_config: model_lib.BertConfig, output_dir: str, tokenizer=None) -> str:
    """Writes our own format: bert_jax_params.safetensors (flattened tree, padding rows kept) and
    bert_jax_config.json (the BertConfig), plus the tokenizer (Tokenizer.save) when given. Returns output_dir."""
    flat = layout.host_params(params)
    layout.check_params(flat, bert_config, "export_flax")
    if jax.process_index() != 0:  # every process gathers (a collective), process 0 writes
        return output_dir
    os.makedirs(output_dir, exist_ok=True)
    safetensors_numpy.save_file({k: np.ascontiguousarray(v) for k, v in flat.items()},
                                os.path.join(output_dir, FLAX_WEIGHTS), metadata={"format": "bert_jax"})
    # The file holds unrolled layers (see layout.host_params), so the config written says so.
    layout.write_json(os.path.join(output_dir, FLAX_CONFIG),
                      dataclasses.asdict(dataclasses.replace(bert_config, scan_layers=False)))
    if tokenizer is not None:
        layout.as_tokenizer(tokenizer).save(output_dir)
    return output_dir


def load_flax(directory: str):
    """(BertConfig, params) from a directory written by export_flax; its config read by config_from_ours."""
    config_path, weights_path = os.path.join(directory, FLAX_CONFIG), os.path.join(directory, FLAX_WEIGHTS)
    config = config_from_ours(config_path)
    flat = layout.read_safetensors(weights_path)
    layout.check_params(flat, config, weights_path)
    return config, layout.unflatten({k: v.astype(np.float32) for k, v in flat.items()})
