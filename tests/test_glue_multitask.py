"""--task glue_multitask (CA-MTL's multi-task GLUE): samplers, MT-Uncertainty, freezing, metrics, predictions.

The data: data-prep/prepare_glue.py on the tiny GLUE TSVs of test_prepare_glue (rows repeated),
binarized with its tiny GPT-2 BPE; the "pretrained" model: the session's tiny RoBERTa with its
vocabulary tensors resized to that BPE dictionary (every other tensor as pretrained). A user's
own tasks (not GLUE) are made at the end as a fairseq user makes them, with fairseq-preprocess.
"""

import json
import math
import os
import re
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import (ROOT, USER_DIR, dumps, fast_python, json_records, launch_ranks, load_ckpt, multitask_args, parse_config,
                     train_multitask)
from helpers.glue_files import GLUE, WORDS, write_bpe, write_tsv
from recadam_fairseq.tiny import make_tiny_roberta as tiny_roberta
from recadam_fairseq.prepare import prepare_glue as pg

from recadam_fairseq.core import mt_sampling
from recadam_fairseq.engine import summarize  # scripts/glue/summarize.py's code
from recadam_fairseq.use import predict_multitask  # scripts/glue/predict_multitask.py's code

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
    for k in ("encoder.sentence_encoder.embed_tokens.weight", "encoder.lm_head.bias"):
        old = ck["model"][k]
        new = torch.randn((n,) + tuple(old.shape[1:]), generator=g) * 0.02
        m = min(n, old.shape[0])
        new[:m] = old[:m]
        ck["model"][k] = new.to(old.dtype)
    ck["model"]["encoder.lm_head.weight"] = ck["model"]["encoder.sentence_encoder.embed_tokens.weight"]  # tied
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


def mt_args(mt, save_dir, *extra, tasks=TASKS, **kw):
    return multitask_args(mt, save_dir, *extra, tasks=tasks, **kw)


def train(mt, save_dir, *extra, tasks=TASKS, **kw):
    return train_multitask(mt, save_dir, *extra, tasks=tasks, **kw)


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
        # another caller's iterator (ChildTuning-D's Fisher passes) does not replace the trainer's cached one
        other = task.get_batch_iterator(ds, max_sentences=4, max_positions=64, seed=9, num_shards=2, shard_id=rank,
                                        disable_iterator_cache=True)
        assert other is not itr and task.get_batch_iterator(ds, max_sentences=4, max_positions=64, seed=9,
                                                            num_shards=2, shard_id=rank) is itr
        shards.append([b["id"].tolist() for b in itr.next_epoch_itr(shuffle=True) if b])
    whole = mt_sampling.epoch_batches("uniform", [24, 18, 18, 24], 4, seed=9, epoch=1)
    assert shards[0] == [b.tolist() for b in whole[0::2]] and shards[1] == [b.tolist() for b in whole[1::2]]


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def run(mt, tmp_path_factory):
    """One multi-task run: 4 tasks incl. STS-B and MNLI (valid1), uniform sampling, layer 0 and
    the embeddings frozen, validated at update 6 and 12."""
    save = tmp_path_factory.mktemp("run")
    _, log = train(mt, save, "--mt-sampling", "uniform", "--valid-subset", "valid,valid1",
                   "--validate-interval-updates", "6", "--save-interval-updates", "6", "--freeze-encoder-layers", "0-0", "--freeze-embeddings")
    return SimpleNamespace(save=save, log=log)


def dev_predictions(mt, ckpt_path):
    """Per task: (predictions, targets) on its dev set, through fairseq's own sentence_prediction
    datasets and the model's head (no glue_multitask code on this path)."""
    from fairseq import checkpoint_utils
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask

    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([ckpt_path])
    model = models[0].eval()
    out = {}
    for name, head in zip(TASKS, HEADS):
        reg = name == "STS-B"
        cfg = SentencePredictionConfig(data=str(mt.data / f"{name}-bin"), num_classes=1 if reg else (3 if name == "MNLI" else 2),
                                       regression_target=reg, classification_head_name=head, seed=1, no_shuffle=True,
                                       init_token=0, separator_token=2)
        task = SentencePredictionTask.setup_task(cfg)
        ds = task.load_dataset("valid")
        sample = ds.collater([ds[i] for i in range(len(ds))])
        with torch.no_grad():
            logits, _ = model(**sample["net_input"], classification_head_name=head)
        pred = logits.view(-1).numpy() if reg else logits.argmax(-1).numpy()
        targ = sample["target"].view(-1).numpy()
        if not reg:  # label ids -> label names -> GLUE's values where they are numbers
            meta = json.loads((mt.data / f"{name}-bin" / "labels.json").read_text())
            names = meta["id2label"]
            pred, targ = [names[str(int(x))] for x in pred], [names[str(int(x))] for x in targ]
        out[name] = (pred, targ)
    return out


