"""--mixout p (roberta_ft): Mixout toward the pretrained weights, and RecAdam reading the same θ*.

Unit (float64, milliseconds): core/mixout.py against the authors' formula written here, E[W̃] = W over the
two mask values exactly and over many masks within a bound derived below, the mask's rate and its
per-input-neuron layout, the gradient, p = 0 (W itself, no random number drawn), p → 1, evaluation
= W, state dicts; core/anchor.py building RecAdam's anchor from the model's targets (the per-tensor
and the flat --fp16 layouts, and anchors restored from a checkpoint). In process: the flags' checks,
--reinit-layers (no mixout there), a mixout checkpoint loaded by a model without mixout. End to end,
the real fairseq-train (6 processes, two at a time): --mixout 0 is the base run bit for bit; with
--optimizer recadam the checkpoint holds targets = the pretrained weights, the anchors are the targets'
storage and equal θ*, the weights moved, and a relaunch from update 2 equals the straight run bit for
bit; --fp16; evaluation reads W; WiSE-FT; --mixout 1 stops with one line.
"""

import math
import os
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import TINY_FT, assert_one_line_error, build_tiny, load_ckpt, random_tokens, run_jobs
from recadam_fairseq.core import anchor as anchor_mod
from recadam_fairseq.core import lora, mixout
from recadam_fairseq.core.errors import ConfigError
from recadam_fairseq.use import interpolate as wise

FT = TINY_FT
HEAD = "sentence_classification_head"
ORIG, TARGET = ".parametrizations.weight.original", ".parametrizations.weight.0.target"
EPS = np.finfo(np.float64).eps


def _plain(name):
    return name.replace(ORIG, ".weight")


def _pair(out_f=5, in_f=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(out_f, in_f, generator=g, dtype=torch.float64),
            torch.randn(out_f, in_f, generator=g, dtype=torch.float64))


# --------------------------------------------------------------------------- core/mixout.py, float64
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1 - 1e-6])
def test_expected_weight_is_w_over_the_two_mask_values(p):
    """W̃ takes two values per element: θ* (M = 0, probability p) and (W − p·θ*)/(1 − p) (M = 1). Their
    mean p·θ* + (1 − p)·(W − p·θ*)/(1 − p) is W exactly in real numbers; in float64 each value is a few
    roundings of numbers up to (|W| + |θ*|)/(1 − p), so the error is below 8ε of that."""
    w, target = _pair()
    scale = torch.tensor(1.0, dtype=torch.float64) / (1 - p)  # M/(1 − p) as the module computes it
    m1 = mixout.mixout_weight(w, target, scale)
    m0 = mixout.mixout_weight(w, target, torch.zeros((), dtype=torch.float64))
    assert torch.equal(m0, target)  # a mixed-out element is θ* exactly
    W, T = w.numpy(), target.numpy()
    authors = ((1 - 1) * T + 1 * W - p * T) / (1 - p)  # their forward, M = 1
    size = (np.abs(W) + np.abs(T)) / (1 - p)
    assert np.all(np.abs(m1.numpy() - authors) <= 8 * EPS * size)
    expected = p * m0.numpy() + (1 - p) * m1.numpy()
    assert np.all(np.abs(expected - W) <= 8 * EPS * size)
    assert np.abs(expected - W).max() <= 8 * EPS * size.max()


def test_mask_rate_layout_and_mean_over_many_masks():
    """Each read draws one mask value per input neuron (column): the column is θ* or the rescaled W. Over
    K reads, each element's mean differs from W by (W − θ*)·(mean of M/(1−p) − 1), of standard deviation
    |W − θ*|·√(p/((1−p)K)); 5 of those bound it (Bernoulli means, 35 elements: a miss has odds ~1e-5)."""
    p, K = 0.3, 4000
    w, target = _pair()
    lin = torch.nn.Linear(7, 5).double()
    with torch.no_grad():
        lin.weight.copy_(target)  # θ* = the weight when mixout is added ...
    mod = mixout.add_mixout(lin, p)
    with torch.no_grad():
        lin.parametrizations.weight.original.copy_(w)  # ... then W moves
    torch.manual_seed(0)
    reads = torch.stack([lin.weight.detach() for _ in range(K)])
    is_target = reads == target
    is_scaled = torch.isclose(reads, (w - p * target) / (1 - p), rtol=0, atol=1e-13)
    assert bool((is_target ^ is_scaled).all())  # every element one of the two values
    col = is_target[:, 0, :]
    assert bool((is_target == col[:, None, :]).all())  # the authors' mask: one value per input neuron
    rate = col.double().mean().item()  # 28,000 Bernoulli(p) draws: σ = 0.0027
    assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / col.numel())
    sigma = (w - target).abs() * math.sqrt(p / ((1 - p) * K))
    assert bool(((reads.mean(0) - w).abs() <= 5 * sigma).all())
    assert mod.p == p and mod.extra_repr() == "p=0.3"


