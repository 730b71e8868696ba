"""What a run reports (λ, distance, penalty, target loss, GLUE metrics) and the coupled objective."""

import glob
import json
import math
import os

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

from helpers import json_records, load_ckpt, parse, trainable_names
from recadam_fairseq.core import glue_metrics

CRIT = ["--criterion", "sentence_prediction_recadam"]


# --------------------------------------------------------------------------- GLUE metrics
@pytest.mark.parametrize("seed", range(5))
def test_glue_metrics_match_sklearn_and_scipy(seed):
    rng = np.random.default_rng(seed)
    t2, p2 = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    p2[:150] = t2[:150]  # correlated with the targets
    t3, p3 = rng.integers(0, 3, 300), rng.integers(0, 3, 300)
    x = rng.normal(size=200)
    y = np.round(x + rng.normal(size=200), 1)  # rounded: ties for the ranks
    assert glue_metrics.matthews_corrcoef(p2, t2) == pytest.approx(matthews_corrcoef(t2, p2), abs=1e-12)
    assert glue_metrics.matthews_corrcoef(p3, t3) == pytest.approx(matthews_corrcoef(t3, p3), abs=1e-12)
    assert glue_metrics.f1(p2, t2) == pytest.approx(f1_score(t2, p2), abs=1e-12)
    assert glue_metrics.pearson(x, y) == pytest.approx(pearsonr(x, y)[0], abs=1e-12)
    assert glue_metrics.spearman(x, y) == pytest.approx(spearmanr(x, y)[0], abs=1e-12)
    assert glue_metrics.matthews_corrcoef(np.zeros(5), np.ones(5)) == 0.0  # sklearn's convention
    # what the criterion sums over batches and workers: a confusion matrix
    cm = sum(glue_metrics.confusion_matrix(p2[i:i + 64], t2[i:i + 64], 2) for i in range(0, 300, 64))
    assert glue_metrics.mcc_from_confusion(cm) == pytest.approx(matthews_corrcoef(t2, p2), abs=1e-12)
    assert glue_metrics.f1_from_confusion(cm) == pytest.approx(f1_score(t2, p2), abs=1e-12)
    assert glue_metrics.accuracy_from_confusion(cm) == pytest.approx(np.mean(p2 == t2), abs=1e-12)


# --------------------------------------------------------------------------- config
def test_shared_flags_exist_once_and_reach_both_components():
    cfg = parse(*CRIT, "--recadam-anneal-k", "0.3", "--recadam-pretrain-cof", "7", "--recadam-objective", "coupled")
    assert cfg.optimizer.recadam_anneal_k == cfg.criterion.recadam_anneal_k == 0.3
    assert cfg.optimizer.recadam_pretrain_cof == cfg.criterion.recadam_pretrain_cof == 7
    assert str(cfg.criterion.recadam_objective) == "coupled"


# --------------------------------------------------------------------------- real runs
K, T0, GAMMA = 0.5, 6.0, 500.0


@pytest.fixture(scope="module")
def json_runs(tiny, tmp_path_factory):
    """recadam (with the forgetting meter's probe) and adam, json logs every 2 updates, validation and
    interval checkpoints every 4: for the metrics test and the plot test."""
    from recadam_fairseq.prepare import binarize_probe

    root = tmp_path_factory.mktemp("json")
    probe = str(root / "probe")  # the forgetting meter's panel: the recadam run has it
    binarize_probe.main(["--text", os.path.join(tiny.root, "raw", "lm.valid"), "--dict",
                         os.path.join(tiny.root, "lm-bin", "dict.txt"), "--out", probe])
    runs = {}
    for name, flags, opt in (("recadam", ["--recadam-anneal-k", str(K), "--recadam-anneal-t0", str(T0),
                                          "--recadam-pretrain-cof", str(GAMMA), "--forgetting-probe", probe,
                                          "--save-interval-updates", "4", "--keep-interval-updates", "-1",
                                          "--best-checkpoint-metric", "mcc", "--maximize-best-checkpoint-metric"],
                              "recadam"),
                             ("adam", [], "adam")):
        rc, log = tiny.train(root / name, *CRIT, *flags, "--log-format", "json", "--log-interval", "2",
                             "--validate-interval-updates", "4", optimizer=opt, validate=True)
        (root / name / "json.log").write_text(log)
        runs[name] = (root / name, log)
    return runs


def test_reported_metrics_agree_with_the_checkpoints(json_runs):
    save, log = json_runs["recadam"]
    k, t0, gamma = K, T0, GAMMA
    inner = [x for x in json_records(log, "train_inner") if int(x["num_updates"]) % 4 == 0]  # the saved updates
    assert [int(x["num_updates"]) for x in inner] == [4, 8, 12]
    for x in inner:
        n = int(x["num_updates"])
        lam = 1 / (1 + math.exp(-k * (n - t0)))
        assert float(x["recadam_lambda"]) == pytest.approx(lam, rel=1e-5)
        ck = load_ckpt(glob.glob(str(save / f"checkpoint_*_{n}.pt"))[0])
        dist = sum(((ck["model"][_name] - st["anchor"]).double() ** 2).sum().item()
                   for _name, st in zip(_names(ck), ck["last_optimizer_state"]["state"].values()) if "anchor" in st)
        assert dist > 0
        assert float(x["recadam_dist"]) == pytest.approx(dist, rel=1e-5)
        assert float(x["recadam_penalty"]) == pytest.approx(gamma / 2 * dist, rel=1e-5)
        assert "target_loss" in x
    valid = json_records(log, "valid")
    assert valid and all({"valid_accuracy", "valid_mcc", "valid_f1", "valid_acc_and_f1"} <= v.keys() for v in valid)
    assert "valid_best_mcc" in valid[-1]


