"""GLUE's official metrics per task, computed by scikit-learn and SciPy, and the numbers a GLUE table shows.

- `scores(task, predictions, labels)`: every metric GLUE reports for `task`, as the libraries give them
  (in [0, 1], correlations in [-1, 1]; a table printer multiplies by 100);
- `primary(task)`: the metric a GLUE table ranks and averages the task by (the BERT paper's Table 1: CoLA
  Matthews correlation, STS-B Spearman, MRPC and QQP F1, accuracy for the rest);
- `table_value(task, scores)`: the number(s) a table cell shows, the primary metric first;
- `average(row)`: a row's average as the BERT paper computes it (the mean of its columns, WNLI left out).

Tasks are GLUE's lower-case names, `TASKS`. MNLI is scored once per evaluation set: a caller that evaluates the
matched and mismatched sets names them `mnli_m` and `mnli_mm` (`TABLE_COLUMNS`), and every function here takes
those names as it takes `mnli`.
"""

from collections.abc import Mapping
import math
import warnings

import numpy as np
from scipy import stats
from sklearn import metrics as sk_metrics

TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
MNLI_SETS = ("mnli_m", "mnli_mm")  # MNLI's matched and mismatched evaluation sets, scored separately

# What GLUE reports per task, the primary metric (the one a table ranks and averages by) first.
METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_corr",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "stsb": ("spearman", "pearson"),
    "qqp": ("f1", "accuracy"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}

# The columns of the BERT paper's GLUE table, in its order; its "Average" is their mean (WNLI is not among them).
TABLE_COLUMNS = ("mnli_m", "mnli_mm", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")

# MRPC's and QQP's label 1 is the positive class ("equivalent", "duplicate"); GLUE's F1 is that class's.
POSITIVE_LABEL = 1


def glue_task(name: str) -> str:
    """The GLUE task `name` is scored as (`mnli_m` and `mnli_mm` are MNLI); a ValueError naming the choices."""
    task = "mnli" if name in MNLI_SETS else name
    if task not in METRICS:
        raise ValueError(f"unknown GLUE task {name!r}; choose one of {list(TASKS) + list(MNLI_SETS)}")
    return task


def scores(task: str, predictions, labels) -> dict[str, float]:
    """Every metric GLUE reports for `task` (METRICS[task]) of `predictions` against gold `labels`.

    predictions / labels: class ids for the classification tasks, similarity scores (floats) for STS-B; any
    array-like (lists, numpy, jax arrays) of one length. A constant prediction scores 0.0 where the metric is
    undefined (Matthews correlation, F1 without a positive prediction, Pearson / Spearman), never raising."""
    task = glue_task(task)
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape or predictions.ndim != 1:
        raise ValueError(f"{task}: predictions of shape {predictions.shape} against labels of shape "
                         f"{labels.shape}; give one prediction per example, both 1-D")
    if task == "stsb":
        return {"spearman": _correlation(stats.spearmanr, predictions, labels),
                "pearson": _correlation(stats.pearsonr, predictions, labels)}
    if task == "cola":
        # sklearn returns 0.0 itself when MCC's denominator is 0 (a constant prediction or constant labels). When
        # both are one and the same class its confusion matrix also warns of the single label: that is this case.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="A single label was found", category=UserWarning)
            return {"matthews_corr": float(sk_metrics.matthews_corrcoef(labels, predictions))}
    if task in ("mrpc", "qqp"):
        # zero_division=0.0: with no positive prediction and no positive label F1 is 0/0; sklearn would warn and
        # give 0.0 anyway, so say it here and keep the evaluation log quiet.
        f1 = sk_metrics.f1_score(labels, predictions, pos_label=POSITIVE_LABEL, average="binary", zero_division=0.0)
        return {"f1": float(f1), "accuracy": float(sk_metrics.accuracy_score(labels, predictions))}
    return {"accuracy": float(sk_metrics.accuracy_score(labels, predictions))}


def _correlation(correlate, predictions, labels) -> float:
    """scipy's `correlate` (pearsonr / spearmanr) of predicted against gold scores; 0.0 where it is undefined.

    A constant side (every prediction the same) has no variance: scipy warns and returns nan. We give 0.0, as
    sklearn does for Matthews correlation: such a predictor says nothing about which pairs are more similar,
    and one nan would make the table's average nan too. A nan from non-finite predictions (a diverged run)
    stays nan, so that it shows."""
    predictions, labels = predictions.astype(np.float64), labels.astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)  # the case handled just below
        value = float(correlate(predictions, labels).statistic)
    finite = np.isfinite(predictions).all() and np.isfinite(labels).all()
    return 0.0 if math.isnan(value) and finite else value


def primary(task: str) -> str:
    """The metric a GLUE table ranks and averages `task` by (the BERT paper's Table 1 caption: F1 for QQP and
    MRPC, Spearman for STS-B, accuracy elsewhere; CoLA's is Matthews correlation, GLUE's metric for it)."""
    return METRICS[glue_task(task)][0]


def table_value(task: str, task_scores: Mapping[str, float]) -> tuple[float, ...]:
    """The number(s) a GLUE table cell shows for `task`, from `scores(task, ...)`: the primary metric first.

    MRPC and QQP give (F1, accuracy), the GLUE leaderboard's "F1/accuracy"; STS-B gives (Spearman, Pearson),
    primary first so that [0] is always the number `average` takes (the leaderboard prints Pearson/Spearman);
    every other task gives one number."""
    return tuple(float(task_scores[name]) for name in METRICS[glue_task(task)])


def average(row: Mapping[str, float]) -> float:
    """A table row's average as the BERT paper's Table 1 computes it: the mean of its columns' primary values
    (MNLI-m and MNLI-mm count as two columns), WNLI left out (GLUE's problematic set, see the paper's note 8)."""
    values = [value for column, value in row.items() if glue_task(column) != "wnli"]
    if not values:
        raise ValueError(f"no GLUE task to average in {sorted(row)} (WNLI does not count)")
    return float(np.mean(values))
