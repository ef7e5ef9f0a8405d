"""Other formats, one module each: HuggingFace transformers (huggingface: config and weights, in and out), the
original google-research/bert TF checkpoints (tf_checkpoint: in), our own Flax files (flax_files: out and in);
what they share (layout: the name table, parameter-tree helpers, scanned-layer stacking); loading any format
(pretrained.load_pretrained), a checkpoint's export (export), and --config.init's architecture taken from any of
them or from a bert_jax run (init_architecture)."""
