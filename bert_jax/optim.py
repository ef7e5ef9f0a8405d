"""Optimizers and learning-rate schedules (optax): AdamW or LAMB, warmup then linear/polynomial decay or
warmup-stable-decay, clipping, parameters held frozen.

Gradient accumulation over micro-batches happens inside the train step (bert_jax.train), so that one optimizer
step sees the gradient of the whole batch while only one micro-batch's activations are alive at a time.
"""

from absl import logging
import jax
import jax.numpy as jnp
import optax

from bert_jax import model as model_lib

OPTIMIZERS = ("adamw", "lamb")
DECAYS = ("linear", "polynomial", "wsd")


def validate(optim_config, num_steps: int) -> None:
    """Checks `config.optim` once at start-up; errors name the field."""
    def fail(field, problem):
        raise ValueError(f"--config.optim.{field}={optim_config[field]!r}: {problem}")

    if optim_config.optimizer not in OPTIMIZERS:
        fail("optimizer", f"choose one of {OPTIMIZERS}")
    if optim_config.decay not in DECAYS:
        fail("decay", f"choose one of {DECAYS}")
    if optim_config.learning_rate <= 0:
        fail("learning_rate", "must be positive")
    if optim_config.warmup_steps < 0:
        fail("warmup_steps", "must be >= 0")
    if optim_config.schedule_steps < 0:
        fail("schedule_steps", "must be >= 0 (0: the schedule spans train.num_steps)")
    if optim_config.warmup_steps > num_steps:
        logging.warning("optim.warmup_steps=%d exceeds train.num_steps=%d: the run ends before the peak "
                        "learning rate", optim_config.warmup_steps, num_steps)
    if optim_config.decay == "wsd":
        fraction = optim_config.get("decay_fraction", 0.1)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"--config.optim.decay_fraction={fraction!r}: must be in (0, 1] (the share of the "
                             "schedule's steps spent decaying)")
        span = schedule_span(optim_config, num_steps)
        decay_steps = _wsd_decay_steps(optim_config, span)
        if optim_config.warmup_steps + decay_steps > span:
            raise ValueError(f"--config.optim.warmup_steps={optim_config.warmup_steps} and --config.optim."
                             f"decay_fraction={fraction} overlap: warmup and the last {decay_steps} decaying steps "
                             f"do not fit the schedule's {span} steps. Fix: fewer warmup steps, a smaller decay_fraction, or "
                             "more steps (train.num_steps or optim.schedule_steps)")
    if optim_config.max_grad_norm < 0:
        fail("max_grad_norm", "must be >= 0 (0 disables clipping)")
    if optim_config.grad_accum_steps < 1:
        fail("grad_accum_steps", "must be >= 1")


def schedule_span(optim_config, num_steps: int) -> int:
    """The steps the schedule spans: optim.schedule_steps, or the run's num_steps where that is 0."""
    return int(optim_config.schedule_steps) or num_steps


def _wsd_decay_steps(optim_config, span: int) -> int:
    return max(int(round(optim_config.get("decay_fraction", 0.1) * span)), 1)


def _one_minus_sqrt(peak: float, end: float, steps: int) -> optax.Schedule:
    """peak -> end over `steps` steps as end + (peak - end) * (1 - sqrt(t)), t = step / steps: the "1-sqrt" cooldown
    of warmup-stable-decay schedules (Hägele et al., 2024), which ModernBERT pretrained with."""
    def schedule(count):
        fraction = jnp.clip(count / steps, 0.0, 1.0)
        return end + (peak - end) * (1.0 - jnp.sqrt(fraction))
    return schedule


def learning_rate_schedule(optim_config, num_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to the peak, then linear or polynomial decay to end_learning_rate at the end of the
    schedule's span (schedule_span); or, with decay="wsd" (warmup-stable-decay), the peak held until the last
    optim.decay_fraction of the span, which cools down to end_learning_rate ("1-sqrt")."""
    num_steps = schedule_span(optim_config, num_steps)
    warmup = int(optim_config.warmup_steps)
    if optim_config.decay == "wsd":
        decay_steps = _wsd_decay_steps(optim_config, num_steps)
        peak = optim_config.learning_rate
        parts = [optax.linear_schedule(0.0, peak, warmup)] if warmup else []
        parts += [optax.constant_schedule(peak), _one_minus_sqrt(peak, optim_config.end_learning_rate, decay_steps)]
        boundaries = [warmup] if warmup else []
        return optax.join_schedules(parts, boundaries=boundaries + [num_steps - decay_steps])
    power = 1.0 if optim_config.decay == "linear" else float(optim_config.decay_power)
    decay = optax.polynomial_schedule(init_value=optim_config.learning_rate,
                                      end_value=optim_config.end_learning_rate, power=power,
                                      transition_steps=max(num_steps - warmup, 1))
    if warmup == 0:
        return decay
    return optax.join_schedules(
        [optax.linear_schedule(0.0, optim_config.learning_rate, warmup), decay], boundaries=[warmup])


def decay_mask(params):
    """True for weights that take weight decay: matrices and embeddings, not LayerNorm parameters or biases.

    Every rank-1 parameter in the model is a LayerNorm scale/offset or a bias, as in the original BERT's exclusion
    of "LayerNorm" and "bias" variables. Scanned layers (model.scan_layers) add a leading layer axis to every
    parameter under "layers", which does not count.
    """
    def takes_decay(path, param):
        scanned = bool(path) and getattr(path[0], "key", None) == model_lib.SCANNED_LAYERS
        return param.ndim - scanned > 1

    return jax.tree_util.tree_map_with_path(takes_decay, params)


def create_optimizer(optim_config, num_steps: int, frozen=None) -> tuple[optax.GradientTransformation,
                                                                         optax.Schedule]:
    """The optimizer chain (clip by global norm, then AdamW or LAMB) and its schedule.

    `frozen(name) -> bool`, given a top-level parameter name (e.g. model.is_encoder_parameter), names the parameters
    to hold fixed: their updates are zero (optax.set_to_zero), so decoupled weight decay, which a zero gradient alone
    would not stop, never shrinks them, and they hold no Adam/LAMB moments; clipping sees the others' gradients only.
    """
    schedule = learning_rate_schedule(optim_config, num_steps)
    common = dict(learning_rate=schedule, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps,
                  weight_decay=optim_config.weight_decay, mask=decay_mask)
    if optim_config.optimizer == "adamw":
        optimizer = optax.adamw(**common)
    else:
        optimizer = optax.lamb(**common)
    if optim_config.max_grad_norm > 0:
        optimizer = optax.chain(optax.clip_by_global_norm(optim_config.max_grad_norm), optimizer)
    if frozen is None:
        return optimizer, schedule

    def labels(params):  # a prefix of the parameter tree: one label per top-level name
        return {name: "frozen" if frozen(name) else "trained" for name in params}

    return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()}, labels), schedule