def test_forward_and_gradient():
    """The forward is the formula with the drawn scale; dW̃/dW = M/(1 − p) (the authors' backward omits
    the 1/(1 − p): theirs is (1 − p) times this)."""
    p = 0.4
    w, target = _pair(seed=1)
    lin = torch.nn.Linear(7, 5).double()
    with torch.no_grad():
        lin.weight.copy_(target)
    mod = mixout.add_mixout(lin, p)
    with torch.no_grad():
        lin.parametrizations.weight.original.copy_(w)
    x = torch.randn(3, 7, dtype=torch.float64)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        scale = mod.draw_scale(w)
    assert set(scale.tolist()) <= {0.0, 1 / (1 - p)}
    torch.manual_seed(5)
    y = lin(x)
    want = x.numpy() @ (target.numpy() + scale.numpy() * (w.numpy() - target.numpy())).T + lin.bias.detach().numpy()
    assert np.abs(y.detach().numpy() - want).max() < 1e-12
    g = torch.randn(3, 5, dtype=torch.float64)
    (y * g).sum().backward()
    grad_w = (g.T @ x).numpy() * scale.numpy()  # dL/dW̃ ⊙ M/(1 − p)
    assert np.abs(lin.parametrizations.weight.original.grad.numpy() - grad_w).max() < 1e-12
    assert mod.target.grad is None and not mod.target.requires_grad


def test_p_zero_eval_and_p_one():
    w, target = _pair(seed=2)
    off = mixout.Mixout(target, 0.0)
    state = torch.get_rng_state()
    assert off(w) is w and torch.equal(torch.get_rng_state(), state)  # W itself, no random number drawn
    on = mixout.Mixout(target, 0.5).eval()
    assert on(w) is w and torch.equal(torch.get_rng_state(), state)  # evaluation: W, nothing drawn
    lin = torch.nn.Linear(7, 5).double()
    state = torch.get_rng_state()
    mixout.add_mixout(lin, 0.5)
    assert torch.equal(torch.get_rng_state(), state)  # adding it draws nothing either (fairseq's init stays)
    lin.eval()
    x = torch.randn(2, 7, dtype=torch.float64)
    assert lin.weight is lin.parametrizations.weight.original
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.parametrizations.weight.original, lin.bias))
    # p → 1: a read is θ* except for a rare column, which (W − p·θ*)/(1 − p) makes huge; p = 1 is refused
    near = mixout.Mixout(target, 1 - 1e-3)
    torch.manual_seed(0)
    assert sum(bool(torch.equal(near(w), target)) for _ in range(200)) > 150
    for bad in (1.0, 1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"mixout probability must be in \[0, 1\)"):
            mixout.Mixout(target, bad)


