"""Tokenizers: parity with the original BERT FullTokenizer, trained vocabularies, loading, saving, errors."""

import gzip
import json
import multiprocessing
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from pydoc_data.topics import topics

from bert_jax.data import tokenization
from bert_jax.data import vocabulary
from bert_jax.data.tokenization import SPECIAL_TOKENS, load_tokenizer, padded_vocab_size

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "google_bert")
UNCASED_VOCAB = os.path.join(FIXTURES, "vocab_uncased.txt")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Real English prose (Python's reference-manual topics, shipped with CPython): ~470 kB, 79 documents.
CORPUS = [topics[key] for key in sorted(topics)]
PROBE = "The interpreter raises a ValueError when the argument's type is right but its value isn't."


@pytest.fixture(scope="module")
def uncased():
    return load_tokenizer(UNCASED_VOCAB)


def _recorded(lower: bool) -> tuple[dict[int, list[int]], list[dict]]:
    """The original FullTokenizer's outputs with vocab_uncased.txt (fixtures/google_bert/README.md): the ids of each
    code point alone, and the stress strings' tokens and ids."""
    ids, stress = {}, []
    with gzip.open(os.path.join(FIXTURES, "wordpiece_codepoints.jsonl.gz"), "rt", encoding="utf-8") as f:
        for row in map(json.loads, f):
            if row["lower"] != lower:
                continue
            if "text" in row:
                stress.append(row)
            else:
                ids.update((cp, row["ids"]) for cp in range(row["first"], row["last"] + 1))
    return ids, stress


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def recorded(request):
    return request.param, *_recorded(request.param)


def _write_vocab(path, tokens):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(token + "\n" for token in tokens))
    return str(path)


