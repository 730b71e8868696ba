"""RecAdam under fairseq's ZeRO stage 1 (--zero-sharding os, fairscale's OSS) on 2 CPU ranks (gloo, fp32).

Each rank's RecAdam holds θ*, EWC's F and Adam's moments of its shard only; the weights must end bit for
bit equal to the unsharded 2-rank run (legacy_ddp), straight and resumed after a save, in either mode from a
checkpoint of either. The runs are RecAdam-EWC: F of the task (--ewc-fisher task, fp32) or of a file
(--memory-efficient-fp16), so θ* and F are sharded together.
"""

import pytest
import torch
from fairseq.optim import build_optimizer

from helpers import (DIST_FLAGS, Net, anchors, assert_same_weights, json_records, load_ckpt, parse, run_jobs,
                     tiny_classifier_args)

pytest.importorskip("fairscale")

OS = ["--zero-sharding", "os"]


def launch(tiny, save, world, *flags, **kw):
    return tiny.ranks(save, world, *DIST_FLAGS, *flags, **kw)

EWC = ["--ewc-fisher", "task", "--ewc-fisher-examples", "16"]  # 16 examples per rank


def fisher_file(tiny, path):
    """A heavy-tailed F (mean ~1, entries ~10^3 times it) of every trainable tensor of the tiny classifier."""
    from recadam_fairseq.core import ewc
    from recadam_fairseq.core.anchor import trainable_named_parameters
    from recadam_fairseq.tools import fisher as tool

    _, _, model, _ = tool.setup([tiny.cls_bin, *tiny_classifier_args(), "--batch-size", "16", "--seed", "7", "--cpu",
                                 "--num-workers", "0", "--restore-file", tiny.pretrained])
    gen = torch.Generator().manual_seed(3)
    ewc.save(str(path), {n: torch.empty(p.shape).exponential_(generator=gen).pow_(3)
                         for n, p in trainable_named_parameters(model)}, 1, "heavy-tailed")
    return str(path)


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """The unsharded run (saving at update 6 too), beside the sharded one stopped after 6 updates and relaunched."""
    root = tmp_path_factory.mktemp("sharding")
    plain, sharded = root / "plain", root / "sharded"
    save = ["--save-interval-updates", "6"]

    def unsharded():
        (log, _) = launch(tiny, plain, 2, *save, *EWC)
        return {"plain6": load_ckpt(plain / "checkpoint_1_6.pt"), "plain": load_ckpt(plain / "checkpoint_last.pt"),
                "plain_log": log}

    def stopped_and_resumed():
        (first, _) = launch(tiny, sharded, 2, *OS, *EWC, "--max-update", "6")
        six = load_ckpt(sharded / "checkpoint_last.pt")
        (log, _) = launch(tiny, sharded, 2, *OS, *EWC, restore=False)
        return {"six": six, "sharded": load_ckpt(sharded / "checkpoint_last.pt"), "first_log": first, "log": log}

    out = run_jobs([unsharded, stopped_and_resumed])

    def crossed(name, ckpt, *flags):  # another run's update-6 checkpoint, resumed in the other mode
        (root / name).mkdir()
        torch.save(ckpt, root / name / "checkpoint_last.pt")
        launch(tiny, root / name, 2, *flags, *EWC, restore=False)
        return {name: load_ckpt(root / name / "checkpoint_last.pt")}

    ewc_file = ["--ewc-fisher", fisher_file(tiny, root / "fisher.pt")]

    def memory_efficient(name, *flags):  # fp16 tensors in the optimizer, fp32 math: the other layout ZeRO allows
        launch(tiny, root / name, 2, "--memory-efficient-fp16", *ewc_file, *flags, "--max-update", "6")
        return {name: load_ckpt(root / name / "checkpoint_last.pt")}

    out.update(run_jobs([lambda: crossed("os_from_plain", out["plain6"], *OS),
                         lambda: crossed("plain_from_os", out["six"]),
                         lambda: memory_efficient("me_plain"), lambda: memory_efficient("me_os", *OS)]))
    return out


def weights_equal(a, b):
    assert_same_weights(a["model"], b["model"])


def test_sharded_run_equals_the_unsharded_one_bit_for_bit(tiny, runs):
    """With the task's F: both ranks' Fisher passes (16 examples each) summed, normalised over every anchored
    element, each rank keeping its shard's F."""
    assert runs["six"]["optimizer_history"][-1]["num_updates"] == 6
    assert "empirical Fisher of 32 training examples at θ*" in runs["first_log"]
    weights_equal(runs["six"], runs["plain6"])
    pre = load_ckpt(tiny.pretrained)["model"]
    assert any(not torch.equal(runs["plain6"]["model"][k], pre[k]) for k in pre if k in runs["plain6"]["model"])


def test_resumed_sharded_run_equals_the_straight_unsharded_one(runs):
    """Saved (consolidated) after 6 updates, relaunched: θ*, F and the moments re-sharded on load (no Fisher
    passes)."""
    assert "θ* restored from the checkpoint's optimizer state" in runs["log"]
    assert "F restored from the checkpoint's optimizer state" in runs["log"] and "empirical Fisher" not in runs["log"]
    weights_equal(runs["sharded"], runs["plain"])


