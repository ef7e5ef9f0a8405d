"""Token classification data: CoNLL reading, IOB1 to IOB2, first-piece labels, long sentences split, not cut."""

import pytest

from bert_jax.data import conll
from bert_jax.data import tokenization
from tests import helpers

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC
call NN I-NP O

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER
"""


@pytest.fixture(scope="module")
def tokenizer():
    return tokenization.load_tokenizer(f"{helpers.FIXTURES}/vocab_uncased.txt")


def test_read_conll_skips_document_starts_and_takes_the_last_column(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(CONLL)
    sentences = conll.read_conll(str(path))
    assert [(s.words, s.tags, s.line) for s in sentences] == [
        (["EU", "rejects", "German", "call"], ["I-ORG", "O", "I-MISC", "O"], 3),
        (["Peter", "Blackburn"], ["I-PER", "I-PER"], 8)]
    assert [conll.to_iob2(s.tags) for s in sentences] == [["B-ORG", "O", "B-MISC", "O"], ["B-PER", "I-PER"]]


def test_iob1_b_tags_between_adjacent_entities_and_iob2_unchanged():
    assert conll.to_iob2(["I-PER", "B-PER", "I-PER", "I-LOC", "O", "I-LOC"]) == \
        ["B-PER", "B-PER", "I-PER", "B-LOC", "O", "B-LOC"]
    iob2 = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC"]
    assert conll.to_iob2(iob2) == iob2


def test_a_line_without_a_tag_is_named_by_its_number(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("EU B-ORG\nrejects\n")
    with pytest.raises(ValueError, match=rf"--config.data.train_file={path}: line 2 \('rejects'\) has no tag"):
        conll.read_conll(str(path))


def test_first_piece_carries_the_label_and_long_sentences_continue_in_the_next_row(tokenizer):
    words = ["the", "unaffable", "man", "walked"]
    pieces = tokenizer.encode_batch(words)
    assert [len(ids) for ids in pieces] == [1, 3, 1, 1]  # un ##aff ##able, as the original vocabulary splits it
    sentence = conll.Sentence(words, ["O", "B-X", "I-X", "O"], 1)
    labels = {"O": 0, "B-X": 1, "I-X": 2}
    rows = conll.encode(tokenizer, [sentence], labels, max_seq_length=16)
    ignore = conll.IGNORE
    assert rows.input_ids[0, :9].tolist() == [tokenizer.cls_id, *sum(pieces, []), tokenizer.sep_id, tokenizer.pad_id]
    assert rows.labels[0, :9].tolist() == [ignore, 0, 1, ignore, ignore, 2, 0, ignore, ignore]
    assert rows.input_mask[0].sum() == 8 and len(rows.sentence) == 1
    # Four pieces per row at most: split between words, every word still labelled once, nothing dropped.
    split = conll.encode(tokenizer, [sentence], labels, max_seq_length=6)
    assert split.sentence.tolist() == [0, 0]
    assert split.input_ids[1, 1:4].tolist() == [*pieces[2], *pieces[3], tokenizer.sep_id]  # row 2 starts at word 3
    assert split.labels[0].tolist() == [ignore, 0, 1, ignore, ignore, ignore]
    assert split.labels[1, :4].tolist() == [ignore, 2, 0, ignore]
    words_back = conll.words_of_rows(split, [sentence], split.labels)
    assert words_back == [[0, 1, 2, 0]]
    with pytest.raises(ValueError, match=r"line 2: the word 'unaffable' has more WordPieces than "
                                         r"data.max_seq_length=4 holds"):
        conll.encode(tokenizer, [sentence], labels, max_seq_length=4)


def test_predictions_file_has_the_inputs_layout(tmp_path):
    sentences = [conll.Sentence(["EU", "rejects"], ["B-ORG", "O"], 1), conll.Sentence(["Peter"], ["B-PER"], 4)]
    conll.write_predictions(str(tmp_path / "p.txt"), sentences, [["B-ORG", "O"], ["O"]])
    assert (tmp_path / "p.txt").read_text() == "EU B-ORG B-ORG\nrejects O O\n\nPeter B-PER O\n\n"
