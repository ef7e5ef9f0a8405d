"""The suite's persistent compilation cache (tests/compile_cache.py) serves a program only in place of the same
program compiled under the same XLA flags: what a test runs from it is what it would have compiled."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import monitoring


@pytest.fixture
def cache_events():
    events = []

    def listen(event, **kwargs):
        del kwargs
        if event in ("/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"):
            events.append(event.rsplit("_", 1)[-1])

    monitoring.register_event_listener(listen)
    yield events
    monitoring.unregister_event_listener(listen)


def _compile_and_run(scale, x):
    jax.clear_caches()  # the in-memory caches: each call below reaches the persistent one
    return np.asarray(jax.jit(lambda a: jnp.tanh(a @ a.T) * scale)(x))


def test_the_run_shares_one_cache_directory_that_keys_programs_and_flags(cache_events, monkeypatch):
    directory = os.environ["JAX_COMPILATION_CACHE_DIR"]
    assert os.path.isdir(directory) and jax.config.jax_compilation_cache_dir == directory
    x = jnp.asarray(np.random.default_rng(0).normal(size=(16, 16)), jnp.float32)
    scale = float(np.random.default_rng().uniform(1, 2))  # a constant no other program has: compiled afresh

    def outcomes(*args):
        cache_events.clear()
        result = _compile_and_run(*args)
        return set(cache_events), result

    seen, first = outcomes(scale, x)
    assert seen == {"misses"}
    seen, again = outcomes(scale, x)
    assert seen == {"hits"} and again.tobytes() == first.tobytes()  # the same program: served, the same result
    assert outcomes(scale + 1, x)[0] == {"misses"}  # another constant is another program
    # Another XLA flag is another key, even for the same program (JAX reads XLA_FLAGS as it computes the key).
    monkeypatch.setenv("XLA_FLAGS", os.environ["XLA_FLAGS"] + " --xla_cpu_max_isa=AVX")
    assert outcomes(scale, x)[0] == {"misses"}


def test_o2_compiles_here_use_xlas_default_emitters_and_o0_ones_the_suites():
    """tests/conftest.py: at -O0 the suite's XLA_FLAGS turn XLA:CPU's newer kernel emitters off (this process and the
    driver processes it starts), and each -O2 compile of this process (the comparisons with references) turns them
    back on, as users' runs compile; -O0 compiles add nothing, so their cache keys are the driver processes'."""
    from jax._src import compiler  # pylint: disable=import-outside-toplevel

    def overrides():
        options = compiler.get_compile_options(num_replicas=1, num_partitions=1, env_options_overrides={})
        return dict(options.env_option_overrides)

    less_optimized = jax.config.read("jax_disable_most_optimizations")
    try:
        jax.config.update("jax_disable_most_optimizations", True)
        at_o0 = overrides()
        jax.config.update("jax_disable_most_optimizations", False)
        at_o2 = overrides()
    finally:
        jax.config.update("jax_disable_most_optimizations", less_optimized)
    suites = bool(os.environ.get("BERT_JAX_TESTS_ADDED_XLA_FLAG"))  # conftest added the flag (a user's stands alone)
    assert at_o0 == {}
    assert at_o2 == ({"xla_cpu_use_fusion_emitters": True} if suites else {})
