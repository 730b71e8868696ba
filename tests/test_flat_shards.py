"""θ* in the layout of FSDP's flat parameter shards (core/flat_shards.py, optim/fsdp_support.py).

The index math against a hand-built layout (shards starting inside a parameter, padding, an empty last
shard), against torch.chunk + padding as fairscale shards, and against fairscale's own shards of a real
FullyShardedDataParallel built on the CPU (world sizes 2 and 3 through a dummy process group: building
FSDP shards locally, no collective; its forward needs CUDA, so fairseq-train under FSDP is the GPU
pass's, scripts/gpu/run.sh fsdp).
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from helpers import DIST_FLAGS, distributed_args, free_port, load_ckpt, parse_config
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_marked_layout_round_trips_runs_whole_and_none(dtype):
    from recadam_fairseq.core.flat_shards import marked, unmarked

    a = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=dtype)
    m = marked(a, [(1, 2), (5, 2)], 8, dtype)
    assert m.dtype == dtype and m.shape == (8,) and torch.isnan(m[[0, 3, 4, 7]]).all()
    anchor, runs = unmarked(m)
    assert torch.equal(anchor, a) and runs == [(1, 2), (5, 2)]
    assert unmarked(marked(None, None, 3, dtype)) == (None, None)  # a shard of a new head only
    whole, runs = unmarked(marked(a, None, 4, dtype))
    assert torch.equal(whole, a) and runs is None
    anchor, runs = unmarked(marked(a[:3], [(0, 3)], 5, dtype))  # the last shard's padding is not anchored
    assert torch.equal(anchor, a[:3]) and runs == [(0, 3)]


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

    from recadam_fairseq.plumbing.anchor_source import quiet_upgrade
    from recadam_fairseq.core.anchor import pretrained_names
    from recadam_fairseq.optim.fsdp_support import build_anchors, shard_parts as parts_of
    from recadam_fairseq.tiny.make_tiny_roberta import TINY_ARCH

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


def test_recadams_own_layout_is_not_what_fairscale_consolidates():
    """fairseq consolidates the optimizer state at every save with fairscale's gather_full_optim_state_dict:
    it all-gathers each state tensor at the padded shard's size and keeps one value of each non-tensor entry,
    which must be equal on every rank. The anchor of a shard holds its anchored runs only, and the runs differ
    per rank (here the new head sits on rank 1 only): hence the marked layout
    (test_fairscale_consolidates_and_reshards_theta_star_in_the_marked_layout)."""
    pytest.importorskip("fairscale")
    from fairscale.nn.data_parallel.fsdp_optim_utils import _extract_non_tensor_state

    from recadam_fairseq.core.recadam import RecAdam
    from recadam_fairseq.optim.fsdp_support import build_anchors

    pretrained = {n: p.detach().clone() for n, p in Net().named_parameters() if not n.startswith("head.")}
    states = []
    for rank in range(2):
        model = fsdp(Net(), 2, rank)
        tensors = list(model.parameters())
        opt = RecAdam(tensors, lr=1e-3, anneal_k=0.5, anneal_t0=6, pretrain_cof=500.0, defer_anchors=True)
        for t, anchor, runs in build_anchors(model, tensors, pretrained, True):
            opt.set_anchor(t, anchor, runs)
        for t in tensors:
            t.grad = torch.zeros_like(t)
        opt.step()
        states.append(opt.state_dict()["state"][0])
    (shard,) = {t.numel() for t in tensors}
    assert [s["anchor"].numel() for s in states] != [shard, shard]  # not the shard's size on every rank
    combined = {0: {k: [s.get(k) for s in states] for k in states[0].keys() | states[1].keys()}}
    assert combined[0]["anchor_runs"][0] != combined[0]["anchor_runs"][1]
    with pytest.raises(TypeError):  # per-rank runs: unhashable, or unequal ("Dont know how to consolidate")
        _extract_non_tensor_state(combined, 0)


def test_why_fairseq_cannot_restore_a_pretrained_roberta_under_fsdp(tiny):
    """fairseq 0.12 loads --restore-file under FSDP through FSDP's load_state_dict, which (after gathering
    the full parameters) calls FlattenParamsWrapper.load_state_dict: torch's strict load, without the model's
    upgrade_state_dict_named, so a new classification head is missing from a pretrained checkpoint, for any
    optimizer. (At world size 1 the shard is the whole flat parameter: no gathering needed here.)"""
    from fairseq import tasks

    from recadam_fairseq.tiny.make_tiny_roberta import TINY_ARCH

    cfg = parse_config(tiny.cls_bin, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                       "--num-classes", "2", "--init-token", "0", "--separator-token", "2", *TINY_ARCH, "--cpu")
    wrapped = fsdp(tasks.setup_task(cfg.task).build_model(cfg.model), 1, 0)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*classification_heads\.sentence_classification_head"):
        wrapped.module.load_state_dict(dict(load_ckpt(tiny.pretrained)["model"]), strict=True)


def flat_grads(world, rank, seed=3):
    """A rank's shard of one fixed gradient of Net's flat parameter, and the whole gradient per parameter."""
    g = torch.Generator().manual_seed(seed)
    grads = {n: torch.randn(p.shape, generator=g) for n, p in Net().named_parameters()}
    return fairscale_shard(torch.cat([v.reshape(-1) for v in grads.values()]), world, rank), grads


def _consolidate_on_rank(rank, world, port, out):
    """One gloo rank: RecAdam on its FSDP shard, 2 steps; the state consolidated by fairscale (as fairseq saves
    it), then re-sharded (as fairseq loads it) into a new RecAdam."""
    import torch.distributed as dist
    from fairseq.distributed.fully_sharded_data_parallel import FullyShardedDataParallel

    from recadam_fairseq.core.recadam import RecAdam
    from recadam_fairseq.optim.fsdp_support import build_anchors, consolidatable_state, restored_state

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gather = dist.all_gather

    def all_gather(outputs, *args, **kwargs):
        # fairscale keeps [x.cpu() for x in outputs] and gathers the next state tensor into the same outputs:
        # on CUDA .cpu() copies, on the CPU it is x itself (every tensor would read as the last one). Fresh
        # outputs for each gather, as the copy gives (this process only)
        outputs[:] = [torch.empty_like(x) for x in outputs]
        return gather(outputs, *args, **kwargs)

    dist.all_gather = all_gather
    try:
        pretrained = {n: p.detach().clone() for n, p in Net().named_parameters() if not n.startswith("head.")}

        def built():
            model = FullyShardedDataParallel(Net(), compute_device=torch.device("cpu"), flatten_parameters=True)
            tensors = list(model.parameters())
            opt = RecAdam(tensors, lr=1e-2, anneal_k=0.5, anneal_t0=6, pretrain_cof=50.0, defer_anchors=True)
            return model, tensors, opt

        model, (t,), opt = built()
        for p, anchor, runs in build_anchors(model, [t], pretrained, True):
            opt.set_anchor(p, anchor, runs)
        t.grad = flat_grads(world, rank)[0]
        opt.step()
        opt.step()
        full = model.gather_full_optim_state_dict(type("Shim", (), {"state_dict": lambda self: consolidatable_state(
            opt, anchored=True)})())
        box = [full]
        dist.broadcast_object_list(box, src=0)
        model2, (t2,), opt2 = built()
        # fairscale re-shards in place (fairseq loads the file's copy): keep the consolidated state to compare
        opt2.load_state_dict(restored_state(model2.get_shard_from_optim_state_dict(copy.deepcopy(box[0]))))
        torch.save({"full": full, "state": opt.state[t], "reloaded": opt2.state[t2]}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_fairscale_consolidates_and_reshards_theta_star_in_the_marked_layout(tmp_path):
    """Two gloo ranks (fairscale's optimizer-state consolidation runs on the CPU; FSDP's forward does not):
    θ* shard-sized with NaN at the elements it does not cover survives fairseq's save (consolidated per
    parameter: the unsharded RecAdam's state, bit for bit) and load (re-sharded: each rank's anchor and runs
    as they were)."""
    pytest.importorskip("fairscale")
    import torch.multiprocessing as mp

    from recadam_fairseq.core.recadam import RecAdam
    from recadam_fairseq.optim.fsdp_support import restored_state

    mp.spawn(_consolidate_on_rank, args=(2, free_port(), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r in ranks:  # the new head sits on rank 1: its anchor there has runs
        assert set(r["reloaded"]) == set(r["state"])
        for k, v in r["state"].items():
            assert torch.equal(v, r["reloaded"][k]) if torch.is_tensor(v) else v == r["reloaded"][k], k
    assert [tuple(x) for x in ranks[1]["state"]["anchor_runs"]] == [(0, 11)]
    # the unsharded RecAdam, same gradient, per-tensor θ*: what the consolidated checkpoint holds
    net = Net()
    params = list(net.parameters())
    opt = RecAdam(params, lr=1e-2, anneal_k=0.5, anneal_t0=6, pretrain_cof=50.0, defer_anchors=True)
    grads = flat_grads(2, 0)[1]
    for (n, p) in net.named_parameters():
        opt.set_anchor(p, None if n.startswith("head.") else p.detach().clone())
        p.grad = grads[n]
    opt.step()
    opt.step()
    full = restored_state(ranks[0]["full"])["state"]
    assert len(full) == len(params)
    for i, p in enumerate(params):
        assert set(full[i]) == set(opt.state[p]), i
        for k, v in opt.state[p].items():
            assert torch.equal(v, full[i][k]) if torch.is_tensor(v) else v == full[i][k], (i, k)


# ----------------------------------------------------------------------------- the GPU pass (scripts/gpu/run.sh fsdp)
@pytest.fixture(scope="module")
def headed(tiny, tmp_path_factory):
    """The pretrained checkpoint with the new head in it, as the unsharded restore's upgrade fills it in:
    fairseq cannot restore the pretrained file itself under FSDP (the test above says why)."""
    pytest.importorskip("fairscale")
    from fairseq import tasks

    from recadam_fairseq.tiny.make_tiny_roberta import TINY_ARCH

    cfg = parse_config(tiny.cls_bin, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                       "--num-classes", "2", "--init-token", "0", "--separator-token", "2", *TINY_ARCH, "--cpu")
    torch.manual_seed(7)
    model = tasks.setup_task(cfg.task).build_model(cfg.model)
    ckpt = load_ckpt(tiny.pretrained)
    state = dict(ckpt["model"])
    model.upgrade_state_dict_named(state, "")
    assert any(k.startswith("classification_heads.") for k in state)
    path = tmp_path_factory.mktemp("headed") / "headed.pt"
    torch.save({**ckpt, "model": state}, path)
    return str(path)


def cuda_run(tiny, save, start, optimizer="recadam", fsdp=False, extra=()):
    """fairseq-train --fp16 on one GPU from ``start``; ``fsdp``: under FSDP, which needs a process group even
    at world size 1 (fairscale asks for one)."""
    flags = DIST_FLAGS if optimizer == "recadam" else DIST_FLAGS[DIST_FLAGS.index("--dropout"):]  # adam: no --recadam-*
    dist = distributed_args(1, 0, free_port(), device="cuda", backend="fully_sharded") if fsdp else []
    return tiny.train(save, *flags, "--fp16", *dist, *extra, "--restore-file", start, "--reset-optimizer",
                      "--reset-dataloader", "--reset-meters", optimizer=optimizer, device="cuda", restore=False,
                      check=False)


@pytest.mark.gpu
def test_fsdp_on_cuda_recadam_stops_in_one_line(tiny, headed, tmp_path):
    rc, log = cuda_run(tiny, tmp_path / "recadam", headed, fsdp=True)
    assert rc != 0 and "Traceback" not in log, log[-3000:]
    assert "model: FullyShardedDataParallel" in log
    (line,) = [ln for ln in log.splitlines() if "train_entry.py: error: " in ln]
    assert line.split("train_entry.py: error: ")[1].startswith("recadam does not support --ddp-backend fully_sharded: ")


@pytest.mark.gpu
def test_fsdp_on_cuda_fairseq_adam_runs_as_unsharded(tiny, headed, tmp_path):
    """What FSDP itself does on this stack (world size 1: one flat shard, padding none), the base for
    lifting the refusal: fairseq's adam under FSDP --fp16 ends where the unsharded --fp16 run does."""
    runs = {}
    for name, fsdp in (("plain", False), ("fsdp", True)):
        # the model only: fairscale 0.4.13 cannot gather FSDP's optimizer state at world size 1 (seen on an H100:
        # gather_full_optim_state_dict reads _full_param_padded, which it makes for sharded parameters only)
        rc, log = cuda_run(tiny, tmp_path / name, headed, "adam", fsdp=fsdp, extra=["--no-save-optimizer-state"])
        assert rc == 0, log[-4000:]
        # our own file; FSDP's adds its metadata (fsdp_metadata, the consolidated state's id maps)
        runs[name] = torch.load(tmp_path / name / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    assert "model: FullyShardedDataParallel" in open(tmp_path / "fsdp" / "train.log").read()
    start = load_ckpt(headed)["model"]
    keys = [k for k in runs["plain"] if runs["plain"][k].is_floating_point() and k in start]
    assert keys and all(k in runs["fsdp"] for k in keys)  # FSDP's state dict: the model's names, unflattened
    cat = lambda d: torch.cat([d[k].double().reshape(-1) for k in keys])  # noqa: E731
    moved = (cat(runs["plain"]) - cat(start)).norm()
    # fp16 forward and backward, fp32 master weights in both (FSDP's mixed precision, fairseq's flat copy)
    assert moved > 0 and (cat(runs["fsdp"]) - cat(runs["plain"])).norm() < 0.1 * moved
