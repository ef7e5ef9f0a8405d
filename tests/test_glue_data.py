"""GLUE's files as download_glue_data.py lays them out: every task's quirks read back exactly, bad files refused."""

import os
import re

import pytest

from bert_jax.data import glue

# Quotes stay text: the files are read with no quote processing.
_SINGLE = [("it 's \"great\" , really", "1"), ("\"a dull film", "0")]
_PAIR = [("A man plays a guitar.", "A man plays an instrument.")]

# task -> (labelled rows, test rows); pair tasks get two texts.
ROWS = {
    "cola": ([("The book was written by John.", "1"), ("Book the was John by written.", "0")],
             [("0", "The sailors rode the breeze clear of the rocks.")]),
    "sst2": (_SINGLE, [("0", "uneasy mishmash of styles"), ("1", "\"quotes\" stay")]),
    "mrpc": ([("He said \"yes\".", "He agreed.", "1"), ("Shares fell.", "Shares rose.", "0")],
             [("0", "PCCW 's chief operating officer", "Mr Wong, PCCW 's chief"), ("1", "a", "b")]),
    "stsb": ([("A plane is taking off.", "An air plane is taking off.", "5.000"), ("A man.", "A cat.", "0.500")],
             [("0", "A girl is styling her hair.", "A girl is brushing her hair.")]),
    "qqp": ([("How do I learn Python?", "How can I learn Python?", "1"), ("Why?", "How?", "0")],
            [("0", "Why do rockets look white?", "Why are rockets white?")]),
    "mnli": ([("Conceptually cream skimming has two dimensions.", "Product and geography matter.", "neutral"),
              ("you know during the season", "You lose the things.", "entailment"),
              ("One of our number will carry out your instructions.", "No one will.", "contradiction")],
             [("9", "Hierbas, ans seco, ans dulce.", "Hierbas is a name.")]),
    "qnli": ([("When did the war end?", "The war ended in 1945.", "entailment"),
              ("Who won?", "It rained.", "not_entailment")], [("0", "What came?", "Nothing came.")]),
    "rte": ([("No weapons were found.", "Weapons were found.", "not_entailment"),
             ("A dog barks.", "An animal barks.", "entailment")], [("0", "Mangla was built.", "Mangla exists.")]),
    "wnli": ([("I stuck a pin through a carrot.", "The carrot has a hole.", "1"), ("x", "y", "0")],
             [("0", "Maude and Dora had seen the trains.", "Maude had seen the trains.")]),
    "ax": (None, [("0", "The cat sat on the mat.", "The cat did not sit on the mat."),
                  ("1", "When you've got no snow, it's really hard.", "When you've got snow, it's hard.")]),
}

SPLITS = [(task, split) for task, spec in glue.TASKS.items() for split in spec.splits]


def _rows(task: str, split: str):
    labelled, test = ROWS[task]
    return test if split in glue.TASKS[task].test_splits else labelled


@pytest.mark.parametrize("task,split", SPLITS, ids=[f"{task}-{split}" for task, split in SPLITS])
def test_every_split_reads_back_the_rows_it_was_written_with(tmp_path, task, split):
    rows = _rows(task, split)
    path = glue.write_split(str(tmp_path), task, split, rows)
    examples = glue.read_split(str(tmp_path), task, split)
    spec = glue.TASKS[task]
    width = 2 if spec.pair else 1
    assert examples.source == path == os.path.join(str(tmp_path), spec.directory, spec.files[split])
    assert examples.class_names == (list(spec.label_names) if spec.label_names else None)
    if split in spec.test_splits:
        assert examples.texts == [[row[1 + column] for row in rows] for column in range(width)]
        assert examples.ids == [row[0] for row in rows] and examples.labels is None
    else:
        assert examples.texts == [[row[column] for row in rows] for column in range(width)]
        assert examples.labels == [row[-1] for row in rows] and examples.ids is None


def _read_back(path: str) -> list[str]:
    with open(path, encoding="utf-8") as file:
        return file.read().split("\n")


