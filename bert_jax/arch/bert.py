"""The original BERT (bert_jax.model): MLM and NSP heads, learned positions and segments, post-LN layers, and the
transformers and original-TF formats it reads and writes (bert_jax.interop)."""

import ml_collections

from bert_jax import model as model_lib
from bert_jax import presets as presets_lib
from bert_jax.arch.base import Architecture, encoder_flops
from bert_jax.interop import flax_files
from bert_jax.interop import huggingface
from bert_jax.interop import layout


class Bert(Architecture):
    name = "bert"
    config_class = model_lib.BertConfig
    description = "a BERT encoder"
    presets = presets_lib.MODEL_PRESETS
    checkpoint_fields = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "hidden_act",
                         "max_position_embeddings", "type_vocab_size", "layer_norm_eps")
    vocab_rows = layout.VOCAB_ROWS
    optional_pretrained_parameters = ("pooler",)
    has_nsp = True
    token_encoders = model_lib.TOKEN_ENCODERS
    export_formats = ("hf", "flax")
    transformers_model_types = ("bert",)
    transformers_pretraining_class = "BertForPreTraining"
    gathers_head_rows = True

    def preset(self, size: str) -> ml_collections.ConfigDict:
        return presets_lib.model_config(size)

    def config_from_record(self, values: dict, where: str):
        return flax_files.config_from_values(values, where)

    def record(self, config) -> dict:
        # BERT's records predate `arch`: written without it, they stay readable by earlier versions.
        values = super().record(config)
        del values["arch"]
        return values

    def pretraining_model(self, config):
        return model_lib.BertForPreTraining(config)

    def sequence_model(self, config, num_labels: int):
        return model_lib.BertForSequenceClassification(config, num_labels)

    def token_model(self, config, num_labels: int, encoder: str = "tuned"):
        return model_lib.BertForTokenClassification(config, num_labels, encoder=encoder)

    def qa_model(self, config):
        return model_lib.BertForQuestionAnswering(config)

    def features_model(self, config):
        return model_lib.BertModel(config)

    def is_pretrained_parameter(self, name: str) -> bool:
        return model_lib.is_encoder_parameter(name)

    def stack_layers(self, params: dict, config) -> dict:
        return layout.stack_layers(params, config.num_layers) if config.scan_layers else params

    def unstack_layers(self, params: dict, config) -> dict:
        return layout.unstack_layers(params)

    def flops_per_sequence(self, config, seq_length: int, max_predictions: int) -> float:
        h = config.hidden_size
        pooler_and_nsp = 6 * (h * h + 2 * h)
        return float(encoder_flops(config, 2, seq_length, max_predictions) + pooler_and_nsp)

    def step_matmul_flops_per_sequence(self, config, seq_length: int, max_predictions: int,
                                       cls_rows: int = 1) -> float:
        """Unrolled, the last layer computes only the rows the heads read (`cls_rows` [CLS] rows, see
        bert_jax.metrics.head_cls_rows, and the masked positions), so each other row skips its query and output
        projections, feed-forward and attention over seq_length keys, forward and backward. Scanned layers compute
        every row of every layer."""
        flops = self.flops_per_sequence(config, seq_length, max_predictions)
        if config.scan_layers:
            return flops
        h = config.hidden_size
        skipped_rows = max(seq_length - cls_rows - max_predictions, 0)
        return flops - skipped_rows * 12 * h * (h + config.intermediate_size + seq_length)

    def checkpoint_shapes(self, params: dict) -> dict | None:
        embeddings = params.get("embeddings", {})
        if "word_embeddings" not in embeddings:
            return None
        vocab_size, hidden_size = embeddings["word_embeddings"]["embedding"].shape
        if model_lib.SCANNED_LAYERS in params:  # stacked: a leading layer axis
            intermediate = params[model_lib.SCANNED_LAYERS]["intermediate"]["kernel"].shape
            num_layers, intermediate_size = intermediate[0], intermediate[-1]
        else:
            num_layers = sum(1 for name in params if model_lib.is_unrolled_layer(name))
            intermediate_size = params["layer_0"]["intermediate"]["kernel"].shape[-1]
        return {"vocab_size": int(vocab_size), "hidden_size": int(hidden_size), "num_layers": int(num_layers),
                "intermediate_size": int(intermediate_size),
                "max_position_embeddings": int(embeddings["position_embeddings"]["embedding"].shape[0]),
                "type_vocab_size": int(embeddings["token_type_embeddings"]["embedding"].shape[0])}

    def config_from_transformers(self, values: dict, where: str):
        return huggingface.config_from_hf(values, where)

    def transformers_config(self, config) -> dict:
        return huggingface.hf_config(config, config.vocab_size)

    def import_transformers(self, path: str, *, seed: int = 0, check_vocab: bool = True):
        return huggingface.import_hf(path, seed=seed, check_vocab=check_vocab)

    def export(self, params, config, output_dir: str, *, tokenizer=None, export_format: str = "hf",
               task: str | None = None, label_names=()) -> str:
        if task is not None:  # the head is told by the parameters (qa_outputs; a pooler or not)
            return huggingface.export_hf_classifier(params, config, output_dir, list(label_names), tokenizer,
                                                    problem_type="regression" if task == "regression" else None)
        if export_format == "flax":
            return flax_files.export_flax(params, config, output_dir, tokenizer=tokenizer)
        return huggingface.export_hf(params, config, output_dir, tokenizer=tokenizer)
