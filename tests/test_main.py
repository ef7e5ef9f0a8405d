"""The driver: end to end as a user runs it (one subprocess, the README's quick start), and its modes, flags and
errors through its main() in this process."""

import json
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import runtime
from tests import helpers
from tests._session import small_records, trained_run  # noqa: F401  (session fixtures)

PRETRAIN = f"{helpers.ROOT}/configs/pretrain.py"
# ml_collections' config_flags loads --config files with importlib's deprecated load_module(), here in this process.
pytestmark = pytest.mark.filterwarnings(r"ignore:the load_module\(\) method is deprecated:DeprecationWarning")

# Small enough to compile and run in seconds on 2 cores, sharded 2 x 2 x 2 over 8 fake CPU devices.
COMMON = ["--config.train.batch_size=8", "--config.mesh.fsdp=2", "--config.mesh.tensor=2",
          "--config.model.max_position_embeddings=128"]
# The driver tests of data sources and modes, with one encoder layer: depth is no part of what they show, and each
# layer adds to every compile (the README's own commands keep the preset's two).
SHALLOW = [*COMMON, "--config.model.num_layers=1"]
# The two runs on the original vocabulary (30522 words, 30592 rows: padded to a multiple of 128) share the model,
# optimizer and 128-token rows: they compile one train step, which the run's compilation cache serves the second.
ORIGINAL_VOCAB_STEP = [*SHALLOW, "--config.optim.learning_rate=1e-3", "--config.optim.warmup_steps=2",
                       "--config.optim.schedule_steps=8"]
# The session's trained run (tests/_session.py) trains helpers.tiny_config on a 2x2x2 mesh; a driver run given these
# fields of it compiles the same programs, which the run's compilation cache (tests/compile_cache.py) then serves.
TRAINED_RUN = helpers.tiny_config((2, 2, 2))
STEP_FIELDS = ("model.dropout_rate", "model.attention_dropout_rate", "optim.learning_rate", "optim.warmup_steps",
               "optim.schedule_steps", "train.batch_size", "mesh.data", "mesh.fsdp", "mesh.tensor")
SHAPE_FIELDS = ("model.vocab_size", "model.max_position_embeddings", "data.max_seq_length",
                "data.max_predictions_per_seq")


IDS_TO_1023 = "ids_to_1023.tfrecord"  # records of the bad-vocabulary case, written into its tmp_path


def _trained_run_flags(*fields):
    """--config.FIELD=VALUE of the trained run's value of each field."""
    return [f"--config.{field}={TRAINED_RUN[field.split('.')[0]][field.split('.')[1]]}" for field in fields]


