"""SAM family end to end through the real fairseq-train on the tiny RoBERTa (tests/conftest.py).

Every SAM run here also checks, inside the process, that θ is back bit for bit after every
perturbation (RECADAM_SAM_CHECK_RESTORE, tests/train_entry.py) and prints how many checks ran.
"""

import re

import pytest
import torch

from fairseq.optim import build_optimizer

from helpers import (DIST_FLAGS, Net, assert_same_run, assert_same_state, assert_same_weights, dumps, json_records,
                     load_ckpt, parse, run_plan)
from recadam_fairseq.core.errors import ConfigError

CHECK = {"RECADAM_SAM_CHECK_RESTORE": "1"}
SEED_FLAGS = ["--sam-type", "fisher-sam", "--rho", "0.05", "--beta", "0.5", "--gamma", "0.5", "--mask-iter-e", "2",
              "--keep-ratio", "0.1", "--num-samples", "32", "--weight-decay", "0.01", "--clip-norm", "0.0",
              "--lr-scheduler", "polynomial_decay", "--total-num-update", "6", "--warmup-updates", "1",
              "--fp16-no-flatten-grads"]


def restore_checks(log):
    m = re.search(r"sam-restore-checks (\d+) pass1-calls (\d+)", log)
    assert m, log[-3000:]
    return int(m.group(1)), int(m.group(2))


# ρ 0 skips the second pass (tests/test_one_line_errors.py); ρ 1e-30 runs it with an ε below every nonzero
# weight's rounding step, so θ + ε = θ in fp32 there (a zero weight, such as a fresh head bias, moves by at
# most 1e-30, which the next sum rounds away): the SAM run must equal its base bit for bit.
TINY_RHO = "1e-30"
RESUME = ["--sam-type", "fisher-esam", "--rho", "0.05", "--mask-iter-e", "3"]
RANKS = ["--sam-type", "fisher-gsam", "--rho", "0.05", "--mask-iter-e", "2", "--max-update", "6"]


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """Every fairseq-train run of this module, two at a time: {name: (save dir, log)}."""
    root = tmp_path_factory.mktemp("sam_train")

    def train(name, *flags, **kw):
        return lambda: (root / name, tiny.train(root / name, *flags, **kw)[1])

    def ranks(name, world, *flags):
        return lambda: (root / name, tiny.ranks(root / name, world, *DIST_FLAGS, *flags)[0])

    seed = [*SEED_FLAGS, "--fp16", "--log-format", "json"]
    esam = [*seed, "--criterion", "sentence_prediction_recadam", "--update-freq", "2"]
    esam[1] = "fisher-esam"  # with our criterion the variant is ESAM (per-example losses, example selection)
    steps = {
        "adam": train("adam", optimizer="adam", updates=6),
        "sam": train("sam", "--sam-type", "sam", "--rho", TINY_RHO, optimizer="samsgd", updates=6, env=CHECK),
        "recadam": train("recadam", updates=6),
        "recadam-sam": train("recadam-sam", "--sam-type", "fisher-gsam", "--rho", TINY_RHO, "--mask-iter-e", "2",
                             updates=6, env=CHECK),
        "seed": train("seed", *seed, optimizer="samsgd", updates=6, env=CHECK),
        "seed-esam": train("seed-esam", *esam, optimizer="samsgd", updates=6, env=CHECK),
        "recadam-fsam": train("recadam-fsam", "--sam-type", "fisher-sam", "--rho", "0.05", "--mask-iter-e", "2",
                              "--log-format", "json", updates=4, env=CHECK),
        "gsam-fp16": train("gsam-fp16", "--fp16", "--sam-type", "gsam", "--rho", "0.05", "--rho-min", "0.01",
                           "--update-freq", "2", "--log-format", "json", optimizer="samsgd", updates=4,
                           env={**CHECK, "RECADAM_SAM_POISON": "3"}),
        "one": ranks("one", 1, "--update-freq", "2", *RANKS),
        "two": ranks("two", 2, *RANKS),
        "straight": train("straight", *RESUME, optimizer="samsgd", updates=8),
        "resumed": train("resumed", *RESUME, optimizer="samsgd", updates=4),
        "resumed-to-8": train("resumed", *RESUME, "--restore-file", str(root / "resumed" / "checkpoint_last.pt"),
                              optimizer="samsgd", updates=8, restore=False),
    }
    return run_plan(steps, after={"resumed-to-8": "resumed"})


def last(runs, name):
    return load_ckpt(runs[name][0] / "checkpoint_last.pt")


def test_rho_zero_equals_adam_bit_for_bit(runs):
    """Pass 1 runs (dropout on: the forked RNG gives pass 2 fairseq's own masks), ε rounds away."""
    checks, calls = restore_checks(runs["sam"][1])
    assert calls == 6 and checks >= 6
    assert_same_weights(last(runs, "sam")["model"], last(runs, "adam")["model"])


def test_rho_zero_over_recadam_equals_recadam_bit_for_bit(runs):
    assert restore_checks(runs["recadam-sam"][1])[1] == 6
    a, b = last(runs, "recadam"), last(runs, "recadam-sam")
    assert_same_weights(a["model"], b["model"])
    sb = dict(b["last_optimizer_state"])
    assert sb.pop("sam")["t"] == 6
    assert_same_state(a["last_optimizer_state"]["state"], sb["state"])  # moments, anchors, t


