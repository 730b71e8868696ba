"""R-Drop (--rdrop-alpha; sentence_prediction_rdrop, label_smoothed_cross_entropy_rdrop): the loss of one
forward recomputed in float64 from the two passes' logits (caught at the head by a forward hook), for
classification, regression and seq2seq with padding and label smoothing; α = 0 as fairseq's criteria
(through the real fairseq-train for sentence_prediction, in process for label_smoothed_cross_entropy);
RecAdam + R-Drop resumed bit for bit; samsgd (ESAM) + R-Drop + the coupled objective; bad input.

The authors' loss is CE₁ + CE₂ + α·½·(KL(p₁‖p₂) + KL(p₂‖p₁)) over their sample size; ours is that over
2 (docs/rdrop.md), which the references below write out.
"""

import os
import resource

import pytest
import torch

from helpers import (ONE_THREAD, assert_same_run, assert_same_weights, criterion, json_records, load_ckpt, one_error_line,
                     run_plan, stock_roberta, transformer)

from recadam_fairseq.core import r3f, rdrop
from recadam_fairseq.core.errors import ConfigError

F64 = torch.float64
HEAD = "sentence_classification_head"


def caught(module):
    """Every output of ``module``'s forward, kept with its gradient."""
    seen = []

    def hook(mod, args, out):
        x = out[0] if isinstance(out, tuple) else out
        x.retain_grad()
        seen.append(x)

    module.register_forward_hook(hook)
    return seen


def kl_both_ways(a, b):
    """Σ over rows of KL(softmax a ‖ softmax b) + KL(softmax b ‖ softmax a), float64, rows: (..., classes)."""
    la, lb = a.log_softmax(-1), b.log_softmax(-1)
    return (la.exp() * (la - lb)).sum(-1) + (lb.exp() * (lb - la)).sum(-1)


# ------------------------------------------------------------------------------------ core
def test_symm_kl_with_padding_and_without():
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(3, 5, 7, generator=g), torch.randn(3, 5, 7, generator=g)
    pad = torch.rand(3, 5, generator=g) < 0.4
    ref = kl_both_ways(p.double(), q.double())
    assert r3f.symm_kl_sum(p, q, pad).item() == pytest.approx(ref[~pad].sum().item(), rel=1e-6)
    assert r3f.symm_kl(p, q).item() == pytest.approx(ref.sum().item() / 3, rel=1e-6)  # R3F's: over dim 0
    assert rdrop.rdrop_loss(torch.tensor(4.0), torch.tensor(2.0), 0.5).item() == 0.5 * 4 + 0.5 * 0.5 * 2 / 2
    twice = rdrop.twice({"src_tokens": torch.arange(6).view(2, 3), "src_lengths": torch.tensor([3, 2]),
                         "nested": {"ids": torch.tensor([7, 8])}, "flag": None})
    assert twice["src_tokens"].tolist() == [[0, 1, 2], [3, 4, 5]] * 2 and twice["src_lengths"].tolist() == [3, 2, 3, 2]
    assert twice["nested"]["ids"].tolist() == [7, 8, 7, 8] and twice["flag"] is None


