"""--task glue_multitask (CA-MTL's multi-task GLUE): samplers, MT-Uncertainty, freezing, metrics, predictions.

The data: data-prep/prepare_glue.py on the tiny GLUE TSVs of test_prepare_glue (rows repeated),
binarized with its tiny GPT-2 BPE; the "pretrained" model: the session's tiny RoBERTa with its
vocabulary tensors resized to that BPE dictionary (every other tensor as pretrained).
"""

import json
import math
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import TRAIN_ENTRY, USER_DIR, ROOT, json_records, load_ckpt, tiny_roberta
from test_prepare_glue import GLUE, pg, write_bpe, write_tsv

from recadam_fairseq import mt_sampling

TASKS = ["CoLA", "MRPC", "STS-B", "MNLI"]
HEADS = ["cola", "mrpc", "sts_b", "mnli"]
REPEAT = {"train": 6, "dev": 3}
# GLUE's test files: index column, then the text columns (prepare_glue reads train/dev only)
TEST_FILES = {"CoLA": {"test.tsv": "CoLA.tsv"}, "MRPC": {"test.tsv": "MRPC.tsv"}, "STS-B": {"test.tsv": "STS-B.tsv"},
              "MNLI": {"test_matched.tsv": "MNLI-m.tsv", "test_mismatched.tsv": "MNLI-mm.tsv"}}
DEV_OF_TEST = {"test.tsv": "dev.tsv", "test_matched.tsv": "dev_matched.tsv", "test_mismatched.tsv": "dev_mismatched.tsv"}


def write_multitask_glue(glue_dir):
    """The tiny GLUE rows, repeated; test files made from the dev rows (GLUE's test layout)."""
    for task in TASKS:
        text_cols, _, files = GLUE[task]
        os.makedirs(os.path.join(glue_dir, task), exist_ok=True)
        for fname, (header, rows) in files.items():
            rep = REPEAT["train" if fname == "train.tsv" else "dev"]
            ncols = len(header) if header else len(rows[0])
            good = [r for r in rows if len(r) == ncols]
            write_tsv(os.path.join(glue_dir, task, fname), header, good * rep)
        for test, _ in TEST_FILES[task].items():
            _, rows = files[DEV_OF_TEST[test]]
            rows = rows * REPEAT["dev"]
            if task == "CoLA":  # GLUE's CoLA test: index, sentence (with a header)
                write_tsv(os.path.join(glue_dir, task, test), ["index", "sentence"], [[str(i), r[3]] for i, r in enumerate(rows)])
            elif task == "MRPC":  # index, #1 ID, #2 ID, #1 String, #2 String
                write_tsv(os.path.join(glue_dir, task, test), ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                          [[str(i), r[1], r[2], r[3], r[4]] for i, r in enumerate(rows)])
            elif task == "STS-B":  # the train columns without the score
                write_tsv(os.path.join(glue_dir, task, test), files["train.tsv"][0][:-1],
                          [[str(i)] + r[1:-1] for i, r in enumerate(rows)])
            else:  # MNLI: index ... sentence1, sentence2
                write_tsv(os.path.join(glue_dir, task, test), files["train.tsv"][0][:10],
                          [[str(i)] + r[1:10] for i, r in enumerate(rows)])


def make_pretrained(tiny, bpe_dir, out):
    """The tiny pretrained RoBERTa with embeddings / LM output resized to the BPE dictionary."""
    from fairseq.data import Dictionary

    n = len(Dictionary.load(os.path.join(bpe_dir, "dict.txt"))) + 1  # + <mask>, as the tasks add it
    ck = load_ckpt(tiny.pretrained)
    g = torch.Generator().manual_seed(0)
    for k in ("encoder.sentence_encoder.embed_tokens.weight", "encoder.lm_head.weight", "encoder.lm_head.bias"):
        old = ck["model"][k]
        new = torch.randn((n,) + tuple(old.shape[1:]), generator=g) * 0.02
        m = min(n, old.shape[0])
        new[:m] = old[:m]
        ck["model"][k] = new.to(old.dtype)
    torch.save(ck, out)


