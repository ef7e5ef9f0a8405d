"""Other formats: HuggingFace transformers (out: export, in: pretrained), the original google-research/bert TF
checkpoints (in: pretrained), our own Flax files (export, pretrained), and --config.init's architecture taken from
any of them or from a bert_jax run (init_architecture)."""
