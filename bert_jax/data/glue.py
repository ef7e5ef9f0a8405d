"""GLUE's own files: the TSV directories download_glue_data.py writes, read as google-research/bert reads them.

The layout, checked against the public sources: google-research/bert run_classifier.py (CoLA, MRPC, MNLI
processors, _read_tsv); transformers' data/processors/glue.py (run_classifier's processors for all nine tasks);
huggingface/datasets' glue.py; transformers' utils/download_glue_data.py (the nyu-mll gist); and the headers of the
files themselves as quoted in public code (SST-2, MRPC, STS-B, QQP, MNLI train and dev).
- Directories under the data dir: CoLA SST-2 MRPC STS-B QQP MNLI QNLI RTE WNLI, and diagnostic/diagnostic.tsv
  (download_diagnostic) for AX, a test set only, predicted with an MNLI model.
- No quote processing: run_classifier reads with csv.reader(quotechar=None), datasets with csv.QUOTE_NONE, so a
  quote is text. Splitting on tabs here is the same thing.
- CoLA: train/dev have no header ("Only the test set has a header", run_classifier) and 4 columns: source, label,
  the original annotation ("*" when unacceptable), sentence. test.tsv: `index sentence`.
- SST-2: `sentence label`; test `index sentence`.
- MRPC: format_mrpc copies msr_paraphrase_train.txt's header into train.tsv and dev.tsv, and that header starts with
  a UTF-8 byte-order mark (datasets' glue.py seeks past it): `Quality #1 ID #2 ID #1 String #2 String`, texts 3
  and 4, label 0. format_mrpc writes test.tsv's header `index #1 ID #2 ID #1 String #2 String`.
- STS-B: `index genre filename year old_index source1 source2 sentence1 sentence2 score`, the label the last field
  (a float, 0 to 5; datasets casts to float32); test.tsv the first 9 (read at 7 and 8 by transformers).
- QQP: `id qid1 qid2 question1 question2 is_duplicate`, test `id question1 question2`; transformers' QqpProcessor
  skips rows too short to index (except IndexError: continue), and datasets drops rows missing a field.
- MNLI: train 12 columns (... sentence1 sentence2 label1 gold_label), dev_matched/dev_mismatched 16 (label1..label5
  then gold_label), test_matched/test_mismatched without labels; texts at 8 and 9, the label line[-1].
- QNLI `index question sentence label`, RTE and WNLI `index sentence1 sentence2 label`, the label line[-1]; their
  test files lack it. AX: `index sentence1 sentence2`.
- Label order, run_classifier's get_labels(): CoLA SST-2 MRPC QQP WNLI 0 1; MNLI (and AX) contradiction
  entailment neutral; QNLI RTE entailment not_entailment; STS-B regression, the score kept as its string.
- The GLUE server's submission files: CoLA.tsv SST-2.tsv MRPC.tsv STS-B.tsv QQP.tsv MNLI-m.tsv MNLI-mm.tsv QNLI.tsv
  RTE.tsv WNLI.tsv AX.tsv (as jiant's GLUE submission guide lists them).

A header must name the columns read by position (so another task's file is refused at line 1), and rows have as
many fields as their header. Where the sources are lenient this reader is too, and says so in the log: QQP's short
rows are skipped and counted; a row with extra fields is read as run_classifier reads it (texts at their columns, a
line[-1] label from the last field); blank lines are skipped as csv.DictReader skips them. Anything else that is
not the task's layout is one ValueError naming the file, the line and the task.

write_split, the fixture writer, is the inverse: a split in the original layout with every quirk. It lives here,
not in tests/, because it reads the same layout table backwards (one table, so reader and writer cannot drift
apart), and because other modules' tests (metrics, the GLUE runner) and users making a small GLUE set need it too.
"""

import dataclasses
import math

from absl import logging

from bert_jax import fileio
from bert_jax.data import finetune_data

_BOM = "\ufeff"


