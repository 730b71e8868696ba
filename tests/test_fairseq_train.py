"""End to end: the real fairseq-train entry point on a tiny RoBERTa; assertions on saved checkpoints."""

import glob
import math

import torch

from helpers import load_ckpt, trainable_names

HEAD = "classification_heads."


def model_state(path):
    return load_ckpt(path)["model"]


def test_recadam_equals_fairseq_adam_when_lambda_is_one(tiny, tmp_path):
    """constant λ = w = 1 and no weight decay: the penalty is multiplied by w − λ = 0."""
    tiny.train(tmp_path / "adam", optimizer="adam")
    tiny.train(tmp_path / "recadam", "--recadam-anneal-fun", "constant", "--recadam-anneal-w", "1",
               "--weight-decay", "0")
    a = model_state(tmp_path / "adam" / "checkpoint_last.pt")
    r = model_state(tmp_path / "recadam" / "checkpoint_last.pt")
    p0 = model_state(tiny.pretrained)
    assert a.keys() == r.keys()
    for k in a:
        assert torch.equal(a[k], r[k]), k  # bit for bit, step for step
    moved = [k for k in p0 if k in a and not torch.equal(p0[k], a[k])]
    assert len(moved) > 10  # the runs did train


def test_every_update_follows_the_recadam_equations(tiny, tmp_path):
    """Recompute each saved update in float64 from the checkpoints before and after it."""
    hp = dict(lr=1e-3, b1=0.9, b2=0.98, eps=1e-6, k=0.5, t0=4.0, w=1.0, gamma=50.0, wd=0.01)
    save = tmp_path / "run"
    tiny.train(save, "--recadam-anneal-k", "0.5", "--recadam-anneal-t0", "4", "--recadam-pretrain-cof", "50",
               "--weight-decay", "0.01", "--save-interval-updates", "1", "--keep-interval-updates", "-1", updates=8)
    ckpts = {int(p.rsplit("_", 1)[1][:-3]): p for p in glob.glob(str(save / "checkpoint_1_*.pt"))}
    assert sorted(ckpts) == list(range(1, 9))
    names = trainable_names(ckpts[8])
    pre = model_state(tiny.pretrained)
    checked_head = checked_body = 0
    for n_upd in range(2, 9):
        before, after = model_state(ckpts[n_upd - 1]), load_ckpt(ckpts[n_upd])
        state = after["last_optimizer_state"]["state"]
        for i, name in enumerate(names):
            st = state[i]
            if "step" not in st:  # never had a gradient (the unused LM head): anchored, untouched
                assert torch.equal(after["model"][name], pre[name]) and torch.equal(st["anchor"], pre[name])
                continue
            t = st["step"]
            p, m, v = (x.double() for x in (before[name], st["exp_avg"], st["exp_avg_sq"]))
            s = hp["lr"] * math.sqrt(1 - hp["b2"] ** t) / (1 - hp["b1"] ** t)
            upd = m / (v.sqrt() + hp["eps"])
            if name.startswith(HEAD):  # new parameters: plain Adam, no anchor
                assert "anchor" not in st
                p = p - s * upd
                checked_head += 1
            else:
                assert torch.equal(st["anchor"], pre[name])  # θ* is the --restore-file weights, exactly
                lam = hp["w"] / (1 + math.exp(-hp["k"] * (t - hp["t0"])))
                p = p - s * lam * upd
                p = p - hp["lr"] * (hp["w"] - lam) * hp["gamma"] * (p - pre[name].double())
                checked_body += 1
            p = p - hp["lr"] * hp["wd"] * p
            got = after["model"][name].double()
            torch.testing.assert_close(got, p, rtol=0, atol=2e-7, msg=f"{name} at update {n_upd}")
            # the check has teeth: the update itself is much larger than the tolerance
            assert (got - before[name].double()).abs().max() > 1e-5 or name.endswith("bias")
    assert checked_head >= 4 * 7 and checked_body >= 20 * 7


def test_penalty_holds_the_encoder_and_not_the_head(tiny, tmp_path):
    """λ ≈ 0 for the whole run: the encoder stays at θ*, the new head learns with plain Adam."""
    tiny.train(tmp_path / "recall", "--recadam-anneal-k", "1", "--recadam-anneal-t0", "1000",
               "--recadam-pretrain-cof", "1000")
    tiny.train(tmp_path / "free", "--recadam-anneal-fun", "sigmoid", "--recadam-anneal-k", "1",
               "--recadam-anneal-t0", "-1000", "--recadam-pretrain-cof", "0")
    pre = model_state(tiny.pretrained)
    for run, tight in (("recall", True), ("free", False)):
        st = model_state(tmp_path / run / "checkpoint_last.pt")
        body = max((st[k].double() - pre[k].double()).abs().max().item() for k in pre if k in st and not k.startswith(HEAD))
        head = [k for k in st if k.startswith(HEAD)]
        assert len(head) == 4
        head_norm = sum(st[k].double().norm().item() for k in head)
        if tight:
            assert body < 1e-6, body
        else:
            assert body > 1e-3, body  # γ = 0 with λ ≈ 1: drifts like Adam
        assert head_norm > 0


def test_fairseq_checkpoints_load_with_weights_only(tiny, tmp_path):
    """Every checkpoint these runs wrote (pretraining, fine-tuning with best-checkpoint tracking) loads."""
    save = tmp_path / "best"
    tiny.train(save, "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric",
               "--validate-interval-updates", "4", "--save-interval-updates", "4", validate=True)
    paths = glob.glob(str(save / "*.pt")) + [tiny.pretrained]
    assert any(p.endswith("checkpoint_best.pt") for p in paths)
    for p in paths:
        assert "model" in load_ckpt(p)


def test_missing_restore_file_is_an_error_before_training(tiny, tmp_path):
    rc, log = tiny.train(tmp_path / "x", check=False, restore=False)
    assert rc != 0
    assert "recadam has no pretrained weights to pull toward" in log
    assert "--restore-file" in log and "--recadam-pretrained-path" in log
    assert not glob.glob(str(tmp_path / "x" / "*.pt"))
