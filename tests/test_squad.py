"""SQuAD question answering data: reading and its errors, windows over long passages, answers back from logits in
the context's own characters, and the official EM/F1 scores."""

import json
import os
import re

import numpy as np
import pytest

from bert_jax.data import squad
from bert_jax.data import tokenization
from bert_jax.data import vocabulary
from tests import helpers

QA_TASK = os.path.join(helpers.ROOT, "tests", "fixtures", "qa_task")


@pytest.fixture(scope="module")
def tokenizer():
    return tokenization.load_tokenizer(f"{helpers.FIXTURES}/vocab_uncased.txt")


def _question(qas_id, question, context, answer=None, occurrence=0, **extra):
    answers = []
    if answer is not None:
        start = -1
        for _ in range(occurrence + 1):
            start = context.index(answer, start + 1)
        answers = [{"text": answer, "answer_start": start}]
    return {"id": qas_id, "question": question, "answers": answers, **extra}


def _write(tmp_path, paragraphs, name="train.json", version="1.1"):
    path = tmp_path / name
    path.write_text(json.dumps({"version": version, "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return str(path)


def _oracle_logits(windows):
    """Logits that peak at each window's gold start/end pieces (position 0 for windows without the answer)."""
    starts = np.full(windows.input_ids.shape, -4.0)
    ends = starts.copy()
    rows = np.arange(len(windows))
    starts[rows, windows.start_positions] = 8.0
    ends[rows, windows.end_positions] = 8.0
    return starts, ends


# The official scores, worked by hand.


def test_normalize_answer_drops_case_punctuation_articles_and_extra_space():
    assert squad.normalize_answer("The  Eiffel-Tower, an icon!") == "eiffeltower icon"
    # "a" only as a whole word: "apple" keeps its a.
    assert squad.normalize_answer("A apple a day") == "apple day"


def test_exact_match_and_f1_by_hand():
    # "the Eiffel Tower" and "Eiffel Tower" both normalise to "eiffel tower".
    assert squad.exact_match("the Eiffel Tower", "Eiffel Tower") == 1.0
    assert squad.f1("the Eiffel Tower", "Eiffel Tower") == 1.0
    # "Paris, France" -> [paris, france] vs [paris]: 1 shared; precision 1/2, recall 1/1,
    # F1 = 2 * (1/2 * 1) / (1/2 + 1) = 2/3.
    assert squad.exact_match("Paris, France", "Paris") == 0.0
    assert squad.f1("Paris, France", "Paris") == pytest.approx(2 / 3)
    # [in, 1895, paris] vs [1895, in, lyon]: 2 shared; precision 2/3, recall 2/3, F1 = 2/3.
    assert squad.f1("in 1895, Paris", "1895 in Lyon") == pytest.approx(2 / 3)
    # Repeated tokens count by multiplicity: [a, a] -> "a" is an article, so use [x, x, y] vs [x, y, y]:
    # shared = min(2,1) + min(1,2) = 2; precision 2/3, recall 2/3.
    assert squad.f1("x x y", "x y y") == pytest.approx(2 / 3)
    assert squad.f1("Lyon", "Paris") == 0.0
    # v2.0: an empty normalised answer scores 1 only against another empty one ("The." normalises to "").
    assert squad.f1("", "") == 1.0 and squad.f1("The.", "") == 1.0 and squad.exact_match("", "the") == 1.0
    assert squad.f1("", "Paris") == 0.0 and squad.f1("Paris", "") == 0.0


def _example(qas_id, answers, impossible=False):
    return squad.Example(qas_id, "q?", "c", ["c"], [0], answers, -1, -1, impossible)


def test_evaluate_takes_the_best_gold_answer_and_counts_missing_questions_as_zero():
    examples = [_example("1", ["Paris", "Paris, France"]), _example("2", ["1895"]), _example("3", ["Lyon"])]
    # q1: "France" vs "Paris, France": EM 0, F1 = 2 * (1 * 1/2) / (1 + 1/2) = 2/3 (vs "Paris": 0).
    # q2: exact. q3: missing -> 0. Means: EM (0 + 1 + 0) / 3, F1 (2/3 + 1 + 0) / 3 = 5/9.
    result = squad.evaluate(examples, {"1": "France", "2": "1895"})
    assert result["exact_match"] == pytest.approx(1 / 3)
    assert result["f1"] == pytest.approx(5 / 9)
    assert result["missing"] == 1 and result["total"] == 3 and "no_answer_f1" not in result


def test_evaluate_v2_splits_answerable_and_unanswerable_questions():
    examples = [_example("1", ["Paris"]), _example("2", [], impossible=True), _example("3", [], impossible=True)]
    # q1 right (1, 1); q2 abstains correctly (gold [""]): (1, 1); q3 answers "Lyon": (0, 0).
    result = squad.evaluate(examples, {"1": "Paris", "2": "", "3": "Lyon"})
    assert result["exact_match"] == pytest.approx(2 / 3) and result["f1"] == pytest.approx(2 / 3)
    assert result["has_answer_exact_match"] == 1.0 and result["has_answer_total"] == 1
    assert result["no_answer_f1"] == 0.5 and result["no_answer_total"] == 2


# Reading.


def test_read_squad_splits_words_as_the_original_and_finds_the_answer_words(tmp_path):
    context = "Marie  Curie was born\tin Warsaw (1867).\n She moved."
    path = _write(tmp_path, [{"context": context, "qas": [
        _question("q1", "Where was she born?", context, "Warsaw (1867)"),
        _question("q2", "Born?", context, "1867")]}])
    first, second = squad.read_squad(path)
    assert first.words == ["Marie", "Curie", "was", "born", "in", "Warsaw", "(1867).", "She", "moved."]
    assert first.word_starts == [0, 7, 13, 17, 22, 25, 32, 41, 45]
    assert (first.start_word, first.end_word, first.answers, first.is_impossible) == (5, 6, ["Warsaw (1867)"], False)
    assert (second.start_word, second.end_word) == (6, 6)


def test_an_answer_that_its_words_do_not_hold_is_skipped_and_counted(tmp_path, caplog):
    # A no-break space is no word boundary for the original, but str.split() cuts the answer there: the
    # whitespace-normalised answer "1 000" is not inside the word "1\u00a0000", so the original skips it.
    context = "About 1\u00a0000 people live in Paris."
    path = _write(tmp_path, [{"context": context, "qas": [
        _question("kept", "Where?", context, "Paris"), _question("gone", "How many?", context, "1\u00a0000")]}])
    examples = squad.read_squad(path)
    assert [example.qas_id for example in examples] == ["kept"]
    assert "skipped 1 question(s) whose answer text" in caplog.text and "'gone'" in caplog.text
    # Outside training it is kept (scored on its text), without a position.
    gone = squad.read_squad(path, training=False)[1]
    assert (gone.qas_id, gone.start_word, gone.answers) == ("gone", -1, ["1\u00a0000"])


def test_v2_unanswerable_questions(tmp_path):
    context = "Paris is large."
    path = _write(tmp_path, [{"context": context, "qas": [
        {"id": "no", "question": "Why?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "large", "answer_start": 9}]}]}], version="v2.0")
    (example,) = squad.read_squad(path)
    assert (example.answers, example.start_word, example.end_word, example.is_impossible) == ([], -1, -1, True)


def test_an_answer_not_at_its_answer_start_is_an_error_naming_file_question_and_fix(tmp_path):
    context = "Lyon and Paris are cities."
    path = _write(tmp_path, [{"context": context, "qas": [
        {"id": "q17", "question": "Which?", "answers": [{"text": "Paris", "answer_start": 0}]}]}])
    with pytest.raises(ValueError, match=rf"^question 'q17' in --config.data.train_file={path}: answer 'Paris' is "
                                         r"not at answer_start=0 \(the context has 'Lyon ' there\)\. Fix: "):
        squad.read_squad(path)


@pytest.mark.parametrize("text, message", [
    ("{not json", r"--config.data.dev_file=.*dev.json is not JSON \(.*\)\. Fix: pass a SQuAD"),
    ('{"version": "1.1"}', r"--config.data.dev_file=.*dev.json is not SQuAD JSON: it has no top-level \"data\""),
    ('{"data": [{"title": "x"}]}', r"dev.json: data\[0\] has no \"paragraphs\" list"),
    ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "q1", "answers": []}]}]}]}',
     r"^question 'q1' in --config.data.dev_file=.*dev.json has no str field \"question\""),
    ('{"data": [{"paragraphs": [{"qas": []}]}]}', r"^a paragraph in .*dev.json has no str field \"context\""),
])
def test_a_file_that_is_not_squad_is_named_with_its_flag(tmp_path, text, message):
    path = tmp_path / "dev.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        squad.read_squad(str(path), field="data.dev_file")