def test_multitask_run_reports_every_task_dev_metric(mt, run):
    from recadam_fairseq.core import glue_metrics

    valid = valid_records(run.log, "valid")
    assert [r["valid_num_updates"] for r in valid] == ["6", "12"]
    last = valid[-1]
    primary = {"cola": "mcc", "mrpc": "f1", "sts_b": "pearson", "mnli": "accuracy"}
    for h, m in primary.items():
        assert f"valid_{h}_{m}" in last, sorted(last)
    for key in ("valid_cola_accuracy", "valid_mrpc_accuracy", "valid_mrpc_acc_and_f1", "valid_sts_b_spearman"):
        assert key in last
    assert float(last["valid_glue_avg"]) == pytest.approx(
        np.mean([float(last[f"valid_{h}_{m}"]) for h, m in primary.items()]), abs=0.01)
    (v1,) = valid_records(run.log, "valid1")[-1:]
    assert "valid1_mnli_accuracy" in v1 and "valid1_cola_mcc" not in v1  # MNLI-mm only
    # the logged metrics are those of the final weights' predictions, computed independently
    preds = dev_predictions(mt, str(run.save / "checkpoint_last.pt"))
    p, t = preds["CoLA"]
    assert float(last["valid_cola_mcc"]) == pytest.approx(100 * glue_metrics.matthews_corrcoef(
        [int(x) for x in p], [int(x) for x in t]), abs=0.01)
    p, t = preds["MRPC"]
    assert float(last["valid_mrpc_f1"]) == pytest.approx(100 * glue_metrics.f1([int(x) for x in p], [int(x) for x in t]), abs=0.01)
    p, t = preds["STS-B"]
    assert float(last["valid_sts_b_pearson"]) == pytest.approx(100 * glue_metrics.pearson(p, t), abs=0.01)
    p, t = preds["MNLI"]
    assert float(last["valid_mnli_accuracy"]) == pytest.approx(100 * glue_metrics.accuracy(p, t), abs=0.01)
    # --best-checkpoint-metric glue_avg picked the best validation
    best = load_ckpt(run.save / "checkpoint_best.pt")["extra_state"]["best"]
    assert best == pytest.approx(max(float(r["valid_glue_avg"]) for r in valid))
    # every task was trained on
    train_rec = json_records(run.log, "train")[-1]
    assert all(train_rec.get(f"train_{h}_loss") not in (None, "null") for h in HEADS)


def test_frozen_layers_bit_for_bit_and_the_rest_moved(mt, run):
    pre = load_ckpt(mt.pretrained)["model"]
    got = load_ckpt(run.save / "checkpoint_last.pt")["model"]
    frozen = [k for k in pre if k.startswith(("encoder.sentence_encoder.layers.0.", "encoder.sentence_encoder.embed_",
                                              "encoder.sentence_encoder.layernorm_embedding"))]
    assert len(frozen) >= 18
    for k in frozen:
        assert torch.equal(got[k], pre[k]), k
    moved = [k for k in pre if k.startswith("encoder.sentence_encoder.layers.1.") and k.endswith("weight")]
    assert moved and all(not torch.equal(got[k], pre[k]) for k in moved)
    assert "glue_multitask: frozen (not given to the optimizer) encoder.sentence_encoder.layers.0, " \
           "encoder.sentence_encoder.embed_tokens, encoder.sentence_encoder.embed_positions" in run.log
    assert sorted({k.split(".")[1] for k in got if k.startswith("classification_heads.")}) == sorted(HEADS)
    assert got["classification_heads.sts_b.out_proj.weight"].shape[0] == 1
    assert got["classification_heads.mnli.out_proj.weight"].shape[0] == 3


