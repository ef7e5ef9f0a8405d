"""bert_jax: BERT pretraining in JAX/Flax, sharded over TPU, GPU or CPU device meshes."""

import os as _os

# XLA:CPU settings (jaxlib 0.10.x), applied when bert_jax is imported, before JAX starts its CPU backend. Each one is
# added only if XLA_FLAGS does not already name it, so `XLA_FLAGS=--FLAG=VALUE` overrides any of them. They are
# CPU-only options: other backends ignore them.
CPU_XLA_FLAGS = (
    # The "ynn" (YNNPACK) library fusion for reductions only. Its dot fusions are left off: with them, a dot with a
    # constant operand fused into a reduction silently returned NaN in jaxlib 0.10. Without "reduce", XLA:CPU emits
    # each reduction as a reduce-window loop: a bias gradient's column sum over [8, 128, 3072] took 6.9 ms instead
    # of 0.4 ms, and the BERT-base fp32 training step on the 2-core benchmark machine was 0.07-0.38 s slower (medians
    # of three alternating runs each: 3.09-3.28 s with "reduce", 3.35-3.55 s without). The cost: the step's temporaries
    # grew from 1.04 to 1.18 GiB, and the process's peak RSS in runs of 40-60 steps from 6.63 to 7.11 GiB.
    ("xla_cpu_experimental_ynn_fusion_type", "reduce"),
    # Dots through oneDNN instead of Eigen: on this project's 2-core benchmark machine, the BERT-base fp32 training
    # step went from 3.17 s to 2.71 s, batched attention matmuls ran twice as fast, and every parity test against
    # transformers and the original BERT fixtures holds unchanged (fp32 stays fp32: oneDNN's strict math mode).
    ("xla_cpu_use_onednn", "true"),
    ("xla_cpu_experimental_onednn_fusion_type", "individual_dot"),
)


def _set_cpu_xla_flags() -> None:
    current = _os.environ.get("XLA_FLAGS", "")
    added = [f"--{name}={value}" for name, value in CPU_XLA_FLAGS if name not in current]
    if added:
        _os.environ["XLA_FLAGS"] = " ".join([current, *added]).strip()


_set_cpu_xla_flags()

# glibc settings so XLA:CPU reuses its step memory instead of faulting in fresh pages every step (host_malloc's
# docstring has the figures); on a TPU or GPU host they are left alone.
from bert_jax import host_malloc as _host_malloc  # noqa: E402

_host_malloc.configure()

__version__ = "0.1.0"
