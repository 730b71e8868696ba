"""RecAdam under fairseq's ZeRO stage 1 (--zero-sharding os, fairscale's OSS) on 2 CPU ranks (gloo, fp32).

Each rank's RecAdam holds θ* and Adam's moments of its shard only; the weights must end bit for bit
equal to the unsharded 2-rank run (legacy_ddp), straight and resumed after a save, in either mode from a
checkpoint of either.
"""

import pytest
import torch
from fairseq.optim import build_optimizer

from helpers import json_records, load_ckpt, run_jobs
from test_adapter import Net, parse
from test_distributed import anchors, launch

pytest.importorskip("fairscale")

OS = ["--zero-sharding", "os"]


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """The unsharded run (saving at update 6 too), beside the sharded one stopped after 6 updates and relaunched."""
    root = tmp_path_factory.mktemp("sharding")
    plain, sharded = root / "plain", root / "sharded"
    save = ["--save-interval-updates", "6"]

    def unsharded():
        (log, _) = launch(tiny, plain, 2, *save)
        return {"plain6": load_ckpt(plain / "checkpoint_1_6.pt"), "plain": load_ckpt(plain / "checkpoint_last.pt"),
                "plain_log": log}

    def stopped_and_resumed():
        (first, _) = launch(tiny, sharded, 2, *OS, "--max-update", "6")
        six = load_ckpt(sharded / "checkpoint_last.pt")
        (log, _) = launch(tiny, sharded, 2, *OS, restore=False)
        return {"six": six, "sharded": load_ckpt(sharded / "checkpoint_last.pt"), "log": log, "first_log": first}

    out = run_jobs([unsharded, stopped_and_resumed])

    def crossed(name, ckpt, *flags):  # another run's update-6 checkpoint, resumed in the other mode
        (root / name).mkdir()
        torch.save(ckpt, root / name / "checkpoint_last.pt")
        launch(tiny, root / name, 2, *flags, restore=False)
        return {name: load_ckpt(root / name / "checkpoint_last.pt")}

    def memory_efficient(name, *flags):  # fp16 tensors in the optimizer, fp32 math: the other layout ZeRO allows
        launch(tiny, root / name, 2, "--memory-efficient-fp16", *flags, "--max-update", "6")
        return {name: load_ckpt(root / name / "checkpoint_last.pt")}

    out.update(run_jobs([lambda: crossed("os_from_plain", out["plain6"], *OS),
                         lambda: crossed("plain_from_os", out["six"]),
                         lambda: memory_efficient("me_plain"), lambda: memory_efficient("me_os", *OS)]))
    return out


def weights_equal(a, b):
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def test_sharded_run_equals_the_unsharded_one_bit_for_bit(tiny, runs):
    assert runs["six"]["optimizer_history"][-1]["num_updates"] == 6
    weights_equal(runs["six"], runs["plain6"])
    pre = load_ckpt(tiny.pretrained)["model"]
    assert any(not torch.equal(runs["plain6"]["model"][k], pre[k]) for k in pre if k in runs["plain6"]["model"])


def test_resumed_sharded_run_equals_the_straight_unsharded_one(runs):
    """Saved (consolidated) after 6 updates, relaunched: θ* and the moments re-sharded on load."""
    assert "θ* restored from the checkpoint's optimizer state" in runs["log"]
    weights_equal(runs["sharded"], runs["plain"])


def test_a_checkpoint_loads_across_the_modes_bit_for_bit(runs):
    """Saved unsharded, resumed sharded (OSS shards the state on load), and the other way round (fairseq saves
    OSS's consolidated state, in the unsharded layout): both end where the straight unsharded run did."""
    weights_equal(runs["os_from_plain"], runs["plain"])
    weights_equal(runs["plain_from_os"], runs["plain"])


def test_memory_efficient_fp16_sharded_equals_unsharded(tiny, runs):
    weights_equal(runs["me_os"], runs["me_plain"])
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


def test_consolidated_state_holds_every_anchor_and_moment_once(runs):
    got, ref = runs["sharded"]["last_optimizer_state"], runs["plain"]["last_optimizer_state"]
    assert got["state"].keys() == ref["state"].keys()
    for i, st in ref["state"].items():
        assert st.keys() == got["state"][i].keys()
        for k, v in st.items():
            assert torch.equal(v, got["state"][i][k]) if torch.is_tensor(v) else v == got["state"][i][k], (i, k)
    assert len(anchors(got)) == 41


def test_each_rank_holds_theta_star_of_its_shard_only(runs):
    total = sum(a.numel() for a in anchors(runs["plain"]["last_optimizer_state"]))
    (line,) = [ln for ln in runs["log"].splitlines() if "θ* elements held per rank" in ln]
    held = [int(x.replace(",", "")) for x in line.split("per rank: ")[1].split(" (")[0].split(", ")]
    assert len(held) == 2 and sum(held) == total and 0 < min(held) and max(held) < total


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