@pytest.fixture(scope="module")
def mt(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("mt")
    glue, bpe, data = root / "glue", root / "bpe", root / "glue-bin"
    write_multitask_glue(glue)
    write_bpe(bpe)
    assert pg.main(["--glue-dir", str(glue), "--bpe-dir", str(bpe), "--out", str(data), "--tasks", *TASKS]) == 0
    make_pretrained(tiny, bpe, root / "pretrained.pt")
    return SimpleNamespace(root=root, glue=glue, bpe=bpe, data=data, pretrained=str(root / "pretrained.pt"))


def mt_args(mt, save_dir, *extra, tasks=TASKS, updates=12, optimizer="adam", restore=True):
    args = [str(mt.data), "--task", "glue_multitask", "--mt-tasks", ",".join(tasks),
            "--criterion", "glue_multitask", *tiny_roberta.TINY_ARCH,
            "--optimizer", optimizer, "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-6",
            "--lr", "1e-3", "--lr-scheduler", "fixed", "--max-update", str(updates),
            "--batch-size", "4", "--required-batch-size-multiple", "1", "--seed", "3", "--num-workers", "0", "--cpu",
            "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--user-dir", USER_DIR,
            "--log-format", "json", "--log-interval", "1",
            "--best-checkpoint-metric", "glue_avg", "--maximize-best-checkpoint-metric"]
    if optimizer == "recadam":
        args += ["--recadam-pretrain-cof", "500"]
    if restore:
        args += ["--restore-file", mt.pretrained, "--reset-optimizer", "--reset-dataloader", "--reset-meters"]
    return args + list(extra)


def train(mt, save_dir, *extra, check=True, **kw):
    os.makedirs(save_dir, exist_ok=True)
    log = os.path.join(str(save_dir), "train.log")
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, TRAIN_ENTRY, *mt_args(mt, save_dir, *extra, **kw)],
                              stdout=f, stderr=subprocess.STDOUT, cwd=str(mt.root))
    text = open(log).read()
    if check and proc.returncode != 0:
        raise AssertionError(f"fairseq-train failed ({proc.returncode}):\n{text[-4000:]}")
    return proc.returncode, text


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def valid_records(log, subset="valid"):
    return [r for r in json_records(log, subset)]


# ----------------------------------------------------------------------------- samplers (pure)

SIZES = [100, 1000, 30]


def task_of(batch, sizes=SIZES):
    return int(np.searchsorted(np.cumsum(sizes), batch[0], side="right"))


@pytest.mark.parametrize("mode,temperature", [("uniform", 1.0), ("proportional", 1.0), ("proportional", 2.0)])
def test_sampler_frequencies_match_the_definition(mode, temperature):
    """Over ~23k batches (20 epochs) each task's share is p_t within 4 standard errors."""
    want = {"uniform": np.full(3, 1 / 3), "proportional": np.power(SIZES, 1 / temperature) / np.power(SIZES, 1 / temperature).sum()}[mode]
    counts = np.zeros(3)
    for epoch in range(1, 21):
        batches = mt_sampling.epoch_batches(mode, SIZES, 1, seed=5, epoch=epoch, temperature=temperature)
        assert len(batches) == sum(SIZES)  # one epoch = ceil(n_t / B) batches summed
        for b in batches:
            t = task_of(b)
            assert all(task_of([i]) == t for i in b)  # one task per batch
            counts[t] += 1
    n = counts.sum()
    tol = 4 * np.sqrt(want * (1 - want) / n)  # ≈ 0.012 for p = 1/3
    assert np.all(np.abs(counts / n - want) < tol), (counts / n, want, tol)


