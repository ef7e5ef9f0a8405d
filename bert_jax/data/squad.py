"""Extractive question answering on SQuAD v1.1 / v2.0 JSON, as google-research/bert's run_squad.py does it: read the
questions, cut each passage into overlapping windows of pieces after the question, turn start/end logits back into
answer text, and score answers as the official evaluation scripts do (as fractions, not percentages).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import json
import math
import re
import string

import numpy as np
from absl import logging

from bert_jax import fileio


@dataclasses.dataclass
class Example:
    qas_id: str
    question: str
    context: str  # the paragraph's original text
    words: list[str]  # the context split on whitespace (the original's doc_tokens)
    word_starts: list[int]  # character offset of each word in `context`
    answers: list[str]  # every gold answer text ([] for a v2.0 unanswerable question)
    start_word: int  # the first answer's first/last word, -1 when unanswerable (or, outside training, unmatched)
    end_word: int
    is_impossible: bool


# Reading.


def _is_whitespace(char: str) -> bool:
    # The original's is_whitespace: NOT str.isspace, so a no-break space stays inside a word, as in its doc_tokens.
    return char in " \t\r\n" or ord(char) == 0x202F


def split_words(context: str) -> tuple[list[str], list[int]]:
    """The context's whitespace-separated words and the character offset of each."""
    words, starts, previous_space = [], [], True
    for offset, char in enumerate(context):
        if _is_whitespace(char):
            previous_space = True
        elif previous_space:
            words.append(char)
            starts.append(offset)
            previous_space = False
        else:
            words[-1] += char
    return words, starts


