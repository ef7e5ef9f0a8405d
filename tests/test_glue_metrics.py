"""GLUE's metrics: each equals scikit-learn's / SciPy's on fixed arrays and a value worked out by hand here; a
constant prediction scores a defined 0.0 without a warning; the primary metrics are the BERT paper's; and the
published rows' averages are what glue_metrics.average computes from their columns."""

import math
import warnings

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk_metrics

from bert_jax.tasks import glue_metrics
from bert_jax.tasks import glue_published

# A 2x2 confusion matrix with tp=3, fn=2 (five gold 1s) and fp=1, tn=4 (five gold 0s).
_LABELS = np.array([1, 1, 1, 1, 1, 0, 0, 0, 0, 0])
_PREDICTIONS = np.array([1, 1, 1, 0, 0, 1, 0, 0, 0, 0])


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    # The constant cases must be handled, not passed on as UndefinedMetricWarning / ConstantInputWarning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_cola_matthews_correlation():
    # MCC = (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = (3*4 - 1*2) / sqrt(4*5*5*6) = 10 / sqrt(600).
    by_hand = (3 * 4 - 1 * 2) / math.sqrt(4 * 5 * 5 * 6)
    assert glue_metrics.scores("cola", _PREDICTIONS, _LABELS) == {"matthews_corr": pytest.approx(by_hand, abs=1e-12)}
    assert by_hand == pytest.approx(sk_metrics.matthews_corrcoef(_LABELS, _PREDICTIONS), abs=1e-12)


@pytest.mark.parametrize("task", ["mrpc", "qqp"])
def test_f1_of_the_positive_class_and_accuracy(task):
    # F1 of label 1 = 2tp / (2tp + fp + fn) = 6 / 9; label 0's would be 2*4 / (2*4 + 2 + 1) = 8 / 11.
    # Accuracy = (tp + tn) / 10 = 7 / 10.
    result = glue_metrics.scores(task, _PREDICTIONS.tolist(), _LABELS.tolist())
    assert result == {"f1": pytest.approx(6 / 9, abs=1e-12), "accuracy": pytest.approx(7 / 10, abs=1e-12)}
    assert result["f1"] == pytest.approx(sk_metrics.f1_score(_LABELS, _PREDICTIONS), abs=1e-12)
    assert result["accuracy"] == pytest.approx(sk_metrics.accuracy_score(_LABELS, _PREDICTIONS), abs=1e-12)


@pytest.mark.parametrize("task", ["sst2", "qnli", "rte", "wnli"])
def test_binary_accuracy(task):
    assert glue_metrics.scores(task, _PREDICTIONS, _LABELS) == {"accuracy": pytest.approx(7 / 10, abs=1e-12)}


@pytest.mark.parametrize("task", ["mnli", "mnli_m", "mnli_mm"])
def test_mnli_accuracy_over_three_classes(task):
    # Four of six right (the third, a gold 2 read as 1, and the fifth, a gold 1 read as 2, are wrong): 4 / 6.
    labels, predictions = [0, 1, 2, 0, 1, 2], [0, 1, 1, 0, 2, 2]
    assert glue_metrics.scores(task, predictions, labels) == {"accuracy": pytest.approx(4 / 6, abs=1e-12)}
    assert 4 / 6 == pytest.approx(sk_metrics.accuracy_score(labels, predictions), abs=1e-12)


def test_stsb_pearson_and_spearman():
    # predicted x = [1, 2, 3, 4] against gold y = [1, 3, 2, 10]: x - 2.5 = [-1.5, -0.5, 0.5, 1.5], y - 4 =
    # [-3, -1, -2, 6]; sum of products 4.5 + 0.5 - 1 + 9 = 13, sums of squares 5 and 50: Pearson 13 / sqrt(250).
    # Ranks of y are [1, 3, 2, 4], so d = [0, -1, 1, 0] and Spearman = 1 - 6 * 2 / (4 * 15) = 0.8.
    predicted, gold = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 3.0, 2.0, 10.0])
    result = glue_metrics.scores("stsb", predicted, gold)
    assert result == {"pearson": pytest.approx(13 / math.sqrt(250), abs=1e-12),
                      "spearman": pytest.approx(0.8, abs=1e-12)}
    assert result["pearson"] == pytest.approx(stats.pearsonr(predicted, gold).statistic, abs=1e-12)
    assert result["spearman"] == pytest.approx(stats.spearmanr(predicted, gold).statistic, abs=1e-12)


def test_stsb_spearman_with_tied_predictions():
    # Tied predictions take their mean rank: ranks [1, 2.5, 2.5, 4] against [1, 2, 3, 4]. Centred: [-1.5, 0, 0, 1.5]
    # and [-1.5, -0.5, 0.5, 1.5]; products sum to 4.5, squares to 4.5 and 5: Spearman 4.5 / sqrt(22.5) = sqrt(0.9).
    predicted, gold = [0.5, 2.0, 2.0, 4.5], [1.0, 2.0, 3.0, 4.0]
    spearman = glue_metrics.scores("stsb", predicted, gold)["spearman"]
    assert spearman == pytest.approx(math.sqrt(0.9), abs=1e-12)
    assert spearman == pytest.approx(stats.spearmanr(predicted, gold).statistic, abs=1e-12)