def test_state_dicts():
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    plain = {k: v.clone() for k, v in net.state_dict().items()}
    mixout.add_mixout(net[0], 0.2)
    state = net.state_dict()
    assert list(state) == ["0.bias", "0" + ORIG, "0" + TARGET, "2.weight", "2.bias"]
    assert mixout.is_mixout_state(state) and not lora.is_lora_state(state) and lora.lora_groups(state) == {}
    assert mixout.mixout_groups(state) == {"0.weight": {"original": "0" + ORIG, "0.target": "0" + TARGET}}
    back = mixout.plain_state_dict(state)
    assert list(back) == ["0.bias", "0.weight", "2.weight", "2.bias"] and all(back[k] is state[k.replace(
        "0.weight", "0" + ORIG)] for k in back)
    assert all(torch.equal(back[k], plain[k]) for k in plain)
    assert list(mixout.targets_by_parameter(net)) == ["0" + ORIG]
    other = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    mixout.add_mixout(other[0], 0.2)
    other.load_state_dict(state)  # the target is persistent: it comes back
    assert torch.equal(other[0].parametrizations.weight[0].target, plain["0.weight"])
    lora.add_lora(other[2], 2, 4.0)  # a LoRA tensor is not a mixout one
    assert list(mixout.mixout_groups(other.state_dict())) == ["0.weight"]
    assert list(lora.lora_groups(other.state_dict())) == ["2.weight"]
    with pytest.raises(ValueError, match="0.parametrizations.weight.original: a target of"):
        mixout.set_target(net, "0" + ORIG, torch.zeros(5, 6))  # float32 for a float64 one


