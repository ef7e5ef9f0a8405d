"""BERT pretraining recipe.

Pick a preset with `--config=configs/pretrain.py:size=base` (tiny, mini, small, medium, base, large) and override any
field with `--config.optim.learning_rate=1e-4`. Several options may be combined: `:size=tiny,data=synthetic`.
Data options: `data=corpus` (the default: make pretraining data from `data.corpus` — the offline demo corpus unless
overridden — into the workdir, then train on it), `data=tfrecord` (existing TFRecords in the original layout),
`data=synthetic` (random batches, for smoke runs and benchmarks). Architecture: `arch=bert` (the default: the original
BERT, MLM and NSP) or `arch=modern` (a ModernBERT-style encoder, bert_jax.modern: masked LM only, at 30%).
The config is locked, so a misspelt override is an error rather than a silently ignored flag.
"""

# The presets live in the library (--config.init compares a checkpoint with them; the benchmarks build from them).
from bert_jax import arch
from bert_jax.presets import MODEL_PRESETS, mesh_config, model_config, pretraining_config  # noqa: F401


def _parse_arg(arg):
    options = {"size": "tiny", "data": "corpus", "arch": "bert"}
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep:  # a bare word is the size, as in `configs/pretrain.py:base`
            key, value = "size", key
        if key not in options:
            raise ValueError(f"configs/pretrain.py: unknown option {key!r} in {arg!r}; known: {sorted(options)}")
        options[key] = value
    if options["size"] not in MODEL_PRESETS:
        raise ValueError(f"configs/pretrain.py: unknown size {options['size']!r}; choose one of {list(MODEL_PRESETS)}")
    if options["data"] not in ("corpus", "synthetic", "tfrecord"):
        raise ValueError(f"configs/pretrain.py: unknown data {options['data']!r}; choose corpus, synthetic or tfrecord")
    if options["arch"] not in arch.names():
        raise ValueError(f"configs/pretrain.py: unknown arch {options['arch']!r}; choose one of {list(arch.names())}")
    return options


def get_config(arg=None):
    options = _parse_arg(arg)
    # Every field, with its one-line comment and its default for the preset, is in bert_jax.presets.pretraining_config.
    return pretraining_config(options["size"], options["data"], options["arch"])
