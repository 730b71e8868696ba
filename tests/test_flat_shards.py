"""θ* in the layout of FSDP's flat parameter shards (core/flat_shards.py, optim/fsdp_support.py).

The index math against a hand-built layout (shards starting inside a parameter, padding, an empty last
shard), against torch.chunk + padding as fairscale shards, and against fairscale's own shards of a real
FullyShardedDataParallel built on the CPU (world sizes 2 and 3 through a dummy process group: building
FSDP shards locally, no collective; its forward needs CUDA, so fairseq-train under FSDP is the GPU
pass's, scripts/gpu/run.sh fsdp).
"""

import pytest
import torch
import torch.nn.functional as F

from recadam_fairseq.core.flat_shards import anchored_runs, shard_anchor, shard_parts, shard_range

NAMES, NUMELS = ["a", "b", "c"], [5, 3, 4]  # 12 elements back to back


def test_hand_built_layout_with_padding_and_an_empty_shard():
    # world 5: torch.chunk gives 4 pieces of 3; rank 4 holds nothing but 3 padding elements
    assert [shard_parts(NAMES, NUMELS, 5, r) for r in range(5)] == [
        [("a", 0, 3, 0)],
        [("a", 0, 2, 3), ("b", 2, 1, 0)],
        [("b", 0, 2, 1), ("c", 2, 1, 0)],
        [("c", 0, 3, 1)],
        [(None, 0, 3, 0)],
    ]
    # world 5 of 11 elements would differ; world 3 of 11: pieces of 4, the last one padded by 1
    assert [shard_parts(["a", "b"], [6, 5], 3, r) for r in range(3)] == [
        [("a", 0, 4, 0)], [("a", 0, 2, 4), ("b", 2, 2, 0)], [("b", 0, 3, 2), (None, 3, 1, 0)]]
    assert shard_parts(NAMES, NUMELS, 1, 0) == [("a", 0, 5, 0), ("b", 5, 3, 0), ("c", 8, 4, 0)]
    assert anchored_runs(shard_parts(NAMES, NUMELS, 5, 1), {"a"}) == [(0, 2)]
    assert anchored_runs(shard_parts(NAMES, NUMELS, 1, 0), {"a", "c"}) == [(0, 5), (8, 4)]
    assert anchored_runs(shard_parts(NAMES, NUMELS, 1, 0), {"a", "b"}) == [(0, 8)]
    with pytest.raises(ValueError):
        shard_range(12, 2, 2)


def fairscale_shard(flat, world, rank):
    """fairscale's FullyShardedDataParallel._get_shard, written out."""
    chunks = list(flat.chunk(world))
    chunks += [flat.new_empty(0)] * (world - len(chunks))
    return F.pad(chunks[rank], [0, chunks[0].numel() - chunks[rank].numel()])


@pytest.mark.parametrize("numels", [[5, 3, 4], [1], [7, 1, 1, 9, 2], [3, 3]])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_parts_place_every_element_where_torch_chunk_and_padding_do(numels, world):
    names = [f"p{i}" for i in range(len(numels))]
    params = {n: torch.arange(k, dtype=torch.float64) + 100 * i + 1 for i, (n, k) in enumerate(zip(names, numels))}
    flat = torch.cat([params[n] for n in names])
    for rank in range(world):
        shard = fairscale_shard(flat, world, rank)
        got = torch.zeros_like(shard)
        for name, start, n, at in shard_parts(names, numels, world, rank):
            if name is not None:
                got[start:start + n] = params[name][at:at + n]
        assert torch.equal(got, shard), (rank, world)
        anchored = names[::2]  # every other parameter: the rest is plain Adam (new heads)
        anchor, runs = shard_anchor(shard, shard_parts(names, numels, world, rank), anchored, params)
        want = [(s, n) for s, n in anchored_runs(shard_parts(names, numels, world, rank), anchored)]
        if not want:
            assert anchor is None and runs is None
            continue
        picked = torch.cat([shard[s:s + n] for s, n in want])
        assert torch.equal(anchor.reshape(-1), picked)
        assert runs == (None if want == [(0, shard.numel())] else want)
        snap, _ = shard_anchor(shard, shard_parts(names, numels, world, rank), anchored)  # θ*: the loaded weights
        assert torch.equal(snap, anchor)


def fsdp(module, world, rank):
    """fairseq's FSDP wrapper of ``module`` as rank ``rank`` of ``world`` builds it, on the CPU."""
    pytest.importorskip("fairscale")
    from fairscale.internal.parallel import ProcessGroupName
    from fairseq.distributed.fully_sharded_data_parallel import DummyProcessGroup, FullyShardedDataParallel

    return FullyShardedDataParallel(module, process_group=DummyProcessGroup(rank, world),
                                    process_group_reduce_scatter=ProcessGroupName.default,
                                    compute_device=torch.device("cpu"), flatten_parameters=True)


