"""Train state, the jitted steps and the one setup of a run.

`train_step(state, batch, rng) -> (state, metrics)` and `eval_step(params, batch) -> sums` are pure functions
(bert_jax.steps); `jit_train_step` jits them with explicit in/out shardings over the mesh and donates the state,
so parameters and optimizer state are created, updated and kept sharded and no device ever holds more than its
part. The loop that
runs them is bert_jax.loop's; `Setup` is the one construction of a run that every job, ahead-of-time compilation
and the benchmarks build from.
"""

import collections
import dataclasses
import math
from typing import Any, Callable, Iterator

from absl import logging
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
import optax
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import arch as arch_lib
from bert_jax import optim
from bert_jax import runtime
from bert_jax import sharding as sharding_lib
from bert_jax.steps import make_train_step, model_inputs


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


# train.dropout_rng: the PRNG implementation of the key dropout draws from. threefry keeps the masks independent of
# the mesh (what the sharding parity tests compare); rbg / unsafe_rbg draw with XLA's RngBitGenerator (unsafe_rbg
# also splits with it), which XLA:TPU partitions without replicating the bits when the driver sets
# --xla_tpu_spmd_rng_bit_generator_unsafe=true for unsafe_rbg (then the masks depend on the mesh).
DROPOUT_RNG_IMPLS = {"threefry": "threefry2x32", "rbg": "rbg", "unsafe_rbg": "unsafe_rbg"}


def dropout_key(seed: int, choice: str, platform: str) -> jax.Array:
    """The run's dropout key. threefry: the second half of split(key(seed)), the first seeding initialisation."""
    name = runtime.dropout_rng_name(choice, platform)
    if name == "threefry":
        return jax.random.split(jax.random.key(seed))[1]
    return jax.random.key(seed, impl=DROPOUT_RNG_IMPLS[name])


# Programs with oneDNN's dots that their owners let go of, kept a little longer (KeptUntilDone.__del__): the last few.
_RETIRED_PROGRAMS = collections.deque(maxlen=8)


class KeptUntilDone:
    """A jitted program that is not freed while it runs, nor just after: letting go of it waits for its last run's
    outputs, then keeps it among the last few programs let go of (_RETIRED_PROGRAMS), to be freed when later ones
    push it out.

    XLA:CPU's oneDNN fusion thunk (runtime.step_compiler_options) aborts the process when a program is freed while
    one of its runs still holds the thunk's oneDNN runtime: when its last owner is its own running execution (a step
    dropped with the job that ran it, an exception between steps), and also just after the run's outputs are ready,
    before the run has handed the runtime back (jaxlib 0.10.2, a loaded 2-core AMD EPYC with AVX-512: 5 of 26 runs of
    tests/test_xla_cpu.py's loop aborted with the wait alone). Calls, .lower and the rest are the jitted function's."""

    def __init__(self, jitted):
        self._jitted = jitted
        self._last = None  # the last output of the last run (the metrics, not the donated state): all of a run's
        # outputs are ready together

    def __call__(self, *args, **kwargs):
        outputs = self._jitted(*args, **kwargs)
        leaves = jax.tree.leaves(outputs)
        self._last = leaves[-1] if leaves and isinstance(leaves[-1], jax.Array) else None
        return outputs

    def __getattr__(self, name):
        if "_jitted" not in self.__dict__:  # not yet initialised (copy, pickle): no recursion through here
            raise AttributeError(name)
        return getattr(self._jitted, name)

    def __del__(self):
        last = self.__dict__.get("_last")
        try:
            if last is not None and not last.is_deleted():
                last.block_until_ready()
        except Exception:  # pylint: disable=broad-except  # a failed run's error is raised where its outputs are read
            pass
        # The jitted function holds its compiled programs (even through jax.clear_caches): freed only once several
        # later programs have been let go of, long after this one's runs have handed their oneDNN runtimes back.
        if "_jitted" in self.__dict__:
            _RETIRED_PROGRAMS.append(self._jitted)


def _jit_step(function, mesh, **kwargs):
    """jax.jit with the step's compile options for the mesh's platform; a program with oneDNN's dots is kept alive
    until its runs end (the others skip the wrapper's per-call work)."""
    options = runtime.step_compiler_options(mesh.devices.flat[0].platform)
    jitted = jax.jit(function, compiler_options=options, **kwargs)
    return jitted if options is None else KeptUntilDone(jitted)


def jit_train_step(train_step, state_shardings, mesh, rules):
    """`train_step(state, batch, rng) -> (state, metrics)` jitted as the training loop runs it: the state in its
    shardings and donated (updated in place), the batch in the mesh's batch sharding, the RNG and metrics
    replicated. Pretraining, fine-tuning, the benchmarks and ahead-of-time compilation all jit it this way."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return _jit_step(train_step, mesh,
                     in_shardings=(state_shardings, sharding_lib.batch_sharding(mesh, rules), replicated),
                     out_shardings=(state_shardings, replicated), donate_argnums=0)


def jit_eval_step(eval_step, params_shardings, mesh, rules):
    """`eval_step(params, batch) -> sums` jitted as the pretraining job runs it: the parameters in their shardings,
    the batch in the mesh's batch sharding, the sums replicated."""
    return _jit_step(eval_step, mesh, in_shardings=(params_shardings, sharding_lib.batch_sharding(mesh, rules)),
                     out_shardings=NamedSharding(mesh, PartitionSpec()))