# ------------------------------------------------------------------------------------ GLUE criterion, in process
@pytest.mark.parametrize("regression", [False, True])
def test_glue_loss_against_both_passes_in_float64(regression):
    """A tiny fairseq RoBERTa with dropout 0.3: one forward of 2B rows (the hook sees one call) whose halves
    draw their dropout masks independently; loss / target_loss / symm_kl and the gradient reaching the logits
    as recomputed in float64 from the two halves' logits."""
    torch.manual_seed(0)
    model, sample = stock_roberta(classes=1 if regression else 3, dropout=0.3)
    if regression:
        sample["target"] = torch.rand(5, generator=torch.Generator().manual_seed(1))
    alpha = 0.7
    crit = criterion("sentence_prediction_rdrop", rdrop_alpha=alpha, regression_target=regression)
    seen = caught(model.classification_heads[HEAD])
    masks = []  # the embeddings' dropout: which elements it zeroed, in each half
    model.encoder.sentence_encoder.dropout_module.register_forward_hook(
        lambda mod, args, out: masks.append(((out == 0) & (args[0] != 0)).chunk(2)))
    loss, n, log = crit(model, sample)
    loss.backward()
    assert len(seen) == 1 and seen[0].shape[0] == 10 and n == 5
    (a, b), = masks  # independent draws: both halves drop an element with probability 0.3² (shared: 0.3)
    assert [h.float().mean().item() for h in (a, b)] == pytest.approx([0.3, 0.3], abs=0.03)
    assert (a & b).float().mean().item() == pytest.approx(0.09, abs=0.03)
    logits = seen[0].detach().to(F64).requires_grad_()
    p1, p2 = logits[:5], logits[5:]
    y = sample["target"]
    if regression:
        task = [((p.view(-1) - y.double()) ** 2).sum() for p in (p1, p2)]
        s = ((p1 - p2) ** 2).sum()  # KL_S of unit-variance Gaussians at the two predictions
    else:
        task = [-p.log_softmax(-1)[torch.arange(5), y].sum() for p in (p1, p2)]
        s = kl_both_ways(p1, p2).sum()
    authors = task[0] + task[1] + alpha * 0.5 * s
    ref = authors / 2
    assert s.item() > 1e-3, "the two halves should differ by their dropout draws"
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert log["target_loss"].item() == pytest.approx((task[0] + task[1]).item() / 2, rel=1e-6)
    assert log["symm_kl"].item() == pytest.approx(s.item(), rel=1e-5)
    assert "ncorrect" in log or regression
    ref.backward()
    torch.testing.assert_close(seen[0].grad.double(), logits.grad, rtol=1e-5, atol=1e-7)


def test_glue_without_dropout_the_halves_agree_and_eval_is_one_pass():
    torch.manual_seed(0)
    model, sample = stock_roberta()
    crit = criterion("sentence_prediction_rdrop")
    assert crit.cfg.rdrop_alpha == 1.0 and crit.rdrop  # the authors' default
    _, _, log = crit(model, sample)
    assert abs(log["symm_kl"].item()) < 1e-5  # only rounding (log_softmax vs log of softmax)
    seen = caught(model.classification_heads[HEAD])
    loss, _, log = crit(model.eval(), sample)
    ref, _, _ = criterion("sentence_prediction_recadam")(model, sample)
    assert len(seen) == 2 and seen[0].shape[0] == 5 and "symm_kl" not in log and torch.equal(loss, ref)


# ------------------------------------------------------------------------------------ seq2seq criterion, in process
def seq2seq_criterion(task, name="label_smoothed_cross_entropy_rdrop", **over):
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY

    cfg = CRITERION_DATACLASS_REGISTRY[name](sentence_avg=False, label_smoothing=0.1, **over)
    return CRITERION_REGISTRY[name].build_criterion(cfg, task)


