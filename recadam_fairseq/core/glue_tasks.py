"""The GLUE tasks, once: names, classes, dev metrics, the files' layout and fairseq's RoBERTa recipe.

Pure Python (no torch, no fairseq), read by ``--task glue_multitask`` and its criterion (which also
take a user's own tasks: ``head_primary_metric``),
``data-prep/prepare_glue.py``, ``scripts/glue/*`` (through ``recadam_fairseq/launch``) and
``summarize.py``.
"""

import re
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from .errors import ConfigError


@dataclass(frozen=True)
class Recipe:
    """fairseq's RoBERTa GLUE fine-tuning recipe (examples/roberta/README.glue.md) for one task."""

    lr: str
    batch: int
    total_updates: int
    warmup_updates: int


@dataclass(frozen=True)
class GlueTask:
    name: str
    labels: Optional[Tuple[str, ...]]  # the label names in the files; None: a regression (STS-B)
    primary_metric: str  # selects checkpoints, enters the GLUE average
    other_metrics: Tuple[str, ...]  # also reported by summarize.py
    recipe: Recipe
    # the GLUE files (data-prep/prepare_glue.py): 0-based columns of train/dev
    text_cols: Tuple[int, ...]  # fed to input0 (, input1)
    label_col: int
    columns: int  # expected columns in train (and dev unless dev_columns)
    header: bool = True
    dev_files: Tuple[str, ...] = ("dev.tsv",)  # -> valid, valid1, ...
    dev_columns: Optional[int] = None
    skip_malformed: bool = False  # skip + report rows with a wrong column count instead of failing (QQP)
    meaning: Dict[str, str] = field(default_factory=dict)  # what the 0/1 labels stand for
    test_files: Tuple[Tuple[str, str], ...] = (("test.tsv", ""),)  # (GLUE test file, submission name)
    test_text_cols: Tuple[int, ...] = ()

    @property
    def regression(self) -> bool:
        return self.labels is None

    @property
    def num_classes(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    @property
    def head_name(self) -> str:
        """The task's classification head in multi-task models: "SST-2" -> "sst_2"."""
        return head_name(self.name)

    def submission_names(self) -> Dict[str, str]:
        """GLUE test file -> the file name GLUE's submission zip expects."""
        return {f: (out or f"{self.name}.tsv") for f, out in self.test_files}


def head_name(task_name: str) -> str:
    return re.sub(r"[^a-z0-9]", "_", task_name.lower())


NLI2 = ("entailment", "not_entailment")
BINARY = ("0", "1")

# In the order of fairseq's RoBERTa GLUE table (its recipe's source); WNLI, which it leaves out, last.
TASKS: Dict[str, GlueTask] = {t.name: t for t in [
    GlueTask("MNLI", ("contradiction", "entailment", "neutral"), "accuracy", (), Recipe("1e-5", 32, 123873, 7432),
             (8, 9), -1, 12, dev_files=("dev_matched.tsv", "dev_mismatched.tsv"), dev_columns=16,
             test_files=(("test_matched.tsv", "MNLI-m.tsv"), ("test_mismatched.tsv", "MNLI-mm.tsv")),
             test_text_cols=(8, 9)),
    GlueTask("QNLI", NLI2, "accuracy", (), Recipe("1e-5", 32, 33112, 1986), (1, 2), 3, 4, test_text_cols=(1, 2)),
    GlueTask("QQP", BINARY, "f1", ("accuracy", "acc_and_f1"), Recipe("1e-5", 32, 113272, 28318),
             (3, 4), 5, 6, skip_malformed=True, meaning={"0": "not_duplicate", "1": "duplicate"},
             test_text_cols=(1, 2)),
    GlueTask("RTE", NLI2, "accuracy", (), Recipe("2e-5", 16, 2036, 122), (1, 2), 3, 4, test_text_cols=(1, 2)),
    GlueTask("SST-2", BINARY, "accuracy", (), Recipe("1e-5", 32, 20935, 1256),
             (0,), 1, 2, meaning={"0": "negative", "1": "positive"}, test_text_cols=(1,)),
    GlueTask("MRPC", BINARY, "f1", ("accuracy", "acc_and_f1"), Recipe("1e-5", 16, 2296, 137),
             (3, 4), 0, 5, meaning={"0": "not_equivalent", "1": "equivalent"}, test_text_cols=(3, 4)),
    GlueTask("CoLA", BINARY, "mcc", ("accuracy",), Recipe("1e-5", 16, 5336, 320),
             (3,), 1, 4, header=False, meaning={"0": "unacceptable", "1": "acceptable"}, test_text_cols=(1,)),
    GlueTask("STS-B", None, "pearson", ("spearman",), Recipe("2e-5", 16, 3598, 214),
             (7, 8), 9, 10, test_text_cols=(7, 8)),
    GlueTask("WNLI", BINARY, "accuracy", (), Recipe("2e-5", 16, 0, 0), (1, 2), 3, 4,
             meaning={"0": "not_entailment", "1": "entailment"}, test_text_cols=(1, 2)),
]}
# The eight tasks of the GLUE average and of fairseq's recipe (WNLI is left out, as RoBERTa's paper does).
RECIPE_TASKS = tuple(n for n, t in TASKS.items() if t.recipe.total_updates)
HEAD_TO_TASK = {t.head_name: n for n, t in TASKS.items()}


class UnknownTask(ConfigError):
    pass


# A task of the user's (data-prep/prepare_task.py's NAME-bin/labels.json): RTE's and STS-B's settings, the small
# GLUE tasks', for 10 epochs of its training set with a 6% warmup, as fairseq's recipe schedules GLUE.
OWN_TASK_LR, OWN_TASK_BATCH, OWN_TASK_EPOCHS, OWN_TASK_WARMUP = "2e-5", 16, 10, 0.06


def own_task_recipe(train_examples: int, batch: int = OWN_TASK_BATCH) -> Recipe:
    """The recipe of a user's task of ``train_examples`` training examples."""
    total = OWN_TASK_EPOCHS * max(1, -(-int(train_examples) // batch))
    return Recipe(OWN_TASK_LR, batch, total, max(1, round(OWN_TASK_WARMUP * total)))


def canonical(name: str) -> str:
    """A task name in any case ("sst-2", "COLA") -> its GLUE spelling; UnknownTask otherwise."""
    by_lower = {n.lower(): n for n in TASKS}
    try:
        return by_lower[str(name).strip().lower()]
    except KeyError:
        raise UnknownTask(f"unknown GLUE task {name!r}; known: {', '.join(TASKS)}") from None


def primary_metric(task_name: str) -> str:
    return TASKS[task_name].primary_metric


def head_primary_metric(head: str, regression: bool) -> str:
    """The dev metric a multi-task head enters ``glue_avg`` with: its GLUE task's primary metric; a
    user's own task (``--mt-tasks NAME`` with ``NAME-bin/labels.json``): accuracy, or pearson for a regression."""
    if head in HEAD_TO_TASK:
        return primary_metric(HEAD_TO_TASK[head])
    return "pearson" if regression else "accuracy"
