"""Unit tests of the pure-torch core: the update against a float64 reference loop."""

import io
import math

import pytest
import torch

import recadam_fairseq.core.recadam_plan as plan
from helpers import F64, HP, make_problem, ref_lambda, run_pair
from recadam_fairseq import RecAdam, anneal_lambda

@pytest.mark.parametrize("foreach", [True, False])
def test_update_matches_float64_reference(foreach):
    got, want, opt = run_pair(foreach)
    for gp, wp in zip(got, want):
        for a, b in zip(gp, wp):
            torch.testing.assert_close(a.detach(), b, rtol=1e-13, atol=1e-13)
    # the reference moved the parameters: the comparison is not vacuous
    groups, _ = make_problem()
    assert not torch.allclose(got[0][0].detach(), groups[0]["params"][0])
    # per-tensor step counts lag where grads were None
    steps = {opt.state[p]["step"] for g in opt.param_groups for p in g["params"]}
    assert len(steps) > 1


def test_chunked_batches_match_reference(monkeypatch):
    monkeypatch.setattr(plan, "CHUNK", 5)  # split tensors into views and batches of ≤ 5 elements
    got, want, _ = run_pair(True)
    for gp, wp in zip(got, want):
        for a, b in zip(gp, wp):
            torch.testing.assert_close(a.detach(), b, rtol=1e-13, atol=1e-13)


def test_foreach_and_single_tensor_agree_in_float32():
    groups, gen = make_problem(dtype=torch.float32)
    outs = []
    for foreach in (True, False):
        params = [torch.nn.Parameter(p.clone()) for g in groups for p in g["params"]]
        opt = RecAdam([dict(params=params, pretrain_params=[a for g in groups for a in g["pretrain"]])],
                      **{k: v for k, v in HP.items()}, foreach=foreach)
        g2 = torch.Generator().manual_seed(3)
        for _ in range(5):
            for p in params:
                p.grad = torch.randn(p.shape, generator=g2)
            opt.step()
        outs.append(torch.cat([p.detach().view(-1) for p in params]))
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-6, atol=2e-7)


def test_flat_runs_equal_per_tensor_layout():
    """One flat tensor with anchor runs == the same tensors updated one by one (fairseq --fp16)."""
    gen = torch.Generator().manual_seed(1)
    shapes, anchored = [(4, 3), (7,), (2, 5), (3,)], [True, False, True, True]
    ps = [torch.randn(s, generator=gen, **F64) for s in shapes]
    anchors = [p + torch.randn(p.shape, generator=gen, **F64) for p in ps]
    per = [torch.nn.Parameter(p.clone()) for p in ps]
    opt1 = RecAdam(per, **HP, defer_anchors=True)
    for p, a, on in zip(per, anchors, anchored):
        opt1.set_anchor(p, a if on else None)
    flat = torch.nn.Parameter(torch.cat([p.view(-1) for p in ps]))
    runs, off = [], 0
    for p, on in zip(ps, anchored):
        if on:
            runs.append((off, p.numel()))
        off += p.numel()
    opt2 = RecAdam([flat], **HP, defer_anchors=True)
    opt2.set_anchor(flat, torch.cat([a.view(-1) for a, on in zip(anchors, anchored) if on]), runs)
    for _ in range(8):
        gs = [torch.randn(s, generator=gen, **F64) for s in shapes]
        for p, g in zip(per, gs):
            p.grad = g.clone()
        flat.grad = torch.cat([g.view(-1) for g in gs])
        opt1.step()
        opt2.step()
    torch.testing.assert_close(flat.detach(), torch.cat([p.detach().view(-1) for p in per]), rtol=1e-14, atol=1e-14)


def test_authors_style_groups_classifier_gets_plain_adam():
    """An anneal_w=0 group (the authors' classifier group) is plain Adam: torch's AdamW agrees."""
    gen = torch.Generator().manual_seed(2)
    p = torch.nn.Parameter(torch.randn(6, **F64, generator=gen))
    q = torch.nn.Parameter(p.detach().clone())
    opt = RecAdam([dict(params=[p], pretrain_params=[p.detach().clone() + 1], anneal_w=0.0)], lr=1e-2, eps=0.0)
    ref = torch.optim.AdamW([q], lr=1e-2, betas=(0.9, 0.999), eps=0.0, weight_decay=0.0)
    for _ in range(5):
        g = torch.randn(6, **F64, generator=gen)
        p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    # torch adds ε after bias correction, RecAdam before (as the authors): with ε = 0 they agree
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------- λ(t)
@pytest.mark.parametrize("k,t,t0", [(0.5, 3, 250), (1.0, 1, 1000), (1.0, 5000, 1000), (0.05, 250, 250),
                                     (1.0, 1, 1e12), (0.0, 1, 10), (1.0, 1, -1e6)])
