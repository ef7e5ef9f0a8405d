"""`--mode=export`: one of our Orbax checkpoints to another format; the checkpoint entry alone lives here.

`export_checkpoint` restores a checkpoint's parameters (`restore_checkpoint_params`) and writes them with the
format's module: "hf" bert_jax.interop.huggingface.export_hf (a directory transformers loads), "flax"
bert_jax.interop.flax_files.export_flax (our own files, read back by load_flax). Exports write the unrolled layout
(bert_jax.interop.layout: scanned layers are unstacked); in a multi-process run call the format exports on every
process (sharded arrays are gathered), process 0 writes. Reading any format back: bert_jax.interop.pretrained.
"""

import flax.linen as nn
import jax

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import model as model_lib
from bert_jax.interop import flax_files
from bert_jax.interop import huggingface
from bert_jax.interop import layout


def restore_model_params(checkpoint: str, model: nn.Module, *inputs) -> dict:
    """`model`'s parameters from one of our Orbax checkpoints (a step, checkpoints or fine-tuned directory), on this
    host's first device, for exporting from a single process. `inputs`: any inputs `model.init` accepts."""
    abstract = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs)))["params"]
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    params, _ = checkpoint_lib.restore_params(checkpoint, abstract, jax.tree.map(lambda _: device, abstract))
    return params


def restore_checkpoint_params(checkpoint: str, bert_config: model_lib.BertConfig) -> dict:
    """A pretraining checkpoint's BertForPreTraining parameters (restore_model_params)."""
    return restore_model_params(checkpoint, model_lib.BertForPreTraining(bert_config), *layout.dummy_inputs())


def export_checkpoint(checkpoint: str, bert_config: model_lib.BertConfig, output_dir: str, *, tokenizer=None,
                      tokenizer_vocab_size: int | None = None, export_format: str = "hf") -> str:
    """`--mode=export`: a checkpoint's parameters to `export_format` "hf" (export_hf) or "flax" (export_flax)."""
    if export_format not in ("hf", "flax"):
        raise ValueError(f"export_format={export_format!r}: choose 'hf' or 'flax'")
    params = restore_checkpoint_params(checkpoint, bert_config)
    if export_format == "flax":
        return flax_files.export_flax(params, bert_config, output_dir, tokenizer=tokenizer)
    return huggingface.export_hf(params, bert_config, output_dir, tokenizer=tokenizer,
                                 tokenizer_vocab_size=tokenizer_vocab_size)