@dataclasses.dataclass(frozen=True)
class Layout:
    """One kind of file: its columns in file order, which are texts / label / id, and whether a header comes first."""
    columns: tuple[str, ...]
    texts: tuple[str, ...]
    label: str | None = None  # None in test files
    id: str | None = None  # the index column the submission files key on (test files)
    header: bool = True  # False only for CoLA's train/dev
    bom: bool = False  # MRPC's train/dev header starts with a byte-order mark (msr_paraphrase_train.txt's)
    label_last: bool = False  # the sources take the label as line[-1] (MNLI, STS-B, QNLI, RTE, WNLI)

    def position(self, column: str) -> int:
        return self.columns.index(column)


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """One GLUE task as its files hold it; splits are named by file (MNLI's dev_matched, dev_mismatched)."""
    name: str  # GLUE's own spelling, as in the directory names and the messages
    directory: str  # under the GLUE data dir
    label_names: tuple[str, ...] | None  # run_classifier's order; None for regression (STS-B)
    pair: bool  # two texts ([CLS] a [SEP] b [SEP]) or one
    dev_splits: tuple[str, ...]
    test_splits: tuple[str, ...]
    files: dict[str, str]  # split -> file name in `directory`
    layouts: dict[str, Layout]  # split -> its layout
    submission_files: dict[str, str]  # test split -> the GLUE server's file name
    train_split: str | None = "train"  # None for AX

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def splits(self) -> tuple[str, ...]:
        return ((self.train_split,) if self.train_split else ()) + self.dev_splits + self.test_splits


def _task(name, directory, label_names, labelled: Layout | dict | None, test: Layout, dev_splits=("dev",),
          test_splits=("test",), submission=None, files=None, train_split="train") -> GlueTask:
    """`labelled` is the train/dev layout, or a layout per split where they differ (MNLI)."""
    splits = ((train_split,) if train_split else ()) + dev_splits
    if not isinstance(labelled, dict):
        labelled = {split: labelled for split in splits}
    layouts = labelled | {split: test for split in test_splits}
    if isinstance(submission, str):
        submission = {test_splits[0]: submission}
    return GlueTask(name, directory, tuple(label_names) if label_names else None, len(test.texts) == 2,
                    tuple(dev_splits), tuple(test_splits), files or {split: f"{split}.tsv" for split in layouts},
                    layouts, submission, train_split)


_BINARY = ("0", "1")
_NLI_2 = ("entailment", "not_entailment")
_MNLI_LABELS = ("contradiction", "entailment", "neutral")
_PAIR_12 = ("sentence1", "sentence2")
_MNLI_HEAD = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
              "sentence1_parse", "sentence2_parse", "sentence1", "sentence2")
_STSB_HEAD = ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2")
_MRPC_TAIL = ("#1 ID", "#2 ID", "#1 String", "#2 String")
_MRPC_TEXTS = ("#1 String", "#2 String")
_INDEX_PAIR = Layout(("index", *_PAIR_12), _PAIR_12, id="index")
# MNLI's train and dev files differ in their label columns (one annotator's label in train, five in dev).
_MNLI_LAYOUTS = {
    "train": Layout((*_MNLI_HEAD, "label1", "gold_label"), _PAIR_12, "gold_label", label_last=True),
    **{split: Layout((*_MNLI_HEAD, *(f"label{i}" for i in range(1, 6)), "gold_label"), _PAIR_12, "gold_label",
                     label_last=True) for split in ("dev_matched", "dev_mismatched")}}
_LABELLED_PAIR = Layout(("index", *_PAIR_12, "label"), _PAIR_12, "label", label_last=True)