def test_sigmoid_matches_reference_and_never_overflows(k, t, t0):
    got = anneal_lambda("sigmoid", t, k, t0, 0.7)
    assert math.isfinite(got) and 0.0 <= got <= 0.7
    assert got == pytest.approx(ref_lambda("sigmoid", t, k, t0, 0.7), rel=1e-12, abs=1e-300)


def test_lambda_values():
    assert anneal_lambda("sigmoid", 1, 1.0, 1000) == 0.0  # the authors' grid: e^999 underflows to exactly 0
    assert anneal_lambda("sigmoid", 10, 0.3, 10, 2.0) == 1.0
    assert anneal_lambda("linear", 5, 0.0, 20, 2.0) == 0.5
    assert anneal_lambda("linear", 50, 0.0, 20, 2.0) == 2.0
    assert anneal_lambda("constant", 7, 0.1, 3, 0.25) == 0.25
    with pytest.raises(ValueError, match="anneal_t0"):
        anneal_lambda("linear", 1, 0.1, 0)
    with pytest.raises(ValueError, match="unknown anneal_fun 'cosine'"):
        anneal_lambda("cosine", 1, 0.1, 10)


# --------------------------------------------------------------------------- validation
def _p():
    return [torch.nn.Parameter(torch.zeros(2, 3))]


@pytest.mark.parametrize("kwargs,match", [
    (dict(lr=-1e-3), r"invalid lr=-0.001"),
    (dict(eps=-1.0), r"invalid eps=-1.0"),
    (dict(anneal_k=-0.5), r"invalid anneal_k=-0.5"),
    (dict(pretrain_cof=-1.0), r"invalid pretrain_cof=-1.0"),
    (dict(betas=(1.0, 0.9)), r"invalid betas=\(1.0, 0.9\)"),
    (dict(betas=(0.9, -0.1)), r"invalid betas=\(0.9, -0.1\)"),
    (dict(weight_decay=-0.1), r"invalid weight_decay=-0.1"),
    (dict(anneal_fun="cosine"), r"invalid anneal_fun='cosine'"),
    (dict(anneal_fun="linear", anneal_t0=0), r"invalid anneal_t0=0.*linear"),
    (dict(anneal_fun="linear", anneal_t0=-5), r"invalid anneal_t0=-5.*linear"),
    (dict(anneal_w=-1.0), r"invalid anneal_w=-1.0"),
    (dict(anneal_t0=float("nan")), r"invalid anneal_t0=nan"),
    (dict(lr=float("nan")), r"invalid lr=nan"),
])
def test_bad_hyperparameters_raise(kwargs, match):
    params = _p()
    with pytest.raises(ValueError, match=match):
        RecAdam(params, pretrain_params=[params[0].detach().clone()], **kwargs)


def test_bad_hyperparameter_in_one_group_names_the_group():
    a, b = _p(), _p()
    with pytest.raises(ValueError, match=r"invalid lr=-1.*param group 1"):
        RecAdam([dict(params=a, anneal_w=0.0), dict(params=b, anneal_w=0.0, lr=-1)])


def test_pretrain_params_misaligned():
    params = _p() + _p()
    with pytest.raises(ValueError, match=r"pretrain_params has 1 tensors but params has 2"):
        RecAdam(params, pretrain_params=[torch.zeros(2, 3)])
    with pytest.raises(ValueError, match=r"pretrain_params\[1\] has shape \(3, 2\) but params\[1\] has shape \(2, 3\)"):
        RecAdam(params, pretrain_params=[torch.zeros(2, 3), torch.zeros(3, 2)])
    with pytest.raises(ValueError, match=r"pretrain_params is required .*anneal_w=1.0"):
        RecAdam(params)
    RecAdam(params, anneal_w=0.0)  # plain Adam needs no anchor