def _run(args, tmp_path, program=(sys.executable, "-m", "bert_jax.main"), **env_overrides):
    # JAX_PLATFORMS unset, as a user runs it: the driver picks the CPU quietly where libtpu is installed (the test
    # extra installs it) but no TPU is attached. The suite's XLA flags (tests/conftest.py: 8 devices, and at -O0 the
    # emitters that compile the steps in about 60% of the time) and its compilation cache, as every test's process.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("JAX_PLATFORMS", None)
    env.update(env_overrides)
    return subprocess.run([*program, f"--workdir={tmp_path}", *args], cwd=helpers.ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _metrics(tmp_path):
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def driver_flags(monkeypatch):
    """Parses driver flags in this process (absl's global FLAGS), restoring them afterwards."""
    from absl import flags
    from absl.testing import flagsaver
    from bert_jax import main as driver

    def forget_overrides():  # config_flags defines a flag per --config.* override it is given
        for name in [name for name in flags.FLAGS if name.startswith("config.")]:
            delattr(flags.FLAGS, name)

    def parse(*args):
        monkeypatch.setattr(sys, "argv", ["bert_jax", *args])  # config_flags finds --config.* overrides there
        flags.FLAGS.unparse_flags()
        forget_overrides()
        flags.FLAGS(sys.argv)
        return driver

    with flagsaver.flagsaver():
        yield parse
    flags.FLAGS.unparse_flags()
    forget_overrides()


def _main(driver_flags, caplog, *args):
    """The driver's main() with these flags, in this process (no interpreter, JAX or TensorFlow start-up to pay
    for); returns the log text."""
    driver = driver_flags(*args)
    caplog.clear()
    caplog.set_level(logging.INFO, logger="absl")  # after parsing, which sets absl's level from --verbosity
    driver.main(["bert_jax"])
    return caplog.text


def test_driver_trains_on_original_tfrecords_and_evaluates(tmp_path, caplog, driver_flags):
    fixtures = helpers.FIXTURES
    log = _main(driver_flags, caplog, f"--workdir={tmp_path}", f"--config={PRETRAIN}:size=tiny,data=tfrecord",
                "--config.train.num_steps=4", "--config.train.log_every=2", "--config.train.eval_every=4",
                "--config.train.eval_steps=3", "--config.model.vocab_size=30592",
                f"--config.data.input_files={fixtures}/sample_seq128.tfrecord",
                f"--config.data.eval_input_files={fixtures}/sample_seq128_wwm.tfrecord", *ORIGINAL_VOCAB_STEP)
    assert "step 4/4" in log
    assert "mesh {'dcn_data': 1, 'data': 2, 'fsdp': 2, 'tensor': 2} over 8 devices" in log
    metrics = _metrics(tmp_path)
    assert [m["step"] for m in metrics] == [2, 4]
    assert all(m["tokens_per_second"] > 0 for m in metrics)
    # The mean of steps 3-4 below that of steps 1-2, the warmup's (measured 11.05 -> 10.86).
    assert metrics[1]["loss"] < metrics[0]["loss"], metrics
    assert "eval_mlm_loss" in metrics[1] and "eval_mlm_loss" not in metrics[0]


@pytest.mark.parametrize("args, error, message", [
    ([*SHALLOW, "--config.data.input_files=/nonexistent/train-*.tfrecord"], FileNotFoundError,
     "no files match '/nonexistent/train-*.tfrecord'; fix --config.data.input_files"),
    # Ids up to 1023 for the trained run's model of TINY_VOCAB rows: the run's compilation cache serves its
    # initialisation.
    ([*_trained_run_flags(*SHAPE_FIELDS, *STEP_FIELDS), f"--config.data.input_files={{tmp_path}}/{IDS_TO_1023}"],
     ValueError, f"but the model's vocab_size is {helpers.TINY_VOCAB}"),
    ([*SHALLOW, f"--config.data.input_files={helpers.FIXTURES}/sample_seq128.tfrecord",
      "--config.data.max_seq_length=64"],
     ValueError, "has length 128 but the config expects 64; set --config.data.max_seq_length=128"),
])
def test_driver_bad_input_fails_with_a_clear_message(tmp_path, caplog, driver_flags, args, error, message):
    args = [arg.format(tmp_path=tmp_path) for arg in args]
    if any(arg.endswith(IDS_TO_1023) for arg in args):  # the vocab_size case's records: ids drawn below 1024
        helpers.write_pretraining_records(tmp_path / IDS_TO_1023, num_records=16, seed=0, vocab_size=1024)
    with pytest.raises(error) as raised:
        _main(driver_flags, caplog, f"--workdir={tmp_path}", f"--config={PRETRAIN}:size=tiny,data=tfrecord",
              "--config.train.num_steps=2", *args)
    assert message in str(raised.value)


def test_console_script_refuses_a_misspelt_field_with_one_message(tmp_path):
    program = shutil.which("bert-jax")
    if program is None:
        pytest.skip("bert-jax console script not installed (pip install -e .)")
    result = _run(["--config=configs/pretrain.py", "--config.optim.learning_rat=1e-4"], tmp_path, (program,))
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()  # no traceback, no flag help
    assert line.startswith("bert_jax: error: ") and "learning_rat" in line


@pytest.mark.slow
def test_a_failed_save_stops_the_run_with_one_message_and_the_last_checkpoint_resumes(tmp_path, caplog,
                                                                                       driver_flags, trained_run):
    """A full disk, made by a file-size limit on the driver process (`ulimit -f`: a write past it fails with EFBIG
    as one would with ENOSPC, and no mount is needed): resuming the trained run's step-4 checkpoint, the step-5 save
    fails, the run stops with one message naming the checkpoint, the cause and the intact one, no traceback, and the
    next run resumes from step 4. The write is asynchronous: the loop learns of the failure when it happens, some
    steps after step 5."""
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(os.path.join(trained_run["workdir"], "checkpoints"), checkpoints)  # a copy: the run is shared
    # The trained run's model and step (schedule_steps=100 spans both runs below): they compile no program of their
    # own, the run's cache serves them.
    args = [f"--workdir={tmp_path}", f"--config={PRETRAIN}:size=tiny,data=synthetic",
            *_trained_run_flags(*SHAPE_FIELDS, *STEP_FIELDS), "--config.checkpoint.every_steps=5",
            "--config.train.log_every=5"]
    assert sorted(os.listdir(checkpoints)) == ["4"]
    # 256 KiB: the metrics files stay under it; a checkpoint's array data (6.5 MB) does not.
    full_disk = ("bash", "-c", 'ulimit -f 256 && exec "$0" "$@"', sys.executable, "-m", "bert_jax.main")
    # The platform and allocator set as the driver would set them itself: no TPU probe (a JAX import) and no
    # re-execution, which the README's quick start shows; here the process is for its file-size limit.
    result = _run(args[1:] + ["--config.train.num_steps=40"], tmp_path, full_disk, JAX_PLATFORMS="cpu",
                  GLIBC_TUNABLES=runtime.CPU_GLIBC_TUNABLES)
    assert result.returncode == 1, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("bert_jax: error: ")]
    assert line.startswith(f"bert_jax: error: saving checkpoint step 5 to {checkpoints / '5'} failed (")
    assert "File too large" in line
    assert line.endswith("the last complete checkpoint, step 4, is intact: fix the cause and rerun to resume "
                         "from it")
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(result.stderr.splitlines()) < 200  # the config dump and a few lines: no flood
    # Stopped once the background write failed: at the latest, before the next save would start (step 10).
    assert "step 15/40" not in result.stderr and "saving step 10 " not in result.stderr
    assert "5" not in os.listdir(checkpoints)  # no partial checkpoint looks whole
    log = _main(driver_flags, caplog, *args, "--config.train.num_steps=6")
    assert f"resumed from {checkpoints / '4'} at step 4" in log
    assert sorted(os.listdir(checkpoints)) == ["4", "5", "6"]  # every 5 steps, and the last