def test_a_training_question_without_answers_must_be_marked_impossible(tmp_path):
    path = _write(tmp_path, [{"context": "Paris.", "qas": [{"id": "q3", "question": "Which?", "answers": []}]}])
    with pytest.raises(ValueError, match=r"^question 'q3' in .* has no answers and is not marked \"is_impossible\""):
        squad.read_squad(path)
    assert squad.read_squad(path, training=False)[0].answers == []  # scored against [""] when evaluating


# Windows and answers back from logits.


def _long_context():
    # About 60 words of filler, then the answer sentence: with max_seq_length=32 the answer lies in a later window.
    filler = " ".join(f"the {word} was new in that year." for word in
                      ("city", "river", "bridge", "school", "church", "market", "station", "garden", "museum"))
    return filler + " The painter Jean Dupont was born (1895–1943) in Paris, at the Café Rouge."


@pytest.fixture(scope="module")
def long_examples(tmp_path_factory):
    context = _long_context()
    short = "Marie Curie (unaffable) discovered polonium in 1898."
    path = _write(tmp_path_factory.mktemp("squad"), [
        {"context": context, "qas": [_question("born", "When was the painter born?", context, "1895"),
                                     _question("where", "Where was he born?", context, "Paris"),
                                     _question("cafe", "Which café?", context, "Café Rouge"),
                                     _question("first", "What was new?", context, "the city")]},
        {"context": short, "qas": [_question("what", "What did Marie Curie discover?", short, "polonium")]}])
    return squad.read_squad(path)