def test_the_fixture_writer_keeps_each_files_quirks(tmp_path):
    data_dir = str(tmp_path)
    cola = _read_back(glue.write_split(data_dir, "cola", "train", ROWS["cola"][0]))
    assert cola == ["gj04\t1\t\tThe book was written by John.", "gj04\t0\t*\tBook the was John by written.", ""]
    assert _read_back(glue.write_split(data_dir, "cola", "test", ROWS["cola"][1]))[0] == "index\tsentence"
    mrpc = _read_back(glue.write_split(data_dir, "mrpc", "dev", ROWS["mrpc"][0]))
    assert mrpc[:2] == ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                        "1\t1000\t1001\tHe said \"yes\".\tHe agreed."]
    assert _read_back(glue.write_split(data_dir, "mrpc", "test", ROWS["mrpc"][1]))[0] == (
        "index\t#1 ID\t#2 ID\t#1 String\t#2 String")
    stsb = _read_back(glue.write_split(data_dir, "stsb", "train", ROWS["stsb"][0]))
    assert stsb[:2] == [
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
        "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA plane is taking off.\t"
        "An air plane is taking off.\t5.000"]
    mnli_dev = _read_back(glue.write_split(data_dir, "mnli", "dev_mismatched", ROWS["mnli"][0]))
    assert [len(line.split("\t")) for line in mnli_dev[:-1]] == [16] * 4
    assert mnli_dev[0].split("\t")[10:] == ["label1", "label2", "label3", "label4", "label5", "gold_label"]
    assert [len(line.split("\t")) for line in _read_back(glue.write_split(data_dir, "mnli", "train",
                                                                          ROWS["mnli"][0]))[:-1]] == [12] * 4
    assert _read_back(glue.write_split(data_dir, "mnli", "test_matched", ROWS["mnli"][1]))[1].split("\t")[8:] == [
        "Hierbas, ans seco, ans dulce.", "Hierbas is a name."]
    assert _read_back(glue.write_split(data_dir, "ax", "test", ROWS["ax"][1]))[0] == "index\tsentence1\tsentence2"
    assert os.path.isfile(os.path.join(data_dir, "diagnostic", "diagnostic.tsv"))


def test_files_written_by_hand_in_glues_layout_read_as_run_classifier_reads_them(tmp_path):
    """Not through write_split: the layout as the real files have it, CRLF line ends and a blank last line too."""
    (tmp_path / "CoLA").mkdir()
    (tmp_path / "CoLA" / "dev.tsv").write_bytes(b"gj04\t1\t\tOur friends won't buy this analysis.\r\n"
                                                 b"gj04\t0\t*\tThey drank the pub.\r\n")
    (tmp_path / "MNLI").mkdir()
    header = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
              "sentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n")
    row = ("0\t63735\t63735n\tslate\t( ( The ) )\t( x )\t(ROOT (S))\t(ROOT (S))\tThe new rights are nice enough\t"
           "Everyone really likes the newest benefits\tneutral\tentailment\tneutral\tneutral\tneutral\tneutral\n")
    (tmp_path / "MNLI" / "dev_matched.tsv").write_text(header + row + "\n", encoding="utf-8")
    cola = glue.read_split(str(tmp_path), "CoLA", "dev")
    assert cola.texts == [["Our friends won't buy this analysis.", "They drank the pub."]] and cola.labels == ["1", "0"]
    mnli = glue.read_split(str(tmp_path), "MNLI", "dev_matched")
    assert mnli.texts == [["The new rights are nice enough"], ["Everyone really likes the newest benefits"]]
    assert mnli.labels == ["neutral"]


def test_qqp_skips_its_malformed_rows_and_counts_them_once_per_file(tmp_path, caplog):
    path = glue.write_split(str(tmp_path), "qqp", "train", ROWS["qqp"][0])
    with open(path, "a", encoding="utf-8") as file:
        file.write("7\t15\t16\tHow do I cut a\n8\t17\n")
    with caplog.at_level("WARNING"):
        examples = glue.read_split(str(tmp_path), "qqp", "train")
    assert examples.texts == [["How do I learn Python?", "Why?"], ["How can I learn Python?", "How?"]]
    assert examples.labels == ["1", "0"]
    warnings = [record.getMessage() for record in caplog.records if "malformed" in record.getMessage()]
    assert warnings == [f"{path}: skipped 2 malformed rows with fewer than 6 fields, as the original QQP readers do"]


def test_a_row_with_extra_fields_takes_its_last_column_label_from_the_last_field(tmp_path, caplog):
    path = glue.write_split(str(tmp_path), "rte", "dev", ROWS["rte"][0])
    with open(path, "a", encoding="utf-8") as file:
        file.write("2\tA text\twith\ta tab\tentailment\n")
    with caplog.at_level("WARNING"):
        examples = glue.read_split(str(tmp_path), "rte", "dev")
    assert examples.texts[0][-1] == "A text" and examples.texts[1][-1] == "with"
    assert examples.labels == ["not_entailment", "entailment", "entailment"]
    assert f"{path}: 1 rows have more than 4 fields" in caplog.text


def test_the_task_table():
    assert list(glue.TASKS) == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "ax"]
    assert {spec.name: spec.submission_files for spec in glue.TASKS.values()} == {
        "CoLA": {"test": "CoLA.tsv"}, "SST-2": {"test": "SST-2.tsv"}, "MRPC": {"test": "MRPC.tsv"},
        "STS-B": {"test": "STS-B.tsv"}, "QQP": {"test": "QQP.tsv"},
        "MNLI": {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}, "QNLI": {"test": "QNLI.tsv"},
        "RTE": {"test": "RTE.tsv"}, "WNLI": {"test": "WNLI.tsv"}, "AX": {"test": "AX.tsv"}}
    assert [spec.directory for spec in glue.TASKS.values()] == [
        "CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI", "diagnostic"]
    mnli, ax, stsb = glue.TASKS["mnli"], glue.TASKS["ax"], glue.TASKS["stsb"]
    assert mnli.splits == ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched")
    assert mnli.label_names == ("contradiction", "entailment", "neutral") and ax.label_names == mnli.label_names
    assert (ax.splits, ax.directory, ax.files) == (("test",), "diagnostic", {"test": "diagnostic.tsv"})
    assert stsb.is_regression and stsb.label_names is None and not glue.TASKS["rte"].is_regression
    assert [name for name, spec in glue.TASKS.items() if not spec.pair] == ["cola", "sst2"]
    assert glue.TASKS["qnli"].label_names == glue.TASKS["rte"].label_names == ("entailment", "not_entailment")
    assert glue.task_of("SST-2") is glue.TASKS["sst2"] and glue.task_of("sts-b") is stsb