def test_uncased_wordpiece_matches_original_bert_on_sample_text(uncased):
    with open(os.path.join(FIXTURES, "sample_text_wordpiece.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 31
    for row in rows:
        assert uncased.tokenize(row["text"]) == row["tokens"], row["text"]
    assert uncased.encode_batch([row["text"] for row in rows]) == [row["ids"] for row in rows]
    assert uncased.special_ids == {"pad_id": 0, "unk_id": 100, "cls_id": 101, "sep_id": 102, "mask_id": 103}
    assert (uncased.kind, uncased.vocab_size, uncased.do_lower_case) == ("wordpiece", 30522, True)


def test_literal_special_token_text_is_split_like_the_original(uncased):
    # The original never maps text to control ids: "[MASK]" typed in a document is three ordinary tokens.
    assert uncased.tokenize("a [MASK] b") == ["a", "[", "mask", "]", "b"]
    assert uncased.mask_id not in uncased.encode_batch(["a [MASK] b [SEP]"])[0]


def test_cased_wordpiece_keeps_case_and_accents_like_original(tmp_path):
    from transformers import BertTokenizerLegacy  # the pure-Python port of the original FullTokenizer

    tokens = list(SPECIAL_TOKENS) + ["Hello", "hello", "Café", "cafe", "caf", "##é", "##e", "World", "world", "!",
                                     ",", "un", "##aff", "##able", "Ünïcode", "der", "Straße", "北", "京"]
    vocab_file = _write_vocab(tmp_path / "cased_vocab.txt", tokens)
    cased = load_tokenizer(vocab_file, do_lower_case=False)
    reference = BertTokenizerLegacy(vocab_file, do_lower_case=False)
    texts = ["Hello, World!", "hello café Café cafe", "unaffable Ünïcode der Straße", "北京 HELLO zzz", "café!"]
    for text in texts:
        assert cased.tokenize(text) == reference.tokenize(text), text
    # é spelled e + combining accent: the original does no NFC, so "cafe" then "##\u0301" fails and the word is
    # [UNK] (BertTokenizerLegacy composes it first and differs here).
    assert cased.tokenize("cafe\u0301!") == ["[UNK]", "!"]
    # Spelled out too, so a change in the reference library cannot hide a regression.
    assert cased.tokenize("hello Café, unaffable Ünïcode 北京 HELLO") == [
        "hello", "Café", ",", "un", "##aff", "##able", "Ünïcode", "北", "京", "[UNK]"]
    assert cased.encode_batch(["Straße World"]) == [[tokens.index("Straße"), tokens.index("World")]]
    # The same vocab lower-cased: accents stripped, so "Café" becomes "cafe".
    assert load_tokenizer(vocab_file).tokenize("Café HELLO") == ["cafe", "hello"]


def test_vocab_file_keeps_original_line_semantics(tmp_path):
    # id = line number; lines are stripped; an empty line is a token; a repeated token keeps its last line's id.
    lines = list(SPECIAL_TOKENS) + ["hello", "", "world", "hello", "##s", "  x  "]
    tokenizer = load_tokenizer(_write_vocab(tmp_path / "vocab.txt", lines))
    assert tokenizer.vocab_size == 11
    assert tokenizer.encode_batch(["hello worlds x"]) == [[8, 7, 9, 10]]
    assert tokenizer.convert_ids_to_tokens([5, 6, 10]) == ["hello", "", "x"]
    assert tokenizer.convert_tokens_to_ids(["hello", "x", "never-seen"]) == [8, 10, tokenizer.unk_id]
    saved = load_tokenizer(tokenizer.save(str(tmp_path / "saved")))
    assert saved.vocab_words == tokenizer.vocab_words  # line numbers survive a save, duplicates included


def test_stress_strings_tokenize_like_the_original(recorded):
    """Long words of 99-201 characters (the original's max_input_chars_per_word=200 is inclusive), final sigma,
    ligatures, combining marks, zero-width, control and private-use characters, CJK, emoji, punctuation."""
    do_lower_case, _, stress = recorded
    assert len(stress) == 36
    tokenizer = load_tokenizer(UNCASED_VOCAB, do_lower_case=do_lower_case)
    for row in stress:
        assert tokenizer.tokenize(row["text"]) == row["tokens"], ascii(row["text"])
    assert tokenizer.encode_batch([row["text"] for row in stress]) == [row["ids"] for row in stress]


def test_overlong_word_becomes_unk_like_the_original(uncased):
    assert uncased.tokenize("a " + "x" * 201 + " b") == ["a", "[UNK]", "b"]
    assert "[UNK]" not in uncased.tokenize("ab" * 100)
    # decode keeps [UNK]: it stands for text that was there.
    assert uncased.decode(uncased.encode_batch(["A " + "x" * 201 + "!"])[0]) == "a [UNK]!"


def test_greek_final_sigma_lower_cases_like_str_lower(uncased):
    # str.lower() makes a word-final capital sigma "ς" and any other "σ". The original drops U+0001 and U+200B
    # before it lower-cases, so they do not end the word.
    assert uncased.tokenize("ΟΔΟΣ") == ["ο", "##δ", "##ος"] and uncased.tokenize("ΟΔΟΣΑ")[-2:] == ["##σ", "##α"]
    assert uncased.tokenize("ΑΣ\x01Α") == uncased.tokenize("ασα") != uncased.tokenize("ας α")


def test_private_use_and_recent_characters_are_kept_like_the_original(uncased):
    # The original's clean-up drops only categories Cc and Cf (and U+0000, U+FFFD): private-use and unassigned code
    # points stay as (unknown) words, and U+2B820..U+2B91F are CJK ideographs that it puts spaces around.
    assert uncased.tokenize("a\x00b\ufffdc\u200dd\x7fe") == uncased.tokenize("abcde")
    assert uncased.tokenize("a \ue000 b") == ["a", "[UNK]", "b"]
    assert uncased.tokenize("a\U000F0000b \U0010FFFD") == ["[UNK]", "[UNK]"]
    assert uncased.tokenize("x\U0002B820y") == ["x", "[UNK]", "y"]


# Every code point but the surrogates (which no UTF-8 text can hold).
CODE_POINTS = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
CODE_POINTS_PER_TEXT = 512


def test_every_code_point_tokenizes_like_the_original(recorded):
    """Each code point's ids against the original's for it alone. Checked in texts of 512 code points apart by
    spaces (the ids of each alone, one after the other); a text that differs is checked one code point at a time,
    so that the failure names them."""
    do_lower_case, expected, _ = recorded
    assert sorted(expected) == CODE_POINTS
    tokenizer = load_tokenizer(UNCASED_VOCAB, do_lower_case=do_lower_case)
    chunks = [CODE_POINTS[i:i + CODE_POINTS_PER_TEXT] for i in range(0, len(CODE_POINTS), CODE_POINTS_PER_TEXT)]
    texts = [" ".join(map(chr, chunk)) for chunk in chunks]
    differing = []
    for chunk, ids in zip(chunks, tokenizer.encode_batch(texts)):
        if ids != [token for cp in chunk for token in expected[cp]]:
            alone = tokenizer.encode_batch([chr(cp) for cp in chunk])
            alone = [cp for cp, ours in zip(chunk, alone) if ours != expected[cp]]
            assert alone, f"U+{chunk[0]:04X}..U+{chunk[-1]:04X} apart differ, but no code point alone does"
            differing += alone
    assert not differing, f"{len(differing)} code points differ: {' '.join(f'U+{cp:04X}' for cp in differing[:100])}"


def test_wordpiece_is_continuation_marks_only_hash_pieces(uncased):
    flags = uncased.is_continuation
    assert flags.dtype == np.bool_ and flags.shape == (30522,)
    ing, playing, the = uncased.convert_tokens_to_ids(["##ing", "playing", "the"])
    assert flags[ing] and not flags[playing] and not flags[the]
    assert not flags[list(uncased.special_ids.values())].any()
    assert flags.sum() == sum(word.startswith("##") for word in uncased.vocab_words) == 5828
    ids = uncased.encode_batch(["unaffable playing"])[0]
    assert uncased.convert_ids_to_tokens(ids) == ["una", "##ffa", "##ble", "playing"]
    assert flags[ids].tolist() == [False, True, True, False]


def test_vocab_without_mask_names_file_and_token(tmp_path):
    vocab_file = _write_vocab(tmp_path / "no_mask_vocab.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello"])
    with pytest.raises(ValueError) as error:
        load_tokenizer(vocab_file)
    message = str(error.value)
    assert vocab_file in message and "lacks the special token(s) [MASK];" in message and "Fix:" in message


def test_missing_paths_raise_file_not_found(tmp_path):
    missing = str(tmp_path / "nowhere" / "vocab.txt")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_tokenizer(missing)
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="empty_dir"):
        load_tokenizer(str(empty))