def test_windows_slide_by_doc_stride_and_label_the_answer_only_where_it_wholly_lies(tokenizer, long_examples):
    windows = squad.encode(tokenizer, long_examples, max_seq_length=32, doc_stride=8, max_query_length=10)
    assert windows.input_ids.shape == (len(windows), 32) and windows.input_ids.dtype == np.int32
    assert windows.example.dtype == np.int64 and windows.start_positions.dtype == np.int32
    born = np.flatnonzero(windows.example == 0)
    assert len(born) > 3  # one passage, several windows
    labelled = [row for row in born if windows.start_positions[row] > 0]
    assert labelled and labelled[0] != born[0]  # the answer is not in the first window
    for row in range(len(windows)):
        ids, mask = windows.input_ids[row], windows.input_mask[row]
        length = int(mask.sum())
        assert ids[0] == tokenizer.cls_id and ids[length - 1] == tokenizer.sep_id and (ids[length:] == 0).all()
        query = int(np.argmax(ids == tokenizer.sep_id))  # the first [SEP] closes the question
        segments = windows.segment_ids[row]
        assert (segments[:query + 1] == 0).all() and (segments[query + 1:length] == 1).all()
        assert (windows.token_to_word[row, query + 1:length - 1] >= 0).all()
        start, end = windows.start_positions[row], windows.end_positions[row]
        if start:
            gold = long_examples[windows.example[row]].answers[0]
            # The labelled pieces decode to the answer (the vocabulary is uncased and strips accents).
            assert tokenizer.decode(ids[start:end + 1]) == tokenizer.decode(tokenizer.encode_batch([gold])[0])
    # Each passage piece has exactly one window that gives it the most context.
    for index in range(len(long_examples)):
        rows = np.flatnonzero(windows.example == index)
        seen = [(windows.token_to_word[r][windows.max_context[r]]).tolist() for r in rows]
        assert sum(len(s) for s in seen) == sum(len(tokenizer.encode_batch([w])[0]) for w in long_examples[index].words)


def test_max_context_is_the_originals_best_window():
    spans = squad._spans(50, 16, 5)
    best = squad._max_context_window(spans, 50)
    for position in range(50):
        # The original's _check_is_max_context, literally: the first window with the highest score wins.
        scores = [min(position - start, start + size - 1 - position) + 0.01 * size if start <= position < start + size
                  else None for start, size in spans]
        assert best[position] == scores.index(max(s for s in scores if s is not None))