@pytest.mark.parametrize("args, message", [
    (["--config.train.batch_size=6"], "--config.train.batch_size=6 must be a positive multiple of the 8 "
     "data-parallel devices"),
    (["--config.init=/nonexistent/checkpoint"], "/nonexistent/checkpoint does not exist"),
    (["--workdir={tmp_path}/a_file"], "--workdir={tmp_path}/a_file is a file; pass a directory"),
    (["--workdir={tmp_path}/a_file/run"], "--workdir={tmp_path}/a_file/run: cannot create the directory"),
    (["--config.optim.learning_rate=one"], "learning_rate"),
    (["stray"], "unexpected arguments ['stray']"),
])
def test_a_user_error_is_one_message_and_exit_1(tmp_path, capsys, monkeypatch, driver_flags, args, message):
    """What the driver prints for a user error: one line naming the flag or field and the fix, no traceback or
    flag help (run() parses the flags and calls main() this way)."""
    from bert_jax import main as driver
    (tmp_path / "a_file").write_text("not a directory")
    argv = ["bert_jax", f"--workdir={tmp_path}/run", f"--config={PRETRAIN}:size=tiny,data=synthetic",
            *[arg.format(tmp_path=tmp_path) for arg in args]]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags finds --config.* overrides there
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        driver._main_reporting_user_errors(driver._parse_flags(argv))  # pylint: disable=protected-access
    assert exited.value.code == 1
    stderr = capsys.readouterr().err
    [line] = [line for line in stderr.splitlines() if line.startswith("bert_jax: error: ")]
    assert message.format(tmp_path=tmp_path) in line and "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_default_run_makes_data_from_the_demo_corpus_then_reuses_it(tmp_path, caplog, driver_flags):
    """The README's quick start as a user runs it (one `python -m bert_jax.main` process), then the other modes
    and a second run in the same workdir (in this process: the process boundary is not what they show)."""
    args = ["--config.train.num_steps=4", "--config.train.log_every=2", "--config.train.eval_every=4",
            "--config.train.eval_steps=1", *COMMON]
    result = _run(["--config=configs/pretrain.py", *args], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not [line for line in result.stderr.splitlines() if "tpu" in line.lower()]  # no TPU start-up errors
    assert "over 8 devices" in result.stderr and "cpu" in result.stderr.lower()
    if "GLIBC_TUNABLES" not in os.environ:  # a CPU run re-executes itself once with the driver's allocator settings
        assert f"glibc allocator: GLIBC_TUNABLES={runtime.CPU_GLIBC_TUNABLES}" in result.stderr
    ready = json.loads((tmp_path / "data" / "READY.json").read_text())
    assert ready["special_ids"] == [0, 2, 3, 4]  # a trained vocab puts [PAD] [CLS] [SEP] [MASK] at fixed ids
    assert ready["stats"]["train"]["instances"] > 1000
    assert "dynamic masking" in result.stderr  # unmasked training records, masked in tf.data
    metrics = _metrics(tmp_path)
    assert "eval_mlm_accuracy" in metrics[-1]
    args = [f"--workdir={tmp_path}", f"--config={PRETRAIN}", *args]
    # --mode=eval reads the final checkpoint's parameters and the whole held-out split.
    log = _main(driver_flags, caplog, *args, "--mode=eval")
    assert f"eval of {tmp_path}/checkpoints/4: eval_mlm_loss" in log
    [line] = [json.loads(line) for line in (tmp_path / "eval_metrics.jsonl").read_text().splitlines()]
    assert line["step"] == 4 and 0 < line["eval_nsp_accuracy"] <= 1 and line["eval_mlm_perplexity"] > 1
    # --mode=export writes what transformers loads, with the trained vocabulary and no padding rows.
    _main(driver_flags, caplog, *args, "--mode=export")
    transformers = pytest.importorskip("transformers")
    hf_model = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "export" / "hf"))
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export" / "hf"))
    assert hf_model.config.vocab_size == ready["tokenizer_vocab_size"] == len(hf_tokenizer)
    assert hf_model.config.hidden_act == "gelu_new"  # the tanh GELU of the original BERT code
    # A second run in the same workdir reuses the data (and its checkpoint: nothing is left to train); a different
    # data setting is refused, not mixed in.
    log = _main(driver_flags, caplog, *args, "--config.train.num_steps=2")
    assert "reusing pretraining data" in log
    assert "already at step 4 of train.num_steps=2" in log
    with pytest.raises(ValueError, match="masked_lm_prob differ"):
        _main(driver_flags, caplog, *args, "--config.data.masked_lm_prob=0.2")


