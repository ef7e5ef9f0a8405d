"""Killing, preempting and resuming the driver in subprocesses; two processes as one 8-device mesh.

Only what needs the process boundary runs as a driver subprocess: the runs that are killed, preempted or split over
two processes. The rest (the uninterrupted runs they must reproduce, a run that only resumes, one process taking over
from two) runs in this process, through the function the driver calls (bert_jax.pretraining.train_and_evaluate) with
the same config and the same XLA flags, which saves a driver start (imports, backend, input pipeline) each.
"""

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax import runtime
from configs import pretrain
from tests import helpers
from tests import test_metrics

# The tiny preset at small shapes and one layer: compiled steps, steps and checkpoints are cheap, and what resuming
# needs restored is all there (a second layer would add only compile time). A schedule that does not depend on
# train.num_steps (optim.schedule_steps), so that the interrupted runs can be started with no end in sight (no race
# between a signal and the run's last step) and finished, like the references, at a step chosen afterwards, all
# compiling the same step (served by the run's compilation cache after the first).
COMMON = [
    "--config.train.batch_size=8", "--config.train.log_every=1", "--config.mesh.fsdp=2", "--config.mesh.tensor=2",
    "--config.model.vocab_size=512", "--config.model.max_position_embeddings=64", "--config.data.max_seq_length=32",
    "--config.data.max_predictions_per_seq=5", "--config.optim.schedule_steps=100", "--config.model.num_layers=1",
]
ENDLESS = ["--config.train.num_steps=100000"]
# Two processes x 4 devices form one (2, 2, 2) mesh.
SYNTHETIC_RUN = ["--config=configs/pretrain.py:size=tiny,data=synthetic", *COMMON, "--config.checkpoint.every_steps=2"]


def _tfrecord_run(records):
    """Dropout on, dynamic masking over unmasked TFRecords (60 records: an epoch is 7 batches, re-shuffled every
    epoch): resuming exactly needs the parameters, optimizer state, RNG and the tf.data iterator state all restored."""
    return ["--config=configs/pretrain.py:size=tiny,data=tfrecord", *COMMON, f"--config.data.input_files={records}",
            "--config.data.masking=dynamic", "--config.data.shuffle_buffer=50", "--config.checkpoint.every_steps=3"]


# For the uninterrupted references: a checkpoint must not change the run, and saving only at the end is quicker.
NO_PERIODIC_SAVES = ["--config.checkpoint.every_steps=0"]
LOSSES = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "grad_norm", "learning_rate")


def _env(devices):
    """This process's environment and XLA flags (conftest's: the driver's CPU options), with `devices` devices, and
    the allocator settings a CPU driver re-executes itself to get, set already: one interpreter start per driver."""
    flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
             if not flag.startswith("--xla_force_host_platform_device_count")]
    return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
                GLIBC_TUNABLES=os.environ.get("GLIBC_TUNABLES", runtime.CPU_GLIBC_TUNABLES),
                XLA_FLAGS=" ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]))


# The drivers a test started, killed when it ends (a failed assertion leaves an endless run going otherwise).
_STARTED = []
# And when the worker that started them dies (killed at its time limit): setpriv (util-linux) has the kernel
# SIGKILL a driver whose parent is gone (the setting outlives exec).
_DIE_WITH_PARENT = ("setpriv", "--pdeathsig", "KILL") if shutil.which("setpriv") else ()


@pytest.fixture(autouse=True)
def kill_leftover_drivers():
    yield
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait()


def _start(workdir, args, log_path, devices=8, extra=()):
    with open(log_path, "a") as log:
        process = subprocess.Popen([*_DIE_WITH_PARENT, sys.executable, "-m", "bert_jax.main", f"--workdir={workdir}",
                                    *args, *extra], cwd=helpers.ROOT, env=_env(devices), stdout=log,
                                   stderr=subprocess.STDOUT)
    _STARTED.append(process)
    return process


def _start_pair(workdir, args, log_path):
    port = _free_port()
    # The suite's compilation cache reaches them too: the driver does not use it for several CPU processes
    # (sharding._without_a_cpu_compilation_cache).
    return [_start(workdir, args, log_path, devices=4, extra=(f"--coordinator_address=localhost:{port}",
                                                              "--num_processes=2", f"--process_id={index}"))
            for index in range(2)]


def _read(path):
    with open(path) as file:
        return file.read()


def _wait(processes, log_path, timeout=300):
    for process in processes:
        assert process.wait(timeout=timeout) == 0, _read(log_path)[-4000:]


