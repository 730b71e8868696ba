"""EWC: the Fisher-weighted pull (decoupled in RecAdam's step, coupled in the loss), its guard, its sources.

Core checks are in-process float64 references; the end-to-end runs share one batch of fairseq-train launches
(the ``runs`` fixture, 2 at a time)."""

import math
import os
import re
import shutil

import pytest
import torch

import recadam_fairseq.core.fused as fused_mod
from recadam_fairseq import RecAdam
from recadam_fairseq.core import ewc
from recadam_fairseq.core.errors import ConfigError

from helpers import (DIST_FLAGS, assert_one_line_error, dumps, flat_params, load_ckpt, run_jobs, run_wrapper,
                     tiny_classifier_args)
from recadam_fairseq.tiny import make_tiny_roberta as tiny_roberta

HP = dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01, anneal_fun="sigmoid", anneal_k=0.5,
          anneal_t0=3.0, anneal_w=1.0, pretrain_cof=40.0)


# --------------------------------------------------------------------------- the decoupled step, float64
def ref_ewc_steps(p, a, f, grads, hp, anchored=None):
    """The EWC update written out per element in Python floats (independent of the implementation):
    Adam step scaled by λ, then p ← p − min(lr·(w−λ)·γ·F, 1)·(p − p*), then decoupled weight decay;
    elements not ``anchored``: plain Adam and the decay."""
    p, m, v = list(p), [0.0] * len(p), [0.0] * len(p)
    b1, b2 = hp["betas"]
    lr, w = hp["lr"], hp["anneal_w"]
    for t, g in enumerate(grads, start=1):
        lam = w / (1 + math.exp(-hp["anneal_k"] * (t - hp["anneal_t0"])))
        s = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        for i in range(len(p)):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i]
            if anchored is None or anchored[i]:
                x = p[i] - s * lam * m[i] / (math.sqrt(v[i]) + hp["eps"])
                c = min(lr * (w - lam) * hp["pretrain_cof"] * f[i], 1.0)
                x = x - c * (x - a[i])
            else:
                x = p[i] - s * m[i] / (math.sqrt(v[i]) + hp["eps"])
            p[i] = x - lr * hp["weight_decay"] * x
    return p


KERNELS = {"foreach": dict(foreach=True, fused=False), "single": dict(foreach=False, fused=False),
           "fused": dict(fused=True)}  # fused: the compiled one-pass kernel, F read and capped inside it


@pytest.fixture
def small_segments_compiled(monkeypatch):
    """The tests' small tensors take the compiled kernel (they are below fused.MIN_SEGMENT)."""
    monkeypatch.setattr(fused_mod, "MIN_SEGMENT", 2)


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("flat", [False, True])
def test_decoupled_step_against_a_float64_reference(kernel, flat, small_segments_compiled):
    """Per tensor, and as --fp16's flat tensor with anchor runs (elements outside them: plain Adam); the eager
    kernels and the compiled one (F inside it) alike."""
    g = torch.Generator().manual_seed(0)
    n = 12
    p0 = torch.randn(n, generator=g, dtype=torch.float64)
    a = p0 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    f = torch.rand(n, generator=g, dtype=torch.float64) * 3
    f[3] = 1e4  # a heavy tail: capped at a weight of 1
    grads = [torch.randn(n, generator=g, dtype=torch.float64) for _ in range(6)]
    p = p0.clone()
    opt = RecAdam([p], **HP, **KERNELS[kernel], defer_anchors=True)
    if flat:
        runs = [(0, 5), (8, 4)]  # elements 5..7: a head without θ*
        idx = [0, 1, 2, 3, 4, 8, 9, 10, 11]
        opt.set_anchor(p, a[idx].clone(), runs)
        opt.set_fisher(p, f[idx].clone())
        anchored = [i in idx for i in range(n)]
    else:
        opt.set_anchor(p, a.clone())
        opt.set_fisher(p, f.clone())
        anchored = None
    for gr in grads:
        p.grad = gr.clone()
        opt.step()
    plan = opt._plans[0]
    if kernel == "fused":  # F went through the compiled kernel, not the eager one
        assert sorted(f is not None for b in plan.compiled for f in b.fishers) == ([False, True, True] if flat
                                                                                   else [True])
        assert not plan.eager
    want = ref_ewc_steps(p0.tolist(), a.tolist(), f.tolist(), [x.tolist() for x in grads], HP, anchored)
    torch.testing.assert_close(p, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-14)
    assert p[3].item() != pytest.approx(p0[3].item())  # the capped element moved (toward θ*)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_fisher_of_ones_is_recadam_bit_for_bit(kernel, small_segments_compiled):
    """fp32, two tensors and a flat one with runs and layer-wise lr scales, bf16-stored F included; the compiled
    kernel with F ≡ 1 is the compiled kernel without F."""
    shapes = [(7, 5), (300,), (64,)]

    def run(with_f, f_dtype=torch.float32, value=1.0):
        ps = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(shapes)]
        opt = RecAdam(ps, **{**HP, "pretrain_cof": 20.0}, **KERNELS[kernel], defer_anchors=True)
        for i, q in enumerate(ps[:2]):
            opt.set_anchor(q, q.detach() + 0.05 * torch.randn(q.shape, generator=torch.Generator().manual_seed(9 + i)))
            if with_f:
                opt.set_fisher(q, torch.full(q.shape, value, dtype=f_dtype))
        runs = [(0, 20), (30, 30)]
        opt.set_anchor(ps[2], ps[2].detach()[:50].clone() * 0.9, runs)
        opt.set_lr_scale(ps[2], [(10, 30, 0.5)])
        if with_f:
            opt.set_fisher(ps[2], torch.ones(50, dtype=f_dtype))
        for step in range(5):
            for q in ps:
                q.grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(100 * step + q.numel()))
            opt.step()
        return ps

    base = run(False)
    for f_dtype in (torch.float32, torch.bfloat16):
        for x, y in zip(base, run(True, f_dtype)):
            assert torch.equal(x, y)
    other = run(True, value=2.0)  # ... and F is read: 2 instead of 1 changes the anchored tensors only
    assert not torch.equal(base[0], other[0]) and torch.equal(base[2], other[2])


