"""Pretraining data made inside a run's workdir, for `data.source=corpus` (the default run).

corpus (`data.corpus`, streamed; every n-th document held out) -> tokenizer (trained on the training documents,
or `data.vocab_file`) -> unmasked training instances (masked dynamically by the input pipeline, fresh masks every
epoch) and statically masked evaluation instances (fixed masks, so evaluations are comparable) in WORKDIR/data.

bert_jax.job_config.prepare calls `prepare` on every process before the driver logs the config, so the trainer
only ever reads TFRecords. It builds once: later runs in the same workdir (a resumed run, say) find
WORKDIR/data/READY.json and reuse the data, as long as the data settings match. Only process 0 builds; the others
wait for it. For corpora that need many machines, run `bert_jax.data.create_beam` separately and train with
`data.source=tfrecord`.
"""

import copy
import functools
import json
import os

from absl import logging
import jax

from bert_jax import fileio
from bert_jax.data import corpus
from bert_jax.data import corpus_formats
from bert_jax.data import create
from bert_jax.data import tokenization
from bert_jax.data import vocabulary

READY_FILE = "READY.json"
TOKENIZER_KINDS = ("wordpiece", "sentencepiece_unigram", "sentencepiece_bpe")
# config.data fields whose change means the data must be made again.
_SETTINGS = ("corpus", "corpus_format", "corpus_field", "skip_bad_records", "vocab_file", "tokenizer",
             "tokenizer_vocab_size", "do_lower_case", "dupe_factor", "eval_every_nth_document", "max_seq_length",
             "max_predictions_per_seq", "masked_lm_prob", "whole_word_mask", "instances")


def _settings(config) -> dict:
    return {**{name: config.data[name] for name in _SETTINGS}, "seed": config.train.seed}


# Settings added since older workdirs were made, with the value those were made with. Their corpus_format was
# "lines" where it is "auto" now, the same layout for a corpus of files not named as records (or demo, tfds:).
_EARLIER_SETTINGS = {"corpus_field": "text", "skip_bad_records": False, "instances": "pairs"}


def _saved_settings(saved: dict, config) -> dict:
    saved = {**_EARLIER_SETTINGS, **saved}
    if saved.get("corpus_format") == "lines" and config.data.corpus_format == "auto":
        source = config.data.corpus
        try:
            files = [] if source == corpus.DEMO_SOURCE or source.startswith(corpus.TFDS_PREFIX) else (
                corpus.resolve_files(source))
        except OSError:  # the corpus has moved since: nothing to compare
            return saved
        if all(corpus_formats.file_format(path, "auto") == "lines" for path in files):
            saved["corpus_format"] = "auto"
    return saved


def _is_held_out(every_nth: int, index: int) -> bool:
    return every_nth > 0 and index % every_nth == every_nth - 1


def _training_sentences(data_config):
    """The training split's sentences, streamed from the corpus (for training a tokenizer on them)."""
    stats = corpus.CorpusStats()
    documents = corpus.iter_documents(data_config.corpus, text_format=data_config.corpus_format,
                                      text_field=data_config.corpus_field,
                                      skip_bad_records=data_config.skip_bad_records, stats=stats)
    for index, document in enumerate(documents):
        if not _is_held_out(data_config.eval_every_nth_document, index):
            yield from document
    if stats.skipped_lines:
        logging.warning("corpus %s: skipped %d lines that are not valid UTF-8", data_config.corpus,
                        stats.skipped_lines)
    if stats.bad_records:
        logging.warning("corpus %s: skipped %d bad records (data.skip_bad_records)", data_config.corpus,
                        stats.bad_records)
    logging.info("corpus %s: %d documents, %d sentences, %d characters", data_config.corpus, stats.documents,
                 stats.sentences, stats.characters)


def _make_tokenizer(data_config, output_dir: str) -> tokenization.Tokenizer:
    if data_config.vocab_file:
        tokenizer = tokenization.load_tokenizer(data_config.vocab_file, do_lower_case=data_config.do_lower_case)
    elif data_config.tokenizer == "wordpiece":
        tokenizer = vocabulary.train_wordpiece(_training_sentences(data_config),
                                                 vocab_size=data_config.tokenizer_vocab_size, output_dir=output_dir,
                                                 do_lower_case=data_config.do_lower_case)
    elif data_config.tokenizer in ("sentencepiece_unigram", "sentencepiece_bpe"):
        tokenizer = vocabulary.train_sentencepiece(
            _training_sentences(data_config), vocab_size=data_config.tokenizer_vocab_size, output_dir=output_dir,
            model_type=data_config.tokenizer.split("_")[1], do_lower_case=data_config.do_lower_case)
    else:
        raise ValueError(f"--config.data.tokenizer={data_config.tokenizer!r}: choose one of {TOKENIZER_KINDS}")
    tokenizer.save(output_dir)
    return tokenizer