@pytest.mark.slow
def test_the_readmes_modern_encoder_learns_on_the_demo_corpus_and_exports_to_transformers(tmp_path, caplog,
                                                                                          driver_flags):
    """The README's arch=modern commands: held-out MLM accuracy rises, no NSP, and transformers gives our logits."""
    config = f"--config={PRETRAIN}:size=tiny,arch=modern"
    # 24 steps of 8 sequences: past the recipe's 20 warmup steps, by when predicting the corpus's commonest tokens
    # has lifted accuracy far above chance (about 1 in 7,700). The first evaluation, at step 6, is of a barely
    # trained model; each reads the same 32 held-out records.
    log = _main(driver_flags, caplog, f"--workdir={tmp_path}", config, *COMMON[:3], "--config.train.num_steps=24",
                "--config.train.log_every=6", "--config.train.eval_every=6", "--config.train.eval_steps=4")
    assert "making pretraining data from demo" in log
    step_lines = [line for line in log.splitlines() if " | mlm_acc " in line]
    assert len(step_lines) == 4 and not [line for line in step_lines if "nsp" in line], step_lines
    metrics = _metrics(tmp_path)
    assert not [name for record in metrics for name in record if "nsp" in name]  # the recipe is masked LM only
    evals = [record for record in metrics if "eval_mlm_accuracy" in record]
    first, last = evals[0], evals[-1]
    assert (first["step"], last["step"], last["eval_records"]) == (6, 24, 32)
    # Measured: accuracy 0.0 -> 0.050, loss 8.87 -> 7.63.
    assert last["eval_mlm_accuracy"] > first["eval_mlm_accuracy"] + 0.03, evals
    assert last["eval_mlm_loss"] < first["eval_mlm_loss"] - 0.5, evals

    _main(driver_flags, caplog, "--mode=export", config, f"--workdir={tmp_path}")  # the README's command as it is
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import jax  # pylint: disable=import-outside-toplevel
    from bert_jax import arch  # pylint: disable=import-outside-toplevel
    from bert_jax import modern  # pylint: disable=import-outside-toplevel
    from bert_jax.data import corpus  # pylint: disable=import-outside-toplevel
    from bert_jax.interop import export, layout  # pylint: disable=import-outside-toplevel
    exported = str(tmp_path / "export" / "hf")
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(exported, local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported, local_files_only=True)
    ready = json.loads((tmp_path / "data" / "READY.json").read_text())
    assert type(theirs).__name__ == "ModernBertForMaskedLM"
    assert theirs.config.vocab_size == ready["tokenizer_vocab_size"] == len(tokenizer)
    # The corpus's first document cut to the 128 tokens of a training row (longer than the local layer's window, 64
    # rows each side, so the window matters) and its first sentence alone, padded.
    document = next(corpus.iter_documents("demo"))
    inputs = tokenizer([" ".join(document), document[0]], padding=True, truncation=True, max_length=128,
                       return_tensors="pt")
    real = inputs["attention_mask"].numpy().astype(bool)
    assert real[0].sum() == 128 > real[1].sum()
    with torch.no_grad():
        expected = theirs(**inputs).logits.numpy()
    # Ours as --mode=export restores them: the run's recorded architecture, its final checkpoint's parameters.
    model = modern.ModernForMaskedLM(arch.config_of(json.loads(
        (tmp_path / "model_config.json").read_text())))
    params = export.restore_model_params(str(tmp_path / "checkpoints"), model, *layout.dummy_inputs())
    logits = jax.jit(model.apply)({"params": params}, inputs["input_ids"].numpy(), inputs["attention_mask"].numpy())
    logits = np.asarray(logits["mlm_logits"])[..., :len(tokenizer)]  # the vocabulary's padding rows are not exported
    difference, scale = np.abs(logits - expected)[real].max(), np.abs(expected[real]).max()
    assert difference <= 1e-4 * scale, (difference, scale)  # measured 3e-7 of the scale