def test_guard_lands_huge_fisher_entries_on_theta_star_without_overshoot():
    """lr·(w−λ)·γ·F of 1.5 and 1e6: the element lands on θ* each step (lerp weight 1 is exact); RecAdam's
    uncapped pull at 1.5 overshoots (the sign flips)."""
    p = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    a = torch.zeros(3, dtype=torch.float64)
    # λ ≈ 0 under a 1e9-update linear ramp: the pull is lr·γ·F, the Adam step negligible
    opt = RecAdam([p], **{**HP, "anneal_fun": "linear", "anneal_t0": 1e9, "weight_decay": 0.0, "pretrain_cof": 100.0},
                  foreach=True, fused=False, defer_anchors=True)
    opt.set_anchor(p, a.clone())
    c = 1e-2 * 100.0  # lr·γ, λ ≈ 0 under the 1e9-update linear ramp
    opt.set_fisher(p, torch.tensor([0.5, 1.5 / c, 1e6], dtype=torch.float64))
    for t in range(5):
        p.grad = torch.full((3,), 1e-3, dtype=torch.float64)
        opt.step()
        assert p[1].item() == 0.0 and p[2].item() == 0.0  # on θ*, exactly
        assert 0 < p[0].item() < 1  # F·lr·γ = 0.5: halfway each step, from the same side
    # RecAdam's own pull at c = 1.5 (no F, no cap) overshoots: the sign of p − p* flips every step
    q = torch.ones(1, dtype=torch.float64)
    rec = RecAdam([q], **{**HP, "anneal_fun": "linear", "anneal_t0": 1e9, "weight_decay": 0.0, "pretrain_cof": 150.0},
                  foreach=True, fused=False, defer_anchors=True)
    rec.set_anchor(q, torch.zeros(1, dtype=torch.float64))
    signs = []
    for _ in range(4):
        q.grad = torch.full((1,), 1e-3, dtype=torch.float64)
        rec.step()
        signs.append(q.item() > 0)
    assert signs == [False, True, False, True]


def test_fisher_segments_take_the_compiled_kernel():
    """fused: large segments go to the compiled kernels with F or without; F's presence and dtype are part of
    the bucket (hence of the kernel's key), so the two never share a program; nothing goes eager."""
    big = fused_mod.MIN_SEGMENT
    p, q, r = torch.zeros(big), torch.zeros(big), torch.zeros(big)
    opt = RecAdam([p, q, r], **HP, fused=False, defer_anchors=True)
    for x in (p, q, r):
        opt.set_anchor(x, torch.ones(big))
    opt.set_fisher(q, torch.ones(big))
    opt.set_fisher(r, torch.ones(big, dtype=torch.bfloat16))
    p.grad, q.grad, r.grad = torch.ones(big), torch.ones(big), torch.ones(big)
    plan = opt._plan(opt.param_groups[0], [p.grad, q.grad, r.grad], True)
    got = {b.kind.dtypes[3]: [(x.data_ptr(), f is None or f.data_ptr()) for x, f in zip(b.ps, b.fishers)]
           for b in plan.compiled}
    assert got == {None: [(p.data_ptr(), True)], torch.float32: [(q.data_ptr(), opt.fisher_of(q).data_ptr())],
                   torch.bfloat16: [(r.data_ptr(), opt.fisher_of(r).data_ptr())]}
    assert not plan.eager


def test_fisher_state_round_trip_and_bad_values():
    p = torch.zeros(4)
    opt = RecAdam([p], **HP, fused=False, defer_anchors=True)
    with pytest.raises(ValueError, match="needs an anchor"):
        opt.set_fisher(p, torch.ones(4))
    opt.set_anchor(p, torch.ones(4))
    for bad, msg in ((torch.ones(3), "does not fit"), (torch.tensor([1.0, -1, 0, 0]), ">= 0"),
                     (torch.tensor([1.0, math.nan, 0, 0]), "finite")):
        with pytest.raises(ValueError, match=msg):
            opt.set_fisher(p, bad)
    opt.set_fisher(p, torch.tensor([1.0, 2, 3, 4], dtype=torch.bfloat16))
    p.grad = torch.ones(4)
    opt.step()
    opt2 = RecAdam([torch.zeros(4)], **HP, fused=False, defer_anchors=True)
    opt2.load_state_dict(opt.state_dict())
    f = opt2.fisher_of(opt2.param_groups[0]["params"][0])
    assert f.dtype == torch.bfloat16 and torch.equal(f, opt.fisher_of(p))  # kept in its dtype
    opt.set_anchor(p, None)
    assert opt.fisher_of(p) is None


# --------------------------------------------------------------------------- the coupled term, normalisation
@pytest.mark.parametrize("dtype, anchor", [(torch.float32, torch.float32), (torch.float16, torch.float32),
                                           (torch.bfloat16, torch.bfloat16), (torch.float64, torch.float32)])
def test_coupled_distance_against_a_float64_reference(dtype, anchor):
    """ewc.distance (the coupled term: one graph node, multi-tensor passes) against Σ F·(θ−θ*)² and 2·F·(θ−θ*)·ḡ in
    float64, per θ dtype (an fp16/bf16 θ: fp32 arithmetic, the gradient rounded once to θ's dtype); F ≡ 1 and no F
    equal bit for bit; and at ḡ = 1 equal bit for bit to the autograd graph of ewc.penalty (what the term was) in
    fp32 and fp16 (at another ḡ the two round F·d·2ḡ in another order: an ulp apart)."""
    g = torch.Generator().manual_seed(2)
    ps = [torch.randn(5, 3, generator=g).to(dtype).requires_grad_(), torch.randn(11, generator=g).to(dtype).requires_grad_()]
    anchors = [(p.detach().double() + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64)).to(anchor)
               for p in ps]
    fs = [torch.rand(5, 3, generator=g) * 4, torch.rand(11, generator=g)]
    scale = torch.tensor(3.0, dtype=torch.float64)  # what the loss's backward brings (λ, γ, a loss scale)
    for f in (None, [torch.ones(5, 3), torch.ones(11)], fs):
        pairs = list(zip(ps, anchors, f or [None, None]))
        dist = ewc.distance(ewc.Pull(pairs))
        grads = torch.autograd.grad(dist * scale.to(dist.dtype), ps)
        wd = sum(float(((1 if fi is None else fi.double()) * (p.detach().double() - a.double()) ** 2).sum())
                 for p, a, fi in pairs)
        assert float(dist) == pytest.approx(wd, rel=1e-6) and dist.dtype == torch.promote_types(dtype, torch.float32)
        for gr, (p, a, fi) in zip(grads, pairs):
            want = 2 * 3.0 * (1 if fi is None else fi.double()) * (p.detach().double() - a.double())
            assert gr.dtype == dtype
            torch.testing.assert_close(gr.double(), want.to(dtype).double(), rtol=2 ** -7 if dtype.itemsize == 2 else 1e-6,
                                       atol=1e-6)
        if f is None:
            plain = (dist, grads)
        elif f[0] is not fs[0]:  # F ≡ 1
            assert torch.equal(dist, plain[0]) and all(torch.equal(x, y) for x, y in zip(grads, plain[1]))
        if dtype in (torch.float32, torch.float16) and anchor == torch.float32:
            ours, ref = torch.autograd.grad(ewc.distance(ewc.Pull(pairs)), ps), torch.autograd.grad(ewc.penalty(pairs), ps)
            assert all(torch.equal(x, y) for x, y in zip(ours, ref))


