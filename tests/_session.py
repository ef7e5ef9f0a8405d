"""Session fixtures shared by several test modules: data and a trained run that each worker makes once.

Import them into a test module with `from tests._session import trained_run  # noqa: F401`. pytest makes a
fixture per module that imports it, so each one keeps its value in this module (imported once per process): the
second module to ask gets the first one's result. Tests must not modify what they are given (copy a workdir
before writing into it; `trained_run["config"]()` returns a fresh copy of the run's config).
"""

import copy

import pytest

from tests import helpers

_MADE = {}


def _once(key, make):
    if key not in _MADE:
        _MADE[key] = make()
    return _MADE[key]


@pytest.fixture(scope="session")
def small_records(tmp_path_factory):
    """Unmasked training records (masked dynamically, as in the default run) and statically masked held-out
    records: 32 tokens, 5 predictions, ids below helpers.TINY_VOCAB; 64 training and 48 held-out instances."""
    def make():
        directory = tmp_path_factory.mktemp("small_records")
        return {"train": helpers.write_pretraining_records(directory / "train.tfrecord", num_records=64, seed=0,
                                                           masked=False),
                "eval": helpers.write_pretraining_records(directory / "eval.tfrecord", num_records=48, seed=1)}
    return _once("small_records", make)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, small_records):
    """One tiny pretraining run (train_and_evaluate) on small_records over a 2x2x2 mesh: 4 steps, a log line every
    2, an evaluation over the whole held-out file at step 4, the checkpoint of step 4, a profiler trace of step 2.

    {"workdir": str, "final": its returned metrics, "config": a function returning a copy of its config}."""
    def make():
        workdir = str(tmp_path_factory.mktemp("trained_run"))
        config = helpers.small_tfrecord_config(small_records, num_steps=4, log_every=2, eval_every=4,
                                               eval_steps=100,  # more batches than the file holds: all of it
                                               profile_start_step=2, profile_steps=1)
        final = helpers.run_pretraining(copy.deepcopy(config), workdir).metrics
        return {"workdir": workdir, "final": final, "config": lambda: copy.deepcopy(config)}
    return _once("trained_run", make)
