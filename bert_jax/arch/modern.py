"""A ModernBERT-style encoder (bert_jax.modern): rotary positions, local and global attention, GeGLU, masked LM
only, and transformers' ModernBERT files both ways (bert_jax.interop.modern)."""

import ml_collections

from bert_jax import model as model_lib
from bert_jax import modern
from bert_jax import presets as presets_lib
from bert_jax.arch.base import Architecture, encoder_flops
from bert_jax.interop import modern as interop_modern


class Modern(Architecture):
    name = "modern"
    config_class = modern.ModernConfig
    description = "a modern encoder"
    presets = presets_lib.MODERN_PRESETS
    # classifier_pooling is a fine-tuned checkpoint's choice, so it is fixed too.
    checkpoint_fields = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                         "max_position_embeddings", "local_attention", "global_attn_every_n_layers",
                         "global_rope_theta", "local_rope_theta", "norm_eps", "classifier_pooling")
    vocab_rows = interop_modern.VOCAB_ROWS
    transformers_model_types = (interop_modern.MODEL_TYPE,)
    transformers_pretraining_class = "ModernBertForMaskedLM"

    def preset(self, size: str) -> ml_collections.ConfigDict:
        return presets_lib.modern_model_config(size)

    def pretraining_recipe(self, config) -> None:
        # ModernBERT's recipe: masked LM only (the model has no NSP head) at a 30% masking rate.
        config.data.masked_lm_prob = 0.3
        config.data.max_predictions_per_seq = 40  # 30% of 128 tokens, rounded up to a multiple of 8
        # No NSP head, so no sentence pairs: full rows of contiguous text (0% padding on the demo corpus against
        # 17% for pairs: docs/data.md, "MLM-only instances").
        config.data.instances = "rows"
        config.optim.decay = "wsd"  # warmup, a stable peak, then the last 10% cooling down

    def pretraining_model(self, config):
        return modern.ModernForMaskedLM(config)

    def sequence_model(self, config, num_labels: int):
        return modern.ModernForSequenceClassification(config, num_labels)

    def token_model(self, config, num_labels: int, encoder: str = "tuned"):
        del encoder  # "tuned" only (token_encoders)
        return modern.ModernForTokenClassification(config, num_labels)

    def qa_model(self, config):
        return modern.ModernForQuestionAnswering(config)

    def is_pretrained_parameter(self, name: str) -> bool:
        return modern.is_pretrained_parameter(name)

    def stack_layers(self, params: dict, config) -> dict:
        return modern.stack_layers(params, config)

    def unstack_layers(self, params: dict, config) -> dict:
        return modern.unstack_layers(params, config)

    def flops_per_sequence(self, config, seq_length: int, max_predictions: int) -> float:
        return float(encoder_flops(config, 3, seq_length, max_predictions))  # a GeGLU: 3 matrices, no NSP head

    def checkpoint_shapes(self, params: dict) -> dict | None:
        if "embeddings_norm" not in params:
            return None
        vocab_size, hidden_size = params["embeddings"]["embedding"].shape
        stacked = params.get(model_lib.SCANNED_LAYERS, {})  # scan_layers: groups of members, a leading group axis
        scanned = len(stacked) * (stacked["member_0"]["mlp_norm"]["scale"].shape[0] if stacked else 0)
        return {"vocab_size": int(vocab_size), "hidden_size": int(hidden_size),
                "num_layers": sum(1 for name in params if model_lib.is_unrolled_layer(name)) + int(scanned),
                "intermediate_size": int(params["layer_0"]["mlp_input"]["kernel"].shape[-1])}

    def config_from_transformers(self, values: dict, where: str):
        return interop_modern.config_from_transformers(values, where)

    def transformers_config(self, config) -> dict:
        return interop_modern.transformers_config(config)

    def import_transformers(self, path: str, *, seed: int = 0, check_vocab: bool = True):
        return interop_modern.import_hf(path, seed=seed, check_vocab=check_vocab)

    def export(self, params, config, output_dir: str, *, tokenizer=None, export_format: str = "hf",
               task: str | None = None, label_names=()) -> str:
        del export_format  # "hf" only (export_formats)
        if task is not None:
            return interop_modern.export_hf_task(params, config, output_dir, task, list(label_names), tokenizer)
        return interop_modern.export_hf(params, config, output_dir, tokenizer=tokenizer)