def test_padded_vocab_size():
    assert padded_vocab_size(30522) == 30592
    assert padded_vocab_size(128) == 128
    assert padded_vocab_size(1) == 128
    assert padded_vocab_size(129) == 256
    assert padded_vocab_size(1000, multiple=64) == 1024
    with pytest.raises(ValueError, match="vocab_size"):
        padded_vocab_size(0)


TRAINERS = {
    "wordpiece": lambda output_dir, **kw: vocabulary.train_wordpiece(CORPUS, vocab_size=1000,
                                                                       output_dir=output_dir, **kw),
    "unigram": lambda output_dir, **kw: vocabulary.train_sentencepiece(CORPUS, vocab_size=1000,
                                                                         output_dir=output_dir, **kw),
    "bpe": lambda output_dir, **kw: vocabulary.train_sentencepiece(CORPUS, vocab_size=1000, output_dir=output_dir,
                                                                     model_type="bpe", **kw),
}


@pytest.mark.parametrize("kind", sorted(TRAINERS))
def test_trained_vocab_has_fixed_special_ids_round_trips_and_is_deterministic(kind, tmp_path):
    first = TRAINERS[kind](str(tmp_path / "first"))
    assert first.vocab_size == 1000
    assert first.vocab_words[:5] == list(SPECIAL_TOKENS)
    assert first.special_ids == {"pad_id": 0, "unk_id": 1, "cls_id": 2, "sep_id": 3, "mask_id": 4}
    assert first.kind == ("wordpiece" if kind == "wordpiece" else "sentencepiece")

    ids = first.encode_batch([PROBE, "", "hello world"])
    assert ids[1] == [] and first.unk_id not in ids[0] and not set(ids[0]) & set(range(5))
    assert len(ids[0]) < len(PROBE) / 2  # it learned sub-words, not just characters
    decoded = first.decode(ids[0])
    expected = PROBE.lower() if first.do_lower_case else PROBE
    if kind == "wordpiece":  # WordPiece keeps words and punctuation, not the spaces around punctuation
        expected = expected.replace("'", " ' ").replace("  ", " ")
    assert decoded == expected
    assert first.decode([first.cls_id] + ids[0] + [first.sep_id, first.pad_id]) == decoded
    assert first.convert_tokens_to_ids(first.tokenize(PROBE)) == ids[0]

    loaded = load_tokenizer(str(tmp_path / "first"))
    assert type(loaded) is type(first) and loaded.do_lower_case == first.do_lower_case
    assert loaded.vocab_words == first.vocab_words
    assert loaded.encode_batch(CORPUS[:5]) == first.encode_batch(CORPUS[:5])
    assert np.array_equal(loaded.is_continuation, first.is_continuation)

    second = TRAINERS[kind](str(tmp_path / "second"))
    assert second.vocab_words == first.vocab_words
    with open(os.path.join(tmp_path, "first", "tokenizer_config.json")) as f:
        config = json.load(f)
    assert config["kind"] == first.kind and config["mask_id"] == 4 and config["do_lower_case"] == first.do_lower_case
    vocab_file = os.path.join(tmp_path, "first", config["vocab_file"])
    assert load_tokenizer(vocab_file, do_lower_case=first.do_lower_case).encode_batch([PROBE]) == [ids[0]]


