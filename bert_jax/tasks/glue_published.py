"""Published GLUE rows to set a run's scores beside, each with its source and the split it was scored on.

Values are as published: percentages (a run's `glue_metrics.scores` are fractions; a table printer multiplies
those by 100), each under the column name `glue_metrics` uses (`mnli_m`, `mnli_mm`, `qqp`, ...), and each the
task's primary metric as the source table reports it. A test row and a dev row are not the same measurement:
GLUE's test labels are private (only its server scores them), so a run scored with its own labels is a dev score.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class PublishedRow:
    """One published row of a GLUE table."""

    name: str
    source: str  # paper, arXiv id, table
    split: str  # "test" (GLUE's server) or "dev"
    values: dict[str, float]  # column -> value as published, in percent
    average: float  # the source's own average (its definition is in `source`)


# BERT paper, Table 1 (arXiv 1810.04805v2): GLUE test set, scored by the evaluation server. Its caption: F1 for QQP
# and MRPC, Spearman for STS-B, accuracy for the other tasks; "Average" leaves out WNLI (glue_metrics.average
# reproduces it from the nine columns). Every number below confirmed against the paper's text as stored in
# github.com/x4nth055/pythoncode-tutorials, handling-pdf-files/extract-text-from-pdf/all-text.txt (the arXiv v2
# PDF's text); BERT-base's row also against huggingface.co/google-bert/bert-base-uncased's model card, as copied in
# github.com/MinwooPark96/ptMLM, scripts/bert-base-uncased/README.md.
_BERT_TABLE_1 = "Devlin et al., 2019, BERT, arXiv 1810.04805, Table 1 (average excludes WNLI)"
BERT_BASE = PublishedRow(
    name="BERT-base", source=_BERT_TABLE_1, split="test",
    values={"mnli_m": 84.6, "mnli_mm": 83.4, "qqp": 71.2, "qnli": 90.5, "sst2": 93.5, "cola": 52.1, "stsb": 85.8,
            "mrpc": 88.9, "rte": 66.4},
    average=79.6)
BERT_LARGE = PublishedRow(
    name="BERT-large", source=_BERT_TABLE_1, split="test",
    values={"mnli_m": 86.7, "mnli_mm": 85.9, "qqp": 72.1, "qnli": 92.7, "sst2": 94.9, "cola": 60.5, "stsb": 86.5,
            "mrpc": 89.3, "rte": 70.1},
    average=82.1)

# ModernBERT paper (arXiv 2412.13663, https://arxiv.org/html/2412.13663v2), Table 5: GLUE dev set, one MNLI column
# (the table does not say matched or mismatched), and a caption that names no per-task metric. Per-task numbers
# confirmed against a markdown transcription of the paper's appendix (its Table 5 row "ModernBERT | 149M | 8192 |
# 65.1 | 96.0 | 92.2 | 91.8 | 92.1 | 89.1 | 93.9 | 87.4"; the copy's repository is not known); MRPC's 92.2 also on
# https://www.wizwand.com/paper/68fa76471e209131cea6c1c0. The average 88.4 is the model card's GLUE score
# (huggingface.co/answerdotai/ModernBERT-base, seen at https://gr.tbb.rip/models/answerdotai/ModernBERT-base), the
# paper's Table 1 GLUE number (a copy of that table, github.com/sillontea/CIKM_reivew content/2412.13663/index.md,
# shows 88.4 in the row, its columns misaligned); it is the mean of the eight columns (88.45), as
# glue_metrics.average computes it.
MODERNBERT_BASE = PublishedRow(
    name="ModernBERT-base", source="Warner et al., 2024, ModernBERT, arXiv 2412.13663, Table 5 (average: Table 1)",
    split="dev",
    values={"cola": 65.1, "sst2": 96.0, "mrpc": 92.2, "stsb": 91.8, "qqp": 92.1, "mnli": 89.1, "qnli": 93.9,
            "rte": 87.4},
    average=88.4)

PUBLISHED_ROWS = (BERT_BASE, BERT_LARGE, MODERNBERT_BASE)