def _load_articles(path: str, where: str) -> list:
    fix = ("Fix: pass a SQuAD v1.1/v2.0 JSON file: {\"version\": ..., \"data\": [{\"title\": ..., \"paragraphs\": "
           "[{\"context\": ..., \"qas\": [{\"id\", \"question\", \"answers\": [{\"text\", \"answer_start\"}]}]}]}]}")
    with fileio.open_file(path, "rb") as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{where} is not JSON ({str(error).splitlines()[0]}). {fix}") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError(f"{where} is not SQuAD JSON: it has no top-level \"data\" list. {fix}")
    for number, article in enumerate(data["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise ValueError(f"{where}: data[{number}] has no \"paragraphs\" list. {fix}")
    return data["data"]


def _field(record, key: str, kind: type, what: str, where: str):
    value = record.get(key) if isinstance(record, dict) else None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or isinstance(value, bool):
        names = " or ".join(k.__name__ for k in kinds)
        raise ValueError(f"{what} in {where} has no {names} field \"{key}\" (got {value!r:.60}). Fix: "
                         f"every paragraph needs \"context\" and \"qas\"; every question \"id\", \"question\", "
                         f"\"answers\" (a list of {{\"text\", \"answer_start\"}})")
    return value


def _answer_words(qas_id: str, answer, context: str, starts: list[int], where: str) -> tuple[str, int, int]:
    """The answer's text and its first/last word; an answer not found at its answer_start is an error."""
    what = f"question {qas_id!r}"
    text = _field(answer, "text", str, what + "'s answer", where)
    start = _field(answer, "answer_start", int, what + "'s answer", where)
    found = context[start:start + len(text)] if start >= 0 else ""
    if found != text or not text:
        raise ValueError(f"{what} in {where}: answer {text!r} is not at answer_start={start} (the context has "
                         f"{found!r} there). Fix: answer_start must be the offset of the answer's first character "
                         f"in the paragraph's context, and the text exactly the context's characters from there")
    first = max(bisect.bisect_right(starts, start) - 1, 0)
    last = max(bisect.bisect_right(starts, start + len(text) - 1) - 1, 0)
    return text, first, last


def _read_question(qa, context: str, words: list[str], starts: list[int], training: bool, where: str):
    """One Example, or None when the original would skip it (its words do not contain the answer)."""
    qas_id = str(_field(qa, "id", (str, int), "a question", where))
    question = _field(qa, "question", str, f"question {qas_id!r}", where)
    impossible = bool(qa.get("is_impossible", False))
    answers = [] if impossible else _field(qa, "answers", list, f"question {qas_id!r}", where)
    if training and not impossible and not answers:
        raise ValueError(f"question {qas_id!r} in {where} has no answers and is not marked \"is_impossible\": "
                         "true. Fix: give it an answer, mark it unanswerable (SQuAD v2.0), or drop it")
    texts, first, last, first_text = [], -1, -1, ""
    for number, answer in enumerate(answers):
        if not training and not (isinstance(answer, dict) and "answer_start" in answer):
            texts.append(_field(answer, "text", str, f"question {qas_id!r}'s answer", where))
            continue  # evaluation scores texts only; a position is optional there
        text, answer_first, answer_last = _answer_words(qas_id, answer, context, starts, where)
        texts.append(text)
        if number == 0:
            first, last, first_text = answer_first, answer_last, text
    if first >= 0 and " ".join(first_text.split()) not in " ".join(words[first:last + 1]):
        # The original's check: the answer's words, whitespace normalised, must hold the answer (see its warning).
        if training:
            return None
        first = last = -1
    return Example(qas_id, question, context, words, starts, texts, first, last, impossible)


def read_squad(path: str, field: str = "data.train_file", training: bool = True) -> list[Example]:
    """The questions of a SQuAD v1.1 / v2.0 JSON file (local or gs://), in file order.

    Training questions whose answer the whitespace words cannot hold are skipped (counted, logged once), as the
    original does; anything malformed is a ValueError naming the file, the --config field and the question.
    """
    where = f"--config.{field}={path}"
    examples, skipped, seen = [], [], set()
    for article in _load_articles(path, where):
        for paragraph in article["paragraphs"]:
            context = _field(paragraph, "context", str, "a paragraph", where)
            words, starts = split_words(context)
            for qa in _field(paragraph, "qas", list, "a paragraph", where):
                example = _read_question(qa, context, words, starts, training, where)
                if example is None:
                    skipped.append(str(qa["id"]))
                    continue
                if example.qas_id in seen:
                    raise ValueError(f"question {example.qas_id!r} in {where} appears twice. Fix: question ids "
                                     "must be unique (predictions are keyed by them)")
                seen.add(example.qas_id)
                examples.append(example)
    if skipped:
        logging.warning("%s: skipped %d question(s) whose answer text the context's whitespace-separated words do "
                        "not contain (as the original run_squad.py does), e.g. %r", where, len(skipped), skipped[0])
    if not examples:
        raise ValueError(f"{where} holds no usable question. Fix: pass a SQuAD JSON file with questions")
    return examples


# Encoding.


@dataclasses.dataclass
class Windows:
    input_ids: np.ndarray  # [n, max_seq_length] int32: [CLS] query [SEP] passage window [SEP], then padding
    input_mask: np.ndarray
    segment_ids: np.ndarray
    start_positions: np.ndarray  # [n] int32; 0 ([CLS]) when unanswerable or not wholly inside this window
    end_positions: np.ndarray
    example: np.ndarray  # [n] int64 index into the examples list
    token_to_word: np.ndarray  # [n, max_seq_length] int32: the word of each passage piece, -1 elsewhere
    max_context: np.ndarray  # [n, max_seq_length] bool: this window is the piece's best context (the original's)
    char_start: np.ndarray  # [n, max_seq_length] int32: a passage piece is context[char_start:char_end]; else -1
    char_end: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        return {"input_ids": self.input_ids, "input_mask": self.input_mask, "segment_ids": self.segment_ids}

    def __len__(self) -> int:
        return len(self.example)


@dataclasses.dataclass
class _Passage:
    ids: list[int]  # the context's pieces, each word tokenized on its own
    word: list[int]  # each piece's word
    char_start: list[int]  # each piece's characters in the context
    char_end: list[int]
    first_piece: list[int]  # each word's first piece (the original's orig_to_tok_index)


def _piece_offsets(tokenizer, words: list[str], ids: list[list[int]]) -> list[list[tuple[int, int]]]:
    """Each piece's (start, end) characters within its word (Tokenizer.encode_with_spans), so an answer is the
    context's own characters (case, accents, punctuation kept) trimmed to the predicted pieces, where the original
    needed get_final_text. Where that cannot be done exactly (a normalisation that cannot be aligned, pieces that
    disagree with encode_batch) every piece of the word spans the whole word, so such answers are whole words."""
    if not words:
        return []
    offsets = []
    for word, word_ids, (found_ids, spans) in zip(words, ids, tokenizer.encode_with_spans(words)):
        exact = spans is not None and found_ids == list(word_ids)
        offsets.append(spans if exact else [(0, len(word))] * len(word_ids))
    return offsets


def _passages(tokenizer, examples: list[Example]) -> list[_Passage]:
    """Each example's passage pieces; a paragraph shared by several questions is tokenized once."""
    unique = {}
    for example in examples:
        unique.setdefault(example.context, example)
    words = [word for example in unique.values() for word in example.words]
    ids = tokenizer.encode_batch(words) if words else []
    offsets = _piece_offsets(tokenizer, words, ids)
    passages, at = {}, 0
    for context, example in unique.items():
        passage = _Passage([], [], [], [], [])
        for index, start in enumerate(example.word_starts):
            word_ids, spans = ids[at + index], offsets[at + index]
            if not word_ids:  # a word of only dropped characters: the original's tokenizer gives it nothing
                word_ids, spans = [tokenizer.unk_id], [(0, len(example.words[index]))]
            passage.first_piece.append(len(passage.ids))
            passage.ids += word_ids
            passage.word += [index] * len(word_ids)
            passage.char_start += [start + s for s, _ in spans]
            passage.char_end += [start + e for _, e in spans]
        at += len(example.words)
        passages[context] = passage
    return [passages[example.context] for example in examples]


def _answer_pieces(example: Example, passage: _Passage, answer_ids: list[int]) -> tuple[int, int]:
    """The first answer's first/last passage piece, tightened as the original's _improve_answer_span: the
    smallest piece span inside the answer's words whose pieces equal the answer text's own."""
    if example.is_impossible or example.start_word < 0:
        return -1, -1
    start = passage.first_piece[example.start_word]
    last_word = example.end_word + 1
    end = passage.first_piece[last_word] - 1 if last_word < len(example.words) else len(passage.ids) - 1
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if passage.ids[new_start:new_end + 1] == answer_ids:
                return new_start, new_end
    return start, end


def _spans(length: int, room: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over `length` passage pieces: the original's sliding loop."""
    spans, start = [], 0
    while start < length:
        size = min(length - start, room)
        spans.append((start, size))
        if start + size == length:
            break
        start += min(size, doc_stride)
    return spans


def _max_context_window(spans: list[tuple[int, int]], length: int) -> np.ndarray:
    """For each passage piece, the window that gives it the most context on its shorter side (the original's
    _check_is_max_context: score min(left, right) + 0.01 * window size; ties go to the earlier window)."""
    positions = np.arange(length)[None, :]
    starts = np.array([start for start, _ in spans])[:, None]
    sizes = np.array([size for _, size in spans])[:, None]
    ends = starts + sizes - 1
    scores = np.minimum(positions - starts, ends - positions) + 0.01 * sizes
    scores = np.where((positions >= starts) & (positions <= ends), scores, -np.inf)
    return np.argmax(scores, axis=0)  # the first of equal maxima


def _check_lengths(max_seq_length: int, doc_stride: int, max_query_length: int) -> int:
    if max_query_length + 3 >= max_seq_length:
        raise ValueError(f"--config.data.max_query_length={max_query_length} leaves no room for the passage in a "
                         f"window of data.max_seq_length={max_seq_length} ([CLS] question [SEP] passage [SEP]). "
                         f"Fix: lower data.max_query_length (64 is the original's) or raise data.max_seq_length")
    if doc_stride <= 0:
        raise ValueError(f"--config.data.doc_stride={doc_stride} must be positive: windows slide by it. Fix: use "
                         f"e.g. 128 (the original's), at most data.max_seq_length - data.max_query_length - 3")
    return max_seq_length - max_query_length - 3


def _check_stride(examples, queries, passages, max_seq_length: int, doc_stride: int, room: int) -> None:
    if doc_stride <= room:
        return
    for example, query, passage in zip(examples, queries, passages):
        if len(passage.ids) > max_seq_length - len(query) - 3:
            # The original's loop steps by min(window, stride), so it loses nothing, but its windows abut: an
            # answer across a boundary then lies wholly inside no window.
            raise ValueError(
                f"--config.data.doc_stride={doc_stride} exceeds the {room} passage pieces a window of "
                f"data.max_seq_length={max_seq_length} holds: passage of question {example.qas_id!r} would be cut "
                f"into windows that do not overlap, so an answer across a cut fits in none. Fix: set "
                f"data.doc_stride to at most {room} (the original uses 128 with max_seq_length 384)")


def _window_rows(query: list[int], passage: _Passage, answer: tuple[int, int], max_seq_length: int,
                 doc_stride: int, tokenizer) -> list[dict]:
    """One dict of row arrays per window of one question's passage."""
    spans = _spans(len(passage.ids), max_seq_length - len(query) - 3, doc_stride)
    if not spans:
        return []  # an empty context: nothing to read, so no window (predict then answers "")
    offset = len(query) + 2  # the passage's first position: after [CLS] query [SEP]
    best_window = _max_context_window(spans, len(passage.ids))
    rows = []
    for span_index, (start, size) in enumerate(spans):
        ids = [tokenizer.cls_id, *query, tokenizer.sep_id, *passage.ids[start:start + size], tokenizer.sep_id]
        row = {"input_ids": np.full(max_seq_length, tokenizer.pad_id, np.int32),
               "input_mask": np.zeros(max_seq_length, np.int32), "segment_ids": np.zeros(max_seq_length, np.int32),
               "token_to_word": np.full(max_seq_length, -1, np.int32),
               "max_context": np.zeros(max_seq_length, bool),
               "char_start": np.full(max_seq_length, -1, np.int32), "char_end": np.full(max_seq_length, -1, np.int32)}
        row["input_ids"][:len(ids)] = ids
        row["input_mask"][:len(ids)] = 1
        row["segment_ids"][offset:len(ids)] = 1
        pieces = slice(offset, offset + size)
        row["token_to_word"][pieces] = passage.word[start:start + size]
        row["char_start"][pieces] = passage.char_start[start:start + size]
        row["char_end"][pieces] = passage.char_end[start:start + size]
        row["max_context"][pieces] = best_window[start:start + size] == span_index
        inside = answer[0] >= start and 0 <= answer[1] <= start + size - 1
        row["start_position"] = answer[0] - start + offset if inside else 0
        row["end_position"] = answer[1] - start + offset if inside else 0
        rows.append(row)
    return rows


def encode(tokenizer, examples: list[Example], max_seq_length: int, doc_stride: int,
           max_query_length: int) -> Windows:
    """Windows of [CLS] question [SEP] passage [SEP] for every example, as the original's
    convert_examples_to_features: the question cut to max_query_length pieces, each passage word tokenized on its
    own, windows of max_seq_length - len(question) - 3 passage pieces sliding by doc_stride."""
    room = _check_lengths(max_seq_length, doc_stride, max_query_length)
    queries = [ids[:max_query_length] for ids in tokenizer.encode_batch([e.question for e in examples])]
    passages = _passages(tokenizer, examples)
    _check_stride(examples, queries, passages, max_seq_length, doc_stride, room)
    answer_ids = tokenizer.encode_batch([e.answers[0] if e.answers else "" for e in examples])
    rows, owners = [], []
    for index, (example, query, passage) in enumerate(zip(examples, queries, passages)):
        answer = _answer_pieces(example, passage, answer_ids[index])
        example_rows = _window_rows(query, passage, answer, max_seq_length, doc_stride, tokenizer)
        rows += example_rows
        owners += [index] * len(example_rows)

    def stacked(key, dtype):
        if not rows:
            return np.zeros((0, max_seq_length), dtype)
        return np.stack([row[key] for row in rows]).astype(dtype)

    return Windows(
        input_ids=stacked("input_ids", np.int32), input_mask=stacked("input_mask", np.int32),
        segment_ids=stacked("segment_ids", np.int32),
        start_positions=np.array([row["start_position"] for row in rows], np.int32),
        end_positions=np.array([row["end_position"] for row in rows], np.int32),
        example=np.array(owners, np.int64), token_to_word=stacked("token_to_word", np.int32),
        max_context=stacked("max_context", bool), char_start=stacked("char_start", np.int32),
        char_end=stacked("char_end", np.int32))


# Predicting.


_Candidate = collections.namedtuple("_Candidate", "row start end start_logit end_logit")


def _candidates(windows: Windows, rows: list[int], start_logits, end_logits, n_best_size: int,
                max_answer_length: int) -> tuple[list[_Candidate], _Candidate | None]:
    """Every allowed span among each window's n_best starts and ends, and the window with the smallest null score
    (start[0] + end[0]), as the original's write_predictions."""
    candidates, null = [], None
    for row in rows:
        starts, ends = start_logits[row], end_logits[row]
        if null is None or starts[0] + ends[0] < null.start_logit + null.end_logit:
            null = _Candidate(row, 0, 0, float(starts[0]), float(ends[0]))
        words, best = windows.token_to_word[row], windows.max_context[row]
        # A stable sort keeps the original's order among equal logits (the earlier position first).
        top_starts = np.argsort(-starts, kind="stable")[:n_best_size, None]
        top_ends = np.argsort(-ends, kind="stable")[None, :n_best_size]
        # Allowed: both in the passage, in order, not too long, and the window sees the start with most context.
        allowed = ((words[top_starts] >= 0) & (words[top_ends] >= 0) & best[top_starts] & (top_ends >= top_starts)
                   & (top_ends - top_starts + 1 <= max_answer_length))
        for i, j in zip(*np.nonzero(allowed)):  # row-major: the original's start-then-end order
            start, end = int(top_starts[i, 0]), int(top_ends[0, j])
            candidates.append(_Candidate(row, start, end, float(starts[start]), float(ends[end])))
    return candidates, null


def _nbest(example: Example, windows: Windows, candidates: list[_Candidate], null: _Candidate | None,
           n_best_size: int) -> list[dict]:
    """The n best distinct answer texts with their logits and softmax probabilities; "" stands for no answer."""
    ranked = sorted(candidates + ([null] if null is not None else []),
                    key=lambda c: c.start_logit + c.end_logit, reverse=True)
    entries, seen = [], set()
    for candidate in ranked:
        if len(entries) >= n_best_size:
            break
        text = ""
        if candidate.start > 0:
            # The context's own characters from the first piece's first to the last piece's last character.
            text = example.context[windows.char_start[candidate.row, candidate.start]:
                                   windows.char_end[candidate.row, candidate.end]]
        if text in seen:
            continue
        seen.add(text)
        entries.append({"text": text, "start_logit": candidate.start_logit, "end_logit": candidate.end_logit})
    if null is not None and "" not in seen:
        entries.append({"text": "", "start_logit": null.start_logit, "end_logit": null.end_logit})
    if not entries:  # no window at all, or no allowed span (the original writes the text "empty" here)
        entries.append({"text": "", "start_logit": 0.0, "end_logit": 0.0})
    totals = np.array([entry["start_logit"] + entry["end_logit"] for entry in entries], np.float64)
    probabilities = np.exp(totals - totals.max())
    probabilities /= probabilities.sum()
    return [{"text": e["text"], "probability": float(p), "start_logit": e["start_logit"],
             "end_logit": e["end_logit"]} for e, p in zip(entries, probabilities)]


def predict(examples: list[Example], windows: Windows, start_logits: np.ndarray, end_logits: np.ndarray,
            n_best_size: int = 20, max_answer_length: int = 30, version_2_with_negative: bool = False,
            null_score_diff_threshold: float = 0.0) -> tuple[dict, dict, dict]:
    """(predictions {qas_id: text}, nbest {qas_id: [{text, probability, start_logit, end_logit}]}, null_odds
    {qas_id: null score - best span score}, empty for v1.1) from logits [n, max_seq_length] aligned with windows.

    v2.0: the answer is "" when the null score exceeds the best non-null span's by more than the threshold; a
    question with no allowed span at all gets "" and null odds of +inf.
    """
    start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
    if start_logits.shape != windows.input_ids.shape or end_logits.shape != windows.input_ids.shape:
        raise ValueError(f"predict: start_logits {start_logits.shape} and end_logits {end_logits.shape} must both "
                         f"be [windows, max_seq_length] = {windows.input_ids.shape}, one row per window")
    rows_of = collections.defaultdict(list)
    for row, index in enumerate(windows.example):
        rows_of[int(index)].append(row)
    predictions, nbest, null_odds = {}, {}, {}
    for index, example in enumerate(examples):
        candidates, null = _candidates(windows, rows_of[index], start_logits, end_logits, n_best_size,
                                       max_answer_length)
        entries = _nbest(example, windows, candidates, null if version_2_with_negative else None, n_best_size)
        nbest[example.qas_id] = entries
        if not version_2_with_negative:
            predictions[example.qas_id] = entries[0]["text"]
            continue
        best = next((entry for entry in entries if entry["text"]), None)
        null_score = null.start_logit + null.end_logit if null is not None else 0.0
        difference = math.inf if best is None else null_score - best["start_logit"] - best["end_logit"]
        null_odds[example.qas_id] = difference
        predictions[example.qas_id] = "" if difference > null_score_diff_threshold else best["text"]
    return predictions, nbest, null_odds


def write_predictions(path: str, predictions: dict) -> None:
    """The official predictions.json: {qas_id: answer text}."""
    with fileio.open_file(path, "w") as f:
        f.write(json.dumps(predictions, ensure_ascii=False, indent=2) + "\n")


# Scoring, as the official evaluate-v1.1.py / evaluate-v2.0.py.


_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-cased, without punctuation, without the articles a/an/the, whitespace collapsed."""
    text = "".join(char for char in text.lower() if char not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-level F1 of the normalised texts; when either is empty, 1.0 if both are and 0.0 otherwise (v2.0)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)
    same = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def evaluate(examples: list[Example], predictions: dict) -> dict:
    """{"exact_match", "f1"} as fractions in [0, 1] (the official scripts print 100x), each question's best over
    its gold answers; an unanswerable question's gold is [""]. With unanswerable questions, also the scores over
    the answerable ("has_answer_*") and unanswerable ("no_answer_*") ones. A question missing from predictions
    scores 0."""
    scores = {"has_answer": [], "no_answer": []}
    missing = 0
    for example in examples:
        gold = [answer for answer in example.answers if normalize_answer(answer)] or [""]
        if example.qas_id not in predictions:
            missing += 1
        prediction = predictions.get(example.qas_id)
        pair = (0.0, 0.0) if prediction is None else (max(exact_match(prediction, g) for g in gold),
                                                        max(f1(prediction, g) for g in gold))
        scores["has_answer" if gold != [""] else "no_answer"].append(pair)
    if missing:
        logging.warning("evaluate: %d of %d questions have no prediction; they score 0", missing, len(examples))
    everything = scores["has_answer"] + scores["no_answer"]
    result = {"exact_match": _mean(everything, 0), "f1": _mean(everything, 1), "total": len(everything),
              "missing": missing}
    if any(example.is_impossible for example in examples):
        for kind, pairs in scores.items():
            result.update({f"{kind}_exact_match": _mean(pairs, 0), f"{kind}_f1": _mean(pairs, 1),
                           f"{kind}_total": len(pairs)})
    return result


def _mean(pairs: list[tuple[float, float]], index: int) -> float:
    return float(np.mean([pair[index] for pair in pairs])) if pairs else 0.0