def test_predictions_in_glue_format(mt, run, tmp_path):
    out = tmp_path / "pred"
    assert predict_multitask.main([str(run.save / "checkpoint_last.pt"), "--glue-dir", str(mt.glue), "--bpe-dir",
                                   str(mt.bpe), "--out", str(out), "--cpu", "--batch-size", "5"]) == 0
    assert sorted(os.listdir(out)) == ["CoLA.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "MRPC.tsv", "STS-B.tsv"]
    preds = dev_predictions(mt, str(run.save / "checkpoint_last.pt"))  # test files = the dev rows
    for name, files in TEST_FILES.items():
        for test, outname in files.items():
            lines = (out / outname).read_text().splitlines()
            assert lines[0] == "index\tprediction"
            rows = [line.split("\t") for line in lines[1:]]
            n_test = len((mt.glue / name / test).read_text().splitlines()) - 1
            assert [r[0] for r in rows] == [str(i) for i in range(n_test)]
            if test == "test_mismatched.tsv":
                labels = {r[1] for r in rows}
                assert labels <= {"entailment", "neutral", "contradiction"}
                continue
            want = preds[name][0]
            if name == "STS-B":
                assert [float(r[1]) for r in rows] == pytest.approx([min(max(5 * x, 0), 5) for x in want], abs=1e-3)
            else:
                assert [r[1] for r in rows] == list(want)


@pytest.mark.parametrize("arch", ["roberta", "ca_mtl_roberta_tiny"])
def test_recadam_with_uncertainty_anchors_exactly_the_pretrained_tensors(mt, tmp_path, arch):
    """--optimizer recadam on multi-task RoBERTa, plain and CA-MTL-conditioned, MT-Uncertainty batches,
    --update-freq 2: θ* is exactly the pretrained tensors; heads and conditional modules get plain Adam."""
    sam = ["--sam-type", "fisher-sam", "--rho", "0.05", "--mask-iter-e", "2"] if arch != "roberta" else []
    _, log = train(mt, tmp_path, "--mt-sampling", "uncertainty", "--update-freq", "2", "--disable-validation",
                   "--freeze-encoder-layers", "0", "--arch", arch, *sam, updates=4, optimizer="recadam")
    pre = load_ckpt(mt.pretrained)["model"]
    ck = load_ckpt(tmp_path / "checkpoint_last.pt")
    heads = [k for k in ck["model"] if k.startswith("classification_heads.")]
    assert len(heads) == 4 * 4
    new = [k for k in ck["model"] if k not in pre and not k.startswith(("classification_heads.",
                                                                          "encoder.sentence_encoder.layers.0."))]
    if arch == "roberta":
        assert new == []
    else:  # the task embedding, alignment, attention biases, FiLM generators and the adapter
        assert any("task_embedding" in k for k in new) and any("adapter" in k for k in new), new
    # the free (plain Adam) tensors are exactly the heads and CA-MTL's new tensors; layer 0 (frozen,
    # conditional parts included) is not in the optimizer
    line = next(x for x in log.splitlines() if "not anchored, plain Adam:" in x)
    assert sorted(line.split("plain Adam: ")[1].split(": ", 1)[1].split(", ")) == sorted(heads + new)
    trainable = [k for k in ck["model"] if not k.startswith("encoder.sentence_encoder.layers.0.")
                 and k != "encoder.lm_head.weight" and not k.endswith(".version")]  # lm_head: tied to embed_tokens
    anchors = [st["anchor"] for st in ck["last_optimizer_state"]["state"].values() if "anchor" in st]
    want = [pre[k] for k in trainable if k in pre]
    assert len(anchors) == len(want) and f"anchored {len(want)} tensors" in log
    assert all(torch.equal(a, w) for a, w in zip(anchors, want))
    # MT-Uncertainty: one extra forward pass over 4 tasks x 4 candidates per micro-batch, 2 per update
    inner = json_records(log, "train_inner")
    assert [float(r["mt_extra_fwd"]) for r in inner] == [2.0] * 4
    assert [float(r["mt_scored"]) for r in inner] == [32.0] * 4
    assert [float(r["bsz"]) for r in inner] == [8.0] * 4  # 2 micro-batches of the top 4
    if sam:  # CA-MTL + RecAdam + FSAM in one run: every method's metrics are logged
        assert all(float(r["sam_eps_norm"]) > 0 and "recadam_lambda" in r for r in inner[1:]), inner


def test_esam_stops_on_mixed_task_batches(mt, tmp_path):
    """ESAM's example selection needs one head per batch: multi-task batches stop with a message."""
    rc, log = train(mt, tmp_path, "--sam-type", "esam", "--rho", "0.05", "--disable-validation", updates=1,
                    optimizer="recadam", check=False)
    assert rc != 0 and "--sam-type esam" in log and "single-task" in log, log[-2000:]


def test_two_cpu_ranks(mt, tmp_path):
    """2 gloo ranks, MT-Uncertainty: each rank scores and selects from its own candidate shard;
    the STS-B dev vectors and confusion matrices sum across ranks."""
    args = mt_args(mt, tmp_path, "--mt-sampling", "uncertainty", "--dropout", "0", "--attention-dropout", "0",
                   updates=4)
    texts = [log for _, log in launch_ranks(args, tmp_path, 2, env={"RECADAM_DUMP_DIR": str(tmp_path)},
                                            cwd=str(mt.root), timeout=120)]
    r0, r1 = dumps(tmp_path, 2)
    assert all(torch.equal(r0["model"][k], r1["model"][k]) for k in r0["model"])
    (valid,) = valid_records(texts[0], "valid")[-1:]
    assert all(f"valid_{h}_loss" in valid for h in HEADS) and "valid_sts_b_pearson" in valid
    inner = json_records(texts[0], "train_inner")
    assert [float(r["mt_extra_fwd"]) for r in inner] == [2.0] * 4  # one per rank, summed
    assert [float(r["bsz"]) for r in inner] == [8.0] * 4


# ----------------------------------------------------------------------------- bad input


def setup(mt, data=None, **kw):
    from recadam_fairseq.tasks.glue_multitask import GlueMultitaskConfig, GlueMultitaskTask

    cfg = dict(data=str(data or mt.data), mt_tasks="CoLA,STS-B", seed=1, train_subset="train")
    cfg.update(kw)
    return GlueMultitaskTask.setup_task(GlueMultitaskConfig(**cfg))


def test_bad_task_names_and_directories(mt, tmp_path):
    from recadam_fairseq.tasks.glue_multitask import MultiTaskError

    with pytest.raises(MultiTaskError, match=r"--mt-tasks SST2: not a GLUE task \(MNLI, QNLI, QQP, RTE, SST-2, MRPC, "
                                             r"CoLA, STS-B, WNLI\) and .*/SST2-bin does not exist: name a GLUE task "
                                             r"or a <NAME>-bin directory with labels.json$"):
        setup(mt, mt_tasks="CoLA,SST2")
    with pytest.raises(MultiTaskError, match=r"--mt-tasks is empty"):
        setup(mt, mt_tasks="")
    with pytest.raises(MultiTaskError, match=r"--mt-tasks RTE: no task directory .*RTE-bin"):
        setup(mt, mt_tasks="CoLA,RTE")
    with pytest.raises(MultiTaskError, match=r"data directory .*nowhere does not exist"):
        setup(mt, data=tmp_path / "nowhere")
    # a task directory binarized with another dictionary
    import shutil

    for name in ("CoLA", "STS-B"):
        shutil.copytree(mt.data / f"{name}-bin", tmp_path / f"{name}-bin")
    d = tmp_path / "STS-B-bin" / "input1" / "dict.txt"
    d.write_text(d.read_text().replace("\n", "\nextra 1\n", 1))
    with pytest.raises(MultiTaskError, match=r"STS-B-bin/input1/dict.txt differs from .*CoLA-bin/input0/dict.txt"):
        setup(mt, data=tmp_path)
    assert setup(mt, mt_tasks="cola,sts-b").mt_task_names == ["CoLA", "STS-B"]  # case-insensitive


def test_bad_sampling_mode_and_freeze_range(mt, capsys):
    from fairseq import tasks

    from recadam_fairseq.tasks.glue_multitask import MultiTaskError

    base = [str(mt.data), "--task", "glue_multitask", "--mt-tasks", "CoLA,STS-B", "--criterion", "glue_multitask",
            *tiny_roberta.TINY_ARCH, "--user-dir", USER_DIR]
    with pytest.raises(SystemExit):
        parse_config(*base, "--mt-sampling", "roundrobin")
    assert "--mt-sampling: invalid choice: 'roundrobin'" in capsys.readouterr().err
    cfg = parse_config(*base, "--freeze-encoder-layers", "0-2")
    task = tasks.setup_task(cfg.task)
    with pytest.raises(MultiTaskError, match=r"--freeze-encoder-layers '0-2': layer 2 does not exist, the model has "
                                             r"2 encoder layers \(0-1\)"):
        task.build_model(cfg.model)
    cfg = parse_config(*base, "--freeze-encoder-layers", "1-0")
    with pytest.raises(MultiTaskError, match=r"range 1-0 is empty"):
        tasks.setup_task(cfg.task).build_model(cfg.model)
    cfg = parse_config(*base, "--criterion", "sentence_prediction")
    with pytest.raises(MultiTaskError, match=r"needs --criterion glue_multitask"):
        tasks.setup_task(cfg.task).build_criterion(cfg.criterion)
    cfg = parse_config(*base, "--r3f-lambda", "0.7")
    with pytest.raises(ValueError, match=r"--r3f-lambda 0.7: R3F is not available with --criterion glue_multitask"):
        tasks.setup_task(cfg.task).build_criterion(cfg.criterion)


# ----------------------------------------------------------------------------- scripts


def test_multitask_script_dry_run(mt, tmp_path):
    env = dict(os.environ, DRY_RUN="1", DATA_DIR=str(mt.data), TASKS="cola,sts-b,MNLI", ROBERTA_PATH=mt.pretrained,
               SAVE_DIR=str(tmp_path), PYTHON=fast_python(), BATCH="4", METHOD="recadam")
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "glue", "multitask.sh"), "--seed", "5"], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    cmd = out.stdout
    # 5 epochs of ceil(24/4) + ceil(18/4) + ceil(24/4) = 17 batches, 10% warm-up
    for flag in ("--task glue_multitask", "--mt-tasks CoLA,STS-B,MNLI", "--mt-sampling uncertainty",
                 "--freeze-encoder-layers lower", "--total-num-update 85", "--warmup-updates 8", "--lr 2e-5",
                 "--optimizer recadam", "--valid-subset valid,valid1", "--best-checkpoint-metric glue_avg",
                 "--criterion glue_multitask", "--seed 5", "--max-positions 64",  # the checkpoint's arch and sizes:
                 "--arch roberta", "--encoder-layers 2", "--encoder-embed-dim 64"):
        assert f"  {flag} \\\n" in cmd or cmd.endswith(f"  {flag}\n"), (flag, cmd)
    assert (tmp_path / "MTL" / "roberta-uncertainty-recadam-k0.1-t1000" / "seed1" / "command.sh").is_file()
    # an ARCH that does not fit the checkpoint stops with one line
    bad = subprocess.run(["bash", os.path.join(ROOT, "scripts", "glue", "multitask.sh")],
                         env=dict(env, ARCH="roberta_large", SAVE_DIR=str(tmp_path / "y")), capture_output=True,
                         text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
        "multitask.sh: error: ARCH=roberta_large builds 24 layers of width 1024, but ROBERTA_PATH="), bad.stderr
    bad = subprocess.run(["bash", os.path.join(ROOT, "scripts", "glue", "multitask.sh")],
                         env=dict(env, SAMPLING="roundrobin"), capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown SAMPLING 'roundrobin'" in bad.stderr
    # METHOD: the catalogue's methods of the multi-task setting (recadam_fairseq/catalogue.py)
    bad = subprocess.run(["bash", os.path.join(ROOT, "scripts", "glue", "multitask.sh")],
                         env=dict(env, METHOD="r3f"), capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == (
        "multitask.sh: error: METHOD r3f is not one of this script's; choose one of adam recadam ewc recadam-ewc"), bad.stderr
    # FREEZE is checked against the model the checkpoint holds (2 layers), naming FREEZE, before anything is written
    bad = subprocess.run(["bash", os.path.join(ROOT, "scripts", "glue", "multitask.sh")],
                         env=dict(env, ARCH="", FREEZE="0-5", SAVE_DIR=str(tmp_path / "x")), capture_output=True,
                         text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == (
        "multitask.sh: error: FREEZE '0-5': layer 2 does not exist, the model has 2 encoder layers (0-1)"), bad.stderr
    assert not (tmp_path / "x").exists()


def test_summarize_reads_multitask_logs(run, tmp_path):
    import csv
    import shutil

    d = tmp_path / "runs" / "MTL" / "roberta-uniform-adam" / "seed1"
    d.mkdir(parents=True)
    shutil.copy(run.save / "train.log", d / "train.log")
    (d / "done").write_text("x")
    summarize.main([str(tmp_path / "runs")])
    valid = valid_records(run.log, "valid")
    best = max(valid, key=lambda r: float(r["valid_glue_avg"]))
    rows = {r["task"]: r for r in csv.DictReader(open(tmp_path / "runs" / "summary.csv"))}
    want = {"CoLA": "valid_cola_mcc", "MRPC": "valid_mrpc_f1", "STS-B": "valid_sts_b_pearson", "MNLI": "valid_mnli_accuracy"}
    for task, key in want.items():
        assert float(rows[task]["roberta-uniform-adam_mean"]) == pytest.approx(float(best[key]))
    mm = [r for r in valid_records(run.log, "valid1") if r["valid1_num_updates"] == best["valid_num_updates"]]
    assert float(rows["MNLI-mm"]["roberta-uniform-adam_mean"]) == pytest.approx(float(mm[-1]["valid1_mnli_accuracy"]))


def test_resume_mid_epoch_is_bit_exact(mt, run, tmp_path):
    """The run's update-6 checkpoint resumed to 12 (mid-epoch: the sampler rebuilds the epoch's
    batches from (seed, epoch) and fairseq skips those done) equals the straight run."""
    import shutil

    shutil.copy(run.save / "checkpoint_1_6.pt", tmp_path / "checkpoint_last.pt")
    _, log = train(mt, tmp_path, "--mt-sampling", "uniform", "--valid-subset", "valid,valid1",
                   "--validate-interval-updates", "6", "--save-interval-updates", "6", "--freeze-encoder-layers", "0-0",
                   "--freeze-embeddings", restore=False)
    assert "(epoch 1 @ 6 updates)" in log
    got, want = (load_ckpt(p)["model"] for p in (tmp_path / "checkpoint_last.pt", run.save / "checkpoint_last.pt"))
    assert all(torch.equal(got[k], want[k]) for k in want)


# ----------------------------------------------------------------------------- a user's own tasks

# name -> (sentences per example, labels), made below as a fairseq user makes sentence_prediction data
OWN = {"Movie-Sent": (1, ["pos", "neg"]), "snli3": (2, ["entailment", "neutral", "contradiction"])}
OWN_HEADS = {"Movie-Sent": "movie_sent", "snli3": "snli3", "CoLA": "cola"}
OWN_SIZES = {"train": 16, "valid": 10}


def make_own_task(data, bpe, name, sentences, labels, seed):
    """<data>/<name>-bin: GPT-2 BPE text per input, fairseq-preprocess --only-source on each input (with
    RoBERTa's dict.txt) and on the labels, and labels.json: the layout of fairseq's sentence_prediction."""
    rng = np.random.default_rng(seed)
    raw = data / f"{name}-raw"
    raw.mkdir()
    for split, n in OWN_SIZES.items():
        ys = rng.permutation(np.arange(n) % len(labels))  # every label in every split
        for k in range(sentences):  # the last sentence's first word says the label (something to learn)
            first = [rng.choice(WORDS[y::len(labels)]) if k == sentences - 1 else rng.choice(WORDS) for y in ys]
            texts = [" ".join([w, *rng.choice(WORDS, size=rng.integers(1, 5))]).capitalize() + "." for w in first]
            pg.write_lines(str(raw / f"{split}.input{k}"), pg.bpe_encode(texts, str(bpe), 1))
        pg.write_lines(str(raw / f"{split}.label"), [labels[y] for y in ys])
    dest = data / f"{name}-bin"
    for kind in [f"input{k}" for k in range(sentences)] + ["label"]:
        pg.fairseq_preprocess(["--only-source", "--trainpref", str(raw / f"train.{kind}"), "--validpref",
                               str(raw / f"valid.{kind}"), "--destdir", str(dest / kind), "--workers", "1"]
                              + (["--srcdict", str(bpe / "dict.txt")] if kind != "label" else []))
    (dest / "labels.json").write_text(json.dumps({"task": name, "num_classes": len(labels)}))


@pytest.fixture(scope="module")
def own(mt, tmp_path_factory):
    """Two user tasks (single sentence 2-class, sentence pair 3-class) and GLUE's CoLA, trained together by
    CA-MTL (task ids from the --mt-tasks order), layer 0 frozen, one epoch (14 updates, task after task), validated."""
    import shutil

    data = tmp_path_factory.mktemp("own-bin")
    for seed, (name, (sentences, labels)) in enumerate(OWN.items()):
        make_own_task(data, mt.bpe, name, sentences, labels, seed)
    shutil.copytree(mt.data / "CoLA-bin", data / "CoLA-bin")
    save = tmp_path_factory.mktemp("own-run")
    _, log = train(mt, save, "--arch", "ca_mtl_roberta_tiny", "--mt-sampling", "sequential", "--freeze-encoder-layers", "0",
                   "--lr", "1e-2", tasks=list(OWN_HEADS), updates=14, data=data)  # lr: Movie-Sent learns its word
    return SimpleNamespace(data=data, save=save, log=log, pretrained=mt.pretrained)


def own_dev_predictions(own):
    """Per task: (predictions, targets) on its dev set through fairseq's own sentence_prediction datasets and
    the saved model, each example conditioned on its task id (its place in --mt-tasks)."""
    from fairseq import checkpoint_utils
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask

    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(own.save / "checkpoint_last.pt")])
    model = models[0].eval()
    out = {}
    for t, (name, head) in enumerate(OWN_HEADS.items()):
        k = len(OWN[name][1]) if name in OWN else 2
        task = SentencePredictionTask.setup_task(SentencePredictionConfig(
            data=str(own.data / f"{name}-bin"), num_classes=k, regression_target=False, classification_head_name=head, seed=1,
            no_shuffle=True,
            init_token=0, separator_token=2))
        ds = task.load_dataset("valid")
        sample = ds.collater([ds[i] for i in range(len(ds))])
        with torch.no_grad():
            logits, _ = model(**sample["net_input"], classification_head_name=head,
                              task_ids=torch.full((len(ds),), t, dtype=torch.long))
        names = [task.label_dictionary[task.label_dictionary.nspecial + i] for i in range(k)]
        out[name] = ([names[i] for i in logits.argmax(-1).tolist()], [names[i] for i in sample["target"].view(-1).tolist()])
    return out


def test_own_tasks_train_with_glue_and_report_their_dev_metrics(own):
    from recadam_fairseq.core import glue_metrics

    assert ("glue_multitask: Movie-Sent (id 0, head movie_sent, 2 classes), snli3 (id 1, head snli3, 3 classes), "
            "CoLA (id 2, head cola, 2 classes)") in own.log
    (valid,) = valid_records(own.log, "valid")
    preds = own_dev_predictions(own)
    want = {}
    for name in OWN:
        h = OWN_HEADS[name]
        p, t = preds[name]
        assert len(t) == OWN_SIZES["valid"] and set(t) == set(OWN[name][1])
        if name == "Movie-Sent":  # it learned: its accuracy is not that of one class everywhere
            assert set(p) == set(t), p
        want[h] = 100 * glue_metrics.accuracy(p, t)  # the primary metric: accuracy
        assert float(valid[f"valid_{h}_accuracy"]) == pytest.approx(want[h], abs=0.006)
        assert float(valid[f"valid_{h}_mcc"]) == pytest.approx(100 * glue_metrics.matthews_corrcoef(p, t), abs=0.006)
        assert f"valid_{h}_f1" not in valid and f"valid_{h}_acc_and_f1" not in valid  # no "class 1" of a user's labels
    p, t = preds["CoLA"]
    want["cola"] = 100 * glue_metrics.matthews_corrcoef([int(x) for x in p], [int(x) for x in t])
    assert float(valid["valid_cola_mcc"]) == pytest.approx(want["cola"], abs=0.006)
    assert "valid_cola_f1" in valid  # GLUE tasks keep GLUE's metrics
    assert len({round(x, 2) for x in want.values()}) == 3  # three different numbers enter the mean
    assert float(valid["valid_glue_avg"]) == pytest.approx(np.mean(list(want.values())), abs=0.006)
    # the heads, CA-MTL's task embedding (one row per task), layer 0 frozen, and every task trained on
    pre, ck = load_ckpt(own.pretrained)["model"], load_ckpt(own.save / "checkpoint_last.pt")["model"]
    assert {h: ck[f"classification_heads.{h}.out_proj.weight"].shape[0] for h in OWN_HEADS.values()} == \
        {"movie_sent": 2, "snli3": 3, "cola": 2}
    (emb,) = [v for k, v in ck.items() if k.endswith("task_embedding.weight")]
    assert emb.shape[0] == 3
    frozen = [k for k in pre if k.startswith("encoder.sentence_encoder.layers.0.")]
    assert frozen and all(torch.equal(ck[k], pre[k]) for k in frozen)
    train_rec = json_records(own.log, "train")[-1]
    assert all(train_rec.get(f"train_{h}_loss") not in (None, "null") for h in OWN_HEADS.values()), train_rec



def test_own_tasks_in_the_glue_scripts(mt, own, tmp_path, capsys):
    """predict_multitask.py writes GLUE's files and skips the user's tasks (refuses them by name);
    summarize.py gives GLUE rows only and says which tasks it left out."""
    import csv

    ckpt = str(own.save / "checkpoint_last.pt")
    args = [ckpt, "--glue-dir", str(mt.glue), "--bpe-dir", str(mt.bpe), "--out", str(tmp_path / "pred"), "--cpu"]
    assert predict_multitask.main(args) == 0
    assert os.listdir(tmp_path / "pred") == ["CoLA.tsv"]
    assert "predict_multitask: skipping Movie-Sent, snli3: not GLUE tasks (no GLUE test file to predict)" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"^predict_multitask: --tasks snli3: not GLUE tasks \(this script writes GLUE's "
                                         r"test submission files\)$"):
        predict_multitask.main(args + ["--tasks", "CoLA", "snli3"])

    d = tmp_path / "runs" / "MTL" / "own" / "seed1"
    d.mkdir(parents=True)
    (d / "train.log").write_text(own.log)
    (d / "done").write_text("x")
    summarize.main([str(tmp_path / "runs")])
    assert "summarize.py: MTL/own/seed1: left out movie_sent, snli3: not GLUE tasks" in capsys.readouterr().err
    runs = list(csv.DictReader(open(tmp_path / "runs" / "runs.csv")))
    assert [r["task"] for r in runs] == ["CoLA"] and "left out: movie_sent, snli3" in runs[0]["note"]
    (valid,) = valid_records(own.log, "valid")
    assert float(runs[0]["best"]) == pytest.approx(float(valid["valid_cola_mcc"]))