def test_seq2seq_loss_against_both_passes_in_float64():
    """Label smoothing 0.1 and padded targets: ½·(LS₁ + LS₂ + α·½·KL_S over the non-pad positions)."""
    model, sample, task, pad = transformer()
    alpha, eps = 5.0, 0.1
    crit = seq2seq_criterion(task)
    assert crit.rdrop_alpha == alpha  # the authors' translation recipe
    seen = caught(model)
    loss, n, log = crit(model, sample)
    loss.backward()
    assert len(seen) == 1 and seen[0].shape[0] == 8 and n == sample["ntokens"] == 14
    logits = seen[0].detach().to(F64).requires_grad_()
    y, keep = sample["target"], sample["target"].ne(pad)
    v = logits.size(-1)
    smoothed = torch.full((4, 5, v), eps / (v - 1), dtype=F64).scatter(-1, y.unsqueeze(-1), 1 - eps)  # fairseq 0.12's
    lp = [h.log_softmax(-1) for h in logits.chunk(2)]
    ls = [-(smoothed * x).sum(-1)[keep].sum() for x in lp]
    nll = [-x.gather(-1, y.unsqueeze(-1)).squeeze(-1)[keep].sum() for x in lp]
    s = kl_both_ways(*logits.chunk(2))[keep].sum()
    ref = (ls[0] + ls[1] + alpha * 0.5 * s) / 2
    assert s.item() > 1e-2
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert log["nll_loss"].item() == pytest.approx((nll[0] + nll[1]).item() / 2, rel=1e-6)
    assert log["symm_kl"].item() == pytest.approx(s.item(), rel=1e-5)
    ref.backward()
    torch.testing.assert_close(seen[0].grad.double(), logits.grad, rtol=1e-5, atol=1e-7)
    assert logits.grad[:4][~keep].abs().sum() == 0  # padding: no loss, no consistency


@pytest.mark.parametrize("train", [True, False])
def test_seq2seq_alpha_zero_and_validation_are_fairseqs_label_smoothed_cross_entropy(train):
    """α = 0 (training) and any α in validation: fairseq's criterion, bit for bit (loss, logs, gradients)."""
    out = []
    for name, over in (("label_smoothed_cross_entropy", {}),
                       ("label_smoothed_cross_entropy_rdrop", {"rdrop_alpha": 0.0 if train else 5.0})):
        model, sample, task, _ = transformer()
        model.train(train)
        torch.manual_seed(3)
        loss, n, log = seq2seq_criterion(task, name, **over)(model, sample)
        loss.backward()
        out.append((loss, n, log, [p.grad for p in model.parameters()]))
    (a, na, la, ga), (b, nb, lb, gb) = out
    assert torch.equal(a, b) and na == nb and la.keys() == lb.keys()
    assert all(torch.equal(la[k], lb[k]) if torch.is_tensor(la[k]) else la[k] == lb[k] for k in la)
    assert all(torch.equal(x, y) for x, y in zip(ga, gb))


# ------------------------------------------------------------------------------------ bad input, in process
@pytest.mark.parametrize("alpha", [-0.1, float("nan"), float("inf")])
def test_bad_alpha_names_the_flag(alpha):
    with pytest.raises(ConfigError, match=r"^--rdrop-alpha must be a finite number >= 0"):
        criterion("sentence_prediction_rdrop", rdrop_alpha=alpha)
    with pytest.raises(ConfigError, match=r"^--rdrop-alpha must be a finite number >= 0"):
        seq2seq_criterion(transformer()[2], rdrop_alpha=alpha)


def test_rdrop_with_r3f_or_multitask_is_refused():
    with pytest.raises(ConfigError, match=r"^--rdrop-alpha 1 with --r3f-lambda 1: R-Drop and R3F each add"):
        criterion("sentence_prediction_r3f", rdrop_alpha=1.0)
    criterion("sentence_prediction_r3f", rdrop_alpha=1.0, eps=0.0)  # R3F off: R-Drop alone
    from recadam_fairseq.criterions.glue_multitask import GlueMultitaskCriterion
    from recadam_fairseq.criterions.sentence_prediction_recadam import SentencePredictionRecAdamConfig

    multitask = type("Task", (), {"mt_task_names": ["RTE"]})()
    with pytest.raises(ConfigError, match=r"^--rdrop-alpha 0.5: R-Drop is not available with --criterion glue_mult"):
        GlueMultitaskCriterion(SentencePredictionRecAdamConfig(rdrop_alpha=0.5), multitask)


