"""What a run reports: after a resume, metrics.jsonl and the TensorBoard events hold each step once."""

import glob
import json
import os
import subprocess
import sys

import jax
import numpy as np

from bert_jax import metrics as metrics_lib
from tests import helpers


def jsonl_records(path):
    """Every line of a metrics.jsonl, in file order (a step written twice shows twice)."""
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file]


def tensorboard_scalars(directory):
    """tag -> [(step, value), ...] of every scalar event in `directory`'s event files, in the order written.

    Read with tf.compat.v1.train.summary_iterator, which applies no purge: a step written twice shows twice."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    files = [list(tf.compat.v1.train.summary_iterator(path))
             for path in glob.glob(os.path.join(directory, "*tfevents*"))]
    scalars = {}
    # Oldest file first, by the time of its first summary (the file_version event's is in whole seconds): names
    # sort badly when two writers of one process share a second (...vm.123.9.v2 after ...vm.123.10.v2).
    for events in sorted(files, key=lambda events: min([event.wall_time for event in events if event.summary.value]
                                                       or [0.0])):
        for event in events:
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return scalars


def _write(workdir, steps, offset, resume_step=None):
    writer = metrics_lib.MetricWriter(str(workdir), resume_step=resume_step)
    for step in steps:
        writer.write(step, {"loss": step + offset, "mlm_loss": 2 * step + offset})
    writer.close()


def test_a_resumed_run_leaves_one_record_per_step(tmp_path):
    """Steps 1-5 logged, then a kill: the last jsonl line and the last event cut short. The run resumes from its
    step-3 checkpoint and logs 4-6 again: each sink holds steps 1-3 of the first run and 4-6 of the second, once."""
    _write(tmp_path, range(1, 6), offset=0.0)
    with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as file:
        file.write('{"step": 6, "loss"')  # a line the kill cut short
    [events] = glob.glob(str(tmp_path / "tensorboard" / "*tfevents*"))
    with open(events, "r+b") as file:
        file.truncate(os.path.getsize(events) - 5)
    # What a rewrite killed before its rename leaves behind.
    (tmp_path / "metrics.jsonl.rewrite-tmp").write_text('{"step": 99}\n')
    (tmp_path / "tensorboard" / "events.out.rewriting.1.host.rewrite-tmp").write_bytes(b"partial")

    _write(tmp_path, range(4, 7), offset=0.5, resume_step=3)

    expected = [1.0, 2.0, 3.0, 4.5, 5.5, 6.5]
    records = jsonl_records(tmp_path / "metrics.jsonl")
    assert [record["step"] for record in records] == [1, 2, 3, 4, 5, 6]
    assert [record["loss"] for record in records] == expected
    scalars = tensorboard_scalars(str(tmp_path / "tensorboard"))
    assert sorted(scalars) == ["loss", "mlm_loss"]
    assert scalars["loss"] == list(zip(range(1, 7), expected))
    assert scalars["mlm_loss"] == [(1, 2.0), (2, 4.0), (3, 6.0), (4, 8.5), (5, 10.5), (6, 12.5)]
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "tensorboard"]
    assert len(os.listdir(tmp_path / "tensorboard")) == 2  # each run's event file, nothing else

    # TensorBoard itself reads the same: one point per step.
    from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=import-outside-toplevel
    from tensorboard.util import tensor_util  # pylint: disable=import-outside-toplevel
    accumulator = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    points = sorted(accumulator.Tensors("loss"), key=lambda point: point.step)  # files in name order: see above
    assert [point.step for point in points] == [1, 2, 3, 4, 5, 6]
    assert [float(tensor_util.make_ndarray(point.tensor_proto)) for point in points] == expected


def test_resuming_from_scratch_drops_everything_and_a_run_with_nothing_to_drop_is_left_alone(tmp_path):
    _write(tmp_path, range(1, 4), offset=0.0)
    before = (tmp_path / "metrics.jsonl").stat().st_mtime_ns
    assert metrics_lib.drop_jsonl_records_after(str(tmp_path / "metrics.jsonl"), 3) == 0
    assert metrics_lib.drop_events_after(str(tmp_path / "tensorboard"), 3) == 0
    assert (tmp_path / "metrics.jsonl").stat().st_mtime_ns == before  # not rewritten
    # An event cut short by a kill (step 3's mlm_loss, the last one written) goes, and the file reads to its end.
    [events] = glob.glob(str(tmp_path / "tensorboard" / "*tfevents*"))
    with open(events, "r+b") as file:
        file.truncate(os.path.getsize(events) - 3)
    assert metrics_lib.drop_events_after(str(tmp_path / "tensorboard"), 3) == 0
    scalars = tensorboard_scalars(str(tmp_path / "tensorboard"))
    assert scalars == {"loss": [(1, 1.0), (2, 2.0), (3, 3.0)], "mlm_loss": [(1, 2.0), (2, 4.0)]}

    # A run killed before its first checkpoint starts again from step 0: none of its records stay.
    _write(tmp_path, [1], offset=0.25, resume_step=0)
    assert jsonl_records(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": 1.25, "mlm_loss": 2.25}]
    assert tensorboard_scalars(str(tmp_path / "tensorboard"))["loss"] == [(1, 1.25)]


def test_only_process_0_writes_or_drops(tmp_path, monkeypatch):
    _write(tmp_path, range(1, 4), offset=0.0)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    _write(tmp_path, range(2, 5), offset=0.5, resume_step=1)
    assert [record["step"] for record in jsonl_records(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert [step for step, _ in tensorboard_scalars(str(tmp_path / "tensorboard"))["loss"]] == [1, 2, 3]


def test_log_line_shows_a_small_learning_rate_and_the_record_count():
    scalars = {"loss": 7.5, "mlm_loss": 6.8, "nsp_loss": 0.7, "mlm_accuracy": 0.1, "nsp_accuracy": 0.5,
               "grad_norm": 1.25, "learning_rate": 2e-5, "eval_mlm_loss": 6.5, "eval_records": 1517.0}
    line = metrics_lib.log_line(10, 20, scalars, steps_per_second=0.0)
    assert line == ("step 10/20 | loss 7.5000 mlm 6.8000 nsp 0.7000 | mlm_acc 0.1000 nsp_acc 0.5000 | grad_norm 1.250 "
                    "lr 2e-05 | eval_mlm_loss 6.5000 | eval_records 1517")


def test_tensorboard_events_are_the_ones_tensorflow_writes_and_need_no_tensorflow(tmp_path):
    """The event file MetricWriter writes holds, event for event, what TensorFlow's tf.summary.scalar writes for the
    same scalars (the writer's name and the times aside), and writing it imports no TensorFlow."""
    script = ("import sys; from bert_jax import metrics; writer = metrics.MetricWriter(sys.argv[1]); "
              "writer.write(1, {'loss': 6.8343, 'learning_rate': 0.0}); writer.write(2, {'loss': 6.5, "
              "'learning_rate': 5e-05}); writer.close(); assert 'tensorflow' not in sys.modules, 'TF imported'")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ours")], cwd=helpers.ROOT, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]

    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    theirs = tf.summary.create_file_writer(str(tmp_path / "theirs"))
    with theirs.as_default():
        for step, scalars in ((1, {"loss": 6.8343, "learning_rate": 0.0}), (2, {"loss": 6.5, "learning_rate": 5e-05})):
            for name, value in scalars.items():
                tf.summary.scalar(name, value, step=step)
    theirs.close()

    def events(directory):
        [path] = glob.glob(os.path.join(directory, "*tfevents*"))
        read = list(tf.compat.v1.train.summary_iterator(path))
        for event in read:
            event.wall_time = 0
            event.ClearField("source_metadata")  # the writer's name
        return read

    ours, expected = events(tmp_path / "ours" / "tensorboard"), events(tmp_path / "theirs")
    assert len(ours) == len(expected) == 5
    assert ours == expected, (ours, expected)
    assert tensorboard_scalars(str(tmp_path / "ours" / "tensorboard")) == {
        "loss": [(1, float(np.float32(6.8343))), (2, 6.5)], "learning_rate": [(1, 0.0), (2, float(np.float32(5e-05)))]}