def _names(ck):
    """Names of the optimizer's tensors in order (fp32: the model's trainable parameters)."""
    import tempfile, os

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "c.pt")
        torch.save(ck, p)
        return trainable_names(p)


def test_regression_metrics_in_real_logs(tiny, tmp_path):
    """STS-B style: one output, MSE loss, Pearson/Spearman over the whole valid set."""
    import os
    import shutil

    data = tmp_path / "reg"
    shutil.copytree(os.path.join(tiny.cls_bin, "input0"), data / "input0")
    (data / "label").mkdir()
    for split in ("train", "valid"):
        n = len(open(os.path.join(tiny.root, "raw", f"cls.{split}.label")).read().split())
        (data / "label" / f"{split}.label").write_text("\n".join(f"{(i % 11) / 10:.1f}" for i in range(n)) + "\n")
    rc, log = tiny.train(tmp_path / "s", "--regression-target", *CRIT, "--log-format", "json", "--recadam-pretrain-cof", "500",
                         "--best-checkpoint-metric", "pearson", "--maximize-best-checkpoint-metric",
                         "--num-classes", "1", validate=True, data=str(data))
    valid = json_records(log, "valid")
    assert valid and all({"valid_pearson", "valid_spearman"} <= v.keys() for v in valid)
    assert "valid_mcc" not in valid[-1]
    # resuming a run that validated, meters included (no --reset-meters): the whole-set totals are
    # not saved in the checkpoint (fairseq could not rebuild a meter class of ours)
    rc, log = tiny.train(tmp_path / "s", "--regression-target", *CRIT, "--log-format", "json",
                         "--recadam-pretrain-cof", "500", "--num-classes", "1", validate=True, data=str(data),
                         restore=False, updates=14)
    assert "Loaded checkpoint" in log and [int(v["valid_num_updates"]) for v in json_records(log, "valid")] == [14]


def test_coupled_objective_trains_with_fairseq_adam(tiny, tmp_path):
    # λ ≡ 1 (t0 far in the past): the coupled loss is the target loss: bit for bit plain fine-tuning
    tiny.train(tmp_path / "plain", optimizer="adam")
    rc, log = tiny.train(tmp_path / "c1", *CRIT, "--recadam-objective", "coupled", "--recadam-anneal-k", "1",
                         "--recadam-anneal-t0", "-1000", optimizer="adam")
    a, b = load_ckpt(tmp_path / "plain" / "checkpoint_last.pt"), load_ckpt(tmp_path / "c1" / "checkpoint_last.pt")
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    # λ ≈ 0 and a strong penalty: the loss is mostly γ/2·Σ(θ−θ*)² and the encoder stays at θ*
    rc, log = tiny.train(tmp_path / "c0", *CRIT, "--recadam-objective", "coupled", "--recadam-anneal-k", "1",
                         "--recadam-anneal-t0", "1000", "--recadam-pretrain-cof", "500", "--log-format", "json",
                         optimizer="adam")
    assert "recadam (coupled objective): pretrained weights θ* from --restore-file" in log
    inner = json_records(log, "train_inner")
    assert all(float(x["recadam_lambda"]) < 1e-6 for x in inner)
    assert all(float(x["loss"]) != float(x["target_loss"]) for x in inner[1:])
    pre = load_ckpt(tiny.pretrained)["model"]
    c0 = load_ckpt(tmp_path / "c0" / "checkpoint_last.pt")["model"]
    free = max((c0[k] - pre[k]).abs().max().item() for k in pre if k in c0)
    moved = max((a["model"][k] - pre[k]).abs().max().item() for k in pre if k in c0)
    assert free < 0.2 * moved


def test_coupled_objective_will_not_resume_toward_finetuned_weights(tiny, tmp_path):
    save = tmp_path / "c"
    flags = [*CRIT, "--recadam-objective", "coupled", "--recadam-pretrain-cof", "50"]
    tiny.train(save, *flags, updates=2, optimizer="adam")
    rc, log = tiny.train(save, *flags, optimizer="adam", check=False, restore=False)
    assert rc != 0 and "FINE-TUNED" in log and "--recadam-pretrained-path" in log