def dummy_batch(batch_size: int, seq_length: int, max_predictions: int) -> dict[str, np.ndarray]:
    """An all-zeros batch of the right shapes and dtypes, for initialisation and shape inference."""
    return {
        "input_ids": np.zeros((batch_size, seq_length), np.int32),
        "input_mask": np.ones((batch_size, seq_length), np.int32),
        "segment_ids": np.zeros((batch_size, seq_length), np.int32),
        "masked_lm_positions": np.zeros((batch_size, max_predictions), np.int32),
        "masked_lm_ids": np.zeros((batch_size, max_predictions), np.int32),
        "masked_lm_weights": np.zeros((batch_size, max_predictions), np.float32),
        "next_sentence_labels": np.zeros((batch_size,), np.int32),
    }


def init_inputs(seq_length: int, max_predictions: int | None = None) -> dict[str, np.ndarray]:
    """Model inputs of one row, for initialisation and shape inference: a pretraining batch's (with
    masked_lm_positions) or, with `max_predictions` None, a downstream model's."""
    if max_predictions is None:
        ids = np.zeros((1, seq_length), np.int32)
        return {"input_ids": ids, "input_mask": ids, "segment_ids": ids}
    return model_inputs(dummy_batch(1, seq_length, max_predictions))


def state_spec(model: nn.Module, tx: optax.GradientTransformation, mesh, rules, inputs: dict):
    """(shapes of the train state, its shardings, the boxed init function), allocating nothing. `inputs`: the
    model's keyword inputs (init_inputs)."""
    def init_boxed(rng):
        with nn.logical_axis_rules(rules):
            params = model.init({"params": rng}, **inputs, deterministic=True)["params"]
        # The optimizer state is built from the boxed params, so its moments inherit the parameters' axis names.
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    boxed = jax.eval_shape(init_boxed, jax.random.key(0))
    shardings = sharding_lib.tree_shardings(boxed, mesh, rules)
    return sharding_lib.unbox(boxed), shardings, init_boxed


def abstract_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh, rules, seq_length: int,
                         max_predictions: int):
    """state_spec of a pretraining model."""
    return state_spec(model, tx, mesh, rules, init_inputs(seq_length, max_predictions))


def create_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh, rules, rng,
                       seq_length: int, max_predictions: int):
    """Creates the train state already sharded: `jax.jit(init, out_shardings=...)`, so no device holds a full copy.

    Returns (state, state_shardings).
    """
    setup = Setup.build(model, tx, None, mesh, rules, init_inputs(seq_length, max_predictions))
    return setup.create_state(rng), setup.shardings


@dataclasses.dataclass(frozen=True)
class Setup:
    """One run's pieces, built once: model, mesh and rules, optimizer and schedule, the train state's shapes and
    shardings, and the jitted steps over them. Pretraining, fine-tuning, bert_jax.aot and the benchmarks build
    from it."""
    model: nn.Module
    mesh: Any
    rules: tuple  # logical axis name -> mesh axes (sharding.logical_rules)
    tx: optax.GradientTransformation
    schedule: Any  # optax.Schedule (None where nothing trains)
    abstract: TrainState  # shapes and dtypes, nothing allocated
    shardings: TrainState
    init_boxed: Callable  # rng -> the boxed TrainState

    @classmethod
    def build(cls, model: nn.Module, tx, schedule, mesh, rules, inputs: dict) -> "Setup":
        """`inputs`: the model's keyword inputs for shape inference (init_inputs)."""
        abstract, shardings, init_boxed = state_spec(model, tx, mesh, rules, inputs)
        return cls(model, mesh, rules, tx, schedule, abstract, shardings, init_boxed)

    @property
    def batch_sharding(self) -> NamedSharding:
        return sharding_lib.batch_sharding(self.mesh, self.rules)

    def create_state(self, rng, given: dict | None = None) -> TrainState:
        """A fresh state from `rng`, born sharded: no device ever holds a full copy.

        `given`: parameters already placed as `self.shardings.params` (some or all of the top-level names, each whole),
        which the state takes as they are (donated); only the others are initialised, from `rng` as without `given`.
        The initialisers of what `given` replaces are left out of the program (dead code), so a run from
        --config.init neither compiles nor holds a throwaway random copy of them. The optimizer state starts from the
        state's parameters."""
        if not given:
            return jax.jit(lambda key: sharding_lib.unbox(self.init_boxed(key)), out_shardings=self.shardings)(rng)

        def fresh(key, given):
            state = sharding_lib.unbox(self.init_boxed(key))
            params = dict(state.params, **given)
            return state.replace(params=params, opt_state=self.tx.init(params))

        return jax.jit(fresh, out_shardings=self.shardings, donate_argnums=1)(rng, given)

    def jit_train_step(self, train_step):
        return jit_train_step(train_step, self.shardings, self.mesh, self.rules)

    def jit_eval_step(self, eval_step):
        """`eval_step(params, batch) -> replicated outputs` (sums, predictions) jitted over the parameters'
        shardings and the batch sharding."""
        return jit_eval_step(eval_step, self.shardings.params, self.mesh, self.rules)

    def pretraining_step(self, grad_accum_steps: int = 1):
        """The pretraining train step (make_train_step), jitted as the loop runs it."""
        return self.jit_train_step(make_train_step(self.model, self.tx, self.schedule, self.rules, self.mesh,
                                                   grad_accum_steps))