def _build(config, data_dir: str) -> dict:
    data = config.data
    tokenizer_dir = os.path.join(data_dir, "tokenizer")
    tokenizer = _make_tokenizer(data, tokenizer_dir)
    logging.info("tokenizer: %s, %d entries", tokenizer.kind, tokenizer.vocab_size)
    every_nth = data.eval_every_nth_document
    common = dict(max_seq_length=data.max_seq_length, max_predictions_per_seq=data.max_predictions_per_seq,
                  masked_lm_prob=data.masked_lm_prob, whole_word_mask=data.whole_word_mask, seed=config.train.seed,
                  instances=data.instances)
    make = functools.partial(create.create_pretraining_data, data.corpus, tokenizer_dir,
                             text_format=data.corpus_format, text_field=data.corpus_field,
                             skip_bad_records=data.skip_bad_records, progress=False, overwrite=True)
    summaries = {"train": make(
        os.path.join(data_dir, "train"), create.DataOptions(dupe_factor=data.dupe_factor, masking="none", **common),
        num_shards=4, prefix="train", document_filter=lambda index: not _is_held_out(every_nth, index))}
    eval_pattern = ""
    if every_nth > 0:
        try:
            summaries["eval"] = make(
                os.path.join(data_dir, "eval"), create.DataOptions(dupe_factor=1, masking="static", **common),
                num_shards=1, prefix="eval", document_filter=functools.partial(_is_held_out, every_nth))
            eval_pattern = os.path.join(data_dir, "eval", "eval-*.tfrecord")
        except ValueError as error:  # a corpus too small to hold out any document
            logging.warning("no held-out evaluation data: %s", error)
    return {"settings": _settings(config), "tokenizer_dir": tokenizer_dir,
            "train_files": os.path.join(data_dir, "train", "train-*.tfrecord"), "eval_files": eval_pattern,
            "tokenizer_vocab_size": tokenizer.vocab_size,
            "special_ids": [tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id],
            "stats": {split: summary.get("stats", {}) for split, summary in summaries.items()}}


def prepare(config, workdir: str):
    """Makes (or reuses) WORKDIR/data for `config`; returns a copy of `config` pointed at it.

    In the copy `data.source` is "tfrecord", `data.input_files` / `eval_input_files` name the shards, `data.vocab_file`
    the tokenizer, `data.special_ids` its ids, and `model.vocab_size` the tokenizer's size padded to a multiple of
    128 (the extra rows are never produced by the data).
    """
    data_dir = fileio.join(workdir, "data")
    ready_path = fileio.join(data_dir, READY_FILE)
    if jax.process_index() == 0:
        ready = None
        if fileio.exists(ready_path):
            with fileio.open_file(ready_path) as file:
                ready = json.load(file)
            saved, current = _saved_settings(ready["settings"], config), _settings(config)
            if saved != current:
                changed = sorted(key for key in {*saved, *current} if saved.get(key) != current.get(key))
                raise ValueError(f"{data_dir} was made with other data settings ({', '.join(changed)} differ); "
                                 "use a new --workdir, delete that directory, or train on it with the old settings")
            logging.info("reusing pretraining data in %s", data_dir)
        else:
            logging.info("making pretraining data from %s into %s", config.data.corpus, data_dir)
            ready = _build(config, data_dir)
            with fileio.open_file(ready_path + ".tmp", "w") as file:
                json.dump(ready, file, indent=2)
            fileio.rename(ready_path + ".tmp", ready_path)  # written last: marks the data done
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("bert_jax workdir data ready")
    with fileio.open_file(ready_path) as file:
        ready = json.load(file)

    config = copy.deepcopy(config)
    padded = tokenization.padded_vocab_size(ready["tokenizer_vocab_size"])
    if config.model.vocab_size != padded:
        logging.info("model.vocab_size %d -> %d (tokenizer's %d entries padded to a multiple of 128)",
                     config.model.vocab_size, padded, ready["tokenizer_vocab_size"])
        config.model.vocab_size = padded
    data = config.data
    data.source = "tfrecord"
    data.input_files = ready["train_files"]
    data.eval_input_files = ready["eval_files"]
    data.vocab_file = ready["tokenizer_dir"]
    data.special_ids = tuple(ready["special_ids"])
    return config