def test_sentencepiece_continuations_and_specials(tmp_path):
    spm = TRAINERS["unigram"](str(tmp_path))
    flags = spm.is_continuation
    words = spm.vocab_words
    assert not flags[:5].any()
    for word, flag in zip(words[5:], flags[5:]):
        assert flag == (not word.startswith("\u2581") and word not in tokenization._PUNCTUATION), word
    assert flags.any() and not flags.all()
    pieces = spm.tokenize("interpreter's")
    assert pieces[0].startswith("\u2581")
    # Literal special-token text is ordinary text for SentencePiece too (they are control symbols).
    assert spm.mask_id not in spm.encode_batch(["a [MASK] b"])[0]


def test_sentencepiece_lower_case_applies_at_encode_and_survives_save(tmp_path):
    lower = TRAINERS["unigram"](str(tmp_path), do_lower_case=True)
    assert lower.encode_batch(["HELLO World"]) == lower.encode_batch(["hello world"])
    assert not any(any(c.isupper() for c in word) for word in lower.vocab_words[5:])
    reloaded = load_tokenizer(str(tmp_path))
    assert reloaded.do_lower_case and reloaded.tokenize("HELLO") == lower.tokenize("hello")
    assert not load_tokenizer(str(tmp_path), do_lower_case=False).do_lower_case


def test_tokenizers_pickle_for_spawned_workers(uncased, tmp_path):
    spm = TRAINERS["bpe"](str(tmp_path))
    for tokenizer in (uncased, spm):
        copy = pickle.loads(pickle.dumps(tokenizer))
        assert copy.encode_batch([PROBE]) == tokenizer.encode_batch([PROBE])
        assert copy.special_ids == tokenizer.special_ids