def test_constant_predictions_score_zero_where_undefined():
    # Every prediction one class: MCC's denominator is 0; sklearn's convention (0.0) is kept.
    assert glue_metrics.scores("cola", [1] * 10, _LABELS) == {"matthews_corr": 0.0}
    # ... also when the labels are that one class too (every prediction right): still 0.0, not 1.0.
    assert glue_metrics.scores("cola", [1] * 4, [1] * 4) == {"matthews_corr": 0.0}
    # Never the positive class: F1 = 0 / (0 + 0 + 5) = 0; accuracy = the five gold 0s / 10.
    assert glue_metrics.scores("mrpc", [0] * 10, _LABELS) == {"f1": 0.0, "accuracy": 0.5}
    # Neither a positive prediction nor a positive label: F1 is 0/0, given as 0.0; every prediction is right.
    assert glue_metrics.scores("qqp", [0] * 4, [0] * 4) == {"f1": 0.0, "accuracy": 1.0}
    # A constant predicted score has no variance: scipy gives nan (and a warning), glue_metrics 0.0.
    assert glue_metrics.scores("stsb", [3.0] * 4, [1.0, 2.0, 3.0, 4.0]) == {"spearman": 0.0, "pearson": 0.0}
    assert glue_metrics.scores("stsb", [1.0, 2.0, 3.0, 4.0], [2.5] * 4) == {"spearman": 0.0, "pearson": 0.0}


def test_non_finite_predictions_stay_nan():
    # Not a constant prediction but a diverged one: its nan must reach the table, not read as "uncorrelated".
    result = glue_metrics.scores("stsb", [1.0, float("nan"), 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    assert math.isnan(result["pearson"]) and math.isnan(result["spearman"])


def test_primary_metrics_are_the_bert_papers():
    # BERT's Table 1: F1 for QQP and MRPC, Spearman for STS-B, accuracy elsewhere; CoLA Matthews correlation.
    assert {task: glue_metrics.primary(task) for task in glue_metrics.TASKS + glue_metrics.MNLI_SETS} == {
        "cola": "matthews_corr", "sst2": "accuracy", "mrpc": "f1", "stsb": "spearman", "qqp": "f1",
        "mnli": "accuracy", "qnli": "accuracy", "rte": "accuracy", "wnli": "accuracy",
        "mnli_m": "accuracy", "mnli_mm": "accuracy"}


def test_table_value_puts_the_primary_metric_first():
    assert glue_metrics.table_value("mrpc", {"accuracy": 0.7, "f1": 0.6}) == (0.6, 0.7)
    assert glue_metrics.table_value("stsb", {"pearson": 0.82, "spearman": 0.8}) == (0.8, 0.82)
    assert glue_metrics.table_value("cola", {"matthews_corr": 0.4}) == (0.4,)
    assert glue_metrics.table_value("mnli_mm", {"accuracy": 0.84}) == (0.84,)


def test_unknown_task_and_mismatched_lengths_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown GLUE task 'sts-b'; choose one of \['cola'"):
        glue_metrics.scores("sts-b", [1.0], [1.0])
    with pytest.raises(ValueError, match=r"rte: predictions of shape \(3,\) against labels of shape \(2,\)"):
        glue_metrics.scores("rte", [0, 1, 1], [0, 1])


def test_average_reproduces_the_published_averages():
    # BERT's Average is the mean of its nine columns (MNLI-m and -mm both; no WNLI): 716.4 / 9 = 79.6 and
    # 738.7 / 9 = 82.07...; ModernBERT's 88.4 is the mean of its eight, 707.6 / 8 = 88.45, printed as 88.4.
    means = {row.name: glue_metrics.average(row.values) for row in glue_published.PUBLISHED_ROWS}
    assert means == {"BERT-base": pytest.approx(716.4 / 9, abs=1e-9),
                     "BERT-large": pytest.approx(738.7 / 9, abs=1e-9),
                     "ModernBERT-base": pytest.approx(707.6 / 8, abs=1e-9)}
    for row in glue_published.PUBLISHED_ROWS:
        assert abs(means[row.name] - row.average) <= 0.05 + 1e-9, row.name
    assert glue_metrics.average({"rte": 70.0, "wnli": 65.1}) == 70.0


def test_published_rows_name_their_split_and_columns():
    assert [(row.name, row.split) for row in glue_published.PUBLISHED_ROWS] == [
        ("BERT-base", "test"), ("BERT-large", "test"), ("ModernBERT-base", "dev")]
    assert tuple(glue_published.BERT_BASE.values) == glue_metrics.TABLE_COLUMNS
    assert tuple(glue_published.BERT_LARGE.values) == glue_metrics.TABLE_COLUMNS