# ------------------------------------------------------------------------------------ through fairseq-train
RDROP = ["--criterion", "sentence_prediction_rdrop", "--log-format", "json"]


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """Every fairseq-train run of this module, two at a time (mostly start-up)."""
    root = tmp_path_factory.mktemp("rdrop")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cases = {
        "base": ((), dict(optimizer="adam", updates=4)),
        "alpha0": ((*RDROP, "--rdrop-alpha", "0"), dict(optimizer="adam", updates=4)),
        "straight": ((*RDROP, "--rdrop-alpha", "0.5", "--save-interval-updates", "2"), dict(updates=4)),
        "sam": ((*RDROP, "--sam-type", "esam", "--rho", "0.05", "--recadam-objective", "coupled",
                 "--recadam-pretrain-cof", "50"), dict(optimizer="samsgd", updates=3)),
        "bad": ((*RDROP, "--rdrop-alpha=-1"), dict(updates=1, check=False)),
    }

    steps = {name: (lambda name=name, extra=extra, kw=kw: tiny.train(root / name, *extra, env=ONE_THREAD, **kw))
             for name, (extra, kw) in cases.items()}
    # resume the straight run's update-2 checkpoint (weights, optimizer, data iterator) up to 4 updates
    steps["resumed"] = lambda: tiny.train(root / "resumed", *RDROP, "--rdrop-alpha", "0.5", "--restore-file",
                                          str(root / "straight" / "checkpoint_1_2.pt"), updates=4, restore=False,
                                          env=ONE_THREAD)
    out = run_plan(steps, after={"resumed": "straight"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"fairseq-train runs: {after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime:.0f} CPU s")
    return dict(root=root, out=out, load=lambda name: load_ckpt(root / name / "checkpoint_last.pt"))


def test_alpha_zero_is_sentence_prediction_bit_for_bit(runs):
    assert_same_weights(runs["load"]("base")["model"], runs["load"]("alpha0")["model"])
    assert "symm_kl" not in runs["out"]["alpha0"][1]


def test_recadam_with_rdrop_logs_both_and_resumes_bit_for_bit(runs):
    inner = json_records(runs["out"]["straight"][1], "train_inner")
    assert [int(x["num_updates"]) for x in inner] == [1, 2, 3, 4]
    for x in inner:
        assert {"recadam_lambda", "recadam_dist", "symm_kl", "target_loss"} <= x.keys()
        # loss = target_loss + α/4·symm_kl per sentence (logged in bits; rounded to 3 decimals)
        assert float(x["symm_kl"]) > 0
        assert float(x["loss"]) == pytest.approx(float(x["target_loss"]) + 0.5 / 4 * float(x["symm_kl"]) / 0.6931472,
                                                 abs=2e-3)
    resumed = runs["out"]["resumed"][1]
    assert [int(x["num_updates"]) for x in json_records(resumed, "train_inner")] == [3, 4]
    assert "θ* restored from the checkpoint's optimizer state" in resumed
    assert_same_run(runs["load"]("straight"), runs["load"]("resumed"))


def test_samsgd_esam_with_rdrop_and_the_coupled_objective(runs):
    inner = json_records(runs["out"]["sam"][1], "train_inner")
    assert len(inner) == 3
    for x in inner:
        assert {"sam_eps_norm", "recadam_lambda", "recadam_penalty", "symm_kl", "target_loss"} <= x.keys()
        assert float(x["sam_eps_norm"]) > 0 and float(x["symm_kl"]) > 0
        assert x["bsz"] == "8"  # ESAM: the second pass on γ = half of the batch of 16 (its copy not counted)
    assert runs["load"]("sam")["last_optimizer_state"]["sam"]["t"] == 3


def test_bad_alpha_stops_at_start_in_one_line(runs):
    rc, log = runs["out"]["bad"]
    assert rc != 0 and one_error_line(log) == ("--rdrop-alpha must be a finite number >= 0 (the weight of R-Drop's "
                                               "consistency term), got -1.0")
    assert not [f for f in os.listdir(runs["root"] / "bad") if f.endswith(".pt")]
