"""SAM family end to end through the real fairseq-train on the tiny RoBERTa (tests/conftest.py).

Every SAM run here also checks, inside the process, that θ is back bit for bit after every
perturbation (RECADAM_SAM_CHECK_RESTORE, tests/train_entry.py) and prints how many checks ran.
"""

import re

import pytest
import torch

from helpers import (DIST_FLAGS, assert_same_run, assert_same_state, assert_same_weights, dumps, json_records,
                     load_ckpt)

CHECK = {"RECADAM_SAM_CHECK_RESTORE": "1"}
SEED_FLAGS = ["--sam-type", "fisher-sam", "--rho", "0.05", "--beta", "0.5", "--gamma", "0.5", "--mask-iter-e", "2",
              "--keep-ratio", "0.1", "--num-samples", "32", "--weight-decay", "0.01", "--clip-norm", "0.0",
              "--lr-scheduler", "polynomial_decay", "--total-num-update", "6", "--warmup-updates", "1",
              "--fp16-no-flatten-grads"]


def restore_checks(log):
    m = re.search(r"sam-restore-checks (\d+) pass1-calls (\d+)", log)
    assert m, log[-3000:]
    return int(m.group(1)), int(m.group(2))


@pytest.fixture(scope="module")
def adam_run(tiny, tmp_path_factory):
    save = tmp_path_factory.mktemp("adam")
    tiny.train(save, optimizer="adam", updates=6)
    return load_ckpt(save / "checkpoint_last.pt")


# ρ 0 skips the second pass (tests/test_one_line_errors.py); ρ 1e-30 runs it with an ε below every nonzero
# weight's rounding step, so θ + ε = θ in fp32 there (a zero weight, such as a fresh head bias, moves by at
# most 1e-30, which the next sum rounds away): the SAM run must equal its base bit for bit.
TINY_RHO = "1e-30"


def test_rho_zero_equals_adam_bit_for_bit(tiny, tmp_path, adam_run):
    """Pass 1 runs (dropout on: the forked RNG gives pass 2 fairseq's own masks), ε rounds away."""
    rc, log = tiny.train(tmp_path / "s", "--sam-type", "sam", "--rho", TINY_RHO, optimizer="samsgd", updates=6,
                         env=CHECK)
    checks, calls = restore_checks(log)
    assert calls == 6 and checks >= 6
    assert_same_weights(load_ckpt(tmp_path / "s" / "checkpoint_last.pt")["model"], adam_run["model"])


def test_rho_zero_over_recadam_equals_recadam_bit_for_bit(tiny, tmp_path):
    tiny.train(tmp_path / "r", updates=6)
    rc, log = tiny.train(tmp_path / "rs", "--sam-type", "fisher-gsam", "--rho", TINY_RHO, "--mask-iter-e", "2",
                         updates=6, env=CHECK)
    assert restore_checks(log)[1] == 6
    a, b = load_ckpt(tmp_path / "r" / "checkpoint_last.pt"), load_ckpt(tmp_path / "rs" / "checkpoint_last.pt")
    assert_same_weights(a["model"], b["model"])
    sb = dict(b["last_optimizer_state"])
    assert sb.pop("sam")["t"] == 6
    assert_same_state(a["last_optimizer_state"]["state"], sb["state"])  # moments, anchors, t


@pytest.mark.parametrize("criterion", ["sentence_prediction", "sentence_prediction_recadam"])
def test_seed_command_trains(tiny, tmp_path, adam_run, criterion):
    """The FSAM authors' command (samsgd, fp16 per-tensor layout, polynomial lr), tiny arch; fairseq's own
    criterion and ours. With ours the variant is ESAM (per-example losses, example selection)."""
    flags = list(SEED_FLAGS) + ["--fp16"]
    if criterion != "sentence_prediction":
        flags[1] = "fisher-esam"
        flags += ["--criterion", criterion, "--update-freq", "2"]
    rc, log = tiny.train(tmp_path / "seed", *flags, "--log-format", "json", optimizer="samsgd", updates=6, env=CHECK)
    checks, calls = restore_checks(log)
    assert calls == 6 * (2 if criterion != "sentence_prediction" else 1) and checks >= calls
    recs = json_records(log, "train_inner")
    assert len(recs) == 6
    for r in recs:
        assert float(r["sam_rho"]) == 0.05
        assert float(r["sam_eps_norm"]) > 0
        assert 0 < float(r["sam_mask_frac"]) < 0.5  # 10 % of the weights + biases/embeddings perturbed unmasked
        assert "sam_sharpness" in r
    if criterion != "sentence_prediction":  # ESAM: the second pass ran on γ = half of each batch
        assert {r["bsz"] for r in recs} == {"16"}
    ck = load_ckpt(tmp_path / "seed" / "checkpoint_last.pt")
    st = ck["last_optimizer_state"]["sam"]
    assert st["t"] == 6 and st["mask"] is not None
    kept = [m for m in st["mask"] if m is not None]
    n_elig = sum(m.numel() for m in kept)
    assert sum(int(m.sum()) for m in kept) == int(n_elig * 0.1)
    moved = sum(not torch.equal(v, adam_run["model"][k]) for k, v in ck["model"].items())
    assert moved > 10