def test_coupled_term_makes_no_host_sync(tiny, runs):
    """The GLUE criterion's coupled term with EWC's F reads no number from a tensor (aten._local_scalar_dense:
    .item(), bool(), float()) in a training forward and backward (after the first call, which builds θ* and F): a
    step reads as many as the same step without the term (fairseq's encoder reads its padding mask); the distance
    and the penalty are logged as tensors, and the criterion's reduction of the logs reads none. A counter check:
    the term computed as it was (an .item() of the distance) is seen."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from recadam_fairseq.criterions import coupled_term
    from recadam_fairseq.tools import fisher as tool

    class Reads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                Reads.count += 1
            return func(*args, **(kwargs or {}))

    cfg, task, model, criterion = tool.setup([tiny.cls_bin, *TRAIN_ARGS, "--restore-file", tiny.pretrained,
                                              "--criterion", "sentence_prediction_recadam", "--recadam-objective",
                                              "coupled", "--ewc-fisher", runs["task_file"]])
    sample = task.dataset("train").collater([task.dataset("train")[i] for i in range(4)])
    model.train()

    def step(term=True):
        Reads.count = 0
        coupled, criterion.coupled = criterion.coupled, criterion.coupled if term else None
        try:
            with Reads():
                loss, _, log = criterion(model, sample)
                loss.backward()
        finally:
            criterion.coupled = coupled
        return log

    step()  # θ* and F
    with torch.no_grad():  # θ off θ*
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    step(term=False)
    without = Reads.count
    log = step()
    assert Reads.count == without > 0 and torch.is_tensor(log["recadam_dist"]) and float(log["recadam_penalty"]) > 0
    Reads.count = 0
    with Reads():
        type(criterion).reduce_metrics([log, log])
    assert Reads.count == 0
    was = coupled_term.ewc.distance
    try:  # the term as it logged before: an .item() of the distance
        coupled_term.ewc.distance = lambda pull: (lambda d: d + 0 * d.item())(was(pull))
        step()
        assert Reads.count == without + 1
    finally:
        coupled_term.ewc.distance = was


def test_normalise_and_check_name_the_file():
    fisher = {"a": torch.tensor([1.0, 3.0]), "b": torch.tensor([[0.0, 4.0]]), "head": torch.tensor([100.0])}
    f, mean = ewc.normalise(fisher, ["a", "b"], "x")
    assert mean == 2.0 and set(f) == {"a", "b"}  # the head (not anchored) is not in the mean
    assert torch.equal(torch.cat([f["a"], f["b"].reshape(-1)]), torch.tensor([0.5, 1.5, 0.0, 2.0]))
    shard, shard_mean = ewc.normalise(fisher, ["a", "b"], "x", keep={"b", "head"})  # a ZeRO rank's: the whole mean
    assert set(shard) == {"b"} and shard_mean == 2.0 and torch.equal(shard["b"], f["b"])
    shapes = {"a": (2,), "b": (1, 2), "head": (1,)}
    w = "--ewc-fisher F.pt"
    cases = [({**fisher, "zzz": torch.ones(1)}, "parameter zzz is not in the model"),
             ({**fisher, "a": torch.ones(3)}, "F of a has shape (3,), the model's parameter (2,)"),
             ({**fisher, "a": torch.tensor([1.0, math.inf])}, "F of a holds 1 NaN or Inf value(s)"),
             ({**fisher, "a": torch.tensor([1.0, -2.0])}, "F of a holds 1 negative value(s)"),
             ({"a": fisher["a"]}, "no F for the pretrained parameter(s) b")]
    for bad, msg in cases:
        with pytest.raises(ConfigError) as e:
            ewc.check(bad, shapes, ["a", "b"], w)
        assert str(e.value).startswith(f"{w}: {msg}") and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="zero on every pretrained element"):
        ewc.normalise({"a": torch.zeros(2)}, ["a"], w)


# --------------------------------------------------------------------------- the Fisher, by hand
TRAIN_ARGS = [*tiny_classifier_args(), "--batch-size", "16", "--seed", "7", "--cpu", "--num-workers", "0"]
NO_ARCH = [*tiny_classifier_args(arch=False), "--batch-size", "16", "--seed", "7", "--cpu", "--num-workers", "0"]


def test_task_fisher_equals_per_example_autograd_in_float64(tiny, caplog):
    """fisher_source.task_fisher (eval mode) on the first 24 examples of the epoch-1 order (the second batch cut
    short) against a loop over those examples, one per forward, in float64: 5 per-example gradients a vmap (the
    chunks straddle the batches) and one at a time alike, to 1e-9. In fp32 the two ways agree to 1e-5 relative and
    1e-6 of F's largest value (float rounding: the vmap's matmuls have other shapes; k_proj's bias has a zero
    gradient up to rounding, softmax being blind to it)."""
    from recadam_fairseq.criterions.fisher_source import task_fisher
    from recadam_fairseq.plumbing.batches import train_batches
    from recadam_fairseq.tools import fisher as tool

    cfg, task, model, criterion = tool.setup([tiny.cls_bin, *TRAIN_ARGS, "--restore-file", tiny.pretrained])
    fp32 = {b: task_fisher(criterion, model, tool.batches_cfg(cfg), 24, batch=b)[0] for b in (5, 0)}
    model = model.double()
    caplog.clear()
    with caplog.at_level("INFO", logger="recadam_fairseq.criterions.fisher_source"):
        got = {b: task_fisher(criterion, model, tool.batches_cfg(cfg), 24, batch=b) for b in (5, 0)}
    assert "one at a time (batch size 0)" in caplog.text and caplog.text.count("one at a time") == 1  # 5: vmapped
    ids = [int(i) for b in train_batches(tool.batches_cfg(cfg), task, model, 1, 0) for i in b["id"]][:24]
    assert got[5][1] == got[0][1] == 24 and len(set(ids)) == 24
    data = task.dataset("train")
    model.eval()
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    want = [torch.zeros_like(p) for p in params]
    for i in ids:
        sample = data.collater([data[i]])
        logits, _ = model(**sample["net_input"], features_only=True,
                          classification_head_name="sentence_classification_head")
        loss = torch.nn.functional.cross_entropy(logits, sample["target"].view(-1), reduction="sum")
        for w, gr in zip(want, torch.autograd.grad(loss, params, allow_unused=True)):
            if gr is not None:
                w += gr * gr
    top = max(float(f.max()) for f in fp32[0].values())
    for name, w in zip(names, want):
        for b in (5, 0):
            torch.testing.assert_close(got[b][0][name], w / 24, rtol=1e-9, atol=1e-18, msg=(b, name))
        torch.testing.assert_close(fp32[5][name], fp32[0][name], rtol=1e-5, atol=1e-6 * top, msg=name)
    assert sum(float(w.sum()) for w in want) > 0


class _Branchy(torch.nn.Module):
    """Embedding, layer norm and a head over tokens (0 pads), with fairseq's branch on the data (``if
    mask.any()``) and, by ``how``, code that vmap cannot take or that a trace of one example gets wrong."""

    def __init__(self, how=""):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.norm, self.out = torch.nn.Embedding(9, 4, padding_idx=0), torch.nn.LayerNorm(4), \
            torch.nn.Linear(4, 3)
        self.how = how

    def forward(self, tokens):
        mask = tokens.eq(0)
        x = self.norm(self.emb(tokens))
        if mask.any():  # the trace keeps this branch: every example is padded first
            x = x * (~mask).unsqueeze(-1)
        if self.how == "number":  # a number read from each example, which a trace bakes in
            x = torch.stack([x[i] * float(tokens[i, 0]) for i in range(len(x))])
        elif self.how == "branch":  # a branch of each example's own
            x = torch.stack([2 * x[i] if bool(tokens[i, 0] > 4) else x[i] for i in range(len(x))])
        elif self.how == "shape":  # a shape that depends on the data (here empty): vmap refuses
            x = x + x[tokens > 100].sum()
        return self.out(x.sum(1))


def test_vmapped_per_example_gradients_and_the_one_at_a_time_way(tmp_path):
    """core/per_example.py on a toy in float64: the vmapped squares (chunks of 3, the batch padded to 8 tokens)
    equal a loop over the examples alone, to 1e-12; a model whose loss a trace of one example gets wrong (a number
    or a branch of the data) or that vmap refuses (a data-dependent shape) is taken one at a time after the check
    of the traced losses or the error, with the same result and the reason in ``why``."""
    import torch.nn.functional as F

    from recadam_fairseq.core.per_example import rows

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 9, (7, 5), generator=g)
    for i, n in enumerate((5, 3, 4, 1, 5, 2, 4)):
        tokens[i, n:] = 0
    sample = {"tokens": tokens, "y": torch.randint(0, 3, (7,), generator=g), "count": 7}

    def loss_fn(model, s):
        return F.cross_entropy(model(s["tokens"]), s["y"], reduction="none")

    def pad(s):
        return {**s, "tokens": F.pad(s["tokens"], (0, 8 - s["tokens"].size(1)))}

    for how, why in (("", ""), ("number", "the traced per-example loss is not the model's"),
                     ("branch", "the traced per-example loss is not the model's"),
                     ("shape", "RuntimeError: vmap: We do not support batching operators")):
        model = _Branchy(how).double()
        named = list(model.named_parameters())
        want = [torch.zeros_like(p) for _, p in named]
        for i in range(7):
            one = rows(sample, 7, i, i + 1)
            for w, gr in zip(want, torch.autograd.grad(loss_fn(model, one)[0], [p for _, p in named])):
                w += gr * gr
        fisher = ewc.FisherPass(model, loss_fn, named, 3, pad=pad)
        fisher.add(sample, 7)
        assert fisher.examples == 7 and why in fisher.why and (why != "") == fisher.why.startswith("one at a time")
        for (name, _), s, w in zip(named, fisher.sums.sums, want):
            torch.testing.assert_close(s, w, rtol=1e-12, atol=1e-15, msg=(how, name))
        assert all(p is q for (_, p), q in zip(named, model.parameters()))  # the weights put back in their slots


@pytest.mark.parametrize("batch", [16, 0])
def test_task_fisher_of_an_fp16_model_unscales_and_halves_on_overflow(tiny, monkeypatch, batch):
    """--fp16's model is half: per-example gradients are taken of loss × a scale (removed from g² again),
    halved when one overflows, then kept. Started at 2^40 (the first examples overflow fp16 until it is halved
    about 25 times), F of 16 examples equals the fp32 model's up to fp16 rounding (per tensor, 2% in L2; a scale
    removed once too often after a halving is a factor of 4): 16 at a time (one vmap) and one at a time."""
    import recadam_fairseq.criterions.fisher_source as source
    from recadam_fairseq.tools import fisher as tool

    cfg, task, model, criterion = tool.setup([tiny.cls_bin, *TRAIN_ARGS, "--restore-file", tiny.pretrained])
    want, n = source.task_fisher(criterion, model, tool.batches_cfg(cfg), 16)
    monkeypatch.setattr(source, "FP16_SCALE", 2.0 ** 40)
    calls = []
    for name in ("add", "add_rows"):
        def recorded(self, grads, scale=1.0, _add=getattr(ewc.FisherSum, name), **kw):
            calls.append((scale, _add(self, grads, scale, **kw)))
            return calls[-1][1]
        monkeypatch.setattr(ewc.FisherSum, name, recorded)
    got, n16 = source.task_fisher(criterion, model.half(), tool.batches_cfg(cfg), 16, batch=batch)
    assert n == n16 == 16
    failed = [c for c in calls if not c[1]]
    assert 20 <= len(failed) <= 30 and failed == [(2.0 ** (40 - i), c[1]) for i, c in enumerate(failed)], calls
    kept = 2.0 ** (40 - len(failed))  # halved once per overflow, then every example at that scale
    assert calls[len(failed):] == [(kept, 16 if batch else True)] * (1 if batch else 16), calls
    for name, w in want.items():
        assert got[name].dtype == torch.float32 and bool(torch.isfinite(got[name]).all()), name
        assert float((got[name] - w).norm()) <= 0.02 * float(w.norm()) + 1e-12, name


# --------------------------------------------------------------------------- end to end, one batch of launches
RECADAM = ["--recadam-anneal-k", "0.5", "--recadam-anneal-t0", "6", "--recadam-pretrain-cof", "500"]
COUPLED = ["--criterion", "sentence_prediction_recadam", "--recadam-objective", "coupled", *RECADAM]  # fairseq's adam
COUPLED_MODES = {"coupled": ["--update-freq", "2"], "coupled16": ["--fp16", "--update-freq", "2"],
                 "coupled16pp": ["--fp16", "--fp16-no-flatten-grads"],
                 "coupled_ewc_amp": ["--amp"]}  # "ewc": with the task's F from scripts/fisher.py


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    from recadam_fairseq.tools import fisher as tool

    root = tmp_path_factory.mktemp("ewc")
    task_file = str(root / "fisher.pt")
    # no architecture flags: scripts/fisher.py reads them from the checkpoint, as the task scripts do
    assert tool.main(["--out", task_file, "--examples", "32", "--", tiny.cls_bin, *NO_ARCH,
                      "--restore-file", tiny.pretrained]) == 0
    raw = torch.load(task_file)
    ones = str(root / "ones.pt")
    ewc.save(ones, {k: torch.ones_like(v) for k, v in raw["fisher"].items()}, 1, "ones")
    bad = str(root / "bad.pt")
    name = "encoder.sentence_encoder.layers.0.fc1.weight"
    ewc.save(bad, {**raw["fisher"], name: torch.ones(3)}, 1, "bad")
    plan = {
        "plain": (RECADAM, {"updates": 4}),
        "ones": (RECADAM + ["--ewc-fisher", ones], {"updates": 4}),
        "task": (RECADAM + ["--ewc-fisher", "task", "--ewc-fisher-examples", "32", "--ewc-fisher-batch-size", "8",
                            "--save-interval-updates", "3"], {"updates": 6}),
        "bad": (RECADAM + ["--ewc-fisher", bad], {"check": False}),
        # --fp16's flat layout: F laid out on the anchored runs of the one fp32 master tensor
        "plain16": (RECADAM + ["--fp16"], {"updates": 3}),
        "ones16": (RECADAM + ["--fp16", "--ewc-fisher", ones], {"updates": 3}),
    }
    for key, extra in COUPLED_MODES.items():  # the coupled term, and its autograd form (tests/train_entry.py)
        for ref in ("", "_ref"):
            plan[key + ref] = (COUPLED + extra + (["--ewc-fisher", task_file] if "ewc" in key else []),
                               {"updates": 3, "optimizer": "adam", "env": {"RECADAM_COUPLED_REFERENCE": "1"} if ref
                                else None})

    def job(key):
        extra, kw = plan[key]
        return lambda: {key: tiny.train(root / key, *extra, **kw)}

    def two_ranks():  # each rank's 16 examples: the 1-rank task run's first 32 (fairseq shards the shuffled batches)
        return {"two": tiny.ranks(root / "two", 2, *DIST_FLAGS, "--ewc-fisher", "task", "--ewc-fisher-examples", "16",
                              "--batch-size", "16", updates=1)}

    def coupled_ranks(ref):  # the coupled term on 2 ranks, --update-freq 2
        key = "coupled_ranks" + ref
        return lambda: {key: tiny.ranks(root / key, 2, *DIST_FLAGS, *COUPLED, "--update-freq", "2", updates=2,
                                        optimizer="adam", env={"RECADAM_COUPLED_REFERENCE": "1"} if ref else None)}

    os.makedirs(root / "bad")  # a save dir that already holds a checkpoint: it stays as it was
    shutil.copy(tiny.pretrained, root / "bad" / "checkpoint_last.pt")
    with open(tiny.pretrained, "rb") as f:
        kept = {"checkpoint_last.pt": f.read()}
    out = run_jobs([job(k) for k in plan] + [two_ranks, coupled_ranks(""), coupled_ranks("_ref")])
    # resume the task run from its update-3 checkpoint to 6: F comes from the optimizer state
    resumed = root / "resumed"
    os.makedirs(resumed)
    shutil.copy(root / "task" / "checkpoint_1_3.pt", resumed / "checkpoint_last.pt")
    out["resumed"] = tiny.train(resumed, *plan["task"][0], "--restore-file", str(resumed / "checkpoint_last.pt"),
                                restore=False, updates=6)
    out["root"], out["task_file"], out["ones_file"], out["bad_name"], out["kept"] = root, task_file, ones, name, kept
    return out


@pytest.mark.parametrize("suffix", ["", "16"])
def test_file_of_ones_trains_as_recadam_bit_for_bit(runs, suffix):
    """fp32, and --fp16 (flat): F ≡ 1 from a file trains as RecAdam, weights and moments equal."""
    a = load_ckpt(runs["root"] / f"plain{suffix}" / "checkpoint_last.pt")
    b = load_ckpt(runs["root"] / f"ones{suffix}" / "checkpoint_last.pt")
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
    sa, sb = a["last_optimizer_state"]["state"], b["last_optimizer_state"]["state"]
    for i in sa:
        for n in ("exp_avg", "exp_avg_sq", "anchor"):
            assert (n in sa[i]) == (n in sb[i]) and (n not in sa[i] or torch.equal(sa[i][n], sb[i][n])), (i, n)
    assert "ewc: F from --ewc-fisher" in runs[f"ones{suffix}"][1] and "max/mean 1," in runs[f"ones{suffix}"][1]
    if suffix:  # one flat master tensor: F is one tensor over its anchored runs
        (f,) = [st["fisher"] for st in sb.values() if "fisher" in st]
        assert f.dim() == 1 and bool((f == 1).all()) and len(sb) == 1


def test_task_fisher_run_resumes_bit_for_bit_and_keeps_f(runs):
    straight = load_ckpt(runs["root"] / "task" / "checkpoint_last.pt")
    resumed = load_ckpt(runs["root"] / "resumed" / "checkpoint_last.pt")
    log = runs["resumed"][1]
    assert "F restored from the checkpoint's optimizer state" in log and "empirical Fisher of" not in log
    assert "empirical Fisher of 32 training examples at θ*" in runs["task"][1]
    for k, v in straight["model"].items():
        assert torch.equal(v, resumed["model"][k]), k
    sa, sb = straight["last_optimizer_state"]["state"], resumed["last_optimizer_state"]["state"]
    fs = [st["fisher"] for st in sa.values() if "fisher" in st]
    assert len(fs) == 41  # every anchored tensor (the head has no θ*)
    flat = torch.cat([f.reshape(-1) for f in fs]).double()
    assert flat.mean().item() == pytest.approx(1.0, rel=1e-6) and flat.max() > 10  # normalised, heavy-tailed
    for i in sa:
        for n, v in sa[i].items():
            assert torch.equal(v, sb[i][n]) if torch.is_tensor(v) else v == sb[i][n]
    plain = load_ckpt(runs["root"] / "plain" / "checkpoint_last.pt")["model"]
    assert any(not torch.equal(v, straight["model"][k]) for k, v in plain.items())  # F changed the run


def test_fisher_file_is_the_task_runs_f(runs):
    """scripts/fisher.py at the run's --seed (a new classifier head drawn as fairseq-train draws it) writes the F that
    --ewc-fisher task computes in that run, normalised: equal up to float32 rounding (the file is written in this
    test's process, whose torch thread count, and so the order of the sums, may differ from the run's)."""
    run = load_ckpt(runs["root"] / "task" / "checkpoint_last.pt")
    names = [n for n, p in run["model"].items() if n in torch.load(runs["task_file"])["fisher"]]
    raw = torch.load(runs["task_file"])
    assert raw["examples"] == 32
    got = [st["fisher"] for st in run["last_optimizer_state"]["state"].values() if "fisher" in st]
    anchored = [n for n in names if "classification_heads" not in n]
    want, _ = ewc.normalise(raw["fisher"], anchored, "--ewc-fisher")
    assert len(got) == len(anchored)
    for g, n in zip(got, anchored):
        torch.testing.assert_close(g, want[n].reshape(g.shape), rtol=1e-5, atol=1e-7, msg=n)


def test_fisher_pass_says_how_far_it_is_on_the_terminal(runs):
    """The task run's Fisher pass (32 examples, 8 per-example gradients at a time) logs a line each tenth of its
    examples (each chunk here), then its time and F; the task scripts' terminal (launch/progress.py) shows those
    lines, not only train.log."""
    from recadam_fairseq.launch.progress import progress_line

    lines = [ln for ln in runs["task"][1].splitlines() if " | recadam_fairseq.criterions.fisher_source | ewc: " in ln]
    shown = [progress_line(ln) for ln in lines]
    passes = [s for s in shown if s and s.startswith("  ewc: the Fisher pass: ")]
    assert [p.split(", ")[0] for p in passes] == [f"  ewc: the Fisher pass: {k}/32 examples ({k * 100 // 32}%)"
                                                  for k in (8, 16, 24)], shown
    assert None not in shown and any(s.startswith("  ewc: the Fisher pass took ") for s in shown)
    from recadam_fairseq.bench.e2e_overhead import FISHER_LINE  # the GPU pass's reading of the same line

    assert int(FISHER_LINE.search(runs["task"][1]).group(2)) == 32


def test_fisher_py_progress_counts_out_of_the_examples_it_will_see(tiny, tmp_path, capsys):
    """--examples 1024 on a split of 64 (cls-bin's valid): the pass sees 64, and its progress lines count out of
    64 (not 1024), a line each tenth of them (one at a time) or each chunk past a tenth (8 at a time)."""
    from recadam_fairseq.tools import fisher as tool

    out = str(tmp_path / "f.pt")
    for batch, ticks in (("0", (7, 13, 20, 26, 32, 39, 45, 52, 58)), ("8", (8, 16, 24, 32, 40, 48, 56))):
        assert tool.main(["--out", out, "--examples", "1024", "--fisher-batch-size", batch, "--", tiny.cls_bin,
                          *NO_ARCH, "--train-subset", "valid", "--restore-file", tiny.pretrained]) == 0
        got = capsys.readouterr()
        lines = [ln for ln in got.err.splitlines() if ln.startswith("fisher.py: ewc: the Fisher pass: ")]
        counts = [ln.split(": ")[-1].split(" examples")[0] for ln in lines]
        assert counts == [f"{k}/64" for k in ticks], got.err
        assert lines[-1].startswith(f"fisher.py: ewc: the Fisher pass: {ticks[-1]}/64 examples ") \
            and "from 64 examples" in got.out


def test_a_pass_out_of_memory_names_the_flag_that_bounds_it(tiny, tmp_path, capsys, monkeypatch):
    """Per-example gradients that do not fit (torch's OutOfMemoryError in the vmap): fisher.py says so in one line
    naming --fisher-batch-size and its value, and writes nothing."""
    from recadam_fairseq.tools import fisher as tool

    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.50 GiB")

    monkeypatch.setattr(torch.func, "vmap", full)  # the chunk's per-example gradients (grads() imports it per call)
    out = tmp_path / "f.pt"
    assert tool.main(["--out", str(out), "--examples", "32", "--", tiny.cls_bin, *NO_ARCH, "--restore-file",
                      tiny.pretrained]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "fisher.py: error: --fisher-batch-size 16: out of memory taking 16 per-example gradients at once (each the "
        "model's size, and the chunk's activations); lower it (0: one at a time)")
    assert not out.exists()


def test_fisher_py_bad_input_is_one_line(tiny, tmp_path, capsys):
    """An --arch that does not build the checkpoint's tensors, and a --restore-file that carries code: one line
    each, before any model is built; the code never runs."""
    from helpers import code_carrying
    from recadam_fairseq.tools import fisher as tool

    refusal = code_carrying(tmp_path / "code.pt", tmp_path / "payload-ran")
    cases = (([*NO_ARCH, "--arch", "roberta_base", "--restore-file", tiny.pretrained],
              f"--arch roberta_base builds 12 layers of width 768, but --restore-file {tiny.pretrained} holds 2 "
              f"layers of width 64: leave --arch out to take the checkpoint's (roberta --encoder-layers 2 "
              f"--encoder-embed-dim 64 --encoder-ffn-embed-dim 128 --encoder-attention-heads 2)"),
             ([*NO_ARCH, "--restore-file", str(tmp_path / "code.pt")], f"--restore-file {tmp_path / 'code.pt'}: {refusal}"))
    for args, message in cases:
        assert tool.main(["--out", str(tmp_path / "f.pt"), "--", tiny.cls_bin, *args]) == 1
        assert capsys.readouterr().err == f"fisher.py: error: {message}\n"
    assert not (tmp_path / "f.pt").exists() and not (tmp_path / "payload-ran").exists()


def test_two_ranks_sum_their_examples_fisher(runs):
    """2 CPU ranks, 16 examples each: F on both ranks is the 1-rank run's F of the same 32 examples (the ranks'
    sums added), up to the order of the fp32 sums."""
    assert "empirical Fisher of 32 training examples at θ*" in runs["two"][0]  # rank 0 logs
    r0, r1 = (d["optimizer"]["state"] for d in dumps(runs["root"] / "two", 2))
    one = load_ckpt(runs["root"] / "task" / "checkpoint_last.pt")["last_optimizer_state"]["state"]
    assert [k for k in r0 if "fisher" in r0[k]] == [k for k in one if "fisher" in one[k]] != []
    for k in one:
        if "fisher" in one[k]:
            assert torch.equal(r0[k]["fisher"], r1[k]["fisher"])
            torch.testing.assert_close(r0[k]["fisher"], one[k]["fisher"], rtol=1e-5, atol=1e-6)


def test_coupled_objective_with_f_of_ones_is_the_coupled_objective_bit_for_bit(tiny, runs):
    """In-process: the GLUE criterion's coupled term (θ moved off θ*, --recadam-pretrained-path) with no F,
    F ≡ 1 and the task's F: loss and gradients equal for F ≡ 1; the task's F changes them."""
    from recadam_fairseq.tools import fisher as tool

    def loss_and_grads(*extra):
        args = [tiny.cls_bin, *TRAIN_ARGS, "--restore-file", tiny.pretrained, "--criterion",
                "sentence_prediction_recadam", "--recadam-objective", "coupled", "--recadam-anneal-t0", "1000",
                "--recadam-pretrained-path", tiny.pretrained,
                *extra]
        cfg, task, model, criterion = tool.setup(args)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        sample = task.dataset("train").collater([task.dataset("train")[i] for i in range(4)])
        with torch.enable_grad():
            model.train()  # a training call (the term is added in training only); dropout seeded alike
            torch.manual_seed(1)
            loss, _, log = criterion(model, sample)
            grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
        return loss, grads, log

    base, ones, task = loss_and_grads(), loss_and_grads("--ewc-fisher", runs["ones_file"]), \
        loss_and_grads("--ewc-fisher", runs["task_file"])
    assert torch.equal(base[0], ones[0]) and base[2]["recadam_penalty"] > 0
    assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(base[1], ones[1]))
    assert not torch.equal(base[0], task[0])


@pytest.mark.parametrize("key", [*(k for k in COUPLED_MODES if "ewc" not in k), "coupled_ranks"])
def test_coupled_term_trains_as_its_autograd_form_bit_for_bit(tiny, runs, key):
    """fairseq's adam with the coupled objective (F ≡ 1), the one-node distance against the autograd graph it
    replaced (RECADAM_COUPLED_REFERENCE): the same weights bit for bit under fp32 with --update-freq 2, --fp16 (flat;
    with --update-freq 2), per parameter and 2 ranks (gloo, --update-freq 2): the gradient enters as 2·(θ−θ*)·ḡ
    either way."""
    logs = {r: "".join(runs[key + r]) if key == "coupled_ranks" else runs[key + r][1] for r in ("", "_ref")}
    assert "coupled-reference-calls" not in logs[""]  # the reference really ran in the other run, and only there
    assert int(re.search(r"coupled-reference-calls (\d+)", logs["_ref"]).group(1)) >= 3  # one a micro-batch
    if key == "coupled_ranks":
        got, ref = (dumps(runs["root"] / f"{key}{r}", 2)[0]["model"] for r in ("", "_ref"))
    else:
        got, ref = (load_ckpt(runs["root"] / f"{key}{r}" / "checkpoint_last.pt")["model"] for r in ("", "_ref"))
    pre = load_ckpt(tiny.pretrained)["model"]  # θ*: the runs moved off it
    assert got.keys() == ref.keys() and all(torch.equal(v, ref[k]) for k, v in got.items())
    assert any(not torch.equal(v, pre[k]) for k, v in got.items() if k in pre)


def test_ewc_coupled_term_trains_as_its_autograd_form(tiny, runs):
    """With EWC's F the two forms round F·(θ−θ*)·2ḡ in another order: under --amp (on the CPU: fp32 with its loss
    scaler, ḡ scaled) the weights after 3 updates agree to 1e-6 of their values (an update moves them by ~1e-3)."""
    assert "coupled-reference-calls" in runs["coupled_ewc_amp_ref"][1]
    got, ref = (load_ckpt(runs["root"] / f"coupled_ewc_amp{r}" / "checkpoint_last.pt")["model"] for r in ("", "_ref"))
    pre = load_ckpt(tiny.pretrained)["model"]
    for k, v in got.items():
        torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-7, msg=k)
    assert any(not torch.equal(v, pre[k]) for k, v in got.items() if k in pre)
    assert "ewc: F from --ewc-fisher" in runs["coupled_ewc_amp"][1]


def test_fisher_file_of_another_shape_is_one_line(runs):
    assert_one_line_error(runs["bad"], runs["root"] / "bad",
                          f"--ewc-fisher {runs['root'] / 'bad.pt'}: F of {runs['bad_name']} has shape (3,), the "
                          f"model's parameter (128, 64)", kept=runs["kept"])


def test_flags_and_files_refused_before_training(tmp_path):
    """The one-line ConfigErrors that need no launch: the flag's combinations, unreadable files, a resume whose
    checkpoint's F disagrees with the flag."""
    from types import SimpleNamespace

    from recadam_fairseq.optim.fairseq_recadam import Anchoring, add_fisher

    cfg = SimpleNamespace(ewc_fisher="task", recadam_anneal_w=1.0, zero_sharding="none", ewc_fisher_examples=8,
                          ewc_fisher_batch_size=8)
    cases = [({"recadam_anneal_w": 0.0}, "--ewc-fisher task with --recadam-anneal-w 0: plain Adam has no pull"),
             ({"ewc_fisher_examples": -1}, "--ewc-fisher-examples -1: must be >= 0"),
             ({"ewc_fisher_batch_size": -1}, "--ewc-fisher-batch-size -1: must be >= 0"),
             ({"ewc_fisher": str(tmp_path / "none.pt")}, f"--ewc-fisher {tmp_path / 'none.pt'}: no such file")]
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    torch.save({"model": {}}, tmp_path / "ckpt.pt")
    from helpers import code_carrying

    refusal = code_carrying(tmp_path / "code.pt", tmp_path / "payload-ran")
    cases += [({"ewc_fisher": str(junk)}, f"--ewc-fisher {junk}: not a torch checkpoint"),
              ({"ewc_fisher": str(tmp_path / "ckpt.pt")}, f"--ewc-fisher {tmp_path / 'ckpt.pt'}: not a Fisher file"),
              ({"ewc_fisher": str(tmp_path / "code.pt")}, f"--ewc-fisher {tmp_path / 'code.pt'}: {refusal}")]
    for change, msg in cases:
        with pytest.raises(ConfigError) as e:
            add_fisher(SimpleNamespace(**{**vars(cfg), **change}))
        assert str(e.value).startswith(msg) and "\n" not in str(e.value), str(e.value)
    assert add_fisher(SimpleNamespace(**{**vars(cfg), "ewc_fisher": ""})) is None  # off
    assert not (tmp_path / "payload-ran").exists()

    p = torch.zeros(3)
    opt = RecAdam([p], **HP, fused=False, defer_anchors=True)
    opt.set_anchor(p, torch.ones(3))
    owner = SimpleNamespace(_optimizer=opt)
    with pytest.raises(ConfigError, match="the checkpoint's optimizer state has no F"):
        Anchoring(owner, SimpleNamespace(ewc_fisher="task", recadam_pretrained_path=None), fisher=object())\
            ._check_restored_fisher([p])
    opt.set_fisher(p, torch.ones(3))
    with pytest.raises(ConfigError, match="holds EWC's F"):
        Anchoring(owner, SimpleNamespace(ewc_fisher="", recadam_pretrained_path=None))._check_restored_fisher([p])