def pretraining_model(model_config) -> nn.Module:
    """The pretraining model of `config.model` (a ConfigDict or an architecture's config): its architecture's
    (BertForPreTraining for BERT, ModernForMaskedLM for arch="modern")."""
    architecture = arch_lib.of(model_config)
    return architecture.pretraining_model(architecture.config(model_config))


def pretraining_setup(config, devices=None, num_steps: int | None = None) -> Setup:
    """The Setup of a pretraining config: pretraining_model of config.model, config.mesh over `devices` (default:
    all), config.optim's optimizer and schedule over `num_steps` (default train.num_steps), the state for
    config.data's shapes. The pretraining job, bert_jax.aot and the benchmarks build from it."""
    model = pretraining_model(config.model)
    tx, schedule = optim.create_optimizer(config.optim, config.train.num_steps if num_steps is None else num_steps)
    return Setup.build(model, tx, schedule, sharding_lib.create_mesh(config.mesh, devices),
                       sharding_lib.logical_rules(config.mesh),
                       init_inputs(config.data.max_seq_length, config.data.max_predictions_per_seq))


def finetuning_optimizer(config, num_examples: int):
    """(tx, schedule, num_steps) of a fine-tuning config over `num_examples` training examples: train.num_steps, or
    train.num_epochs of them; warmup in proportion to the steps the schedule spans (optim.schedule_steps, or
    num_steps); a frozen encoder (train.encoder) keeps the pretrained parameters fixed."""
    train = config.train
    num_steps = train.num_steps or math.ceil(train.num_epochs * num_examples / train.batch_size)
    optim_config = ml_collections.ConfigDict(config.optim.to_dict())
    optim_config.warmup_steps = config.optim.warmup_steps or int(
        config.optim.warmup_proportion * optim.schedule_span(config.optim, num_steps))
    frozen = arch_lib.of(config.model).is_pretrained_parameter if config.train.encoder != "tuned" else None
    tx, schedule = optim.create_optimizer(optim_config, num_steps, frozen=frozen)
    logging.info("%d training examples, %d steps of %d (%.2f epochs), warmup %d steps", num_examples, num_steps,
                 train.batch_size, num_steps * train.batch_size / num_examples, optim_config.warmup_steps)
    return tx, schedule, num_steps


def finetuning_setup(config, task, devices=None) -> tuple[Setup, int]:
    """(the Setup of a fine-tuning config for `task`, its number of steps): the task's model over config.model's
    architecture (bert_jax.tasks: the task chooses which of the architecture's task models), config.mesh over
    `devices` (default: all), finetuning_optimizer over the task's training examples, the state for
    data.max_seq_length. The fine-tuning job builds from it, as pretraining from pretraining_setup."""
    model = task.model(arch_lib.config_of(config.model), config.train.encoder)
    tx, schedule, num_steps = finetuning_optimizer(config, len(task.train_labels))
    return Setup.build(model, tx, schedule, sharding_lib.create_mesh(config.mesh, devices),
                       sharding_lib.logical_rules(config.mesh), init_inputs(config.data.max_seq_length)), num_steps


def inference_setup(model: nn.Module, mesh, rules, seq_length: int) -> Setup:
    """The Setup of `model` with nothing to train (an identity optimizer): a training run's shapes, shardings and
    initialisation, for reading and applying parameters (features, and --config.init read on its own)."""
    return Setup.build(model, optax.identity(), None, mesh, rules, init_inputs(seq_length))


def sum_over_batches(step, params, batches: Iterator, batch_sharding, num_batches: int | None = None
                     ) -> tuple[dict[str, float], int]:
    """(the sums `step(params, global batch)` returns, added over `batches`' local batches (at most `num_batches`;
    None: all), as floats; the number of batches), the one held-out loop of both jobs.

    Every process must run the same number of sharded steps: it goes on while any one has data, and a process whose
    share has run out feeds `batches.empty_batch()`, of weight 0 (its shard may hold a batch fewer than another's).
    """
    totals, count = None, 0
    while num_batches is None or count < num_batches:
        local = next(batches, None)
        if sharding_lib.all_processes_agree(local is None):
            break
        if local is None:
            local = batches.empty_batch()
        sums = step(params, sharding_lib.make_global_batch(local, batch_sharding))
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        count += 1
    return ({} if totals is None else {k: float(v) for k, v in jax.device_get(totals).items()}), count