def test_run_on_a_text_corpus_with_the_original_vocab_and_whole_word_masking(tmp_path, caplog, driver_flags):
    log = _main(driver_flags, caplog, f"--workdir={tmp_path}", f"--config={PRETRAIN}:size=tiny,data=corpus",
                "--config.train.num_steps=1", "--config.train.log_every=1",
                f"--config.data.corpus={helpers.FIXTURES}/sample_text.txt",
                f"--config.data.vocab_file={helpers.FIXTURES}/vocab_uncased.txt",
                "--config.data.whole_word_mask=True", "--config.data.eval_every_nth_document=0",
                *ORIGINAL_VOCAB_STEP)  # the preset's 128 tokens: the original records' run's step
    assert "step 1/1" in log
    ready = json.loads((tmp_path / "data" / "READY.json").read_text())
    assert ready["special_ids"] == [0, 101, 102, 103]
    assert ready["eval_files"] == ""
    assert "model.vocab_size 30522 -> 30592" in log


def test_driver_finetunes_then_extracts_features(tmp_path, caplog, driver_flags):
    from tests.test_finetune import vocab_of_pieces  # pylint: disable=import-outside-toplevel
    rows = [("a great film", "positive"), ("an awful film", "negative")] * 16
    train_file = tmp_path / "reviews.csv"
    train_file.write_text("review,sentiment\n" + "".join(f"{text},{label}\n" for text, label in rows))
    # The uncased vocabulary's pieces of these texts: 128 embedding rows to train, save and export instead of 30592.
    vocab, vocab_rows = vocab_of_pieces([text for text, _ in rows], str(tmp_path / "vocab"))
    common = [f"--workdir={tmp_path / 'work'}", f"--config={helpers.ROOT}/configs/finetune.py:size=tiny",
              f"--config.data.vocab_file={vocab}",
              f"--config.data.train_file={train_file}", f"--config.data.eval_file={train_file}",
              "--config.data.text_columns=review", "--config.data.label_column=sentiment",
              "--config.data.max_seq_length=16", f"--config.model.vocab_size={vocab_rows}",
              "--config.train.batch_size=8",
              *SHALLOW[1:]]
    _main(driver_flags, caplog, "--mode=finetune", *common, "--config.train.num_steps=3",
          "--config.train.log_every=3")
    assert "eval_accuracy" in _metrics(tmp_path / "work")[-1]
    _main(driver_flags, caplog, "--mode=features", *common, f"--config.init={tmp_path / 'work' / 'finetuned'}",
          f"--config.features.input_file={train_file}", "--config.features.pooling=mean",
          f"--config.features.output={tmp_path / 'features.npy'}")
    embeddings = np.load(tmp_path / "features.npy")
    assert embeddings.shape == (32, 128)
    np.testing.assert_allclose(embeddings[0], embeddings[2], rtol=1e-5)  # the same text, the same vector
    # A pretraining config in a downstream mode is refused with the reason, not a traceback.
    with pytest.raises(ValueError, match="configs/finetune.py"):
        _main(driver_flags, caplog, "--mode=finetune", f"--workdir={tmp_path / 'wrong'}",
              f"--config={PRETRAIN}:size=tiny")