# --------------------------------------------------------------------------- core/anchor.py: one copy of θ*
def _anchor_setup(dtype):
    """A model with mixout on its first Linear, in ``dtype``; its pretrained state under the model's names."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)).to(dtype)
    mixout.add_mixout(net[0], 0.2)
    pretrained = {n: p.detach().clone() for n, p in net.named_parameters()}
    return net, pretrained, mixout.targets_by_parameter(net)


def test_anchor_is_the_models_target_per_tensor():
    net, pretrained, targets = _anchor_setup(torch.float32)
    params = [p for p in net.parameters()]
    plan = anchor_mod.AnchorPlan(params, net, pretrained)
    built = list(plan.build(None, dtype=torch.float32, shared=targets))
    assert plan.shared == ["0" + ORIG] and plan.views == {}
    got = {n: a for (n, _), (_, a, _) in zip(net.named_parameters(), built)}
    assert got["0" + ORIG].untyped_storage().data_ptr() == targets["0" + ORIG].untyped_storage().data_ptr()
    assert all(torch.equal(got[n], pretrained[n]) for n in pretrained)  # every anchor is θ*
    assert got["1.weight"].untyped_storage().data_ptr() != params[2].untyped_storage().data_ptr()  # a copy
    # bf16 anchors would round θ*: the model's exact target would pull elsewhere, so it is not used
    plan = anchor_mod.AnchorPlan(params, net, pretrained)
    built = list(plan.build(None, dtype=torch.bfloat16, shared=targets))
    assert plan.shared == [] and all(a.dtype == torch.bfloat16 for _, a, _ in built)
    # a target that no longer holds θ* is not θ*
    with torch.no_grad():
        targets["0" + ORIG][0, 0] += 1
    plan = anchor_mod.AnchorPlan(params, net, pretrained)
    list(plan.build(None, dtype=torch.float32, shared=targets))
    assert plan.shared == []
    # memory-efficient fp16: the fp16 target stands for an fp32 anchor (the same numbers)
    net, pretrained, targets = _anchor_setup(torch.float16)
    plan = anchor_mod.AnchorPlan(list(net.parameters()), net, pretrained)
    built = list(plan.build(None, dtype=torch.float32, shared=targets))
    assert plan.shared == ["0" + ORIG] and built[1][1] is not None and built[1][1].dtype == torch.float16
    assert [a.dtype for _, a, _ in built] == [torch.float32, torch.float16, torch.float32, torch.float32]


def test_flat_fp16_anchor_holds_the_targets():
    """--fp16: one flat fp32 master tensor; θ* (fp16 numbers) is built in fp16 and the targets become its pieces."""
    net, pretrained, targets = _anchor_setup(torch.float16)
    flat = torch.cat([p.detach().float().reshape(-1) for p in net.parameters()])
    plan = anchor_mod.AnchorPlan([flat], net, pretrained)
    ((_, anchor, runs),) = list(plan.build(None, dtype=torch.float32, shared=targets))
    assert runs is None and anchor.dtype == torch.float16 and torch.equal(anchor.float(), flat)
    (name, piece), = plan.views.items()
    assert name == "0" + ORIG and torch.equal(piece, targets[name])
    mixout.set_target(net, name, piece)
    assert net[0].parametrizations.weight[0].target.untyped_storage().data_ptr() == anchor.untyped_storage().data_ptr()
    assert mixout.held_bytes([anchor, *mixout.targets_by_parameter(net).values()]) == flat.numel() * 2
    # restored from a checkpoint (fairseq saves half tensors as fp32): narrowed to fp16, the targets its pieces
    net, pretrained, targets = _anchor_setup(torch.float16)
    flat = torch.cat([p.detach().float().reshape(-1) for p in net.parameters()])
    restored = flat.clone()
    ((new, runs),), used, views = anchor_mod.share_existing([flat], [(restored, None)], net, targets)
    assert used == [] and new.dtype == torch.float16 and torch.equal(new.float(), restored)
    assert list(views) == ["0" + ORIG]
    assert views["0" + ORIG].untyped_storage().data_ptr() == new.untyped_storage().data_ptr()
    # per tensor (fp32): a restored anchor gives way to the model's target holding the same numbers
    net, pretrained, targets = _anchor_setup(torch.float32)
    params = list(net.parameters())
    restored = [(pretrained[n].clone(), None) for n, _ in net.named_parameters()]
    out, used, views = anchor_mod.share_existing(params, restored, net, targets)
    assert used == ["0" + ORIG] and views == {} and out[1][0].untyped_storage().data_ptr() == \
        targets["0" + ORIG].untyped_storage().data_ptr()
    assert all(out[i][0] is restored[i][0] for i in (0, 2, 3))


# --------------------------------------------------------------------------- the model, in process
def _args(**kw):
    base = dict(reinit_layers=0, encoder_layers=2, lora_modules="q,v", lora_rank=0, lora_alpha=8.0, mixout=0.0)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw, message", [
    (dict(mixout=1.0), r"--mixout 1: must be in \[0, 1\) \(0: off; at 1 every weight would be its pretrained"),
    (dict(mixout=-0.1), r"--mixout -0.1: must be in \[0, 1\)"),
    (dict(mixout=float("nan")), r"--mixout nan: must be in \[0, 1\)"),
    (dict(mixout=0.1, lora_rank=8), r"--mixout 0.1 with --lora-rank 8: LoRA freezes every pretrained weight"),
    (dict(mixout=0.5, reinit_layers=2), r"--mixout 0.5 with --reinit-layers 2: every encoder layer is re-init"),
])
def test_bad_values_name_the_flag(kw, message):
    from recadam_fairseq.models.roberta_ft import check_args

    with pytest.raises(ConfigError, match="^" + message):
        check_args(_args(**kw))
    check_args(_args(mixout=0.99, reinit_layers=1))  # with --reinit-layers: fine (no mixout in those layers)


def _build(tiny, *extra, seed=7):
    return build_tiny(tiny, *FT, *extra, seed=seed)


@pytest.fixture(scope="module")
def pretrained(tiny):
    return load_ckpt(tiny.pretrained)["model"]


def test_reinit_layers_get_no_mixout(tiny, pretrained):
    model, _, cfg = _build(tiny, "--mixout", "0.3", "--reinit-layers", "1")
    init = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(dict(pretrained), strict=True, model_cfg=cfg)
    targets = mixout.targets_by_parameter(model)
    assert sorted(targets) == sorted(f"encoder.sentence_encoder.layers.0.{m}{ORIG}" for m in lora.MODULES.values())
    assert all(torch.equal(t, pretrained[_plain(n)]) for n, t in targets.items())
    top = "encoder.sentence_encoder.layers.1.fc1.weight"
    assert torch.equal(model.state_dict()[top], init[top])  # re-initialised, plain


# --------------------------------------------------------------------------- fairseq-train
@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixout")
    d = {k: str(root / k) for k in ("base", "off", "rec", "rec_resumed", "fp16", "bad")}
    rec = [*FT, "--mixout", "0.3", "--recadam-anneal-k", "1", "--recadam-anneal-t0", "2"]

    def straight_then_resumed():
        out = {"rec": tiny.train(d["rec"], *rec, "--save-interval-updates", "2", "--keep-interval-updates", "-1",
                                 updates=4)[1]}
        os.makedirs(d["rec_resumed"])
        shutil.copy(os.path.join(d["rec"], "checkpoint_1_2.pt"), os.path.join(d["rec_resumed"], "checkpoint_last.pt"))
        out["rec_resumed"] = tiny.train(d["rec_resumed"], *rec, "--restore-file", os.path.join(
            d["rec_resumed"], "checkpoint_last.pt"), restore=False, updates=4)[1]
        return out

    jobs = [
        straight_then_resumed,
        lambda: {"base": tiny.train(d["base"], *FT, optimizer="adam", updates=3)[1]},
        lambda: {"off": tiny.train(d["off"], *FT, "--mixout", "0", optimizer="adam", updates=3)[1]},
        lambda: {"fp16": tiny.train(d["fp16"], *rec, "--fp16", updates=2)[1]},
        lambda: {"bad": tiny.train(d["bad"], *FT, "--mixout", "1", optimizer="adam", check=False)},
    ]
    return d, run_jobs(jobs)


def _ckpt(save, name="checkpoint_last.pt"):
    return load_ckpt(os.path.join(save, name))


def _lines(log, what):
    return [ln for ln in log.splitlines() if what in ln]


def test_mixout_zero_is_the_base_run(runs):
    d, logs = runs
    a, b = _ckpt(d["base"])["model"], _ckpt(d["off"])["model"]
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    loss = re.compile(r"train_inner \| .* loss=([\d.]+),")
    assert loss.findall(logs["base"]) == loss.findall(logs["off"]) and len(loss.findall(logs["off"])) == 3
    assert not _lines(logs["off"], "roberta_ft: mixout") and not _lines(logs["off"], "recadam: --mixout")


def _param_names(tiny):
    model, _, _ = _build(tiny, "--mixout", "0.3")
    return [n for n, p in model.named_parameters() if p.requires_grad]  # the optimizer's order


def test_targets_are_the_pretrained_weights_and_the_anchor_is_them(runs, tiny, pretrained):
    d, logs = runs
    ckpt = _ckpt(d["rec"])
    model, state = ckpt["model"], ckpt["last_optimizer_state"]["state"]
    names = [k for k in model if k.endswith(ORIG)]
    assert len(names) == 12 and not any(_plain(k) in model for k in names)
    for k in names:
        assert torch.equal(model[k.replace(ORIG, TARGET)], pretrained[_plain(k)]), k  # θ*, bit for bit
        assert not torch.equal(model[k], pretrained[_plain(k)]), k  # W moved
    # RecAdam's anchor of each mixout weight is the target's storage (torch.save kept one copy), and every
    # anchor is θ* exactly
    params = _param_names(tiny)
    storage = {model[k.replace(ORIG, TARGET)].untyped_storage().data_ptr(): k for k in names}
    anchored = {params[int(i)]: s["anchor"] for i, s in state.items() if "anchor" in s}
    assert sorted(storage.get(a.untyped_storage().data_ptr()) for n, a in anchored.items() if n.endswith(ORIG)) \
        == sorted(names)
    assert set(anchored) == {n for n in params if _plain(n) in pretrained}
    assert all(torch.equal(a, pretrained[_plain(n)]) for n, a in anchored.items())
    # the log's figures: 82,409 anchored elements in fp32 (the twelve targets among them), 65,536 in targets
    numel = sum(pretrained[_plain(n)].numel() for n in anchored)
    targets = sum(pretrained[_plain(k)].numel() for k in names)
    assert (numel, targets) == (82409, 65536)
    (line,) = _lines(logs["rec"], "recadam: --mixout: ")
    assert line.endswith(f"θ* stored once for 12 of 12 mixout weights (12 anchors are the model's targets); anchor "
                         f"+ targets hold {4 * numel:,} bytes ({4 * (numel + targets):,} as two copies)")
    assert _lines(logs["rec"], "roberta_ft: mixout targets θ* = the loaded weights for 12 weights")
    assert _lines(logs["rec"], "roberta_ft: mixout p=0.3 on q,k,v,out,fc1,fc2 of layers 0-1: 12 weights, 65,536 "
                               "elements; the classification heads have none")


def _same_run(a, b):
    """Same weights and optimizer state, bit for bit."""
    assert list(a["model"]) == list(b["model"])
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    sa, sb = a["last_optimizer_state"]["state"], b["last_optimizer_state"]["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    for i in sa:
        assert sa[i].keys() == sb[i].keys()
        for n, v in sa[i].items():
            assert (torch.equal(v, sb[i][n]) if torch.is_tensor(v) else v == sb[i][n]), (i, n)


def test_resume_is_bit_exact_and_keeps_the_targets(runs):
    d, logs = runs
    _same_run(_ckpt(d["rec"]), _ckpt(d["rec_resumed"]))
    log = logs["rec_resumed"]
    assert _lines(log, "roberta_ft: mixout targets θ* of 12 weights loaded from the checkpoint (a mixout run's), "
                       "not reset") and not _lines(log, "= the loaded weights")
    assert _lines(log, "θ* restored from the checkpoint's optimizer state")
    assert _lines(log, "θ* stored once for 12 of 12 mixout weights (12 anchors are the model's targets)")


def test_fp16_targets_are_pieces_of_the_anchor(runs, pretrained):
    d, logs = runs
    (line,) = _lines(logs["fp16"], "recadam: --mixout: ")
    # one fp16 anchor of the 82,409 anchored elements; apart: an fp32 anchor + the fp16 targets
    assert line.endswith("θ* stored once for 12 of 12 mixout weights (12 targets are pieces of the float16 anchor); "
                         f"anchor + targets hold {2 * 82409:,} bytes ({4 * 82409 + 2 * 65536:,} as two copies)")
    losses = [float(x) for x in re.findall(r"train_inner \| .* loss=([\d.]+),.*loss_scale=", logs["fp16"])]
    assert len(losses) == 2 and all(np.isfinite(losses))
    ckpt = _ckpt(d["fp16"])
    model = ckpt["model"]  # fairseq saves half tensors as fp32
    ((flat,),) = [[s["anchor"] for s in ckpt["last_optimizer_state"]["state"].values() if "anchor" in s]]
    names = [k for k in model if k.endswith(ORIG)]
    for k in names:
        assert torch.equal(model[k.replace(ORIG, TARGET)], pretrained[_plain(k)].half().float()), k
    assert flat.numel() == 82409 and not any(torch.equal(model[k], pretrained[_plain(k)].half().float())
                                             for k in names)


def test_evaluation_reads_w_and_loads_without_mixout(runs, tiny, tmp_path, pretrained):
    from fairseq import checkpoint_utils

    d, _ = runs
    last = os.path.join(d["rec"], "checkpoint_last.pt")
    (mixed,), _, task = checkpoint_utils.load_model_ensemble_and_task([last], arg_overrides={"data": tiny.cls_bin})
    assert mixout.targets_by_parameter(mixed)
    plain, _, cfg = _build(tiny)  # no --mixout: the checkpoint's W under the plain names, targets dropped
    plain.load_state_dict(dict(_ckpt(d["rec"])["model"]), strict=True, model_cfg=cfg)
    assert not mixout.targets_by_parameter(plain)
    toks = random_tokens(task)[0]
    mixed.eval(), plain.eval()
    with torch.no_grad():
        a, b = mixed(toks, classification_head_name=HEAD)[0], plain(toks, classification_head_name=HEAD)[0]
    assert torch.equal(a, b)
    # WiSE-FT of a mixout checkpoint: W is interpolated with θ*, the targets stay θ*
    out = str(tmp_path / "wise.pt")
    assert wise.main([last, "--pretrained", tiny.pretrained, "--alpha", "0.5", "--out", out]) == 0
    half, ft = load_ckpt(out)["model"], _ckpt(d["rec"])["model"]
    k = "encoder.sentence_encoder.layers.0.fc1" + ORIG
    assert torch.allclose(half[k].double(), (ft[k].double() + pretrained[_plain(k)].double()) / 2, rtol=0, atol=1e-7)
    assert torch.equal(half[k.replace(ORIG, TARGET)], pretrained[_plain(k)])


def test_bad_p_stops_with_one_line(runs):
    d, logs = runs
    assert_one_line_error(logs["bad"], d["bad"], "--mixout 1: must be in [0, 1) (0: off; at 1 every weight would "
                          "be its pretrained value in training and nothing would learn)")
