"""Corpus sources: the original reader's documents, globs, bad bytes, sentence splitting, TFDS and the demo corpus."""

import dataclasses
import functools
import gzip
import inspect
import logging
import os
import textwrap

import numpy as np
import pytest

from bert_jax.data import corpus
from bert_jax.data import demo_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_TEXT = os.path.join(ROOT, "tests", "fixtures", "google_bert", "sample_text.txt")


def _write(path, data) -> str:
    with open(path, "wb") as file:
        file.write(data.encode("utf-8") if isinstance(data, str) else data)
    return str(path)


def _original_reader(paths):
    """The loop of google-research/bert create_pretraining_data.py, with a whitespace tokenizer standing in."""
    all_documents = [[]]
    for path in paths:
        with open(path, encoding="utf-8", newline="\n") as reader:  # GFile splits on "\n" only, like this
            while True:
                line = reader.readline()
                if not line:
                    break
                line = line.strip()
                if not line:
                    all_documents.append([])
                tokens = line.split()
                if tokens:
                    all_documents[-1].append(line)
    return [document for document in all_documents if document]


# ---------------------------------------------------------------------------------------------------------------
# Files in the original layout


def test_original_layout_documents(tmp_path):
    text = ("First doc, sentence one.  \n  Sentence two.\n\n\n   \nSecond doc.\n\t\n"
            "Third doc \u529b\u52a0.\r\nlast line without a newline")
    path = _write(tmp_path / "corpus.txt", text)
    stats = corpus.CorpusStats()
    documents = list(corpus.iter_documents(path, stats=stats))
    expected = [["First doc, sentence one.", "Sentence two."], ["Second doc."],
                ["Third doc \u529b\u52a0.", "last line without a newline"]]
    assert documents == expected
    assert documents == _original_reader([path])
    assert stats == corpus.CorpusStats(files=1, documents=3, sentences=5, skipped_lines=0,
                                       characters=sum(len(s) for document in expected for s in document))


def test_sample_text_matches_original_reader():
    expected = _original_reader([SAMPLE_TEXT])
    documents = list(corpus.iter_documents(SAMPLE_TEXT))
    assert documents == expected
    assert len(documents) == 3
    assert documents[0][0].startswith("This text is included to make sure Unicode is handled properly: \u529b\u52a0")
    assert documents[-1][-1] == expected[-1][-1]


def test_document_without_trailing_blank_line_continues_into_next_file(tmp_path):
    # The original reader only starts documents at blank lines, never at file boundaries; parity keeps that.
    first = _write(tmp_path / "a.txt", "Doc one.\n\nDoc two starts.")
    second = _write(tmp_path / "b.txt", "Doc two ends.\n\nDoc three.\n")
    documents = list(corpus.iter_documents(f"{first},{second}"))
    assert documents == [["Doc one."], ["Doc two starts.", "Doc two ends."], ["Doc three."]]
    assert documents == _original_reader([first, second])


def test_reading_in_small_chunks_gives_the_same_lines(tmp_path, monkeypatch):
    text = "Alpha \u529b\u52a0\u52dd line.\nBeta.\n\nGamma \u00e9\u00e8.\n" * 3
    path = _write(tmp_path / "corpus.txt", text)
    expected = list(corpus.iter_documents(path))
    monkeypatch.setattr(corpus, "_READ_CHUNK_BYTES", 5)  # chunks end inside lines and inside UTF-8 characters
    assert list(corpus.iter_documents(path)) == expected == _original_reader([path])


def test_gzip_file_reads_like_plain_text(tmp_path):
    text = "One.\nTwo.\n\nThree.\n"
    plain = _write(tmp_path / "corpus.txt", text)
    packed = _write(tmp_path / "corpus.txt.gz", gzip.compress(text.encode("utf-8")))
    assert list(corpus.iter_documents(packed)) == list(corpus.iter_documents(plain)) == [["One.", "Two."], ["Three."]]