def test_glue_avg_of_own_classification_and_regression_heads():
    """The criterion's reduction over two validation batches of a user's classification head (accuracy), a
    user's regression head (pearson) and CoLA (mcc): glue_avg is their mean, computed here from the counts."""
    from fairseq.logging import metrics

    from recadam_fairseq.criterions.glue_multitask import GlueMultitaskCriterion

    g = torch.Generator().manual_seed(0)
    cm = [torch.tensor([[3, 1], [2, 4]]), torch.tensor([[2, 2], [0, 3]])]  # [target, prediction]
    cola = [torch.tensor([[1, 2], [1, 3]]), torch.tensor([[2, 0], [1, 1]])]
    pred, targ = torch.randn(9, generator=g, dtype=torch.float64), torch.randn(9, generator=g, dtype=torch.float64)
    logs = []
    for b, at in enumerate([range(0, 5), range(5, 9)]):
        reg = torch.zeros(3, 9, dtype=torch.float64)
        reg[0, at], reg[1, at], reg[2, at] = pred[at], targ[at], 1.0
        logs.append({"loss": 1.0, "target_loss": 1.0, "sample_size": 10, "ntokens": 50, "nsentences": 10,
                     "mood_n": int(cm[b].sum()), "mood_loss": 1.0, "mood_ncorrect": torch.trace(cm[b]), "mood_cm": cm[b],
                     "score_n": len(at), "score_loss": 1.0, "score_reg": reg,
                     "cola_n": int(cola[b].sum()), "cola_loss": 1.0, "cola_ncorrect": torch.trace(cola[b]),
                     "cola_cm": cola[b]})
    with metrics.aggregate(new_root=True) as agg:
        GlueMultitaskCriterion.reduce_metrics(logs)
        got = agg.get_smoothed_values()
    c, k = (sum(cm).double().numpy(), sum(cola).double().numpy())
    accuracy = 100 * np.trace(c) / c.sum()
    pearson = 100 * np.corrcoef(pred.numpy(), targ.numpy())[0, 1]
    (tn, fp), (fn, tp) = k
    mcc = 100 * (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert float(got["mood_accuracy"]) == pytest.approx(accuracy, abs=0.006)
    assert float(got["score_pearson"]) == pytest.approx(pearson, abs=0.006) and "score_spearman" in got
    assert float(got["cola_mcc"]) == pytest.approx(mcc, abs=0.006) and "cola_f1" in got and "mood_f1" not in got
    assert float(got["glue_avg"]) == pytest.approx(np.mean([accuracy, pearson, mcc]), abs=0.006)


def test_own_task_errors(mt, own, tmp_path):
    """Each bad user task stops setup with one line naming the file or flag; good ones load."""
    import shutil

    from recadam_fairseq.core.errors import ConfigError

    for name in ("Movie-Sent", "snli3", "CoLA"):
        shutil.copytree(own.data / f"{name}-bin", tmp_path / f"{name}-bin")

    def variant(name, src="Movie-Sent", labels=None):
        shutil.copytree(tmp_path / f"{src}-bin", tmp_path / f"{name}-bin")
        path = tmp_path / f"{name}-bin" / "labels.json"
        if labels is None:
            path.unlink()
        else:
            path.write_text(labels if isinstance(labels, str) else json.dumps(labels))

    variant("nolabels")
    variant("other", labels={"task": "snli3", "num_classes": 2})
    variant("movie_sent", labels={"task": "movie_sent", "num_classes": 2})
    variant("one", labels={"task": "one", "num_classes": 1})
    variant("sts_b", labels={"task": "sts_b", "num_classes": 2})
    variant("target", labels={"task": "target", "num_classes": 2})
    variant("reg3", labels={"task": "reg3", "regression": True, "num_classes": 3})
    variant("bad", labels="{task: bad}")
    variant("two", src="snli3", labels={"task": "two", "num_classes": 2})  # the files hold 3 labels
    variant("nolabeldict", labels={"task": "nolabeldict", "num_classes": 2})
    shutil.rmtree(tmp_path / "nolabeldict-bin" / "label")
    d = str(tmp_path)
    cases = [
        ("CoLA,nolabels", rf"--mt-tasks nolabels: not a GLUE task \(MNLI, QNLI, QQP, RTE, SST-2, MRPC, CoLA, STS-B, WNLI\) "
                          rf"and {d}/nolabels-bin/labels.json does not exist: name a GLUE task or a <NAME>-bin "
                          rf"directory with labels.json"),
        ("movie-sent", rf"--mt-tasks movie-sent: not a GLUE task .* and {d}/movie-sent-bin does not exist"),  # case
        ("other", rf"{d}/other-bin/labels.json: describes task 'snli3', expected 'other'"),
        ("Movie-Sent,snli3,movie_sent", r"--mt-tasks: Movie-Sent and movie_sent map to one head name movie_sent "
                                        r"\(lower case, other characters than a-z0-9 as _\); rename one"),
        ("one", rf"{d}/one-bin/labels.json: num_classes 1: a classification task needs an integer >= 2 \(expected "
                rf'{{"task": "one", "num_classes": K}} or {{"task": "one", "regression": true}}\)'),
        ("sts_b", r"--mt-tasks sts_b: its head name sts_b is GLUE task STS-B's; rename the task and its directory"),
        ("target", r"--mt-tasks target: head name target would log as the criterion's own target_loss"),
        ("reg3", rf"{d}/reg3-bin/labels.json: a regression has one output, but num_classes is 3"),
        ("bad", rf"{d}/bad-bin/labels.json: not valid JSON"),
        ("two", rf"{d}/two-bin/label/train.bin, example \d+: label '\w+' \(line 3 of label/dict\.txt\) is class index 2, but "
                rf"{d}/two-bin/labels.json "
                rf"num_classes 2 gives the head classes 0-1; set {d}/two-bin/labels.json num_classes 3"),
        ("nolabeldict", rf"--mt-tasks nolabeldict: {d}/nolabeldict-bin/label/dict.txt is missing"),
    ]
    for spec, message in cases:
        with pytest.raises(ConfigError) as e:
            setup(mt, data=tmp_path, mt_tasks=spec)
        assert re.match(message, str(e.value)) and "\n" not in str(e.value), (spec, str(e.value))
    task = setup(mt, data=tmp_path, mt_tasks="snli3,cola,Movie-Sent")
    assert task.mt_task_names == ["snli3", "CoLA", "Movie-Sent"] and task.num_classes == [3, 2, 2]
    assert task.head_names == ["snli3", "cola", "movie_sent"]


def test_per_example_losses_are_each_example_alone_and_feed_ewc_task_fisher(mt):
    """glue_multitask's per-example losses (EWC's --ewc-fisher task) on a batch mixing the four heads, STS-B's
    regression included, in float64: each is that example's loss computed alone through the criterion, and
    they sum to the batch's; task_fisher takes them (a Fisher of 12 examples, finite, not all zero)."""
    from recadam_fairseq.criterions.fisher_source import task_fisher
    from recadam_fairseq.tools import fisher as tool

    cfg, task, model, criterion = tool.setup(mt_args(mt, mt.root / "unused"))
    model = model.double().eval()
    data = task.dataset("train")  # 3 examples of each task in one batch (the sampler's batches hold one task)
    batch = data.collater([data[int(o) + j] for j in range(3) for o in data.offsets])
    assert batch["task_ids"].tolist() == list(range(len(TASKS))) * 3  # interleaved: positions matter
    losses = criterion.per_example_loss(model, batch)
    F = torch.nn.functional
    for i, idx in enumerate(batch["id"].tolist()):
        one = data.collater([data[idx]])
        t = int(one["task_ids"][0])
        logits = model.classification_heads[HEADS[t]](model(**one["net_input"], features_only=True)[0])
        y = one["target"].view(-1)
        want = F.mse_loss(logits.view(-1), y.double()) if HEADS[t] == "sts_b" else F.cross_entropy(logits, y.long())
        torch.testing.assert_close(losses[i], want, rtol=1e-12, atol=0)
    torch.testing.assert_close(losses.sum().float(), criterion(model, batch)[2]["target_loss"])  # fp32 there
    fisher, n = task_fisher(criterion, model, tool.batches_cfg(cfg), 12)
    assert n == 12 and all(torch.isfinite(f).all() for f in fisher.values())
    assert sum(float(f.sum()) for f in fisher.values()) > 0