TASKS: dict[str, GlueTask] = {
    "cola": _task("CoLA", "CoLA", _BINARY,
                  Layout(("source", "label", "original_label", "sentence"), ("sentence",), "label", header=False),
                  Layout(("index", "sentence"), ("sentence",), id="index"), submission="CoLA.tsv"),
    "sst2": _task("SST-2", "SST-2", _BINARY, Layout(("sentence", "label"), ("sentence",), "label"),
                  Layout(("index", "sentence"), ("sentence",), id="index"), submission="SST-2.tsv"),
    "mrpc": _task("MRPC", "MRPC", _BINARY, Layout(("Quality", *_MRPC_TAIL), _MRPC_TEXTS, "Quality", bom=True),
                  Layout(("index", *_MRPC_TAIL), _MRPC_TEXTS, id="index"), submission="MRPC.tsv"),
    "stsb": _task("STS-B", "STS-B", None, Layout((*_STSB_HEAD, "score"), _PAIR_12, "score", label_last=True),
                  Layout(_STSB_HEAD, _PAIR_12, id="index"), submission="STS-B.tsv"),
    "qqp": _task("QQP", "QQP", _BINARY,
                 Layout(("id", "qid1", "qid2", "question1", "question2", "is_duplicate"), ("question1", "question2"),
                        "is_duplicate"),
                 Layout(("id", "question1", "question2"), ("question1", "question2"), id="id"), submission="QQP.tsv"),
    "mnli": _task("MNLI", "MNLI", _MNLI_LABELS, _MNLI_LAYOUTS, Layout(_MNLI_HEAD, _PAIR_12, id="index"),
                  dev_splits=("dev_matched", "dev_mismatched"), test_splits=("test_matched", "test_mismatched"),
                  submission={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}),
    "qnli": _task("QNLI", "QNLI", _NLI_2, Layout(("index", "question", "sentence", "label"), ("question", "sentence"),
                                                "label", label_last=True),
                  Layout(("index", "question", "sentence"), ("question", "sentence"), id="index"),
                  submission="QNLI.tsv"),
    "rte": _task("RTE", "RTE", _NLI_2, _LABELLED_PAIR, _INDEX_PAIR, submission="RTE.tsv"),
    "wnli": _task("WNLI", "WNLI", _BINARY, _LABELLED_PAIR, _INDEX_PAIR, submission="WNLI.tsv"),
    "ax": _task("AX", "diagnostic", _MNLI_LABELS, None, _INDEX_PAIR, dev_splits=(), submission="AX.tsv",
                files={"test": "diagnostic.tsv"}, train_split=None),
}


def task_of(task: str) -> GlueTask:
    """The task by name, however GLUE spells it: "sst2", "SST-2", "sts-b", "MNLI"."""
    key = task.lower().replace("-", "").replace("_", "")
    if key not in TASKS:
        raise ValueError(f"unknown GLUE task {task!r}; the tasks are {', '.join(TASKS)}")
    return TASKS[key]


# The nine tasks in the BERT paper's Table 1 order, AX left out (a test set only, predicted with MNLI's model).
BENCHMARK = ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte", "wnli")


def parse_tasks(text: str) -> tuple[str, ...]:
    """A list of tasks ("all", or names comma-separated, GLUE's spellings too) in BENCHMARK's order."""
    names = BENCHMARK if text.strip() == "all" else tuple(
        next(key for key, value in TASKS.items() if value is task_of(name.strip()))
        for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in BENCHMARK]
    if unknown or not names:
        raise ValueError(f"--config.glue.tasks={text!r}: {unknown or 'none'} of GLUE's nine; choose 'all' or a "
                         f"comma list of {', '.join(BENCHMARK)}")
    return tuple(name for name in BENCHMARK if name in names)


def read_file(path: str, task: str) -> finetune_data.Examples:
    """read_split of the file at `path`: the split its name gives, in its task directory's parent (data.format
    "glue", with data.glue_task naming the task)."""
    glue_task = task_of(task)
    name = path.rstrip("/").rsplit("/", 1)[-1]
    splits = [split for split, file_name in glue_task.files.items() if file_name == name]
    if not splits:
        raise ValueError(f"{path}: not a file of GLUE's {glue_task.name} (--config.data.glue_task={task!r}), whose "
                         f"files are {_expected_layout(glue_task)}")
    directory = path.rstrip("/").rsplit("/", 1)[0] if "/" in path.rstrip("/") else "."
    data_dir = directory.rsplit("/", 1)[0] if "/" in directory else "."
    return read_split(data_dir, task, splits[0])


def split_path(data_dir: str, task: str, split: str) -> str:
    glue_task = task_of(task)
    if split not in glue_task.files:
        raise ValueError(f"GLUE task {glue_task.name} has no split {split!r}; its splits are "
                         f"{', '.join(glue_task.splits)}")
    return fileio.join(fileio.join(data_dir, glue_task.directory), glue_task.files[split])


def _expected_layout(glue_task: GlueTask) -> str:
    return f"{glue_task.directory}/{{{','.join(glue_task.files[split] for split in glue_task.splits)}}}"


