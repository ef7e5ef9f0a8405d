"""Killing, preempting and resuming the driver in subprocesses; two processes as one 8-device mesh."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests import helpers

# Dropout on, dynamic masking over the fixture TFRecords (re-shuffled every epoch): resuming exactly needs the
# parameters, optimizer state, RNG and the tf.data iterator state all restored.
TFRECORD_RUN = [
    "--config=configs/pretrain.py:size=tiny,data=tfrecord",
    f"--config.data.input_files={helpers.FIXTURES}/sample_seq128.tfrecord",
    "--config.data.masking=dynamic", "--config.data.shuffle_buffer=50",
    "--config.train.batch_size=8", "--config.train.log_every=1",
    "--config.model.max_position_embeddings=128", "--config.mesh.fsdp=2", "--config.mesh.tensor=2",
]


def _env(devices=8):
    return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")


def _start(workdir, args, devices=8, extra=()):
    log = open(os.path.join(str(workdir) + ".log"), "a")
    return subprocess.Popen([sys.executable, "-m", "bert_jax.main", f"--workdir={workdir}", *args, *extra],
                            cwd=helpers.ROOT, env=_env(devices), stdout=log, stderr=subprocess.STDOUT)


def _log(workdir):
    with open(str(workdir) + ".log") as file:
        return file.read()


def _run(workdir, args, devices=8):
    process = _start(workdir, args, devices)
    assert process.wait(timeout=300) == 0, _log(workdir)[-3000:]


def _metrics(workdir):
    """step -> logged values, the last line of each step winning (a killed run's steps are logged again)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return {}
    with open(path) as file:
        lines = [json.loads(line) for line in file if line.endswith("\n")]
    return {line["step"]: line for line in lines}


def _wait_for_step(process, workdir, step, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _metrics(workdir) and max(_metrics(workdir)) >= step:
            return
        assert process.poll() is None, f"the run ended before step {step}:\n" + _log(workdir)[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def _checkpoint_steps(workdir):
    return sorted(int(name) for name in os.listdir(os.path.join(workdir, "checkpoints")) if name.isdigit())


@pytest.mark.slow
def test_kill_9_then_resume_gives_the_uninterrupted_losses_bit_for_bit(tmp_path):
    args = [*TFRECORD_RUN, "--config.train.num_steps=40", "--config.checkpoint.every_steps=7"]
    reference = tmp_path / "reference"
    _run(reference, args)
    expected = _metrics(reference)

    workdir = tmp_path / "killed"
    process = _start(workdir, args)
    _wait_for_step(process, workdir, 17)
    process.kill()  # SIGKILL: no handler runs, an asynchronous save may be half-written
    process.wait()
    killed_at = max(_metrics(workdir))
    assert killed_at < 40, "the run finished before it was killed"
    # The saves that were complete when the process died (a step's directory appears only once its save is
    # finalised). On a loaded host the step-14 save can still be in flight at step 17; then the run must resume
    # from step 7, not from the half-written 14.
    complete = _checkpoint_steps(workdir)
    assert complete and complete[-1] >= 7, complete
    _run(workdir, args)
    log = _log(workdir)
    resumed_from = max(step for step in (7, 14, 21, 28, 35) if f"resumed from {workdir}/checkpoints/{step} " in log)
    assert resumed_from == complete[-1] <= killed_at
    got = _metrics(workdir)
    assert sorted(got) == sorted(expected) == list(range(1, 41))
    for step in range(1, 41):
        for name in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "grad_norm"):
            assert got[step][name] == expected[step][name], (step, name)


@pytest.mark.slow
def test_sigterm_saves_the_current_step_and_exits_0_even_when_repeated(tmp_path):
    workdir = tmp_path / "run"
    args = [*TFRECORD_RUN, "--config.train.num_steps=100000", "--config.checkpoint.every_steps=0"]
    process = _start(workdir, args)
    _wait_for_step(process, workdir, 5)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # a second, impatient signal must not corrupt the save
    assert process.wait(timeout=120) == 0, _log(workdir)[-3000:]
    log = _log(workdir)
    [saved] = _checkpoint_steps(workdir)  # every_steps=0: the only checkpoint is the one SIGTERM made
    assert saved == max(_metrics(workdir)) >= 5
    assert f"SIGTERM received: saved a checkpoint at step {saved}" in log

    # The saved step restores: a run to saved + 2 resumes from it and trains two more steps.
    _run(workdir, [*args[:-2], f"--config.train.num_steps={saved + 2}", "--config.checkpoint.every_steps=0"])
    assert f"resumed from {workdir}/checkpoints/{saved} at step {saved}" in _log(workdir)
    assert max(_metrics(workdir)) == saved + 2


def _free_port():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_checkpoint_and_resume_like_one(tmp_path):
    """Two processes x 4 CPU devices, jax.distributed over localhost, form one (2, 2, 2) mesh: the losses equal a
    single process with 8 devices (dropout on; every row on the same device as in the single process), and the
    pair checkpoints and resumes. Cross-process reductions (gloo) may add in another order than in-process ones,
    which was seen to move a loss by one float32 ulp, so equality is to 1e-6 relative."""
    common = ["--config=configs/pretrain.py:size=tiny,data=synthetic", "--config.train.batch_size=8",
              "--config.train.log_every=1", "--config.checkpoint.every_steps=3", "--config.mesh.fsdp=2",
              "--config.mesh.tensor=2", "--config.model.max_position_embeddings=128",
              # A schedule independent of num_steps, so that a 5-step run is the start of an 8-step one.
              "--config.optim.end_learning_rate=1e-3"]
    single = tmp_path / "single"
    _run(single, [*common, "--config.train.num_steps=8"])
    expected = _metrics(single)

    pair = tmp_path / "pair"

    def run_pair(num_steps):
        port = _free_port()
        processes = [_start(pair, [*common, f"--config.train.num_steps={num_steps}"], devices=4,
                            extra=(f"--coordinator_address=localhost:{port}", "--num_processes=2",
                                   f"--process_id={index}")) for index in range(2)]
        for process in processes:
            assert process.wait(timeout=300) == 0, _log(pair)[-4000:]

    run_pair(5)
    assert _checkpoint_steps(pair) == [3, 5]
    assert "over 8 devices (cpu), 2 processes" in _log(pair)
    data_files = sorted(os.listdir(pair / "checkpoints" / "5" / "data"))
    assert "process_0-of-2.json" in data_files and "process_1-of-2.json" in data_files
    run_pair(8)
    assert f"resumed from {pair}/checkpoints/5 at step 5" in _log(pair)
    got = _metrics(pair)
    assert sorted(got) == sorted(expected) == list(range(1, 9))
    for step in range(1, 9):
        for name in ("loss", "mlm_loss", "nsp_loss", "grad_norm"):
            assert got[step][name] == pytest.approx(expected[step][name], rel=1e-6, abs=0), (step, name)

    # One process takes over the pair's workdir: parameters and optimizer resume; the per-process input
    # positions cannot, so the input goes on as a new stream, with a warning.
    _run(pair, [*common, "--config.train.num_steps=9"])
    log = _log(pair)
    assert "written by a different number of processes" in log
    assert f"resumed from {pair}/checkpoints/8 at step 8" in log
    assert max(_metrics(pair)) == 9


@pytest.mark.slow
def test_sigterm_to_one_of_two_processes_stops_both_at_the_same_saved_step(tmp_path):
    """The pod-slice preemption path: JAX's preemption service tells every process, all save one step, exit 0."""
    workdir = tmp_path / "pair"
    port = _free_port()
    args = ["--config=configs/pretrain.py:size=tiny,data=synthetic", "--config.train.batch_size=8",
            "--config.train.log_every=1", "--config.checkpoint.every_steps=0", "--config.mesh.fsdp=2",
            "--config.mesh.tensor=2", "--config.model.max_position_embeddings=128",
            "--config.train.num_steps=100000"]
    processes = [_start(workdir, args, devices=4, extra=(f"--coordinator_address=localhost:{port}",
                                                         "--num_processes=2", f"--process_id={index}"))
                 for index in range(2)]
    _wait_for_step(processes[0], workdir, 3)
    processes[1].send_signal(signal.SIGTERM)
    for process in processes:
        assert process.wait(timeout=120) == 0, _log(workdir)[-4000:]
    [saved] = _checkpoint_steps(workdir)
    assert _log(workdir).count(f"SIGTERM received: saved a checkpoint at step {saved} ") == 2
    assert sorted(os.listdir(workdir / "checkpoints" / str(saved) / "data")) == [
        "commit_success.txt", "process_0-of-2.json", "process_1-of-2.json"]