def _in_process_config(args, recipe=pretrain):
    """The config the driver builds from `args` (--config=FILE:ARG and --config.SECTION.FIELD=VALUE flags) with
    `recipe` (the module FILE names)."""
    [arg] = [flag.split(":", 1)[1] for flag in args if flag.startswith("--config=")]
    config = recipe.get_config(arg)
    for flag in args:
        if flag.startswith("--config."):
            name, value = flag[len("--config."):].split("=", 1)
            section, field = name.split(".")
            config[section][field] = type(config[section][field])(value)
    return config


def _metrics(workdir):
    """step -> logged values; read while a run writes (a last line not yet whole is skipped)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return {}
    with open(path) as file:
        lines = [json.loads(line) for line in file if line.endswith("\n")]
    return {line["step"]: line for line in lines}


def _wait_for_step(process, workdir, step, log_path, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _metrics(workdir) and max(_metrics(workdir)) >= step:
            return
        assert process.poll() is None, f"the run ended before step {step}:\n" + _read(log_path)[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def _checkpoint_steps(workdir):
    return sorted(int(name) for name in os.listdir(os.path.join(workdir, "checkpoints")) if name.isdigit())


def _free_port():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _sigterm_twice(process):
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # a second, impatient signal must not corrupt the save


@pytest.mark.slow
def test_kill_9_then_sigterm_then_resume_gives_the_uninterrupted_losses_bit_for_bit(tmp_path, caplog):
    """One run interrupted twice: SIGKILL (no handler runs; an asynchronous save may be half-written), then, in the
    driver that resumed from it, SIGTERM (sent twice), which saves the current step and exits 0; a third run (in
    this process: resuming needs no process boundary) finishes. Every step's losses equal the uninterrupted run's
    bit for bit."""
    run = _tfrecord_run(helpers.write_pretraining_records(tmp_path / "train.tfrecord", num_records=60, seed=0,
                                                          masked=False))
    workdir = tmp_path / "run"
    logs = [tmp_path / f"run{index}.log" for index in range(2)]

    process = _start(workdir, [*run, *ENDLESS], logs[0])
    _wait_for_step(process, workdir, 7, logs[0])
    process.kill()
    process.wait()
    killed_at = max(_metrics(workdir))
    # The saves that were complete when the process died (a step's directory appears only once its save is
    # finalised). On a loaded host the step-6 save can still be in flight at step 7; then the run must resume
    # from step 3, not from the half-written 6.
    complete = _checkpoint_steps(workdir)
    assert complete and complete[-1] >= 3, complete

    process = _start(workdir, [*run, *ENDLESS], logs[1])
    _wait_for_step(process, workdir, killed_at + 2, logs[1])  # past the step it was killed at
    _sigterm_twice(process)
    assert process.wait(timeout=120) == 0, _read(logs[1])[-3000:]
    log = _read(logs[1])
    assert f"resumed from {workdir}/checkpoints/{complete[-1]} at step {complete[-1]} " in log
    saved = max(_metrics(workdir))
    assert saved >= killed_at + 2
    assert f"SIGTERM received: saved a checkpoint at step {saved} " in log
    assert saved in _checkpoint_steps(workdir)

    end = saved + 3
    with caplog.at_level(logging.INFO, logger="absl"):  # absl sets its own level from --verbosity
        helpers.run_pretraining(_in_process_config([*run, f"--config.train.num_steps={end}"]), str(workdir))
    assert f"resumed from {workdir}/checkpoints/{saved} at step {saved} " in caplog.text
    assert "Metadata file does not exist" not in caplog.text

    reference = [*run, f"--config.train.num_steps={end}", *NO_PERIODIC_SAVES]
    helpers.run_pretraining(_in_process_config(reference), str(tmp_path / "reference"))
    # Each step once in metrics.jsonl, though the killed run logged steps past its last checkpoint: the resumed
    # runs dropped those records and logged the steps again.
    records = test_metrics.jsonl_records(workdir / "metrics.jsonl")
    assert [record["step"] for record in records] == list(range(1, end + 1))
    expected, got = _metrics(tmp_path / "reference"), _metrics(workdir)
    assert sorted(expected) == list(range(1, end + 1))
    for step in range(1, end + 1):
        for name in LOSSES:
            assert got[step][name] == expected[step][name], (step, name)
    # The same in the TensorBoard event files (one per run that wrote to the workdir), read back as written.
    scalars = test_metrics.tensorboard_scalars(str(workdir / "tensorboard"))
    for name in LOSSES:
        assert scalars[name] == [(step, float(np.float32(got[step][name]))) for step in range(1, end + 1)], name


@pytest.mark.slow
def test_two_processes_train_like_one_stop_together_on_sigterm_stop_when_one_dies_and_resume(tmp_path, caplog):
    """Two processes x 4 CPU devices, jax.distributed over localhost, form one (2, 2, 2) mesh.

    - SIGTERM to one of them (the pod-slice preemption path: JAX's preemption service tells every process) stops
      both at the same step, each saving it (its own input position), and both exit 0;
    - the pair resumes from that step; then kill -9 of one of them: the other, waiting in a collective, stops within
      --heartbeat_timeout_s (10 s here; 30 by default) with JAX's message that another task died, instead of
      hanging;
    - restarted, the pair resumes from the last complete checkpoint and runs to the end;
    - its losses equal one process with 8 devices (dropout on; every row on the same device as in the single
      process). Cross-process reductions (gloo) may add in another order than in-process ones, which was seen to
      move a loss by one float32 ulp, so equality is to 1e-6 relative;
    - one process takes over the pair's workdir: parameters and optimizer resume; the per-process input positions
      cannot, so the input goes on as a new stream, with a warning.
    One scenario, so that the pair's drivers start three times rather than four (each start imports TensorFlow,
    JAX and Orbax and compiles: two processes cannot use the run's compilation cache).
    """
    pair = tmp_path / "pair"
    logs = [tmp_path / f"pair{index}.log" for index in range(3)]
    heartbeat = ["--heartbeat_timeout_s=10"]
    processes = _start_pair(pair, [*SYNTHETIC_RUN, *ENDLESS, *heartbeat], logs[0])
    _wait_for_step(processes[0], pair, 3, logs[0])
    processes[1].send_signal(signal.SIGTERM)
    _wait(processes, logs[0], timeout=120)
    log = _read(logs[0])
    assert "over 8 devices (cpu), 2 processes" in log
    *periodic, saved = _checkpoint_steps(pair)
    assert saved == max(_metrics(pair)) >= 3
    assert periodic and all(step % 2 == 0 for step in periodic), periodic  # every_steps=2 saves, by both
    assert log.count(f"SIGTERM received: saved a checkpoint at step {saved} ") == 2
    for step in (periodic[-1], saved):
        assert sorted(os.listdir(pair / "checkpoints" / str(step) / "data")) == [
            "commit_success.txt", "process_0-of-2.json", "process_1-of-2.json"]

    processes = _start_pair(pair, [*SYNTHETIC_RUN, *ENDLESS, *heartbeat], logs[1])
    _wait_for_step(processes[0], pair, saved + 3, logs[1])
    processes[1].kill()
    killed = time.time()
    code = processes[0].wait(timeout=120)
    waited = time.time() - killed
    assert code != 0 and waited < 40, (code, waited)  # 10.5 s when measured alone; the margin is for a busy machine
    log = _read(logs[1])
    assert f"resumed from {pair}/checkpoints/{saved} at step {saved} " in log
    assert "another task died" in log
    # The resumed pair's newest complete save (every_steps=2); on a loaded host the one in flight when it died may
    # not be, and then the restart must resume from `saved`, not from the half-written one.
    last = _checkpoint_steps(pair)[-1]
    assert last >= saved

    end = last + 2
    _wait(_start_pair(pair, [*SYNTHETIC_RUN, f"--config.train.num_steps={end}", *heartbeat], logs[2]), logs[2])
    assert f"resumed from {pair}/checkpoints/{last} at step {last} " in _read(logs[2])
    assert _checkpoint_steps(pair)[-1] == end

    helpers.run_pretraining(_in_process_config([*SYNTHETIC_RUN, f"--config.train.num_steps={end}", *NO_PERIODIC_SAVES]),
                     str(tmp_path / "single"))
    expected, got = _metrics(tmp_path / "single"), _metrics(pair)
    assert sorted(got) == sorted(expected) == list(range(1, end + 1))
    for step in range(1, end + 1):
        for name in ("loss", "mlm_loss", "nsp_loss", "grad_norm"):
            assert got[step][name] == pytest.approx(expected[step][name], rel=1e-6, abs=0), (step, name)

    with caplog.at_level(logging.INFO, logger="absl"):  # absl sets its own level from --verbosity
        helpers.run_pretraining(_in_process_config([*SYNTHETIC_RUN, f"--config.train.num_steps={end + 1}"]), str(pair))
    assert "written by a different number of processes" in caplog.text
    assert f"resumed from {pair}/checkpoints/{end} at step {end} " in caplog.text
    assert max(_metrics(pair)) == end + 1