def _lines(path: str) -> list[str]:
    """The file's lines, bytes decoded here so that local and gs:// files split alike ('\\r\\n' or '\\n')."""
    with fileio.open_file(path, "rb") as file:
        text = file.read().decode("utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _check_header(path: str, glue_task: GlueTask, split: str, layout: Layout, fields: list[str]) -> None:
    """The columns read by position must be named as the task's: that tells another task's file (or a
    headerless one) at line 1. Other columns are not checked, so a header with a column more still reads."""
    wanted = [(layout.position(column), column) for column in (*layout.texts, layout.id) if column]
    if layout.label:
        wanted.append((-1 if layout.label_last else layout.position(layout.label), layout.label))
    if any(position >= len(fields) or fields[position] != column for position, column in wanted):
        raise ValueError(
            f"{path}:1: the header row {fields} is not {glue_task.name}'s {glue_task.files[split]} header, which "
            f"has {len(layout.columns)} columns {list(layout.columns)}. Is this the {glue_task.directory} directory "
            f"download_glue_data.py wrote? (GLUE task {glue_task.name}, split {split})")


def _check_label(path: str, line_number: int, glue_task: GlueTask, label: str) -> None:
    if glue_task.is_regression:
        try:
            score = float(label)
        except ValueError:
            score = math.nan
        if not 0.0 <= score <= 5.0:
            raise ValueError(f"{path}:{line_number}: GLUE task {glue_task.name}'s score {label!r} is not a "
                             "number in [0, 5]. Fix: the last column holds the similarity score; check the row")
    elif label not in glue_task.label_names:
        raise ValueError(f"{path}:{line_number}: label {label!r} is not one of GLUE task {glue_task.name}'s "
                         f"labels {list(glue_task.label_names)}. Fix: correct the row, or read it as the task "
                         "whose labels these are")


def read_split(data_dir: str, task: str, split: str) -> finetune_data.Examples:
    """One split of one task: texts by column, labels (None for test splits), ids (test splits' index column)."""
    glue_task = task_of(task)
    path = split_path(data_dir, task, split)
    if not fileio.exists(path):
        raise FileNotFoundError(
            f"{path} does not exist: GLUE task {glue_task.name}'s {split} split is {glue_task.files[split]} in "
            f"{fileio.join(data_dir, glue_task.directory)}, the layout download_glue_data.py writes "
            f"({_expected_layout(glue_task)}). Fix: point data_dir at the directory holding {glue_task.directory}/")
    layout = glue_task.layouts[split]
    lines = _lines(path)
    if lines and lines[0].startswith(_BOM):
        lines[0] = lines[0][len(_BOM):]
    # A row has as many fields as the header; CoLA's headerless train/dev files have their 4 columns.
    header, start = list(layout.columns), 0
    if layout.header:
        if not lines:
            raise ValueError(f"{path} is empty where GLUE task {glue_task.name}'s {glue_task.files[split]} starts "
                             f"with the header {header}. Fix: download the task again")
        header, start = lines[0].split("\t"), 1
        _check_header(path, glue_task, split, layout, header)
    width = len(header)
    text_positions = [layout.position(column) for column in layout.texts]
    # MNLI's gold_label, STS-B's score, ... come from the last field, as the sources take them (line[-1]).
    label_position = (-1 if layout.label_last else layout.position(layout.label)) if layout.label else None
    id_position = layout.position(layout.id) if layout.id else None
    texts = [[] for _ in text_positions]
    labels = [] if layout.label else None
    ids = [] if layout.id else None
    short, long = 0, 0
    for line_number, line in enumerate(lines[start:], start + 1):
        if not line:  # a blank line is no row (csv.DictReader, which datasets reads GLUE with, skips them too)
            continue
        fields = line.split("\t")
        if len(fields) < width:
            if glue_task.name == "QQP":  # the QQP readers skip these (transformers' QqpProcessor, datasets)
                short += 1
                continue
            hint = (" (a CoLA train/dev file has no header row)" if not layout.header and line_number == 1 else "")
            raise ValueError(
                f"{path}:{line_number}: a row of {len(fields)} fields where {glue_task.name}'s "
                f"{glue_task.files[split]} has {width} ({', '.join(header)}). Is this the {glue_task.directory} "
                f"directory download_glue_data.py wrote?{hint} (GLUE task {glue_task.name}, split {split})")
        long += len(fields) > width
        if labels is not None:
            label = fields[label_position]
            if not layout.header and line_number == 1 and label not in glue_task.label_names:
                raise ValueError(
                    f"{path}:1: {fields} looks like a header row, but GLUE task {glue_task.name}'s "
                    f"{glue_task.files[split]} has none: its rows are {', '.join(layout.columns)}, the label "
                    f"{list(glue_task.label_names)} in column 2. Fix: delete the header line")
            _check_label(path, line_number, glue_task, label)
            labels.append(label)
        for column, position in enumerate(text_positions):
            texts[column].append(fields[position])
        if ids is not None:
            ids.append(fields[id_position])
    if short:
        logging.warning("%s: skipped %d malformed rows with fewer than %d fields, as the original %s readers do",
                        path, short, width, glue_task.name)
    if long:
        logging.warning("%s: %d rows have more than %d fields; read as run_classifier.py reads them (texts at their "
                        "columns, a last-column label from the last field)", path, long, width)
    if not texts[0]:
        raise ValueError(f"{path} holds no examples (GLUE task {glue_task.name}, split {split}). Fix: download the "
                         "task again")
    return finetune_data.Examples(texts, labels, path,
                                  list(glue_task.label_names) if glue_task.label_names else None, ids)


# ---------------------------------------------------------------------------------------------------------------
# The fixture writer: a split in the original layout, for tests and small hand-made sets.

def _filler(column: str, row: int, label: str | None) -> str:
    """A plausible value for a column the reader does not use, so that written files look like GLUE's."""
    values = {
        "source": "gj04", "original_label": "*" if label == "0" else "",
        "#1 ID": str(1000 + 2 * row), "#2 ID": str(1001 + 2 * row),
        "genre": "main-captions", "filename": "MSRvid", "year": "2012test", "old_index": f"{row:04d}",
        "source1": "none", "source2": "none",
        "qid1": str(2 * row + 1), "qid2": str(2 * row + 2),
        "promptID": str(31193 + row), "pairID": f"{31193 + row}n",
    }
    if column in values:
        return values[column]
    if column.startswith("label"):  # MNLI's annotator labels agree with the gold label here
        return label or ""
    return str(row)  # index / id columns


def write_split(data_dir: str, task: str, split: str, rows) -> str:
    """Writes `rows` as `split` of `task` in GLUE's original layout (headers, BOM, filler columns); returns the path.

    Labelled splits take rows (text_a, [text_b,] label); test splits (id, text_a, [text_b]).
    """
    glue_task = task_of(task)
    path = split_path(data_dir, task, split)
    layout = glue_task.layouts[split]
    width = len(layout.texts) + 1
    lines = ([(_BOM if layout.bom else "") + "\t".join(layout.columns)] if layout.header else [])
    parse = {"sentence1_binary_parse": "sentence1", "sentence2_binary_parse": "sentence2",
             "sentence1_parse": "sentence1", "sentence2_parse": "sentence2"} if glue_task.name == "MNLI" else {}
    for row_number, row in enumerate(rows):
        row = tuple(str(value) for value in row)
        if len(row) != width or any("\t" in value or "\n" in value or "\r" in value for value in row):
            kind = "(id, text_a, [text_b])" if layout.id else "(text_a, [text_b,] label)"
            raise ValueError(f"write_split({task!r}, {split!r}): row {row_number} {row!r} is not {kind} with "
                             f"{width} fields free of tabs and newlines")
        if layout.id:
            values = {layout.id: row[0], **dict(zip(layout.texts, row[1:]))}
            label = None
        else:
            values = dict(zip(layout.texts, row[:-1]))
            label = values[layout.label] = row[-1]
        for column, text_column in parse.items():
            words = values[text_column]
            values[column] = f"( {words} )" if "binary" in column else f"(ROOT {words})"
        lines.append("\t".join(values[column] if column in values else _filler(column, row_number, label)
                               for column in layout.columns))
    fileio.makedirs(fileio.join(data_dir, glue_task.directory))
    with fileio.open_file(path, "wb") as file:
        file.write(("\n".join(lines) + "\n").encode("utf-8"))
    return path
