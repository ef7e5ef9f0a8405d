"""A run's pretraining batches, whatever --config.data.source names: the one entry point the trainer reads them from.

Synthetic batches (bert_jax.data.synthetic) need only numpy; TFRecords are read by bert_jax.data.input_pipeline
(tf.data), imported only for them, so that a synthetic run never imports TensorFlow (seconds of start-up, and absent
from many GPU images). Both take the same arguments and return host-local numpy batches (input_pipeline's docstring
has their layout).
"""

from bert_jax.data import synthetic


def make_iterator(data_config, *, split: str, **kwargs):
    """This process's batches for `split` ("train" or "eval") from the source `data_config` names; the keyword
    arguments are input_pipeline.make_iterator's."""
    if data_config.source == "synthetic":
        return synthetic.make_iterator(data_config, split=split, **kwargs)
    from bert_jax.data import input_pipeline  # pylint: disable=import-outside-toplevel  # TensorFlow: see above
    return input_pipeline.make_iterator(data_config, split=split, **kwargs)
