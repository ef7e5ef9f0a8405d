"""The model presets (tiny to large): their architectures and config.model defaults, which the recipes in configs/
start from and --config.init compares a checkpoint's architecture with."""

import ml_collections

# (layers, hidden, heads) of each preset; the intermediate size is always 4 * hidden, as in BERT.
MODEL_PRESETS = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def model_config(size: str) -> ml_collections.ConfigDict:
    """config.model of preset `size` (MODEL_PRESETS), as every recipe starts it (configs/pretrain.py, configs/finetune.py)."""
    layers, hidden, heads = MODEL_PRESETS[size]
    model = ml_collections.ConfigDict()
    # Word-embedding rows; must exceed every token id in the data. 30522 is the original BERT WordPiece vocab, so the
    # presets match HF's bert-base/large exactly. data.source=corpus replaces it with the trained tokenizer's size
    # padded to a multiple of 128. Training the original vocab from scratch: 30592 (padded to a multiple of 128)
    # keeps the vocab dimension shardable over any tensor axis and tile-aligned; padding rows are never looked up,
    # --config.init pads an imported vocab, and HF exports drop the padding rows given data.vocab_file.
    model.vocab_size = 30522
    model.hidden_size = hidden  # width of the residual stream
    model.num_layers = layers  # number of encoder layers
    model.num_heads = heads  # attention heads; must divide hidden_size
    model.intermediate_size = 4 * hidden  # feed-forward width
    model.hidden_act = "gelu_tanh"  # "gelu_tanh" (the original BERT code) or "gelu" (exact erf form)
    model.max_position_embeddings = 512  # learned position table size; must be >= data.max_seq_length
    model.type_vocab_size = 2  # segment (token type) ids
    model.dropout_rate = 0.1  # hidden-state dropout
    model.attention_dropout_rate = 0.1  # dropout on attention probabilities
    model.initializer_range = 0.02  # stddev of the truncated-normal initialiser
    model.layer_norm_eps = 1e-12  # as in the original BERT
    # Compute dtype: "float32" or "bfloat16" (mixed precision: parameters, optimizer state, attention scores and
    # softmax, LayerNorm statistics and the losses stay float32; matmuls and activations run in bfloat16).
    model.dtype = "float32"
    return model