def test_globs_expand_sorted_and_patterns_keep_their_order(tmp_path):
    for name in ("b.txt", "c.txt", "a.txt"):
        _write(tmp_path / name, f"From {name}.\n\n")
    _write(tmp_path / "skip.md", "Not matched.\n")
    stats = corpus.CorpusStats()
    documents = list(corpus.iter_documents(str(tmp_path / "*.txt"), stats=stats))
    assert documents == [["From a.txt."], ["From b.txt."], ["From c.txt."]]
    assert stats.files == 3
    # Patterns keep the given order; a file matched twice is read once, where first named.
    source = f"{tmp_path / 'c.txt'}, {tmp_path / '*.txt'},{tmp_path / 'a.txt'}"
    assert list(corpus.iter_documents(source)) == [["From c.txt."], ["From a.txt."], ["From b.txt."]]


def test_missing_files_name_the_pattern(tmp_path):
    pattern = str(tmp_path / "*.nothing")
    with pytest.raises(FileNotFoundError, match=r"pattern .*\*\.nothing.* matches no file"):
        corpus.iter_documents(pattern)
    _write(tmp_path / "real.txt", "Text.\n")
    missing = str(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        corpus.iter_documents(f"{tmp_path / 'real.txt'},{missing}")
    with pytest.raises(IsADirectoryError, match=r"\*\.txt"):
        corpus.iter_documents(str(tmp_path))


def test_undecodable_line_is_skipped_and_counted(tmp_path, caplog):
    path = _write(tmp_path / "bad.txt", b"Good one.\n\xff\xfe broken \xc3\n Good two. \n\nNext doc.\n")
    stats = corpus.CorpusStats()
    with caplog.at_level(logging.WARNING, logger=corpus.__name__):
        documents = list(corpus.iter_documents(path, stats=stats))
    assert documents == [["Good one.", "Good two."], ["Next doc."]]
    assert stats.skipped_lines == 1
    assert stats.sentences == 3
    assert f"{path}:2" in caplog.text


def test_corpus_without_text_raises_naming_the_source(tmp_path):
    path = _write(tmp_path / "blank.txt", "\n   \n\t\n\n")
    documents = corpus.iter_documents(path)
    with pytest.raises(ValueError, match=rf"{path}.*no documents"):
        list(documents)


def test_unknown_text_format_raises():
    with pytest.raises(ValueError, match="text_format='markdown'"):
        corpus.iter_documents(SAMPLE_TEXT, text_format="markdown")


# ---------------------------------------------------------------------------------------------------------------
# Sentences and paragraphs


TRICKY_TEXT = ('Dr. Smith arrived at 3.30 p.m. on Monday. He said "Stop!" Then he left, e.g. for lunch, i.e. at '
               'noon. Was it late?  Yes!! Mr. J. Doe paid $4.50 etc. for the U.S. version.\n"Quoted start." '
               '(Parenthetical.) 2020 was a year... the end? no')


def test_rule_splitter_of_the_demo_corpus_on_tricky_text():
    assert demo_corpus.split_sentences_by_rules(TRICKY_TEXT) == [
        "Dr. Smith arrived at 3.30 p.m. on Monday.",
        'He said "Stop!"',
        "Then he left, e.g. for lunch, i.e. at noon.",
        "Was it late?",
        "Yes!!",
        "Mr. J. Doe paid $4.50 etc. for the U.S. version.",
        '"Quoted start."',
        "(Parenthetical.)",
        "2020 was a year... the end? no",
    ]
    assert demo_corpus.split_sentences_by_rules("  \n ") == []
    assert demo_corpus.split_sentences_by_rules("No final stop") == ["No final stop"]


def test_split_sentences_of_user_corpora_on_tricky_text():
    # sentencex: abbreviations, initials, decimals, prices and quotes as the rules have them, and it also ends a
    # sentence before a lower-case word ("no") where the rules cannot tell.
    assert corpus.split_sentences(TRICKY_TEXT) == [
        "Dr. Smith arrived at 3.30 p.m. on Monday.",
        'He said "Stop!"',
        "Then he left, e.g. for lunch, i.e. at noon.",
        "Was it late?",
        "Yes!!",
        "Mr. J. Doe paid $4.50 etc. for the U.S. version.",
        '"Quoted start."',
        "(Parenthetical.) 2020 was a year... the end?",
        "no",
    ]
    assert corpus.split_sentences("  \n ") == []
    assert corpus.split_sentences("No final stop") == ["No final stop"]


@pytest.mark.parametrize("text, sentences", [
    # Cases the rules get wrong (the first three) and ones both must keep whole.
    ("I live in the U.S. How about you?", ["I live in the U.S.", "How about you?"]),
    ("the model was trained for a week. it converged quickly.",
     ["the model was trained for a week.", "it converged quickly."]),
    ("今天天气很好。我们去公园吧！你觉得怎么样？", ["今天天气很好。", "我们去公园吧！", "你觉得怎么样？"]),
    ("Er war z. B. sehr müde. Dann ging er.", ["Er war z. B. sehr müde.", "Dann ging er."]),
    ("Pi is about 3.14159. The value of e is 2.718.", ["Pi is about 3.14159.", "The value of e is 2.718."]),
    ('"Are you coming?" she asked. "No."', ['"Are you coming?" she asked.', '"No."']),
    ("Version 2.0 ships in Jan. 2025. It is late.", ["Version 2.0 ships in Jan. 2025.", "It is late."]),
])
def test_split_sentences_of_user_corpora_on_hard_cases(text, sentences):
    assert corpus.split_sentences(text) == sentences


def test_paragraphs_format_makes_one_document_per_file(tmp_path):
    first = _write(tmp_path / "a.txt", "First paragraph line one\ncontinues here. Second sentence!\n\n  \n"
                                        "New paragraph? Yes.\n")
    second = _write(tmp_path / "b.txt", "\nOnly one.\n")
    _write(tmp_path / "c.txt", "\n\n")
    documents = list(corpus.iter_documents(str(tmp_path / "*.txt"), text_format="paragraphs"))
    assert documents == [["First paragraph line one continues here.", "Second sentence!", "New paragraph?", "Yes."],
                         ["Only one."]]
    assert list(corpus.iter_documents(f"{second},{first}", text_format="paragraphs"))[0] == ["Only one."]


# ---------------------------------------------------------------------------------------------------------------
# The demo corpus


@pytest.fixture(scope="module")
def demo_text():
    return corpus.demo_corpus_text()


def test_demo_corpus_is_deterministic_large_and_prose(demo_text):
    assert corpus.demo_corpus_text() == demo_text
    documents = corpus._documents_from_lines(demo_text.split("\n"))
    documents = list(documents)
    sentences = [sentence for document in documents for sentence in document]
    # Measured on CPython 3.11: 1.25 MB, 718 documents, 14.8k sentences; the floors leave room for other versions.
    assert len(demo_text.encode("utf-8")) > 1_000_000
    assert len(documents) > 500
    assert len(sentences) > 10_000
    assert demo_text.endswith("\n\n") and "\n\n\n" not in demo_text
    for sentence in sentences:
        visible = sentence.replace(" ", "")
        letters = sum(char.isalpha() for char in visible)
        assert sentence == sentence.strip() and letters >= 0.75 * len(visible), sentence
        assert ">>>" not in sentence and "::=" not in sentence, sentence
    assert 'The "if" statement is used for conditional execution:' in sentences  # pydoc topic "if"
    assert "Assignments to \"__debug__\" are illegal." in sentences  # pydoc topic "assert"
    assert "Return the number of items in a container." in sentences  # builtins.len


def test_demo_corpus_ignores_docstrings_rewritten_by_imported_packages(demo_text, monkeypatch):
    # Third-party packages edit standard-library docstrings when imported; the corpus must not see that.
    monkeypatch.setattr(textwrap.dedent, "__doc__", "An edited docstring that must not reach the corpus.")
    assert "An edited docstring" not in corpus.demo_corpus_text()
    assert inspect.cleandoc(textwrap.__doc__).splitlines()[0] in demo_text


def test_demo_source_and_written_file_give_the_same_documents(tmp_path, demo_text):
    path = str(tmp_path / "demo.txt")
    written = corpus.write_demo_corpus(path)
    with open(path, encoding="utf-8") as file:
        assert file.read() == demo_text
    stats = corpus.CorpusStats()
    from_demo = list(corpus.iter_documents("demo", stats=stats))
    assert list(corpus.iter_documents(path)) == from_demo
    assert written == dataclasses.replace(stats, files=1)  # the one file written; reading "demo" opens none
    assert stats.documents == len(from_demo) and stats.sentences == sum(map(len, from_demo))
    assert stats.characters == sum(len(sentence) for document in from_demo for sentence in document)


# ---------------------------------------------------------------------------------------------------------------
# TensorFlow Datasets


WIKI40B_ARTICLE = ("\n_START_ARTICLE_\nBlazing Star\n_START_SECTION_\nHistory\n_START_PARAGRAPH_\n"
                   "The rain had ceased. Dr. Gray awoke._NEWLINE_A second paragraph.\n_START_SECTION_\nLater\n"
                   "_START_PARAGRAPH_\nThe end came? It did.")


@functools.cache
def _tiny_dataset_builder_class():
    """Defined once per process: TFDS registers every builder class by name and refuses a second one."""
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

    class CorpusTestArticles(tfds.core.GeneratorBasedBuilder):
        """Three articles: Wiki-40B markup, plain lines, and nothing but markers."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, disable_shuffling=True, features=tfds.features.FeaturesDict(
                {"text": tfds.features.Text(), "title": tfds.features.Text(), "id": tfds.features.Scalar(np.int64)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            texts = [WIKI40B_ARTICLE, "Plain first line. Still first.\nSecond line.", "_START_ARTICLE_\nTitle only"]
            for index, text in enumerate(texts):
                yield index, {"text": text, "title": f"Article {index}.", "id": index}

    return CorpusTestArticles


def _prepare_tiny_dataset(data_dir):
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

    builder = _tiny_dataset_builder_class()(data_dir=data_dir)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))


def test_tfds_prepared_dataset_documents(tmp_path, monkeypatch, network_attempts):
    _prepare_tiny_dataset(str(tmp_path))
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    stats = corpus.CorpusStats()
    documents = list(corpus.iter_documents("tfds:corpus_test_articles:train:text", stats=stats))
    assert documents == [
        ["The rain had ceased.", "Dr. Gray awoke.", "A second paragraph.", "The end came?", "It did."],
        ["Plain first line.", "Still first.", "Second line."],
    ]
    assert stats.documents == 2 and stats.sentences == 8
    assert list(corpus.iter_documents("tfds:corpus_test_articles:train[1:]:title")) == [["Article 1."], ["Article 2."]]
    with pytest.raises(ValueError, match=r"no text field 'id'.*\['text', 'title'\]"):
        corpus.iter_documents("tfds:corpus_test_articles:train:id")
    with pytest.raises(ValueError, match=r"bad split 'validation'.*\['train'\]"):
        corpus.iter_documents("tfds:corpus_test_articles:validation")
    assert not network_attempts


def test_tfds_mock_data_reads_without_network(network_attempts):
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

    with tfds.testing.mock_data(num_examples=5):
        documents = list(corpus.iter_documents("tfds:wiki40b/en"))
    assert len(documents) == 5
    assert all(len(document) == 1 and document[0].strip() for document in documents)
    assert not network_attempts


def test_tfds_dataset_not_prepared_fails_fast_without_download(tmp_path, monkeypatch, network_attempts):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"'imdb_reviews' is not prepared.*tfds build imdb_reviews"):
        corpus.iter_documents("tfds:imdb_reviews:train:text")
    with pytest.raises(ValueError, match="no dataset 'no_such_corpus_dataset'"):
        corpus.iter_documents("tfds:no_such_corpus_dataset")
    with pytest.raises(ValueError, match="tfds:NAME"):
        corpus.iter_documents("tfds:imdb_reviews:train:text:extra")
    assert not network_attempts