def test_peaked_logits_give_back_the_gold_text_in_the_contexts_own_characters(tokenizer, long_examples):
    windows = squad.encode(tokenizer, long_examples, max_seq_length=32, doc_stride=8, max_query_length=10)
    predictions, nbest, null_odds = squad.predict(long_examples, windows, *_oracle_logits(windows))
    # "1895" is one piece of the word "(1895–1943)": the answer is that piece's characters, not the whole word;
    # "Café Rouge" keeps its case and accent though the vocabulary saw "cafe rouge".
    assert predictions == {"born": "1895", "where": "Paris", "cafe": "Café Rouge", "first": "the city",
                           "what": "polonium"}
    assert null_odds == {}
    top = nbest["born"][0]
    assert top["text"] == "1895" and top["start_logit"] == 8.0 and top["end_logit"] == 8.0
    assert sum(entry["probability"] for entry in nbest["born"]) == pytest.approx(1.0)
    assert squad.evaluate(long_examples, predictions) == {"exact_match": 1.0, "f1": 1.0, "total": 5, "missing": 0}


def test_a_span_of_sub_word_pieces_gives_exactly_their_characters(tokenizer, long_examples):
    (example,) = [e for e in long_examples if e.qas_id == "what"]
    windows = squad.encode(tokenizer, [example], max_seq_length=40, doc_stride=8, max_query_length=10)
    tokens = tokenizer.convert_ids_to_tokens(windows.input_ids[0])
    una = tokens.index("una")
    assert tokens[una - 1:una + 4] == ["(", "una", "##ffa", "##ble", ")"]
    starts, ends = np.zeros((2, *windows.input_ids.shape))
    starts[0, una + 1] = ends[0, una + 2] = 5.0
    assert squad.predict([example], windows, starts, ends)[0] == {"what": "ffable"}
    starts[0, una + 1], starts[0, una - 1] = 0.0, 9.0
    assert squad.predict([example], windows, starts, ends)[0] == {"what": "(unaffable"}


def test_v2_answers_nothing_when_the_null_score_beats_the_best_span_by_more_than_the_threshold(tokenizer, tmp_path):
    context = "Paris is the capital of France."
    path = _write(tmp_path, [{"context": context, "qas": [_question("q", "What is the capital?", context, "Paris")]}])
    examples = squad.read_squad(path)
    windows = squad.encode(tokenizer, examples, max_seq_length=32, doc_stride=8, max_query_length=10)
    paris = windows.start_positions[0]
    starts, ends = np.zeros((2, 1, 32))
    starts[0, 0] = ends[0, 0] = 2.0  # null score 4
    starts[0, paris] = ends[0, paris] = 1.5  # best span 3: null odds 4 - 3 = 1
    for threshold, expected in ((0.0, ""), (0.99, ""), (1.0, "Paris"), (1.5, "Paris")):
        predictions, nbest, null_odds = squad.predict(examples, windows, starts, ends, version_2_with_negative=True,
                                                      null_score_diff_threshold=threshold)
        assert predictions == {"q": expected} and null_odds == {"q": pytest.approx(1.0)}, threshold
    assert [entry["text"] for entry in nbest["q"]][:2] == ["", "Paris"]
    # v1.1 never abstains.
    assert squad.predict(examples, windows, starts, ends)[0] == {"q": "Paris"}


def test_write_predictions_is_the_official_json(tmp_path):
    path = str(tmp_path / "predictions.json")
    squad.write_predictions(path, {"q1": "Café", "q2": ""})
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == {"q1": "Café", "q2": ""}


def test_window_length_errors_name_the_flag_and_the_fix(tokenizer, long_examples):
    with pytest.raises(ValueError, match=r"^--config.data.max_query_length=29 leaves no room for the passage in a "
                                         r"window of data.max_seq_length=32 .* Fix: "):
        squad.encode(tokenizer, long_examples, max_seq_length=32, doc_stride=8, max_query_length=29)
    with pytest.raises(ValueError, match=r"^--config.data.doc_stride=0 must be positive"):
        squad.encode(tokenizer, long_examples, max_seq_length=32, doc_stride=0, max_query_length=10)
    with pytest.raises(ValueError, match=r"^--config.data.doc_stride=20 exceeds the 19 passage pieces a window of "
                                         r"data.max_seq_length=32 holds: passage of question 'born' .* Fix: set "
                                         r"data.doc_stride to at most 19"):
        squad.encode(tokenizer, long_examples, max_seq_length=32, doc_stride=20, max_query_length=10)
    # A stride that large is harmless when every passage fits in one window.
    short = [e for e in long_examples if e.qas_id == "what"]
    assert len(squad.encode(tokenizer, short, max_seq_length=32, doc_stride=20, max_query_length=10)) == 1


