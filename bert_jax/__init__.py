"""bert_jax: BERT pretraining in JAX/Flax, sharded over TPU, GPU or CPU device meshes.

Importing it, or any of its modules, changes no process-wide state: the driver (bert_jax.main) sets the XLA options.
"""

__version__ = "0.1.0"
