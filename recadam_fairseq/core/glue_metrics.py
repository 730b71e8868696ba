"""GLUE dev metrics over a whole validation set, in numpy (official fairseq 0.12.2 has none).

Each matches scikit-learn / scipy (tests compare them): Matthews correlation (multi-class),
binary F1, Pearson and Spearman (average ranks for ties) correlations. The classification ones
are computed from a confusion matrix, which sums across batches and workers.
"""

import numpy as np


def accuracy(pred, targ) -> float:
    return float(np.mean(np.asarray(pred) == np.asarray(targ)))


def confusion_matrix(pred, targ, k: int) -> np.ndarray:
    """cm[target, prediction] counts, labels 0..k-1."""
    pred, targ = np.asarray(pred, dtype=np.int64), np.asarray(targ, dtype=np.int64)
    return np.bincount(targ * k + pred, minlength=k * k).reshape(k, k)


def matthews_corrcoef(pred, targ) -> float:
    """Multi-class MCC (Gorodkin's R_K), as sklearn.metrics.matthews_corrcoef(targ, pred)."""
    pred, targ = np.asarray(pred), np.asarray(targ)
    labels, idx = np.unique(np.concatenate([targ, pred]), return_inverse=True)
    n = len(targ)
    return mcc_from_confusion(confusion_matrix(idx[n:], idx[:n], len(labels)))


def mcc_from_confusion(cm) -> float:
    cm = np.asarray(cm, dtype=np.float64)
    t_sum, p_sum = cm.sum(axis=1), cm.sum(axis=0)
    correct, s = np.trace(cm), cm.sum()
    cov_ytyp = correct * s - np.dot(t_sum, p_sum)
    cov_ypyp = s * s - np.dot(p_sum, p_sum)
    cov_ytyt = s * s - np.dot(t_sum, t_sum)
    if cov_ypyp * cov_ytyt == 0:
        return 0.0
    return float(cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp))


def f1(pred, targ, positive=1) -> float:
    """Binary F1 of the positive class (0 when it is never predicted nor present)."""
    pred, targ = np.asarray(pred) == positive, np.asarray(targ) == positive
    return f1_from_confusion([[np.sum(~targ & ~pred), np.sum(~targ & pred)], [np.sum(targ & ~pred), np.sum(targ & pred)]])


def f1_from_confusion(cm, positive=1) -> float:
    cm = np.asarray(cm, dtype=np.float64)
    tp = cm[positive, positive]
    denom = cm[positive, :].sum() + cm[:, positive].sum()
    return float(2 * tp / denom) if denom else 0.0


def accuracy_from_confusion(cm) -> float:
    cm = np.asarray(cm, dtype=np.float64)
    return float(np.trace(cm) / cm.sum()) if cm.sum() else 0.0


def acc_and_f1_from_confusion(cm) -> float:
    """MRPC/QQP's combined metric: the mean of accuracy and F1."""
    return (accuracy_from_confusion(cm) + f1_from_confusion(cm)) / 2


def pearson(x, y) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denom = np.sqrt(np.dot(x, x) * np.dot(y, y))
    return float(np.dot(x, y) / denom) if denom else float("nan")


def _ranks(a) -> np.ndarray:
    """1-based ranks, ties getting their average rank (scipy.stats.rankdata 'average')."""
    a = np.asarray(a, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    sorted_a = a[order]
    first = np.r_[True, sorted_a[1:] != sorted_a[:-1]]
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(a)]
    avg = (starts + ends + 1) / 2.0  # mean of 1-based positions start+1 .. end
    ranks = np.empty(len(a))
    ranks[order] = avg[group]
    return ranks


def spearman(x, y) -> float:
    return pearson(_ranks(x), _ranks(y))
