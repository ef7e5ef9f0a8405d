"""The original google-research/bert TensorFlow checkpoints, in: bert_model.ckpt.* + bert_config.json + vocab.txt.

`import_tf` reads the weights with TensorFlow's checkpoint reader (tensorflow is imported only then); `config_from_tf`
the bert_config.json, whose fields are HF's (bert_jax.interop.huggingface.config_from_hf reads them) except that the
original code's "gelu" is the tanh approximation: its hidden_act "gelu" becomes our "gelu_tanh" (HF's own converter
maps it to exact gelu, which moves every activation slightly). Heads a checkpoint lacks are initialised and reported;
the name table is bert_jax.interop.layout's. Paths are local files.
"""

import os
import re

from bert_jax import model as model_lib
from bert_jax.interop import huggingface
from bert_jax.interop import layout
from bert_jax.interop.layout import VOCAB_FILE

TF_CONFIG = "bert_config.json"
# The original modeling.py's "gelu" is 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))): our gelu_tanh.
TF_ACTIVATIONS = {"gelu": "gelu_tanh"}


def config_from_tf(config_path: str) -> model_lib.BertConfig:
    """The original bert_config.json: HF's field names, and "gelu" meaning the tanh approximation."""
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{config_path} does not exist. Fix: pass bert_config_json=.../bert_config.json")
    values = layout.read_json(config_path)
    act = values.get("hidden_act")
    if act not in TF_ACTIVATIONS:
        raise ValueError(f"{config_path}: field 'hidden_act' is {act!r}; the original BERT checkpoints use 'gelu'")
    return huggingface.config_from_hf(dict(values, hidden_act="gelu_new", model_type="bert"), config_path)


def tf_prefix(path: str) -> str:
    if os.path.isdir(path):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        latest = tf.train.latest_checkpoint(path)
        if latest:
            return latest
        indexes = sorted(name[:-len(".index")] for name in os.listdir(path) if name.endswith(".index"))
        if len(indexes) != 1:
            raise FileNotFoundError(f"{path}: expected one TF checkpoint (NAME.index + NAME.data-*), found "
                                    f"{indexes or 'none'}. Fix: pass the prefix, e.g. {path}/bert_model.ckpt")
        return os.path.join(path, indexes[0])
    for suffix in (".index", ".meta"):
        if path.endswith(suffix):
            return path[:-len(suffix)]
    return re.sub(r"\.data-\d+-of-\d+$", "", path)


def import_tf(checkpoint_dir_or_prefix: str, bert_config_json: str | None = None, *, seed: int = 0,
              check_vocab: bool = True):
    """(BertConfig, params, ImportReport) from an original google-research/bert TensorFlow checkpoint.

    `checkpoint_dir_or_prefix`: the directory (bert_model.ckpt.* inside) or the prefix .../bert_model.ckpt.
    bert_config.json defaults to the one beside it; its hidden_act "gelu" means the original code's tanh
    approximation and becomes our "gelu_tanh". A missing pooler/MLM/NSP head is initialised (see import_hf);
    optimizer slots (adam_m, adam_v) and global_step are ignored.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    prefix = tf_prefix(os.fspath(checkpoint_dir_or_prefix))
    if not os.path.exists(prefix + ".index"):
        raise FileNotFoundError(f"{prefix}.index does not exist: {checkpoint_dir_or_prefix} is not an original "
                                "BERT checkpoint (bert_model.ckpt.index + bert_model.ckpt.data-*)")
    directory = os.path.dirname(prefix)
    config_path = bert_config_json or os.path.join(directory, TF_CONFIG)
    config = config_from_tf(config_path)
    reader = tf.train.load_checkpoint(prefix)
    tensors = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    report = layout.ImportReport(source=prefix, format="tf_checkpoint", notes=[
        "hidden_act: the original BERT 'gelu' is the tanh approximation, imported as gelu_tanh"])
    vocab_file = os.path.join(directory, VOCAB_FILE)
    params = layout.assemble(config, tensors, kind="tf", where=prefix, config_name=config_path,
                             vocab_file=vocab_file if os.path.exists(vocab_file) else None, check_vocab=check_vocab,
                             seed=seed, report=report)
    return config, params, report