def test_task_fisher_must_be_taken_at_theta_star():
    """--ewc-fisher task over weights other than θ* (--recadam-pretrained-path over a random init) is refused;
    a bf16 θ* of the same weights is θ* to its rounding."""
    from recadam_fairseq.criterions.fisher_source import check_at_theta_star, pieces

    t = torch.randn(10)
    check_at_theta_star(pieces([(t, t.clone(), None), (t, None, None)]), "w")
    check_at_theta_star(pieces([(t, torch.cat([t[2:5], t[6:10]]).to(torch.bfloat16), [(2, 3), (6, 4)])]), "w")
    moved = t.clone()
    moved[7] += 1e-3
    with pytest.raises(ConfigError, match="^w: the Fisher passes saw weights other than θ"):
        check_at_theta_star(pieces([(moved, torch.cat([t[2:5], t[6:10]]), [(2, 3), (6, 4)])]), "w")
    check_at_theta_star(pieces([(moved, torch.cat([t[2:5], t[6:7]]), [(2, 3), (6, 1)])]), "w")  # 7: no θ*


def test_masked_lm_fisher_on_held_out_text(tiny, tmp_path, capsys):
    """scripts/fisher.py with fairseq's masked_lm on the valid split: the per-example losses are the criterion's
    loss split by example (each equal to that example alone, in float64), and the file fits the classifier."""
    from recadam_fairseq.criterions.fisher_source import masked_lm_per_example
    from recadam_fairseq.tools import fisher as tool

    mlm = [tiny.lm_bin, "--task", "masked_lm", "--criterion", "masked_lm", *tiny_roberta.TINY_ARCH,
           "--tokens-per-sample", "64", "--batch-size", "8", "--seed", "7", "--cpu", "--num-workers", "0",
           "--train-subset", "valid", "--restore-file", tiny.pretrained]
    cfg, task, model, criterion = tool.setup(mlm)
    model = model.double().eval()
    data = task.dataset("valid")
    sample = data.collater([data[i] for i in range(4)])
    per = masked_lm_per_example(criterion)(model, sample)
    loss, _, _ = criterion(model, sample)
    assert per.shape == (4,) and float(per.sum()) == pytest.approx(float(loss), rel=1e-9)
    for i in range(4):
        alone = masked_lm_per_example(criterion)(model, data.collater([data[i]]))
        assert float(alone[0]) == pytest.approx(float(per[i]), rel=1e-9)
    out = str(tmp_path / "mlm.pt")
    capsys.readouterr()
    assert tool.main(["--out", out, "--examples", "8", "--", *mlm]) == 0
    assert "one at a time" not in capsys.readouterr().err  # the vmapped pass (the logits of every position)
    fisher, line = ewc.load(out)
    assert "8 examples" in line and "valid" in line
    classifier = torch.load(tiny.pretrained, weights_only=False)["model"]  # the names fine-tuning anchors
    shapes = {n: tuple(v.shape) for n, v in classifier.items()}
    ewc.check(fisher, shapes, [n for n in shapes if n in fisher], f"--ewc-fisher {out}")
    assert set(fisher) == {n for n, p in model.named_parameters() if p.requires_grad}  # lm_head.weight: tied
    assert sum(float(f.sum()) for f in fisher.values()) > 0