def test_driver_prepares_the_data_then_logs_the_final_config_then_trains(tmp_path, monkeypatch, caplog,
                                                                           driver_flags):
    from bert_jax import pretraining
    received = {}

    def fake_job(name, result):
        def job(config, workdir, *args):
            received[name] = {"config": config.to_dict(), "ready": (tmp_path / "data" / "READY.json").exists()}
            return result
        return job

    monkeypatch.setattr(pretraining, "train_and_evaluate", fake_job("train", pretraining.TrainResult({"loss": 1.0})))
    monkeypatch.setattr(pretraining, "export_checkpoint", fake_job("export", str(tmp_path / "export")))
    common = [f"--config={helpers.ROOT}/configs/pretrain.py:size=tiny,data=corpus", f"--workdir={tmp_path}",
              f"--config.data.corpus={helpers.FIXTURES}/sample_text.txt", "--config.data.tokenizer_vocab_size=300",
              "--config.data.eval_every_nth_document=0"]
    driver = driver_flags(*common)
    caplog.set_level(logging.INFO, logger="absl")  # after parsing, which sets absl's level from --verbosity
    driver.main(["bert_jax"])
    ready = json.loads((tmp_path / "data" / "READY.json").read_text())
    assert 200 < ready["tokenizer_vocab_size"] <= 300  # the tokenizer trained on the corpus
    padded = -(-ready["tokenizer_vocab_size"] // 128) * 128  # not the preset's 30522
    # The trainer got the prepared config: the padded trained vocabulary and the data step's TFRecords.
    config = received["train"]["config"]
    assert received["train"]["ready"] and config["model"]["vocab_size"] == padded
    assert config["data"]["source"] == "tfrecord" and config["data"]["input_files"] == ready["train_files"]
    # And the config in the log is that one: logged after the data step, holding the trained vocab size.
    messages = [record.getMessage() for record in caplog.records]
    [config_line] = [index for index, message in enumerate(messages) if message.startswith("config:")]
    [data_line] = [index for index, message in enumerate(messages) if "making pretraining data" in message]
    assert data_line < config_line
    assert f"\n  vocab_size: {padded}\n" in messages[config_line] and "source: tfrecord" in messages[config_line]
    # Export reads the same prepared data (reused, not made again) for the tokenizer and vocab size.
    caplog.clear()
    driver = driver_flags(*common, "--mode=export")
    caplog.set_level(logging.INFO, logger="absl")
    driver.main(["bert_jax"])
    assert received["export"]["config"] == config
    assert any("reusing pretraining data" in record.getMessage() for record in caplog.records)


def test_eval_mode_needs_only_the_held_out_files(tmp_path, caplog, driver_flags, trained_run, small_records):
    """--mode=eval of a run's checkpoint with data.input_files empty: the held-out metrics the run logged."""
    log = _main(driver_flags, caplog, f"--workdir={tmp_path}", f"--config={PRETRAIN}:size=tiny,data=tfrecord",
                "--mode=eval", f"--checkpoint={trained_run['workdir']}/checkpoints", "--config.data.input_files=",
                f"--config.data.eval_input_files={small_records['eval']}", "--config.train.eval_steps=100",
                f"--config.model.vocab_size={helpers.TINY_VOCAB}", "--config.data.max_seq_length=32",
                "--config.data.max_predictions_per_seq=5", "--config.model.max_position_embeddings=64",
                "--config.train.batch_size=16", "--config.mesh.fsdp=2", "--config.mesh.tensor=2")
    assert f"eval of {trained_run['workdir']}/checkpoints/4" in log
    [line] = [json.loads(line) for line in (tmp_path / "eval_metrics.jsonl").read_text().splitlines()]
    for name in ("eval_mlm_loss", "eval_mlm_accuracy", "eval_nsp_loss", "eval_records"):
        assert line[name] == pytest.approx(trained_run["final"][name], rel=1e-6), name


def test_driver_takes_the_architecture_from_config_init(tmp_path, caplog, driver_flags, trained_run, small_records):
    """Continuing pretraining from a run's checkpoint with the tiny preset (and the run's optimizer and dropout): the
    checkpoint's vocabulary (512 rows) and positions (64) replace the preset's before the config is logged; a field
    named on the command line must agree with the checkpoint."""
    args = [f"--workdir={tmp_path}", f"--config={PRETRAIN}:size=tiny,data=tfrecord",
            f"--config.init={trained_run['workdir']}/checkpoints",
            f"--config.data.input_files={small_records['train']}",
            f"--config.data.eval_input_files={small_records['eval']}", "--config.data.max_seq_length=32",
            "--config.data.max_predictions_per_seq=5", "--config.train.num_steps=1",
            *_trained_run_flags(*STEP_FIELDS)]  # the run's step, which the run's compilation cache serves
    log = _main(driver_flags, caplog, *args)
    [config_line] = [record.getMessage() for record in caplog.records if record.getMessage().startswith("config:")]
    assert f"\n  vocab_size: {helpers.TINY_VOCAB}\n" in config_line
    assert "\n  max_position_embeddings: 64\n" in config_line
    assert "step 1/1" in log
    with pytest.raises(ValueError, match="max_position_embeddings") as raised:
        _main(driver_flags, caplog, *args, f"--workdir={tmp_path}/other", "--config.model.max_position_embeddings=128")
    assert "64" in str(raised.value)


@pytest.fixture
def exec_calls(monkeypatch):
    """run()'s re-execution, recorded instead of made; the process looks like `python -X dev -m bert_jax.main`."""
    from bert_jax import main as driver  # pylint: disable=import-outside-toplevel
    calls = []
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append((path, argv, os.environ.get("GLIBC_TUNABLES"))))
    monkeypatch.setattr(sys, "argv", [driver.__file__, "--workdir=/w"])
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-X", "dev", "-m", "bert_jax.main", "--workdir=/w"])
    # Set, then removed: monkeypatch then restores the original state at the end, also when run() set the variable
    # itself (a bare delenv of an absent variable records nothing, and the worker's later subprocesses would
    # inherit the tuned allocator).
    monkeypatch.setenv("GLIBC_TUNABLES", "")
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setattr(runtime, "runs_on_the_cpu", lambda: True)
    return calls