def test_sampler_draws_each_task_without_replacement():
    batches = mt_sampling.epoch_batches("uniform", SIZES, 8, seed=1, epoch=1)
    small = np.concatenate([b for b in batches if task_of(b) == 2])
    # the 30 examples of the small task: every block of 30 draws is a permutation of them
    for k in range(len(small) // 30):
        assert sorted(small[30 * k:30 * (k + 1)]) == list(range(1100, 1130))


def test_sequential_is_task_after_task_covering_each_once():
    batches = mt_sampling.epoch_batches("sequential", SIZES, 16, seed=1, epoch=3)
    tasks = [task_of(b) for b in batches]
    assert tasks == sorted(tasks) and tasks[0] == 0 and tasks[-1] == 2
    assert [tasks.count(t) for t in range(3)] == [math.ceil(n / 16) for n in SIZES]
    assert sorted(np.concatenate(batches)) == list(range(sum(SIZES)))
    # reproducible per (seed, epoch) -- what resuming relies on -- and reshuffled per epoch
    again = mt_sampling.epoch_batches("sequential", SIZES, 16, seed=1, epoch=3)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    other = mt_sampling.epoch_batches("sequential", SIZES, 16, seed=1, epoch=4)
    assert not all(np.array_equal(a, b) for a, b in zip(batches, other))


def test_uncertainty_candidates_hold_b_examples_of_every_task():
    batches = mt_sampling.epoch_batches("uncertainty", SIZES, 8, seed=1, epoch=1)
    assert len(batches) == sum(math.ceil(n / 8) for n in SIZES)
    for b in batches[:20]:
        assert [task_of([i]) for i in b] == [0] * 8 + [1] * 8 + [2] * 8


def test_unknown_sampling_mode():
    with pytest.raises(ValueError, match="unknown sampling mode 'roundrobin'"):
        mt_sampling.epoch_batches("roundrobin", SIZES, 8, seed=1, epoch=1)


# ----------------------------------------------------------------------------- MT-Uncertainty


def reference_selection(logits_per_example, task_ids, num_classes, k, donor):
    """The paper's definition, in float64 and plain Python (independent of mt_sampling)."""
    h = []
    for lg, t in zip(logits_per_example, task_ids):
        if num_classes[t] == 1:
            h.append(None)
            continue
        z = np.asarray(lg, dtype=np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()
        h.append(float(-(p * np.log(p)).sum() / math.log(num_classes[t])))
    means = {}
    for t in set(task_ids):
        vals = [x for x, s in zip(h, task_ids) if s == t and x is not None]
        if vals:
            means[t] = sum(vals) / len(vals)
    top = max(means.values())
    score = [None if x is None else x * means[t] / top for x, t in zip(h, task_ids)]
    donor_scores = [s for s, t in zip(score, task_ids) if t == donor]
    for t in set(task_ids):
        if num_classes[t] == 1:
            pos = [i for i, s in enumerate(task_ids) if s == t]
            for j, i in enumerate(pos):
                score[i] = donor_scores[j % len(donor_scores)]
    order = sorted(range(len(score)), key=lambda i: (-score[i], i))
    return sorted(order[:k]), score


def test_uncertainty_selection_equals_the_definition():
    g = torch.Generator().manual_seed(4)
    num_classes = [2, 3, 1, 2]
    task_ids = [0] * 5 + [1] * 5 + [2] * 5 + [3] * 3
    logits = [torch.randn(num_classes[t], generator=g) * (1 + 2 * t) for t in task_ids]
    want, want_scores = reference_selection([x.tolist() for x in logits], task_ids, num_classes, 6, donor=0)
    tid = torch.tensor(task_ids)
    h = torch.empty(len(tid))
    for t in range(4):
        pos = torch.nonzero(tid == t).flatten()
        h[pos] = mt_sampling.normalized_entropy(torch.stack([logits[i] for i in pos]))
    scores = mt_sampling.uncertainty_scores(h, tid, 4)
    assert torch.allclose(scores.double(), torch.tensor(want_scores, dtype=torch.float64), atol=1e-6)
    assert mt_sampling.select_uncertain(scores, 6).tolist() == want
    assert set(want) != set(range(6))  # not simply the first B


class FixedModel(torch.nn.Module):
    """Predictions fixed per example: the head's logits are table rows chosen by the first token.

    Task-conditioned (interface §3): records the task_ids it is given.
    """

    is_task_conditioned = True

    def __init__(self, table, heads):
        super().__init__()
        self.table = table
        self.classification_heads = torch.nn.ModuleDict(
            {h: _Slice(k) for h, k in heads.items()})
        self.seen_task_ids = []

    def forward(self, src_tokens, features_only=False, return_all_hiddens=False, classification_head_name=None,
                task_ids=None, **kwargs):
        self.seen_task_ids.append(task_ids)
        feats = self.table[src_tokens[:, 1]].unsqueeze(1).expand(-1, src_tokens.size(1), -1)
        return feats, {}


class _Slice(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, features):
        return features[:, 0, : self.k]


def test_task_select_uncertain_with_fixed_predictions(mt):
    from recadam_fairseq.tasks.glue_multitask import GlueMultitaskConfig, GlueMultitaskTask

    task = GlueMultitaskTask.setup_task(GlueMultitaskConfig(data=str(mt.data), mt_tasks=",".join(TASKS),
                                                            mt_sampling="uncertainty", seed=1, train_subset="train"))
    ds = task.load_dataset("train")
    itr = task.get_batch_iterator(ds, max_sentences=4, max_positions=64, seed=1).next_epoch_itr(shuffle=False)
    sample = next(iter(itr))
    assert len(sample["task_ids"]) == 16 and sorted(set(sample["task_ids"].tolist())) == [0, 1, 2, 3]
    vocab = len(task.source_dictionary)
    table = torch.randn(vocab, 3, generator=torch.Generator().manual_seed(2)) * 3
    model = FixedModel(table, dict(zip(HEADS, task.num_classes)))
    picked = task.select_uncertain(model, sample)
    # independent: the logits each example gets, then the definition
    first = sample["net_input"]["src_tokens"][:, 1]
    logits = [table[first[i]][: task.num_classes[t]].tolist() for i, t in enumerate(sample["task_ids"].tolist())]
    want, _ = reference_selection(logits, sample["task_ids"].tolist(), task.num_classes, 4, donor=0)
    assert picked["id"].tolist() == sample["id"][want].tolist()
    assert torch.equal(model.seen_task_ids[0], sample["task_ids"])  # the conditioned model got per-example ids
    assert picked["mt_scored"] == 16 and picked["nsentences"] == 4
    assert picked["net_input"]["src_tokens"].size(1) == int(picked["net_input"]["src_lengths"].max())


def test_each_rank_gets_its_own_shard(mt):
    from recadam_fairseq.tasks.glue_multitask import GlueMultitaskConfig, GlueMultitaskTask

    shards = []
    for rank in range(2):
        task = GlueMultitaskTask.setup_task(GlueMultitaskConfig(data=str(mt.data), mt_tasks=",".join(TASKS),
                                                                mt_sampling="uniform", seed=1, train_subset="train"))
        ds = task.load_dataset("train")
        itr = task.get_batch_iterator(ds, max_sentences=4, max_positions=64, seed=9, num_shards=2, shard_id=rank)
        shards.append([b["id"].tolist() for b in itr.next_epoch_itr(shuffle=True) if b])
    whole = mt_sampling.epoch_batches("uniform", [24, 18, 18, 24], 4, seed=9, epoch=1)
    assert shards[0] == [b.tolist() for b in whole[0::2]] and shards[1] == [b.tolist() for b in whole[1::2]]