@pytest.mark.parametrize("mode", ["fp16-flat", "fp16-per-param", "memory-efficient-fp16"])
def test_fp16_wrappers_hold_f_beside_theta_star(mode, tmp_path, cpu_flat_fp16):
    """In-process, fairseq's FP16Optimizer (flat, per parameter) and MemoryEfficientFP16Optimizer: F ≡ 1 is the
    run without F bit for bit; another F changes it and sits in the state as θ* does, normalised to mean 1."""
    ones, rand = tmp_path / "ones.pt", tmp_path / "rand.pt"
    ewc.save(str(ones), {"encoder.weight": torch.ones(4, 3), "encoder.bias": torch.ones(4)}, 1, "ones")
    f = {"encoder.weight": torch.rand(4, 3, generator=torch.Generator().manual_seed(3)) * 3,
         "encoder.bias": torch.tensor([0.1, 5.0, 1.0, 2.0])}
    ewc.save(str(rand), f, 1, "rand")
    base, _ = run_wrapper(mode, tmp_path)
    same, _ = run_wrapper(mode, tmp_path, extra=("--ewc-fisher", str(ones)))
    assert torch.equal(flat_params(base), flat_params(same))
    other, opt = run_wrapper(mode, tmp_path, extra=("--ewc-fisher", str(rand), "--ewc-fisher-dtype", "bf16"))
    assert not torch.equal(flat_params(base), flat_params(other))
    rec = (getattr(opt, "fp32_optimizer", None) or opt.wrapped_optimizer)._optimizer  # the RecAdam inside
    held = [rec.fisher_of(p) for g in rec.param_groups for p in g["params"]]
    held = torch.cat([x.reshape(-1).float() for x in held if x is not None])
    raw = torch.cat([f["encoder.weight"].reshape(-1), f["encoder.bias"]]).double()
    assert torch.equal(held, (raw / raw.mean()).float().to(torch.bfloat16).float())