@pytest.mark.parametrize("name", ["seed", "seed-esam"])
def test_seed_command_trains(runs, name):
    """The FSAM authors' command (samsgd, fp16 per-tensor layout, polynomial lr), tiny arch; fairseq's own
    criterion and ours. With ours the variant is ESAM (per-example losses, example selection)."""
    log = runs[name][1]
    esam = name == "seed-esam"
    checks, calls = restore_checks(log)
    assert calls == 6 * (2 if esam else 1) and checks >= calls
    recs = json_records(log, "train_inner")
    assert len(recs) == 6
    for r in recs:
        assert float(r["sam_rho"]) == 0.05
        assert float(r["sam_eps_norm"]) > 0
        assert 0 < float(r["sam_mask_frac"]) < 0.5  # 10 % of the weights + biases/embeddings perturbed unmasked
        assert "sam_sharpness" in r
    if esam:  # ESAM: the second pass ran on γ = half of each batch
        assert {r["bsz"] for r in recs} == {"16"}
    ck = last(runs, name)
    st = ck["last_optimizer_state"]["sam"]
    assert st["t"] == 6 and st["mask"] is not None
    kept = [m for m in st["mask"] if m is not None]
    n_elig = sum(m.numel() for m in kept)
    assert sum(int(m.sum()) for m in kept) == int(n_elig * 0.1)
    adam = last(runs, "adam")["model"]
    moved = sum(not torch.equal(v, adam[k]) for k, v in ck["model"].items())
    assert moved > 10


def test_recadam_fisher_sam_logs_both_methods(runs):
    log = runs["recadam-fsam"][1]
    assert restore_checks(log)[0] >= 4
    recs = json_records(log, "train_inner")
    for r in recs:
        for k in ("recadam_lambda", "recadam_dist", "recadam_penalty", "sam_rho", "sam_eps_norm", "sam_mask_frac",
                  "sam_sharpness"):
            assert k in r, (k, r)
    assert float(recs[-1]["sam_eps_norm"]) > 0 and float(recs[-1]["sam_mask_frac"]) < 0.5
    st = last(runs, "recadam-fsam")["last_optimizer_state"]
    assert "anchor" in st["state"][0] and st["sam"]["t"] == 4


def test_fp16_flat_update_freq_gsam_and_a_pass1_overflow_skips_the_update(runs):
    """Flat fp16 layout, --update-freq 2, GSAM; pass 1 of the 3rd micro-batch (update 2) made non-finite:
    fairseq's overflow check skips that update, the SAM state does not count it."""
    log = runs["gsam-fp16"][1]
    assert "gradient overflow detected" in log
    checks, calls = restore_checks(log)
    assert calls == 2 * 5  # 4 updates + the skipped one
    ck = last(runs, "gsam-fp16")
    assert ck["last_optimizer_state"]["sam"]["t"] == 4
    assert ck["optimizer_history"][-1]["num_updates"] == 4
    assert ck["last_optimizer_state"]["loss_scale"] < 128  # fairseq lowered its scale once


def test_bad_input_stops_before_training():
    """In-process, through fairseq's parser and the optimizer's own check (the one-line path of a launch:
    tests/test_one_line_errors.py)."""
    with pytest.raises(ConfigError, match="--rho must be >= 0"):
        build_optimizer(parse("--optimizer", "samsgd", "--sam-type", "sam", "--rho", "-0.1").optimizer,
                        list(Net().parameters()))
    with pytest.raises(SystemExit):  # argparse: --sam-type: invalid choice
        parse("--optimizer", "samsgd", "--sam-type", "ssam")


def test_two_ranks_equal_one_process_with_update_freq_two(tiny, runs):
    """ε per rank and micro-batch; GSAM's decomposition and the Fisher mask on the summed gradients:
    2 CPU ranks == 1 process with --update-freq 2 (dropout off; the gradient sum in another order)."""
    (ref,), (r0, r1) = dumps(runs["one"][0], 1), dumps(runs["two"][0], 2)
    for k in r0["model"]:
        assert torch.equal(r0["model"][k], r1["model"][k]), k
        assert torch.allclose(r0["model"][k], ref["model"][k], rtol=0, atol=1e-5), k
    m0, mref = r0["optimizer"]["sam"]["mask"], ref["optimizer"]["sam"]["mask"]
    assert r0["optimizer"]["sam"]["t"] == 6
    diff = sum(int((a != b).sum()) for a, b in zip(m0, mref) if a is not None)
    assert diff <= 2  # the same top-k (ties in the last float bits aside)
    pre = load_ckpt(tiny.pretrained)["model"]
    assert max((ref["model"][k] - pre[k]).abs().max().item() for k in pre if k in ref["model"]) > 50 * 1e-5


def test_resume_is_bit_exact(runs):
    """Mask, its schedule (t) and the ESAM generator travel in checkpoint_last.pt (fp32, CPU)."""
    a, b = last(runs, "straight"), last(runs, "resumed-to-8")
    assert_same_run(a, b)
    assert b["last_optimizer_state"]["sam"]["t"] == 8
