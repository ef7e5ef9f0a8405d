"""Fine-tuning keeps pretraining's checkpoint guarantees (bert_jax.loop): killed with SIGKILL, then preempted with
SIGTERM, the same command resumes, and the run ends with the uninterrupted run's losses, held-out scores and
parameters bit for bit (dropout on). Token classification and question answering, on the shipped fixtures.

The interrupted runs are driver subprocesses (the process boundary is what is tested); the run that finishes and
the uninterrupted reference run in this process through the function the driver calls, with the same config.
"""

import json
import logging
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import finetune
from configs import finetune as finetune_recipe
from tests import helpers
from tests import test_finetune
from tests import test_question_answering
from tests import test_resume
from tests.test_resume import kill_leftover_drivers  # noqa: F401  (autouse: the drivers started are killed)

FIXTURES = f"{helpers.ROOT}/tests/fixtures"
# One encoder layer: what resuming needs restored is all there, and a second layer would add only compile and step
# time. A schedule that does not depend on train.num_steps (optim.schedule_steps), so that the interrupted runs can
# be started with no end in sight and finished, like the reference, at a step chosen afterwards, all compiling the
# same step (served by the run's compilation cache after the first).
COMMON = ["--config.train.batch_size=16", "--config.train.log_every=1", "--config.optim.warmup_steps=2",
          "--config.optim.schedule_steps=100", "--config.checkpoint.every_steps=3", "--config.model.num_layers=1"]
TASKS = {
    "tokens": ["--config=configs/finetune.py:task=tokens", f"--config.data.train_file={FIXTURES}/tagging_task/train.txt",
               f"--config.data.eval_file={FIXTURES}/tagging_task/dev.txt", "--config.data.max_seq_length=32"],
    "qa": ["--config=configs/finetune.py:task=qa", f"--config.data.train_file={FIXTURES}/qa_task/train.json",
           f"--config.data.eval_file={FIXTURES}/qa_task/dev.json", "--config.data.max_seq_length=64",
           "--config.data.max_query_length=16"],
}
TRAIN_METRICS = ("loss", "accuracy", "grad_norm", "learning_rate")


def _texts(task):
    """The shipped task's texts (the fixture files are their generators' output, as tests hold)."""
    if task == "tokens":
        return [" ".join(words) for count, seed in ((320, 0), (160, 1))
                for words, _ in test_finetune.tagging_sentences(count, seed)]
    return test_question_answering._qa_texts()  # pylint: disable=protected-access


def _vocabulary(task, directory):
    """The uncased vocabulary's pieces of the task (the same tokens; test_finetune.vocab_of_pieces): 128 embedding
    rows instead of 30522, so that a step and a checkpoint (47 MB with Adam's moments at 30522) cost little."""
    path, rows = test_finetune.vocab_of_pieces(_texts(task), str(directory))
    return [f"--config.data.vocab_file={path}", f"--config.model.vocab_size={rows}"]


def _in_process_config(args):
    return test_resume._in_process_config(args, finetune_recipe)  # pylint: disable=protected-access


def _params(workdir):
    saved = ocp.StandardCheckpointer().restore(os.path.join(workdir, finetune.FINETUNED_SUBDIR,
                                                            checkpoint_lib.STATE_ITEM))
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(saved)}


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(TASKS))
def test_killed_then_preempted_finetuning_resumes_to_the_uninterrupted_result_bit_for_bit(task, tmp_path, caplog):
    run = [*TASKS[task], *COMMON, *_vocabulary(task, tmp_path / "vocab")]
    workdir = tmp_path / "run"
    logs = [tmp_path / f"run{index}.log" for index in range(2)]

    # kill -9 mid-run: the next run resumes from the last checkpoint complete when it died.
    process = test_resume._start(workdir, ["--mode=finetune", *run, *test_resume.ENDLESS], logs[0])
    test_resume._wait_for_step(process, workdir, 7, logs[0])
    process.kill()
    process.wait()
    killed_at = max(test_resume._metrics(workdir))
    complete = test_resume._checkpoint_steps(workdir)
    assert complete and complete[-1] >= 3, complete

    # SIGTERM after a periodic checkpoint: it saves the current step and exits 0, writing no finetuned directory.
    process = test_resume._start(workdir, ["--mode=finetune", *run, *test_resume.ENDLESS], logs[1])
    test_resume._wait_for_step(process, workdir, killed_at + 2, logs[1])
    test_resume._sigterm_twice(process)
    assert process.wait(timeout=120) == 0, test_resume._read(logs[1])[-3000:]
    log = test_resume._read(logs[1])
    assert f"resumed from {workdir}/checkpoints/{complete[-1]} at step {complete[-1]} " in log
    saved = max(test_resume._metrics(workdir))
    assert f"SIGTERM received: saved a checkpoint at step {saved} " in log
    assert saved in test_resume._checkpoint_steps(workdir)
    assert not (workdir / finetune.FINETUNED_SUBDIR).exists()

    # The same command, to an end: resumed from the saved step, scored on the held-out set.
    end = saved + 3
    with caplog.at_level(logging.INFO, logger="absl"):
        final = helpers.run_finetune(_in_process_config([*run, f"--config.train.num_steps={end}"]), str(workdir))
    assert f"resumed from {workdir}/checkpoints/{saved} at step {saved} " in caplog.text
    reference = helpers.run_finetune(_in_process_config([*run, f"--config.train.num_steps={end}",
                                                         "--config.checkpoint.every_steps=0"]),
                                     str(tmp_path / "reference"))
    assert final["step"] == reference["step"] == end
    scores = [name for name in reference if name.startswith("eval_")]
    assert len(scores) >= 3, reference  # loss, accuracy and the task's own (entity F1, or exact match and F1)
    assert {name: final[name] for name in scores} == {name: reference[name] for name in scores}
    expected, got = test_resume._metrics(tmp_path / "reference"), test_resume._metrics(workdir)
    assert sorted(got) == sorted(expected) == list(range(1, end + 1))
    for step in range(1, end + 1):
        for name in TRAIN_METRICS:
            assert got[step][name] == expected[step][name], (step, name)
    ours, theirs = _params(workdir), _params(tmp_path / "reference")
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)
    predictions = "eval_predictions.txt" if task == "tokens" else "predictions.json"
    assert (workdir / predictions).read_bytes() == (tmp_path / "reference" / predictions).read_bytes()
    assert json.loads((workdir / finetune.FINETUNED_SUBDIR / finetune.TASK_FILE).read_text())["task"] == task