def _match(path, line: int, message: str) -> str:
    return re.escape(f"{path}:{line}: {message}")


def test_a_short_row_names_the_file_line_and_task(tmp_path):
    path = glue.write_split(str(tmp_path), "rte", "train", ROWS["rte"][0])
    with open(path, "a", encoding="utf-8") as file:
        file.write("2\tOnly one sentence.\n")
    with pytest.raises(ValueError, match=_match(path, 4, "a row of 2 fields where RTE's train.tsv has 4 (index, "
                                                         "sentence1, sentence2, label). Is this the RTE directory")):
        glue.read_split(str(tmp_path), "rte", "train")


def test_a_label_outside_the_tasks_labels_names_its_line(tmp_path):
    path = glue.write_split(str(tmp_path), "rte", "dev", [("a", "b", "entailment"), ("c", "d", "neutral")])
    with pytest.raises(ValueError, match=_match(path, 3, "label 'neutral' is not one of GLUE task RTE's labels "
                                                         "['entailment', 'not_entailment']")):
        glue.read_split(str(tmp_path), "rte", "dev")
    path = glue.write_split(str(tmp_path), "stsb", "dev", [("a", "b", "5.5")])
    with pytest.raises(ValueError, match=_match(path, 2, "GLUE task STS-B's score '5.5' is not a number in [0, 5]")):
        glue.read_split(str(tmp_path), "stsb", "dev")


def test_a_missing_file_names_the_path_and_the_layout(tmp_path):
    path = os.path.join(str(tmp_path), "MNLI", "dev_mismatched.tsv")
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"{path} does not exist: GLUE task MNLI's dev_mismatched split is dev_mismatched.tsv in ")) as error:
        glue.read_split(str(tmp_path), "mnli", "dev_mismatched")
    assert ("MNLI/{train.tsv,dev_matched.tsv,dev_mismatched.tsv,test_matched.tsv,test_mismatched.tsv}"
            in str(error.value))


def test_a_header_in_colas_headerless_files_is_named(tmp_path):
    (tmp_path / "CoLA").mkdir()
    path = tmp_path / "CoLA" / "train.tsv"
    path.write_text("source\tlabel\toriginal\tsentence\ngj04\t1\t\tFine.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=_match(path, 1, "['source', 'label', 'original', 'sentence'] looks like a "
                                                         "header row, but GLUE task CoLA's train.tsv has none")):
        glue.read_split(str(tmp_path), "cola", "train")
    path.write_text("sentence\tlabel\nFine.\t1\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape("(a CoLA train/dev file has no header row)")):
        glue.read_split(str(tmp_path), "cola", "train")


def test_another_tasks_file_is_refused_at_its_header(tmp_path):
    rte = glue.write_split(str(tmp_path), "rte", "dev", ROWS["rte"][0])
    os.makedirs(tmp_path / "MNLI")
    os.replace(rte, tmp_path / "MNLI" / "dev_matched.tsv")
    with pytest.raises(ValueError, match=_match(tmp_path / "MNLI" / "dev_matched.tsv", 1, "the header row ['index', "
                                                "'sentence1', 'sentence2', 'label'] is not MNLI's dev_matched.tsv "
                                                "header, which has 16 columns")):
        glue.read_split(str(tmp_path), "mnli", "dev_matched")


def test_unknown_tasks_splits_and_rows_name_the_choices(tmp_path):
    with pytest.raises(ValueError, match=re.escape("unknown GLUE task 'squad'; the tasks are cola, sst2, mrpc, stsb, "
                                                   "qqp, mnli, qnli, rte, wnli, ax")):
        glue.read_split(str(tmp_path), "squad", "train")
    with pytest.raises(ValueError, match=re.escape("GLUE task MNLI has no split 'dev'; its splits are train, "
                                                   "dev_matched, dev_mismatched, test_matched, test_mismatched")):
        glue.read_split(str(tmp_path), "mnli", "dev")
    with pytest.raises(ValueError, match=re.escape("write_split('rte', 'test'): row 0 ('0', 'a\\tb', 'c') is not")):
        glue.write_split(str(tmp_path), "rte", "test", [("0", "a\tb", "c")])