def test_piece_spans_map_lower_cased_accent_stripped_pieces_back_to_the_original_characters(tokenizer):
    # "İ" lower-cases to two characters and "ï" loses its accent: the spans still fall on the word's own letters.
    words = ["İSTANBUL's", "Naïve", "(1895–1943)", "café."]
    example = squad.Example("q", "?", " ".join(words), words, [0, 11, 17, 29], [], -1, -1, False)
    (passage,) = squad._passages(tokenizer, [example])
    texts = [example.context[s:e] for s, e in zip(passage.char_start, passage.char_end)]
    assert tokenizer.convert_ids_to_tokens(passage.ids) == ["istanbul", "'", "s", "naive", "(", "1895", "–", "1943",
                                                            ")", "cafe", "."]
    assert texts == ["İSTANBUL", "'", "s", "Naïve", "(", "1895", "–", "1943", ")", "café", "."]
    cased = tokenization.WordPieceTokenizer(tokenization.SPECIAL_TOKENS + ("Na", "##ïve", "x"), do_lower_case=False)
    (passage,) = squad._passages(cased, [squad.Example("q", "?", "Naïve", ["Naïve"], [0], [], -1, -1, False)])
    assert (passage.char_start, passage.char_end) == ([0, 2], [2, 5])


def test_sentencepiece_answers_come_back_exactly(tmp_path):
    with open(os.path.join(QA_TASK, "train.json"), encoding="utf-8") as f:
        texts = [p["context"] for p in json.load(f)["data"][0]["paragraphs"]]
    sentencepiece = vocabulary.train_sentencepiece(texts, vocab_size=80, output_dir=str(tmp_path / "spm"))
    examples = squad.read_squad(os.path.join(QA_TASK, "dev.json"))
    windows = squad.encode(sentencepiece, examples, max_seq_length=256, doc_stride=64, max_query_length=32)
    assert (windows.start_positions > 0).all()
    predictions = squad.predict(examples, windows, *_oracle_logits(windows))[0]
    # The answers end sentences ("... the list."): the span is tightened to the answer's own pieces, without ".".
    assert all(predictions[e.qas_id] == e.answers[0] for e in examples)


def test_duplicate_question_ids_are_refused(tmp_path):
    qas = [_question("q1", "Which?", "Paris.", "Paris"), _question("q1", "Again?", "Paris.", "Paris")]
    path = _write(tmp_path, [{"context": "Paris.", "qas": qas}])
    with pytest.raises(ValueError, match=r"^question 'q1' in .* appears twice"):
        squad.read_squad(path)


# The shipped QA task: a synthetic SQuAD v1.1 dataset a tiny BERT can learn.

# Each template states one relation of a named thing; its question names the same kind, name and relation words,
# so the answer is found by matching the question to its sentence. (kind, names, sentence, question, answers)
QA_TEMPLATES = (
    ("function", ("read", "write", "open", "load", "dump", "split", "join", "parse", "format", "sort"),
     "The function {name} will return the {answer}.", "What will the function {name} return?",
     ("int", "float", "str", "bool", "dict", "list", "string", "number")),
    ("module", ("json", "sys", "math", "os", "io", "time", "random", "string"),
     "The module {name} will define the class {answer}.", "Which class will the module {name} define?",
     ("decoder", "encoder", "reader", "writer", "parser", "buffer", "counter", "queue")),
    ("method", ("get", "set", "add", "pop", "copy", "update", "clear", "find"),
     "The method {name} will take the {answer} argument.", "Which argument will the method {name} take?",
     ("file name", "line number", "default value", "key path", "data type", "first line", "new text")),
    ("class", ("decoder", "encoder", "reader", "writer", "parser", "buffer", "counter", "queue"),
     "The class {name} will store the {answer} of each object.", "What will the class {name} store?",
     ("name", "path", "value", "key", "result", "text", "type", "data")),
)


def _qa_paragraph(rng, index, seed, questions):
    """A paragraph of 3 or 4 template sentences, each of another template (so the question's kind and relation
    words point at one sentence), and up to `questions` questions."""
    sentences, facts = [], []
    for template in rng.permutation(len(QA_TEMPLATES))[:int(rng.integers(3, 5))]:
        kind, names, sentence, question, answers = QA_TEMPLATES[int(template)]
        name, answer = str(rng.choice(names)), str(rng.choice(answers))
        prefix = " ".join(sentences + [sentence.split("{answer}")[0].format(name=name)])
        facts.append((question.format(name=name), answer, len(prefix)))
        sentences.append(sentence.format(name=name, answer=answer))
    context = " ".join(sentences)
    asked = rng.permutation(len(facts))[:questions]
    qas = [{"id": f"qa{seed}-{index}-{int(k)}", "question": facts[k][0],
            "answers": [{"text": facts[k][1], "answer_start": facts[k][2]}]} for k in asked]
    return {"context": context, "qas": qas}


