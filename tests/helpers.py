"""Shared test configuration: the tiny preset, shrunk further so that every test compiles in seconds."""

import os

from configs import pretrain

TINY_VOCAB = 512  # divisible by every tensor-axis size tested, so the vocab dimension really is sharded
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "google_bert")


def tiny_config(mesh_shape=(1, 1, 1), dropout=False, vocab_size=TINY_VOCAB, **train_overrides):
    config = pretrain.get_config("size=tiny,data=synthetic")
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh_shape
    config.model.vocab_size = vocab_size
    config.model.max_position_embeddings = 64
    if not dropout:
        config.model.dropout_rate = 0.0
        config.model.attention_dropout_rate = 0.0
    config.optim.learning_rate = 1e-3
    config.optim.warmup_steps = 2
    config.data.max_seq_length = 32
    config.data.max_predictions_per_seq = 5
    config.train.batch_size = 16
    config.train.num_steps = 10
    config.train.log_every = 5
    for key, value in train_overrides.items():
        config.train[key] = value
    return config