def test_a_checkpoint_loads_across_the_modes_bit_for_bit(runs):
    """Saved unsharded, resumed sharded (OSS shards the state on load), and the other way round (fairseq saves
    OSS's consolidated state, in the unsharded layout): both end where the straight unsharded run did."""
    weights_equal(runs["os_from_plain"], runs["plain"])
    weights_equal(runs["plain_from_os"], runs["plain"])


def test_memory_efficient_fp16_sharded_equals_unsharded(tiny, runs):
    """With F from a file (heavy-tailed: some elements' pull capped at 1)."""
    weights_equal(runs["me_os"], runs["me_plain"])
    fs = [st["fisher"] for st in runs["me_os"]["last_optimizer_state"]["state"].values() if "fisher" in st]
    assert len(fs) == 41 and max(float(f.max()) for f in fs) > 100  # F is in the run, not F ≡ 1
    pre = load_ckpt(tiny.pretrained)["model"]
    w = runs["me_os"]["model"]["encoder.sentence_encoder.layers.0.fc1.weight"]  # saved as fp32 by fairseq
    assert torch.equal(w.half().float(), w)  # fp16 values: the model trained in fp16
    assert not torch.equal(w, pre["encoder.sentence_encoder.layers.0.fc1.weight"].half().float())


def test_logged_distance_is_the_unsharded_runs(runs):
    """recadam_dist under OSS: each rank's Σ(θ−θ*)² over its shard, summed over the ranks, is the unsharded
    run's at every log step (updates 4, then 8 and 12 after the resume)."""
    def dists(log):
        return {int(r["num_updates"]): float(r["recadam_dist"]) for r in json_records(log, "train_inner")}

    plain, sharded = dists(runs["plain_log"]), {**dists(runs["first_log"]), **dists(runs["log"])}
    assert sorted(sharded) == sorted(plain) == [4, 8, 12]
    for n in plain:
        assert sharded[n] == pytest.approx(plain[n], rel=1e-6), n  # the log's 6 significant digits
    assert plain[12] > plain[4] > 0


def test_consolidated_state_holds_every_anchor_f_and_moment_once(runs):
    got, ref = runs["sharded"]["last_optimizer_state"], runs["plain"]["last_optimizer_state"]
    assert got["state"].keys() == ref["state"].keys()
    for i, st in ref["state"].items():
        assert st.keys() == got["state"][i].keys()
        for k, v in st.items():
            assert torch.equal(v, got["state"][i][k]) if torch.is_tensor(v) else v == got["state"][i][k], (i, k)
    fishers = [st["fisher"] for st in got["state"].values() if "fisher" in st]
    assert len(anchors(got)) == len(fishers) == 41 and all(f.numel() == a.numel() for f, a in zip(fishers, anchors(got)))


@pytest.mark.parametrize("held, log", [("θ*", "log"), ("F", "log"), ("F", "first_log")])
def test_each_rank_holds_theta_star_and_f_of_its_shard_only(runs, held, log):
    """Logged by rank 0 from every rank's RecAdam: computed (the first launch) and restored (the resumed one)."""
    total = sum(a.numel() for a in anchors(runs["plain"]["last_optimizer_state"]))
    (line,) = [ln for ln in runs[log].splitlines() if f"{held} elements held per rank" in ln]
    counts = [int(x.replace(",", "")) for x in line.split("per rank: ")[1].split(" (")[0].split(", ")]
    assert len(counts) == 2 and sum(counts) == total and 0 < min(counts) and max(counts) < total


def test_the_shard_optimizer_gets_the_constructor_kwargs():
    """fairseq builds each rank's optimizer as type(inner)(shard, **optimizer_config)."""
    opt = build_optimizer(parse("--recadam-fused", "off").optimizer, list(Net().parameters()))
    shard = type(opt.optimizer)(list(Net().parameters()), **opt.optimizer_config)
    assert shard.fused is False and shard._defer_anchors
    assert shard.param_groups[0].keys() == opt.optimizer.param_groups[0].keys()


@pytest.mark.parametrize("flags, message", [
    (["--ddp-backend", "fully_sharded"], "recadam does not support --ddp-backend fully_sharded: "),
    ([*OS, "--sam-type", "sam"], "--sam-type sam does not support --zero-sharding os yet: drop one of them"),
    ([*OS, "--child-tuning", "F"], "--child-tuning F does not support --zero-sharding os yet: drop one of them"),
    ([*OS, "--layer-lr-decay", "0.9"], "--layer-lr-decay 0.9 does not support --zero-sharding os yet: drop one of them"),
])
def test_refusals_are_one_line_naming_the_flag(flags, message):
    with pytest.raises(Exception) as e:
        build_optimizer(parse(*flags).optimizer, list(Net().parameters()))
    assert type(e.value).__name__ == "ConfigError" and "\n" not in str(e.value)
    assert str(e.value).startswith(message)