def squad_examples(count, seed):
    """A SQuAD v1.1 dataset of `count` questions, two per paragraph, over Python-documentation words.
    tests/fixtures/qa_task holds train.json = squad_examples(1280, 0) and dev.json = squad_examples(160, 1); with
    the uncased BERT vocabulary every question and paragraph fits one window of 96 pieces (at most 69)."""
    rng = np.random.default_rng(seed)
    paragraphs = []
    while sum(len(p["qas"]) for p in paragraphs) < count:
        left = count - sum(len(p["qas"]) for p in paragraphs)
        paragraphs.append(_qa_paragraph(rng, len(paragraphs), seed, min(2, left)))
    return {"version": "1.1", "data": [{"title": f"qa_task_{seed}", "paragraphs": paragraphs}]}


def _qa_task_text(count, seed):
    return json.dumps(squad_examples(count, seed), indent=None)


def test_the_shipped_qa_task_is_its_generators_output():
    for name, count, seed in (("train.json", 1280, 0), ("dev.json", 160, 1)):
        with open(os.path.join(QA_TASK, name), encoding="utf-8") as f:
            assert f.read() == _qa_task_text(count, seed), name


def test_the_qa_task_reads_encodes_and_round_trips_with_peaked_logits(tokenizer):
    examples = squad.read_squad(os.path.join(QA_TASK, "train.json"))
    assert len(examples) == 1280 and len({e.qas_id for e in examples}) == 1280
    for example in examples:  # the question's kind and name open exactly one sentence of its paragraph
        subject = re.search(r" the (\w+ \w+)", example.question).group(1)
        assert example.context.count(f"The {subject} will ") == 1, example.qas_id
    windows = squad.encode(tokenizer, examples, max_seq_length=128, doc_stride=64, max_query_length=16)
    assert len(windows) == len(examples)  # one window each at 128: the task needs no sliding
    assert (windows.start_positions > 0).all()
    predictions = squad.predict(examples, windows, *_oracle_logits(windows))[0]
    assert squad.evaluate(examples, predictions)["exact_match"] == 1.0
    assert all(predictions[e.qas_id] == e.answers[0] for e in examples)


def squad_v2_examples(count, seed):
    """squad_examples in SQuAD v2.0 form with every third question unanswerable: it asks about a named thing its
    paragraph does not mention (not shipped; for tests)."""
    data = squad_examples(count, seed)
    rng = np.random.default_rng(seed + 1000)
    number = 0
    for paragraph in data["data"][0]["paragraphs"]:
        for qa in paragraph["qas"]:
            qa["is_impossible"] = number % 3 == 2
            if qa["is_impossible"]:
                kind, names, _, question, _ = QA_TEMPLATES[int(rng.integers(len(QA_TEMPLATES)))]
                absent = [name for name in names if f"The {kind} {name} " not in paragraph["context"]]
                qa["question"], qa["answers"] = question.format(name=str(rng.choice(absent))), []
            number += 1
    data["version"] = "v2.0"
    return data


def test_v2_unanswerable_questions_round_trip_and_score_apart(tokenizer, tmp_path):
    path = tmp_path / "dev-v2.json"
    path.write_text(json.dumps(squad_v2_examples(30, 2)))
    examples = squad.read_squad(str(path))
    assert sum(e.is_impossible for e in examples) == 10
    windows = squad.encode(tokenizer, examples, max_seq_length=128, doc_stride=64, max_query_length=16)
    starts, ends = _oracle_logits(windows)  # unanswerable: the peak is at [CLS]
    predictions, _, null_odds = squad.predict(examples, windows, starts, ends, version_2_with_negative=True)
    assert all(predictions[e.qas_id] == (e.answers[0] if e.answers else "") for e in examples)
    assert all((null_odds[e.qas_id] > 0) == e.is_impossible for e in examples)
    result = squad.evaluate(examples, predictions)
    assert result["exact_match"] == 1.0 and result["no_answer_total"] == 10 and result["has_answer_f1"] == 1.0
