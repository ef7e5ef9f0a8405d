"""Benchmark of sentence splitters: accuracy against gold sentence boundaries, and speed on one core.

    python -m bert_jax.benchmarks.sentences [--conllu=a.conllu,b.conllu] [--golden_rules=english_golden_rules.py]

Splitters: this project's rules (`demo_corpus.split_sentences_by_rules`, which builds the demo corpus), the libraries
of `CANDIDATES` that import here (pysbd, blingfire, syntok, sentencex, spaCy's rule-based sentencizer; a missing
one is listed as such), and `corpus.split_sentences` as user corpora get it (sentencex, English rules).
Gold text, each piece a paragraph whose sentences the splitter must find again:
  * sample_text: the original BERT sample text (one sentence per line), each document's lines joined;
  * hard cases: `HARD_CASES` below, hand-made (abbreviations, decimals, quotes, ellipses, lower-case starts,
    German, French, Spanish, Chinese, Japanese);
  * --golden_rules: a Python file defining GOLDEN_EN_RULES as (text, sentences) pairs (pysbd's copy of the
    "Golden Rules" of pragmatic_segmenter; pysbd was written to pass them, so they flatter it);
  * --conllu: Universal Dependencies treebanks (`# text =` sentences, `# newpar` paragraphs; without paragraph
    marks, runs of 10 sentences); the language is the file name's prefix (en_ewt-ud-test.conllu -> en).
A boundary is the count of non-space characters before a sentence start, so splitters that trim or keep
whitespace score alike; precision, recall and F1 are over all boundaries inside paragraphs of a set.

Speed: the demo corpus's documents, each joined into one paragraph, repeated up to --megabytes; each splitter
runs on this process pinned to one core for at most --seconds of CPU time, and sentences/s and MB/s are of the
paragraphs it got through (CPU time, so other work on a shared machine does not count against it).
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import time
from typing import Callable

from absl import app
from absl import flags

from bert_jax.data import corpus
from bert_jax.data import demo_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE_TEXT = os.path.join(ROOT, "tests", "fixtures", "google_bert", "sample_text.txt")

FLAGS = flags.FLAGS
flags.DEFINE_list("conllu", [], "Universal Dependencies .conllu files to score against (language: the file name's "
                  "prefix before '_').")
flags.DEFINE_string("golden_rules", None, "A Python file defining GOLDEN_EN_RULES, e.g. the "
                    "benchmarks/english_golden_rules.py that pysbd's wheel installs.")
flags.DEFINE_float("megabytes", 5.0, "Size of the speed text.")
flags.DEFINE_float("seconds", 10.0, "CPU-time budget of each splitter on the speed text.")
flags.DEFINE_list("splitters", [], "Only these splitters (default: all that import).")

# (language, paragraph, gold sentences). Cases where a splitter has to know more than punctuation.
HARD_CASES = [
    ("en", "Dr. Smith arrived at 3.30 p.m. on Monday. He left at 5.",
     ["Dr. Smith arrived at 3.30 p.m. on Monday.", "He left at 5."]),
    ("en", "Use a tool, e.g. a hammer, i.e. something heavy. It works.",
     ["Use a tool, e.g. a hammer, i.e. something heavy.", "It works."]),
    ("en", "The U.S. economy grew in 2019. The E.U. did not.", ["The U.S. economy grew in 2019.", "The E.U. did not."]),
    ("en", "I have lived in the U.S. for years. How about you?",
     ["I have lived in the U.S. for years.", "How about you?"]),
    ("en", "I live in the U.S. How about you?", ["I live in the U.S.", "How about you?"]),
    ("en", "Pi is about 3.14159. The value of e is 2.718.", ["Pi is about 3.14159.", "The value of e is 2.718."]),
    ("en", 'He said, "Stop!" Then he left.', ['He said, "Stop!"', "Then he left."]),
    ("en", '"Are you coming?" she asked. "No."', ['"Are you coming?" she asked.', '"No."']),
    ("en", "I paused... and then went on. It was late.", ["I paused... and then went on.", "It was late."]),
    ("en", "Mr. and Mrs. Jones live at 12 Main St. in Springfield. They have two cats.",
     ["Mr. and Mrs. Jones live at 12 Main St. in Springfield.", "They have two cats."]),
    ("en", "See Fig. 3 for details. The results are in Table 2.",
     ["See Fig. 3 for details.", "The results are in Table 2."]),
    ("en", "the model was trained for a week. it converged quickly.",
     ["the model was trained for a week.", "it converged quickly."]),
    ("en", "He was born in 1990. In 2010 he moved to Paris.", ["He was born in 1990.", "In 2010 he moved to Paris."]),
    ("en", "Prof. J. R. R. Tolkien wrote it. Everyone read it.",
     ["Prof. J. R. R. Tolkien wrote it.", "Everyone read it."]),
    ("en", "What?! No way! Really?", ["What?!", "No way!", "Really?"]),
    ("en", "(This is in brackets.) This is not.", ["(This is in brackets.)", "This is not."]),
    ("en", "The meeting is at 10 a.m. tomorrow. Please be on time.",
     ["The meeting is at 10 a.m. tomorrow.", "Please be on time."]),
    ("en", "The company, Acme Inc., was founded in 1999. It makes anvils.",
     ["The company, Acme Inc., was founded in 1999.", "It makes anvils."]),
    ("en", "Write to john.doe@example.com or visit www.example.com today. Thanks!",
     ["Write to john.doe@example.com or visit www.example.com today.", "Thanks!"]),
    ("en", "She earned her Ph.D. in 2005. Then she taught.", ["She earned her Ph.D. in 2005.", "Then she taught."]),
    ("en", "Section 2.1 describes the data. Section 2.2 describes the model.",
     ["Section 2.1 describes the data.", "Section 2.2 describes the model."]),
    ("en", "It cost $4.50 etc. and more. We paid.", ["It cost $4.50 etc. and more.", "We paid."]),
    ("de", "Dr. Müller kam um 9 Uhr an. Er war z. B. sehr müde.", ["Dr. Müller kam um 9 Uhr an.",
                                                                 "Er war z. B. sehr müde."]),
    ("de", "Die Sitzung endete am 3. Oktober 2020. Danach gingen alle nach Hause.",
     ["Die Sitzung endete am 3. Oktober 2020.", "Danach gingen alle nach Hause."]),
    ("de", "Er wohnt in der Hauptstr. 5 in Berlin. Sie wohnt in München.",
     ["Er wohnt in der Hauptstr. 5 in Berlin.", "Sie wohnt in München."]),
    ("de", "„Kommst du mit?“, fragte sie. Er nickte.", ["„Kommst du mit?“, fragte sie.", "Er nickte."]),
    ("fr", "M. Dupont est arrivé à 9 h. Il était fatigué.", ["M. Dupont est arrivé à 9 h.", "Il était fatigué."]),
    ("fr", "« Viens ici ! » dit-il. Elle ne répondit pas.", ["« Viens ici ! » dit-il.", "Elle ne répondit pas."]),
    ("fr", "Le prix est de 3,5 millions d'euros. C'est beaucoup !",
     ["Le prix est de 3,5 millions d'euros.", "C'est beaucoup !"]),
    ("es", "¿Dónde está el Sr. García? Está en la oficina.", ["¿Dónde está el Sr. García?", "Está en la oficina."]),
    ("zh", "今天天气很好。我们去公园吧！你觉得怎么样？", ["今天天气很好。", "我们去公园吧！", "你觉得怎么样？"]),
    ("ja", "今日は晴れです。公園に行きましょう！どう思いますか？", ["今日は晴れです。", "公園に行きましょう！", "どう思いますか？"]),
]


# ---------------------------------------------------------------------------------------------------------------
# The splitters: each is built once (imports, pipelines) and returns split(text, language) -> sentences.

def _rules():
    return lambda text, language: demo_corpus.split_sentences_by_rules(text)


_PYSBD_LANGUAGES = ("en hi mr zh es am ar hy bg ur ru pl fa nl da fr my el it ja de kk sk").split()


def _pysbd():
    import pysbd  # pylint: disable=import-outside-toplevel
    segmenters = {}

    def split(text, language):
        language = language if language in _PYSBD_LANGUAGES else "en"
        if language not in segmenters:
            segmenters[language] = pysbd.Segmenter(language=language, clean=False)
        return segmenters[language].segment(text)
    return split


def _blingfire():
    import blingfire  # pylint: disable=import-outside-toplevel
    return lambda text, language: blingfire.text_to_sentences(text).split("\n")


def _syntok():
    from syntok import segmenter  # pylint: disable=import-outside-toplevel
    return lambda text, language: ["".join(token.spacing + token.value for token in sentence)
                                   for paragraph in segmenter.process(text) for sentence in paragraph]


def _sentencex():
    import sentencex  # pylint: disable=import-outside-toplevel
    return lambda text, language: list(sentencex.segment(language, text))


def _sentencex_english():
    # What a corpus of unknown language gets: English rules, with sentencex's fallbacks (e.g. CJK full stops).
    import sentencex  # pylint: disable=import-outside-toplevel
    return lambda text, language: list(sentencex.segment("en", text))


def _spacy():
    import spacy  # pylint: disable=import-outside-toplevel
    pipelines = {}

    def split(text, language):
        if language not in pipelines:
            try:
                pipelines[language] = spacy.blank(language)
            except ImportError:
                pipelines[language] = spacy.blank("xx")
            pipelines[language].add_pipe("sentencizer")
            pipelines[language].max_length = 10 ** 8
        return [sentence.text for sentence in pipelines[language](text).sents]
    return split


def _ours():
    return lambda text, language: corpus.split_sentences(text)


CANDIDATES: dict[str, Callable] = {
    "rules (today's)": _rules, "pysbd": _pysbd, "blingfire": _blingfire, "syntok": _syntok,
    "sentencex": _sentencex, "sentencex (en only)": _sentencex_english, "spacy sentencizer": _spacy,
    "corpus.split_sentences": _ours,
}


# ---------------------------------------------------------------------------------------------------------------
# Gold text and scoring

@dataclasses.dataclass
class GoldSet:
    name: str
    paragraphs: list[tuple[str, str, list[str]]]  # (language, text, gold sentences)


def _boundaries(sentences: list[str]) -> set[int]:
    """Sentence starts after the first, as counts of the non-space characters before them."""
    starts, count = set(), 0
    for sentence in sentences:
        if count:
            starts.add(count)
        count += len("".join(sentence.split()))
    return starts


def sample_text_set() -> GoldSet:
    with open(SAMPLE_TEXT, encoding="utf-8") as reader:
        documents = [block.split("\n") for block in reader.read().split("\n\n")]
    paragraphs = []
    for lines in documents:
        lines = [line.strip() for line in lines if line.strip()]
        if lines:
            paragraphs.append(("en", " ".join(lines), lines))
    return GoldSet("sample_text", paragraphs)


def conllu_set(path: str, sentences_per_chunk: int = 10) -> GoldSet:
    language = os.path.basename(path).split("_")[0]
    paragraphs, current, has_paragraphs = [], [], False
    with open(path, encoding="utf-8") as reader:
        for line in reader:
            if line.startswith(("# newpar", "# newdoc")) and not line.startswith("# newpar_block"):
                has_paragraphs = True
                if current:
                    paragraphs.append(current)
                current = []
            elif line.startswith("# text = "):
                current.append(line[len("# text = "):].strip())
                if not has_paragraphs and len(current) == sentences_per_chunk:
                    paragraphs.append(current)
                    current = []
    if current:
        paragraphs.append(current)
    return GoldSet(os.path.basename(path).removesuffix(".conllu"),
                   [(language, " ".join(sentences), sentences) for sentences in paragraphs])


def golden_rules_set(path: str) -> GoldSet:
    rules = runpy.run_path(path)["GOLDEN_EN_RULES"]
    return GoldSet("golden_rules (en)", [("en", text, list(gold)) for text, gold in rules])


@dataclasses.dataclass
class Score:
    true_positives: int = 0
    predicted: int = 0
    gold: int = 0
    exact: int = 0
    paragraphs: int = 0
    changed_text: int = 0  # paragraphs whose non-space characters the splitter did not give back unchanged

    def f1(self) -> tuple[float, float, float]:
        precision = self.true_positives / self.predicted if self.predicted else 1.0
        recall = self.true_positives / self.gold if self.gold else 1.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return precision, recall, f1


def score(split, gold_set: GoldSet) -> Score:
    result = Score()
    for language, text, gold in gold_set.paragraphs:
        predicted = [sentence for sentence in split(text, language) if sentence.strip()]
        if "".join("".join(predicted).split()) != "".join(text.split()):
            result.changed_text += 1
        predicted_boundaries, gold_boundaries = _boundaries(predicted), _boundaries(gold)
        result.true_positives += len(predicted_boundaries & gold_boundaries)
        result.predicted += len(predicted_boundaries)
        result.gold += len(gold_boundaries)
        result.exact += predicted_boundaries == gold_boundaries
        result.paragraphs += 1
    return result


# ---------------------------------------------------------------------------------------------------------------
# Speed

def speed_paragraphs(megabytes: float) -> list[str]:
    documents = [document.split("\n") for document in corpus.demo_corpus_text().split("\n\n") if document.strip()]
    paragraphs = [" ".join(lines) for lines in documents]
    out, size, limit = [], 0, int(megabytes * 1e6)
    while size < limit:
        for paragraph in paragraphs:
            out.append(paragraph)
            size += len(paragraph.encode("utf-8")) + 1
            if size >= limit:
                break
    return out


def speed(split, paragraphs: list[str], seconds: float) -> tuple[float, float, float]:
    """(sentences/s, MB/s, MB done) over the paragraphs done within `seconds` of this process's CPU time."""
    sentences = done_bytes = 0
    start = time.process_time()
    for paragraph in paragraphs:
        sentences += len(split(paragraph, "en"))
        done_bytes += len(paragraph.encode("utf-8")) + 1
        if time.process_time() - start >= seconds:
            break
    elapsed = time.process_time() - start
    return sentences / elapsed, done_bytes / 1e6 / elapsed, done_bytes / 1e6