def test_plot_run_renders_real_logs(json_runs, tmp_path):
    from recadam_fairseq.tools import plot_run

    logs = [str(json_runs[name][0] / "json.log") for name in ("recadam", "adam")]
    out = tmp_path / "runs.png"
    fig = plot_run.plot(logs, ["recadam", "adam"], str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    panels = {ax.get_title(): [ln.get_label() for ln in ax.get_lines()] for ax in fig.axes}
    assert panels["λ(t)"] == ["recadam"]  # adam reports no λ
    # fairseq's adam logs its distance through the plug-in's criterion (meters/theta_distance.py)
    assert panels["Σ(θ−θ*)²  (distance to the pretrained weights)"] == ["recadam", "adam"]
    assert panels["train target loss (bits)"] == ["recadam", "adam"]
    assert panels["dev accuracy"] == ["recadam", "adam"]
    (fgt,) = [ax for ax in fig.axes if ax.get_title().startswith("forgetting: masked-LM loss")]
    assert [ln.get_label() for ln in fgt.get_lines()] == ["recadam"] and list(fgt.get_lines()[0].get_xdata()) == [4, 8, 12]
    lam = [ax for ax in fig.axes if ax.get_title() == "λ(t)"][0].get_lines()[0]
    assert list(lam.get_xdata()) == [2, 4, 6, 8, 10, 12]
    # --table: the recadam run's best mcc (its --best-checkpoint-metric) at the update checkpoint_best.pt holds, the
    # meter's delta there and at the last validation as its log says
    head, rule, recadam, adam = plot_run.table(logs, ["recadam", "adam"], "mcc")
    saved = load_ckpt(json_runs["recadam"][0] / "checkpoint_best.pt")["optimizer_history"][-1]["num_updates"]
    valid = {int(v["valid_num_updates"]): v for v in json_records(json_runs["recadam"][1], "valid")}
    assert recadam.startswith(f"| recadam | {float(valid[saved]['valid_mcc']):.1f} ({saved}) | "), recadam
    shown = recadam.split(" | ")[2].rstrip(" |").split(" / ")
    for cell, n in zip(shown, (saved, 12)):  # two significant digits, signed
        assert cell[0] in "+−" and float(cell.replace("−", "-")) == pytest.approx(
            float(valid[n]["valid_fgt_mlm_loss_delta"]), rel=0.05, abs=1e-12), (cell, n)
    assert head.startswith("| run | dev mcc: best (update) | forgetting, mlm loss (bits) since θ*: ") and adam.endswith(
        " |  /  |")
    # of equal best scores the later, as summarize.py and checkpoint_best.pt take it
    tie = tmp_path / "tie.log"
    tie.write_text("".join("x | INFO | valid | " + json.dumps({"epoch": 1, "valid_accuracy": a, "valid_num_updates": n,
                                                                  "valid_fgt_mlm_loss_delta": f}) + "\n"
                           for n, a, f in (("176", "84.4", "-0.0016"), ("240", "84.4", "-0.0021"), ("300", "80", "1.04e-05"))))
    assert plot_run.table([str(tie)], ["adam"], "accuracy")[2] == "| adam | 84.4 (240) | −0.0021 / +0.00001 |"


class _FakeModel(torch.nn.Module):
    """Returns fixed logits: enough of a RobertaModel for the criterion's forward."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits
        self.classification_heads = {"sentence_classification_head": None}

    def forward(self, **kw):
        return self.logits, None

    def get_targets(self, sample, net_output):
        return sample["target"]


def test_f1_is_of_the_label_named_1_whatever_its_dictionary_id():
    """fairseq-preprocess orders labels by frequency: in MRPC "1" is the most frequent, id 0."""
    from fairseq.data import Dictionary
    from fairseq.logging import metrics

    from recadam_fairseq.criterions.sentence_prediction_recadam import (
        SentencePredictionRecAdamConfig, SentencePredictionRecAdamCriterion)

    labels = Dictionary()
    labels.add_symbol("1")  # id 0 after the specials
    labels.add_symbol("0")  # id 1
    labels.pad_to_multiple_(8)  # fairseq-preprocess pads with madeupword entries

    class Task:
        label_dictionary = labels

    crit = SentencePredictionRecAdamCriterion(SentencePredictionRecAdamConfig(), Task())
    rng = np.random.default_rng(0)
    ids_t, ids_p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    ids_p[:120] = ids_t[:120]
    name = np.array([1, 0])  # label value of each id
    with metrics.aggregate(new_root=True) as agg:
        for i in range(0, 200, 50):  # four validation batches
            logits = torch.nn.functional.one_hot(torch.tensor(ids_p[i:i + 50]), 2).float()
            model = _FakeModel(logits).eval()
            sample = {"net_input": {}, "target": torch.tensor(ids_t[i:i + 50]), "ntokens": 500}
            _, _, out = crit(model, sample)
            crit.reduce_metrics([out])
        values = agg.get_smoothed_values()
    t, p = name[ids_t], name[ids_p]
    assert values["f1"] == pytest.approx(100 * f1_score(t, p), abs=0.01)
    assert values["mcc"] == pytest.approx(100 * matthews_corrcoef(t, p), abs=0.01)
    assert values["accuracy"] == pytest.approx(100 * np.mean(t == p), abs=0.1)
    assert values["f1"] != pytest.approx(100 * f1_score(ids_t, ids_p), abs=0.01)  # the id-based F1 differs