def test_anchor_aliasing_its_parameter_is_rejected():
    p = torch.nn.Parameter(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"shares memory with its parameter.*clone"):
        RecAdam([p], pretrain_params=[p.detach()])
    RecAdam([p], pretrain_params=[p.detach().clone()])


def test_sparse_grad_rejected():
    p = torch.nn.Parameter(torch.zeros(3, 2))
    opt = RecAdam([p], anneal_w=0.0)
    p.grad = torch.zeros(3, 2).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


# --------------------------------------------------------------------------- state dict
def _train(opt, params, gen, steps):
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


def test_state_dict_round_trip_is_exact_and_weights_only():
    torch.manual_seed(0)
    base = [torch.randn(4, 3), torch.randn(5)]
    kw = dict(lr=1e-2, anneal_k=0.5, anneal_t0=3, pretrain_cof=10.0)

    pa = [torch.nn.Parameter(b.clone()) for b in base]
    opt_a = RecAdam(pa, pretrain_params=[b.clone().bfloat16().float() for b in base], **kw)
    _train(opt_a, pa, torch.Generator().manual_seed(1), 6)

    pb = [torch.nn.Parameter(b.clone()) for b in base]
    anchors = [b.clone().bfloat16() for b in base]  # a half-precision anchor keeps its dtype
    opt_b = RecAdam(pb, pretrain_params=[a.float() for a in anchors], **kw)
    gen = torch.Generator().manual_seed(1)
    _train(opt_b, pb, gen, 3)
    buf = io.BytesIO()
    torch.save(opt_b.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)

    pc = [torch.nn.Parameter(p.detach().clone()) for p in pb]
    opt_c = RecAdam(pc, pretrain_params=[torch.zeros_like(b) for b in base], **kw)  # anchors come from the state
    opt_c.load_state_dict(saved)
    assert [opt_c.state[p]["step"] for p in pc] == [3, 3]
    _train(opt_c, pc, gen, 3)
    for a, c in zip(pa, pc):
        assert torch.equal(a, c)

    opt_h = RecAdam([torch.nn.Parameter(b.clone()) for b in base], pretrain_params=anchors, **kw)
    sd = opt_h.state_dict()
    ph = [torch.nn.Parameter(b.clone()) for b in base]
    opt_h2 = RecAdam(ph, pretrain_params=[b.clone() for b in base], **kw)
    opt_h2.load_state_dict(sd)
    assert opt_h2.state[ph[0]]["anchor"].dtype == torch.bfloat16


def test_load_state_dict_of_another_model_size_raises():
    p = [torch.nn.Parameter(torch.zeros(4))]
    opt = RecAdam(p, anneal_w=0.0)
    p[0].grad = torch.ones(4)
    opt.step()
    q = [torch.nn.Parameter(torch.zeros(6))]
    opt2 = RecAdam(q, anneal_w=0.0)
    with pytest.raises(ValueError, match=r"exp_avg of parameter 0 has shape \(4,\) but the parameter has shape \(6,\)"):
        opt2.load_state_dict(opt.state_dict())


def test_half_params_are_updated_in_fp32():
    """Memory-efficient fp16: fp16 params, fp32 moments; equals the fp32 math rounded each step."""
    torch.manual_seed(0)
    p16 = torch.nn.Parameter(torch.randn(50).half())
    p32 = torch.nn.Parameter(p16.detach().float())
    anchor = p16.detach().float() + 0.1
    o16 = RecAdam([p16], pretrain_params=[anchor.half()], lr=1e-2, anneal_k=0.5, anneal_t0=2, pretrain_cof=5.0)
    o32 = RecAdam([p32], pretrain_params=[anchor.half().float()], lr=1e-2, anneal_k=0.5, anneal_t0=2, pretrain_cof=5.0)
    for _ in range(4):
        g = torch.randn(50)
        p16.grad, p32.grad = g.half(), g.half().float()
        o16.step()
        o32.step()
        p32.data.copy_(p32.data.half().float())  # the master copy is the rounded fp16 value
    assert o16.state[p16]["exp_avg"].dtype == torch.float32
    torch.testing.assert_close(p16.detach().float(), p32.detach(), rtol=0, atol=0)