def test_a_cpu_run_re_executes_itself_once_with_the_glibc_tunables(exec_calls, monkeypatch):
    from bert_jax import main as driver  # pylint: disable=import-outside-toplevel
    if runtime.platform.libc_ver()[0] != "glibc" or not sys.platform.startswith("linux"):
        pytest.skip("GLIBC_TUNABLES is glibc's")
    runtime.with_cpu_glibc_tunables(driver.__file__)
    # The same interpreter, its options and module; the variable set from then on stops a second exec.
    assert exec_calls == [(sys.executable, [sys.executable, "-X", "dev", "-m", "bert_jax.main", "--workdir=/w"],
                           runtime.CPU_GLIBC_TUNABLES)]
    runtime.with_cpu_glibc_tunables(driver.__file__)
    assert len(exec_calls) == 1


@pytest.mark.parametrize("case", ["users_value", "users_empty_value", "not_the_cpu", "not_the_driver"])
def test_the_glibc_tunables_are_left_alone(exec_calls, monkeypatch, case):
    from bert_jax import main as driver  # pylint: disable=import-outside-toplevel
    if case == "users_value":
        monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=4")
    elif case == "users_empty_value":  # how a user opts out
        monkeypatch.setenv("GLIBC_TUNABLES", "")
    elif case == "not_the_cpu":
        monkeypatch.setattr(runtime, "runs_on_the_cpu", lambda: False)
    else:  # a program that calls run() itself (a test, a notebook) is never replaced by exec
        monkeypatch.setattr(sys, "argv", ["/usr/bin/pytest"])
    before = os.environ.get("GLIBC_TUNABLES")
    runtime.with_cpu_glibc_tunables(driver.__file__)
    assert exec_calls == [] and os.environ.get("GLIBC_TUNABLES") == before


def test_the_platform_is_the_cpu_when_jax_platforms_names_it_first():
    for platforms, on_cpu in (("cpu", True), ("cpu,tpu", True), ("tpu,cpu", False), ("cuda", False)):
        assert runtime.runs_on_the_cpu(platforms) is on_cpu, platforms