class Net(torch.nn.Module):
    def __init__(self, inner_world=None, rank=0):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Tanh(), torch.nn.Linear(3, 3))
        if inner_world:  # fairseq's fsdp_wrap of a layer: a nested instance with its own flat parameter
            self.body[2] = fsdp(self.body[2], inner_world, rank)
        self.head = torch.nn.Linear(3, 2)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("nested", [False, True])
def test_theta_star_per_shard_of_a_real_fsdp_model(world, nested):
    from recadam_fairseq.optim.fsdp_support import build_anchors, shard_parts as parts_of

    full = {n: p.detach().clone() for n, p in Net().named_parameters()}
    pretrained = {n: v for n, v in full.items() if not n.startswith("head.")}  # the head is new
    held = {n: torch.zeros(v.numel()) for n, v in full.items()}
    for rank in range(world):
        model = fsdp(Net(world if nested else None, rank), world, rank)
        tensors = [p for p in model.parameters() if p.requires_grad]  # fairseq's optimizer tensors
        assert len(tensors) == (2 if nested else 1)
        for t, parts in zip(tensors, parts_of(model, tensors)):
            assert {n for n, *_ in parts if n} <= set(full)  # the model's names, without the wrappers'
            for name, start, n, at in parts:  # fairscale's shard holds these elements of these parameters
                if name:
                    assert torch.equal(t.detach()[start:start + n], full[name].reshape(-1)[at:at + n])
                    held[name][at:at + n] += 1
        for from_file in (True, False):
            for t, anchor, runs in build_anchors(model, tensors, pretrained, from_file):
                parts = parts_of(model, [t])[0]
                names = {n for n, *_ in parts if n}
                if not names & set(pretrained):
                    assert anchor is None
                    continue
                want = torch.cat([full[n].reshape(-1)[at:at + k] for n, _, k, at in parts if n in pretrained])
                assert torch.equal(anchor.reshape(-1), want)
                assert (runs is None) == (names <= set(pretrained) and parts[-1][0] is not None)
    assert all(bool((h == 1).all()) for h in held.values())  # every element on exactly one rank


def test_a_size_mismatch_is_one_line_naming_the_parameter():
    from recadam_fairseq.core.errors import ConfigError
    from recadam_fairseq.optim.fsdp_support import build_anchors

    model = fsdp(Net(), 2, 0)
    with pytest.raises(ConfigError, match=r"^parameter body.0.weight has 16 elements in the pretrained "
                                          r"checkpoint but 15 in the model$"):
        build_anchors(model, list(model.parameters()), {"body.0.weight": torch.zeros(16)}, True)


def test_tiny_roberta_under_fsdp_anchors_what_the_unsharded_run_does(tiny):
    """fairseq's model, loaded from the pretrained checkpoint (its upgrade adds the new head), then sharded
    over 2 ranks: θ* of each shard is the pretrained values of its elements; the head stays plain Adam."""
    from fairseq import tasks

    from conftest import load_ckpt, parse_config
    from recadam_fairseq.anchor_source import quiet_upgrade
    from recadam_fairseq.core.anchor import pretrained_names
    from recadam_fairseq.optim.fsdp_support import build_anchors, shard_parts as parts_of
    from recadam_fairseq.tools.make_tiny_roberta import TINY_ARCH

    cfg = parse_config(tiny.cls_bin, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                       "--num-classes", "2", "--init-token", "0", "--separator-token", "2", *TINY_ARCH, "--cpu")
    task = tasks.setup_task(cfg.task)
    state = load_ckpt(tiny.pretrained)["model"]
    anchored = {}
    for rank in range(2):
        torch.manual_seed(1)
        model = task.build_model(cfg.model)
        model.load_state_dict(dict(state), strict=True, model_cfg=cfg.model)  # as fairseq restores, unsharded
        loaded = {n: p.detach().clone() for n, p in model.named_parameters()}
        wrapped = fsdp(model, 2, rank)
        tensors = [p for p in wrapped.parameters() if p.requires_grad]
        named = pretrained_names(wrapped, state, quiet_upgrade(wrapped))
        for (t, anchor, runs), parts in zip(build_anchors(wrapped, tensors, named, True), parts_of(wrapped, tensors)):
            pieces = [(n, at, k) for n, _, k, at in parts if n and n in named]
            assert torch.equal(anchor.reshape(-1), torch.cat([loaded[n].reshape(-1)[at:at + k] for n, at, k in pieces]))
            for n, _, k in pieces:
                anchored[n] = anchored.get(n, 0) + k
    heads = {n for n in loaded if n.startswith("classification_heads.")}
    assert heads and anchored == {n: p.numel() for n, p in loaded.items() if n not in heads}
