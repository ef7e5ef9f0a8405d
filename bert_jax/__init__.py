"""bert_jax: BERT pretraining in JAX/Flax, sharded over TPU, GPU or CPU device meshes."""

import os as _os


def _avoid_xla_cpu_ynn_fusion() -> None:
    # XLA:CPU's "ynn" fusion (jaxlib 0.10.x) silently returns NaN for a dot with a constant operand fused into a
    # reduction. Turning it off costs nothing measurable; it must happen before JAX starts its CPU backend.
    flag = "--xla_cpu_experimental_ynn_fusion_type="
    current = _os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_experimental_ynn_fusion_type" not in current:
        _os.environ["XLA_FLAGS"] = f"{current} {flag}".strip()


_avoid_xla_cpu_ynn_fusion()

__version__ = "0.1.0"