def _encode_in_worker(args):
    saved_dir, texts = args
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return load_tokenizer(saved_dir).encode_batch(texts)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX, if another test imported it; unused here
def test_load_and_encode_in_forked_workers(uncased, tmp_path):
    saved_dir = uncased.save(str(tmp_path / "wordpiece"))
    texts = CORPUS[:8]
    expected = uncased.encode_batch(texts)  # the parent's Rust pool is running before the fork
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map_async(_encode_in_worker, [(saved_dir, texts[:4]), (saved_dir, texts[4:])]).get(60)
    assert results[0] + results[1] == expected


def test_local_loading_does_not_import_tensorflow():
    code = ("import sys; from bert_jax.data.tokenization import load_tokenizer; "
            f"load_tokenizer({UNCASED_VOCAB!r}).encode_batch(['x']); assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_remote_paths_go_through_tf_gfile(uncased):
    # TF's in-memory filesystem stands in for gs://: the same tf.io.gfile calls serve both.
    saved = uncased.save("ram://tokenizer_test/wordpiece")
    assert saved == "ram://tokenizer_test/wordpiece"
    loaded = load_tokenizer(saved)
    assert loaded.encode_batch([PROBE]) == uncased.encode_batch([PROBE])
    with pytest.raises(FileNotFoundError, match="ram://tokenizer_test/missing"):
        load_tokenizer("ram://tokenizer_test/missing")


def test_a_tokenizer_json_encodes_as_transformers_fast_tokenizer_and_words_as_split_into_words(tmp_path):
    """A ModernBERT-style byte-level BPE tokenizer.json: whole texts give transformers' PreTrainedTokenizerFast ids
    (without [CLS]/[SEP]), words encoded one by one give its is_split_into_words ids (no prefix space), spans are
    the characters of the text, and it survives save, a HuggingFace-style directory, and pickling."""
    transformers = pytest.importorskip("transformers")
    from bert_jax.data import corpus  # pylint: disable=import-outside-toplevel
    from tests import helpers  # pylint: disable=import-outside-toplevel
    texts = [" ".join(document) for document in corpus.iter_documents("demo")][:100]
    path = helpers.byte_level_bpe(texts, 400, str(tmp_path / "hf"))
    ours = load_tokenizer(str(tmp_path / "hf"))  # a directory without our config: its tokenizer.json
    assert ours.kind == "tokenizer_json" and ours.vocab_size == 400
    assert ours.special_ids == {"pad_id": 3, "unk_id": 0, "cls_id": 1, "sep_id": 2, "mask_id": 4}
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=path)
    samples = ["The function returns a copy of the list.", "Ünïcode  spaces\tand\nlines", texts[3][:300]]
    assert ours.encode_batch(samples) == theirs(samples, add_special_tokens=False)["input_ids"]
    words = samples[0].split()
    assert sum(ours.encode_batch(words), []) == theirs(words, is_split_into_words=True,
                                                       add_special_tokens=False)["input_ids"]
    assert ours.tokenize("a the") == ["a", "\u0120the"]  # the space belongs to the next word's piece
    assert ours.decode(ours.encode_batch(samples[:1])[0]) == samples[0]
    [(ids, spans)] = ours.encode_with_spans(["héllo"])
    assert ids == ours.encode_batch(["héllo"])[0] and spans[0][0] == 0 and spans[-1][1] == len("héllo")
    continuation = ours.is_continuation
    assert not continuation[[ours.cls_id, ours.pad_id]].any()
    assert continuation[ours.convert_tokens_to_ids(["he"])[0]] != continuation[ours.convert_tokens_to_ids(
        ["\u0120the"])[0]]
    saved = load_tokenizer(ours.save(str(tmp_path / "saved")))
    assert sorted(os.listdir(tmp_path / "saved")) == ["tokenizer.json", "tokenizer_config.json"]
    assert saved.encode_batch(samples) == pickle.loads(pickle.dumps(ours)).encode_batch(samples) == \
        ours.encode_batch(samples)
    assert load_tokenizer(path).vocab_words == ours.vocab_words