def main(argv):
    del argv
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as a tf.data worker would give it
    gold_sets = [sample_text_set(), GoldSet("hard cases", HARD_CASES)]
    if FLAGS.golden_rules:
        gold_sets.append(golden_rules_set(FLAGS.golden_rules))
    gold_sets.extend(conllu_set(path) for path in FLAGS.conllu)
    paragraphs = speed_paragraphs(FLAGS.megabytes)
    for gold_set in gold_sets:
        boundaries = sum(len(gold) - 1 for _, _, gold in gold_set.paragraphs)
        print(f"gold {gold_set.name}: {len(gold_set.paragraphs)} paragraphs, {boundaries} boundaries")
    print(f"speed text: {len(paragraphs)} paragraphs, {sum(map(len, paragraphs)) / 1e6:.2f} M characters\n")

    names = FLAGS.splitters or list(CANDIDATES)
    header = ["splitter"] + [f"{gold_set.name} P/R/F1" for gold_set in gold_sets] + ["hard exact", "sent/s", "MB/s"]
    rows = []
    for name in names:
        start = time.perf_counter()
        try:
            split = CANDIDATES[name]()
        except ImportError as error:
            rows.append([name, f"not installed ({error})"])
            continue
        setup = time.perf_counter() - start
        row = [name]
        for gold_set in gold_sets:
            result = score(split, gold_set)
            precision, recall, f1 = result.f1()
            changed = f" ({result.changed_text} changed)" if result.changed_text else ""
            row.append(f"{precision:.3f}/{recall:.3f}/{f1:.3f}{changed}")
            if gold_set.name == "hard cases":
                exact = f"{result.exact}/{result.paragraphs}"
        sentences_per_second, megabytes_per_second, done = speed(split, paragraphs, FLAGS.seconds)
        row += [exact, f"{sentences_per_second:,.0f}", f"{megabytes_per_second:.2f} ({done:.1f} MB, setup "
                f"{setup:.2f} s)"]
        rows.append(row)
        print(" | ".join(row), flush=True)
    print("\n| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    app.run(main)