def test_recadam_fisher_sam_logs_both_methods(tiny, tmp_path):
    rc, log = tiny.train(tmp_path / "rf", "--sam-type", "fisher-sam", "--rho", "0.05", "--mask-iter-e", "2",
                         "--log-format", "json", updates=4, env=CHECK)
    assert restore_checks(log)[0] >= 4
    recs = json_records(log, "train_inner")
    for r in recs:
        for k in ("recadam_lambda", "recadam_dist", "recadam_penalty", "sam_rho", "sam_eps_norm", "sam_mask_frac",
                  "sam_sharpness"):
            assert k in r, (k, r)
    assert float(recs[-1]["sam_eps_norm"]) > 0 and float(recs[-1]["sam_mask_frac"]) < 0.5
    st = load_ckpt(tmp_path / "rf" / "checkpoint_last.pt")["last_optimizer_state"]
    assert "anchor" in st["state"][0] and st["sam"]["t"] == 4


def test_fp16_flat_update_freq_gsam_and_a_pass1_overflow_skips_the_update(tiny, tmp_path):
    """Flat fp16 layout, --update-freq 2, GSAM; pass 1 of the 3rd micro-batch (update 2) made non-finite:
    fairseq's overflow check skips that update, the SAM state does not count it."""
    rc, log = tiny.train(tmp_path / "g", "--fp16", "--sam-type", "gsam", "--rho", "0.05", "--rho-min", "0.01",
                         "--update-freq", "2", "--log-format", "json", optimizer="samsgd", updates=4,
                         env={**CHECK, "RECADAM_SAM_POISON": "3"})
    assert "gradient overflow detected" in log
    checks, calls = restore_checks(log)
    assert calls == 2 * 5  # 4 updates + the skipped one
    ck = load_ckpt(tmp_path / "g" / "checkpoint_last.pt")
    assert ck["last_optimizer_state"]["sam"]["t"] == 4
    assert ck["optimizer_history"][-1]["num_updates"] == 4
    assert ck["last_optimizer_state"]["loss_scale"] < 128  # fairseq lowered its scale once


def test_bad_input_stops_before_training(tiny, tmp_path):
    rc, log = tiny.train(tmp_path / "b", "--sam-type", "sam", "--rho", "-0.1", optimizer="samsgd", check=False)
    assert rc != 0 and "--rho must be >= 0" in log and "num_updates" not in log
    rc, log = tiny.train(tmp_path / "b2", "--sam-type", "ssam", optimizer="samsgd", check=False)
    assert rc != 0 and "--sam-type" in log and "invalid choice" in log


def test_two_ranks_equal_one_process_with_update_freq_two(tiny, tmp_path):
    """ε per rank and micro-batch; GSAM's decomposition and the Fisher mask on the summed gradients:
    2 CPU ranks == 1 process with --update-freq 2 (dropout off; the gradient sum in another order)."""
    flags = ["--sam-type", "fisher-gsam", "--rho", "0.05", "--mask-iter-e", "2", "--max-update", "6"]
    tiny.ranks(tmp_path / "one", 1, *DIST_FLAGS, "--update-freq", "2", *flags)
    tiny.ranks(tmp_path / "two", 2, *DIST_FLAGS, *flags)
    (ref,), (r0, r1) = dumps(tmp_path / "one", 1), dumps(tmp_path / "two", 2)
    for k in r0["model"]:
        assert torch.equal(r0["model"][k], r1["model"][k]), k
        assert torch.allclose(r0["model"][k], ref["model"][k], rtol=0, atol=1e-5), k
    m0, mref = r0["optimizer"]["sam"]["mask"], ref["optimizer"]["sam"]["mask"]
    assert r0["optimizer"]["sam"]["t"] == 6
    diff = sum(int((a != b).sum()) for a, b in zip(m0, mref) if a is not None)
    assert diff <= 2  # the same top-k (ties in the last float bits aside)
    pre = load_ckpt(tiny.pretrained)["model"]
    assert max((ref["model"][k] - pre[k]).abs().max().item() for k in pre if k in ref["model"]) > 50 * 1e-5


def test_resume_is_bit_exact(tiny, tmp_path):
    """Mask, its schedule (t) and the ESAM generator travel in checkpoint_last.pt (fp32, CPU)."""
    flags = ["--sam-type", "fisher-esam", "--rho", "0.05", "--mask-iter-e", "3"]
    tiny.train(tmp_path / "straight", *flags, optimizer="samsgd", updates=8)
    save = tmp_path / "resumed"
    tiny.train(save, *flags, optimizer="samsgd", updates=4)
    tiny.train(save, *flags, "--restore-file", str(save / "checkpoint_last.pt"), optimizer="samsgd", updates=8,
               restore=False)
    a, b = load_ckpt(tmp_path / "straight" / "checkpoint_last.pt"), load_ckpt(save / "checkpoint_last.pt")
    assert_same_run(a, b)
    assert b["last_optimizer_state"]["sam"]["t"] == 8
