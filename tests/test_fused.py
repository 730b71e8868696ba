"""The fused (torch.compile'd, one pass over memory) update against the eager reference paths.

The float64 runs must match the independent reference loop as closely as the eager path does
(1e-13): the compiled loop evaluates the same expressions in the same order. In float32 the two
differ only where the compiler contracts a·b + c into one FMA (one rounding instead of two),
about an ulp per step; we assert rtol 1e-6 (8 ulp) on the weights and moments after 6 steps.
"""

import copy
import warnings

import pytest
import torch

import recadam_fairseq.core.fused as fused_mod
from recadam_fairseq import RecAdam
from helpers import HP, run_pair

F64 = dict(dtype=torch.float64)


class Counted(list):
    """The sizes of the segments the compiled kernels updated; ``many``: the multi-tensor calls."""
    many = 0


@pytest.fixture
def counted(monkeypatch):
    """Count the segments that go through the compiled kernels (one at a time or many per call)."""
    calls = Counted()
    one, many = fused_mod.update_segments, fused_mod.update_many

    def update_segments(segments, s):
        calls.extend(seg[0].numel() for seg in segments)
        return one(segments, s)

    def update_many(segments, s, **kw):
        calls.many += 1
        calls.extend(seg[0].numel() for seg in segments)
        return many(segments, s, **kw)

    monkeypatch.setattr(fused_mod, "update_segments", update_segments)
    monkeypatch.setattr(fused_mod, "update_many", update_many)
    return calls


@pytest.mark.parametrize("multi", [False, True])
def test_fused_matches_float64_reference(monkeypatch, counted, multi):
    monkeypatch.setattr(fused_mod, "MIN_SEGMENT", 2)  # the test's small tensors take the kernel too
    monkeypatch.setattr(fused_mod, "MULTI_MIN_SEGMENTS", 2 if multi else 10 ** 9)
    got, want, _ = run_pair(True, fused=True)
    for gp, wp in zip(got, want):
        for a, b in zip(gp, wp):
            torch.testing.assert_close(a.detach(), b, rtol=1e-13, atol=1e-13)
    assert len(counted) > 100  # every group, every step: the kernel did the work
    assert (counted.many > 0) == multi


SHAPES = [(300, 257), (70_000,), (257, 300), (3, 40_000), (65_536,), (128, 512)]


def per_tensor_problem(dtype=torch.float32, anchor_dtype=None, seed=0):
    """A per-tensor layout (fp32 training, --fp16-no-flatten-grads, memory-efficient): one tensor per
    parameter; the first four anchored, the last two not (a new head)."""
    gen = torch.Generator().manual_seed(seed)
    ps = [torch.randn(s, generator=gen, **F64) for s in SHAPES]
    anchors = [p + 0.05 * torch.randn(p.shape, generator=gen, **F64) for p in ps[:4]]
    grads = [[torch.randn(p.shape, generator=gen, **F64) for p in ps] for _ in range(6)]
    return ([p.to(dtype) for p in ps], [a.to(anchor_dtype or dtype) for a in anchors],
            [[g.to(dtype) for g in gs] for gs in grads])


def train_per_tensor(fused, problem, p_dtype=None, fishers=None, **hp):
    """``fishers``: EWC's F of the anchored tensors (RecAdam.set_fisher), None: RecAdam's pull."""
    ps0, anchors, grads = problem
    ps = [torch.nn.Parameter(p.clone().to(p_dtype or p.dtype)) for p in ps0]
    opt = RecAdam([{"params": ps[:4], "pretrain_params": anchors}, {"params": ps[4:], "anneal_w": 0.0}],
                  **dict(HP, weight_decay=0.01, **hp), fused=fused)
    for p, f in zip(ps, fishers or []):
        opt.set_fisher(p, f)
    peak = [p.detach().abs().float() for p in ps]  # each weight's largest magnitude on its way
    for i, gs in enumerate(grads):
        if i == 3:
            opt.param_groups[0]["lr"] *= 0.5
        for p, g in zip(ps, gs):
            p.grad = g.to(p.dtype)
        opt.step()
        peak = [torch.maximum(m, p.detach().abs().float()) for m, p in zip(peak, ps)]
    return ([p.detach() for p in ps], [opt.state[p]["exp_avg"] for p in ps], [opt.state[p]["exp_avg_sq"] for p in ps],
            peak)


def assert_close_to_eager(fast, eager, p_dtype):
    """(weights, m, v) of the compiled path against the eager one: FMA contraction in fp32 (rtol 1e-6).

    fp16 weights: an fp32 result an ulp apart may round to the neighbouring fp16 value, and that
    one-ulp step stays in the weight while it shrinks: on the H200 an element that ended at 1.0e-3
    was 2^-18 (4 of its final ulps) apart. We allow two fp16 ulps at the weight's largest magnitude
    on the way (one ulp <= 2^-10 of it), with the eager run's trajectory as that magnitude."""
    for x, y, peak in zip(fast[0], eager[0], eager[3]):
        if p_dtype == torch.float32:
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)
        else:
            gap = (x.float() - y.float()).abs() - 2 ** -9 * peak
            assert gap.max() <= 2 ** -24, f"{(gap > 2 ** -24).sum().item()} fp16 weights beyond 2 ulps of their peak"
    for xs, ys in zip(fast[1:3], eager[1:3]):
        for x, y in zip(xs, ys):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("p_dtype", [torch.float32, torch.float16])
def test_many_tensors_in_one_compiled_call(monkeypatch, counted, p_dtype):
    """Separate tensors sharing scalars take one compiled call: the same numbers as one call each."""
    monkeypatch.setattr(fused_mod, "MULTI_MIN_SEGMENTS", 2)
    monkeypatch.setattr(fused_mod, "CUDA_GRAPH", True)  # CUDA only: on the CPU, the compiled call as ever
    monkeypatch.setattr(fused_mod, "_graphs", {})
    problem = per_tensor_problem()
    many = train_per_tensor(True, problem, p_dtype=p_dtype)
    assert counted.many == 12 and len(counted) == 36  # 2 groups x 6 steps; 6 tensors x 6 steps
    assert fused_mod._graphs == {}
    monkeypatch.setattr(fused_mod, "MULTI_MIN_SEGMENTS", 10 ** 9)
    one = train_per_tensor(True, problem, p_dtype=p_dtype)
    assert counted.many == 12 and len(counted) == 72
    for xs, ys in zip(many, one):
        for x, y in zip(xs, ys):
            assert torch.equal(x, y)  # the same loop per tensor, in one program
    eager = train_per_tensor(False, problem, p_dtype=p_dtype)
    assert_close_to_eager(many, eager, p_dtype)
    assert not torch.equal(eager[0][0], problem[0][0].to(p_dtype))  # the weights moved


def test_changing_tensor_sets_stop_compiling_after_the_limit(monkeypatch, counted):
    """Parameters that get no gradient on some steps change the set: a new program each, up to a bound."""
    monkeypatch.setattr(fused_mod, "MULTI_MIN_SEGMENTS", 2)
    monkeypatch.setattr(fused_mod, "MULTI_MAX_PROGRAMS", 1)
    ps = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES[:4]]
    opt = RecAdam(ps, **dict(HP, anneal_w=0.0), fused=True)
    for skip in (None, 0, 1, None):  # all four, then two other sets of three, then all four again
        for i, p in enumerate(ps):
            p.grad = None if i == skip else torch.ones_like(p)
        opt.step()
    # step 4: the tensors' step counts now differ (3, 3, 4, 4), which splits them into two more sets
    assert len(opt._many_keys) == 1 and counted.many == 1
    assert len(counted) == 4 + 3 + 3 + 4  # the other sets still updated, one call a tensor
    assert [opt.state[p]["step"] for p in ps] == [3, 3, 4, 4]


def test_many_tensors_do_not_recompile_across_steps(monkeypatch):
    from torch._dynamo.utils import counters

    monkeypatch.setattr(fused_mod, "MULTI_MIN_SEGMENTS", 2)
    problem = per_tensor_problem(seed=1)
    train_per_tensor(True, problem)
    before = dict(counters["stats"])
    train_per_tensor(True, problem, anneal_k=1.0, anneal_t0=2.0, pretrain_cof=7.0)
    assert dict(counters["stats"]) == before


def flat_problem(n=300_000, runs=((1_000, 150_000), (160_000, 139_000)), dtype=torch.float32,
                 anchor_dtype=None, seed=0):
    """One flat tensor (fairseq --fp16's layout) with two anchored runs and three plain gaps."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=gen, **F64)
    anchor = torch.cat([p[s:s + k] for s, k in runs]) + 0.05 * torch.randn(sum(k for _, k in runs), generator=gen, **F64)
    grads = [torch.randn(n, generator=gen, **F64) for _ in range(6)]
    return (p.to(dtype), anchor.to(anchor_dtype or dtype), list(runs), [g.to(dtype) for g in grads])


def train_flat(fused, problem, p_dtype=None, fisher=None, **hp):
    p0, anchor, runs, grads = problem
    p = torch.nn.Parameter(p0.clone().to(p_dtype or p0.dtype))
    opt = RecAdam([p], **dict(HP, weight_decay=0.01, **hp), fused=fused, defer_anchors=True)
    opt.set_anchor(p, anchor, runs)
    if fisher is not None:  # EWC's F over the anchored runs, back to back
        opt.set_fisher(p, fisher)
    for i, g in enumerate(grads):
        if i == 3:
            opt.param_groups[0]["lr"] *= 0.5  # a scheduler's change reaches the kernel's scalars
        p.grad = g.to(p.dtype)
        opt.step()
    st = opt.state[p]
    return p.detach(), st["exp_avg"], st["exp_avg_sq"], opt


@pytest.mark.parametrize("anchor_dtype", [torch.float32, torch.bfloat16])
def test_fused_and_eager_agree_in_float32(counted, anchor_dtype):
    problem = flat_problem(anchor_dtype=anchor_dtype)
    eager = train_flat(False, problem)
    assert not counted
    fast = train_flat(True, problem)
    # the two anchored runs take the kernel every step; the small gaps (< MIN_SEGMENT) stay eager
    assert sorted(set(counted)) == [139_000, 150_000] and len(counted) == 12
    for a, b in zip(fast[:3], eager[:3]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert not torch.equal(eager[0], problem[0])  # the weights moved


def test_fused_half_params_round_like_eager(counted):
    """Memory-efficient fp16: fp16 params and grads, fp32 moments, the math in fp32."""
    problem = flat_problem(n=200_000, runs=((0, 150_000),))
    eager = train_flat(False, problem, p_dtype=torch.float16)
    fast = train_flat(True, problem, p_dtype=torch.float16)
    assert counted and fast[0].dtype == torch.float16 and fast[1].dtype == torch.float32
    torch.testing.assert_close(fast[1], eager[1], rtol=1e-6, atol=1e-7)
    # an fp32 result an ulp apart may round to neighbouring fp16 values: one fp16 ulp at most
    torch.testing.assert_close(fast[0].float(), eager[0].float(), rtol=2 ** -10, atol=2 ** -24)


def test_no_recompile_across_steps():
    """Step-dependent scalars travel as a tensor: steps 2..n reuse the compiled kernels, and so does another
    optimizer at other settings (a search's trials: every lr, k, t0, γ, weight decay and λ(t)'s schedule)."""
    from torch._dynamo.utils import counters

    problem = flat_problem(n=150_000, runs=((0, 100_000),))
    train_flat(True, problem)  # compiles what this layout needs
    before = dict(counters["stats"])
    train_flat(True, problem, anneal_k=1.0, anneal_t0=2.0, pretrain_cof=7.0)
    train_flat(True, problem, lr=3.7e-4, anneal_k=0.02, anneal_t0=9.0, pretrain_cof=123.0, anneal_fun="linear")
    assert dict(counters["stats"]) == before


def test_auto_uses_the_kernel_only_for_large_models(monkeypatch, counted):
    problem = flat_problem(n=150_000, runs=((0, 100_000),))
    train_flat(None, problem)
    assert not counted  # 150k elements < AUTO_MIN_NUMEL: eager
    monkeypatch.setattr(fused_mod, "AUTO_MIN_NUMEL", 100_000)
    train_flat(None, problem)
    assert counted


def test_failed_compile_falls_back_in_auto_and_raises_when_asked(monkeypatch):
    problem = flat_problem(n=150_000, runs=((0, 100_000),), dtype=torch.float64)
    eager = train_flat(False, problem)

    def broken(key):
        def kernel(*args):
            raise RuntimeError("no C++ compiler here")
        return kernel

    monkeypatch.setattr(fused_mod, "_kernel", broken)
    monkeypatch.setattr(fused_mod, "AUTO_MIN_NUMEL", 1)
    monkeypatch.setattr(fused_mod, "update_many", lambda segments, s, **kw: broken(None)())
    with pytest.warns(UserWarning, match="failed to compile .*no C\\+\\+ compiler.*eager update"):
        auto = train_flat(None, problem)
    for a, b in zip(auto[:3], eager[:3]):
        assert torch.equal(a, b)  # nothing was half-updated before falling back
    with pytest.raises(RuntimeError, match="fused=True, but the fused update failed to compile .*no C\\+\\+ compiler"):
        train_flat(True, problem)
    # the multi-tensor call likewise
    problem = per_tensor_problem(dtype=torch.float64)
    eager = train_per_tensor(False, problem)
    with pytest.warns(UserWarning, match="failed to compile .*no C\\+\\+ compiler.*eager update"):
        auto = train_per_tensor(None, problem)
    for xs, ys in zip(auto, eager):
        for x, y in zip(xs, ys):
            assert torch.equal(x, y)


def test_fused_needs_foreach():
    with pytest.raises(ValueError, match="fused=True and foreach=False"):
        RecAdam([torch.nn.Parameter(torch.zeros(3))], anneal_w=0.0, foreach=False, fused=True)


def test_fused_is_not_saved_in_the_state_dict():
    opt = RecAdam([torch.nn.Parameter(torch.zeros(3))], anneal_w=0.0, fused=True)
    assert all("fused" not in g for g in opt.state_dict()["param_groups"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RecAdam([torch.nn.Parameter(torch.zeros(3))], anneal_w=0.0, fused=False).load_state_dict(opt.state_dict())


@pytest.mark.parametrize("fused", [True, False])
def test_anchor_distance_matches_float64(monkeypatch, fused):
    """recadam_dist: one compiled pass (fp32 differences, float64 sum) or fp32 dots per chunk."""
    calls = []
    original = fused_mod.distance
    monkeypatch.setattr(fused_mod, "distance", lambda p, a: calls.append(p.numel()) or original(p, a))
    p0, anchor, runs, grads = problem = flat_problem()
    p, *_, opt = train_flat(fused, problem)
    parts, off = [], 0
    for s, k in runs:
        parts.append(((p[s:s + k].double() - anchor[off:off + k].double()) ** 2).sum())
        off += k
    exact = torch.stack(parts).sum()
    got = opt.anchor_distance()
    assert got.dtype == torch.float64 and exact > 0
    assert abs(got - exact) / exact < (1e-9 if fused else 1e-5)
    assert sorted(calls) == (sorted(k for _, k in runs) if fused else [])


@pytest.mark.parametrize("fused", [True, False])
def test_cached_layouts_follow_changes_between_steps(fused):
    """The step reuses each tensor's segments across steps: a new θ*, a new lr scale, a gradient of
    another dtype or a loaded state must take effect at once, as in an optimizer built at that point."""
    ps0, anchors, grads = per_tensor_problem(dtype=torch.float64)

    def build(ps):
        return RecAdam([{"params": ps[:4], "pretrain_params": anchors}, {"params": ps[4:], "anneal_w": 0.0}],
                       **HP, fused=fused)

    ps = [torch.nn.Parameter(p.clone()) for p in ps0]
    opt = build(ps)
    for gs in grads[:3]:
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()
    twin_ps = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    twin = build(twin_ps)
    twin.load_state_dict(copy.deepcopy(opt.state_dict()))  # its own moments, not views of opt's
    new_anchor = anchors[0] + 0.5
    for o, qs in ((opt, ps), (twin, twin_ps)):  # the changes, applied to the running optimizer and its twin
        o.set_anchor(qs[0], new_anchor.clone())
        o.set_lr_scale(qs[2], 0.25)
        o.set_lr_scale(qs[5], [(0, 30_000, 0.5), (30_000, 35_536, 2.0)])
    for gs in grads[3:]:
        for qs in (ps, twin_ps):
            for p, g in zip(qs, gs):
                p.grad = g.clone()
        opt.step()
        twin.step()
    for a, b in zip(ps, twin_ps):
        assert torch.equal(a, b)
    assert not torch.equal(opt.state[ps[0]]["anchor"], anchors[0])


@pytest.mark.parametrize("fused", [True, False])
def test_cached_plans_follow_direct_state_changes(fused):
    """The step reuses a group's plan across steps: a moment or a whole state replaced from outside, a step
    count set, a parameter moved to new storage, a gradient missing, each must take effect at once, as in
    an optimizer built at that point from the state (which has no plan yet)."""
    ps0, anchors, grads = per_tensor_problem(dtype=torch.float64)

    def build(ps):
        return RecAdam([{"params": ps[:4], "pretrain_params": anchors}, {"params": ps[4:], "anneal_w": 0.0}],
                       **HP, fused=fused)

    ps = [torch.nn.Parameter(p.clone()) for p in ps0]
    opt, st = build(ps), None
    changes = [
        lambda: st[ps[1]].__setitem__("exp_avg", st[ps[1]]["exp_avg"] * 0.5),
        lambda: st.__setitem__(ps[2], dict(st[ps[2]], exp_avg_sq=st[ps[2]]["exp_avg_sq"] * 2)),
        lambda: st[ps[0]].__setitem__("step", 10),
        lambda: setattr(ps[3], "data", ps[3].data.clone()),
        lambda: None,  # and no gradient for the last tensor
    ]
    for k, gs in enumerate(grads):
        twin = None
        if k >= 1:  # the plan made at step 1, then a change before each step
            st = opt.state
            changes[k - 1]()
            twin_ps = [torch.nn.Parameter(p.detach().clone()) for p in ps]
            twin = build(twin_ps)
            twin.load_state_dict(copy.deepcopy(opt.state_dict()))
        for qs in (ps, twin_ps) if twin else (ps,):
            for i, (p, g) in enumerate(zip(qs, gs)):
                p.grad = None if (k == 5 and i == 5) else g.clone()
        opt.step()
        if twin:
            twin.step()
            for a, b in zip(ps, twin_ps):
                assert torch.equal(a, b), f"change {k - 1}"
    assert opt.state[ps[0]]["step"] == 13 and opt.state[ps[5]]["step"] == 5


@pytest.mark.parametrize("anchor_dtype", [torch.float32, torch.bfloat16])
def test_anchor_distance_of_many_tensors_in_batches(monkeypatch, anchor_dtype):
    """A per-tensor layout: no compiled call per tensor (14 ms of host time on an H100 at RoBERTa-base's
    ~200 tensors), batches of _foreach_sub / _foreach_norm, split where a tensor crosses a batch."""
    import recadam_fairseq.core.recadam_kernels as kernels

    calls = []
    monkeypatch.setattr(fused_mod, "distance", lambda p, a: calls.append(p.numel()))
    monkeypatch.setattr(kernels, "DISTANCE_BATCH", 100_000)  # 4 tensors of 70,000 to 120,000 elements
    ps, anchors, _ = per_tensor_problem(anchor_dtype=anchor_dtype)
    ps = [torch.nn.Parameter(p) for p in ps]
    opt = RecAdam([{"params": ps[:4], "pretrain_params": anchors}, {"params": ps[4:], "anneal_w": 0.0}],
                  **HP, fused=True)
    exact = sum(((p.double() - a.double()) ** 2).sum() for p, a in zip(ps[:4], anchors))
    got = opt.anchor_distance()
    assert got.dtype == torch.float64 and calls == []
    assert abs(got - exact) / exact < 1e-6
    # a large tensor: the norms accumulate in float64 (fp32's sum was 2e-3 off at MiniLM's 22M elements)
    monkeypatch.setattr(kernels, "DISTANCE_BATCH", 1 << 23)
    big = torch.nn.Parameter(torch.randn(1 << 23, generator=torch.Generator().manual_seed(1)))
    anchor = big.detach() + 0.05
    opt = RecAdam([{"params": [big, *ps[:3]], "pretrain_params": [anchor, *anchors[:3]]}], **HP, fused=True)
    exact = ((big.double() - anchor.double()) ** 2).sum() + sum(((p.double() - a.double()) ** 2).sum()
                                                                 for p, a in zip(ps[:3], anchors[:3]))
    assert abs(opt.anchor_distance() - exact) / exact < 1e-7


def heavy_tailed(shape, seed, dtype=torch.float32):
    """A stand-in for EWC's F: >= 0, mean about 1, its largest entries far above it (capped at weight 1)."""
    return torch.empty(shape).exponential_(generator=torch.Generator().manual_seed(seed)).pow_(3).to(dtype)


@pytest.mark.parametrize("f_dtype", [torch.float32, torch.bfloat16])
def test_fisher_in_the_compiled_kernels_matches_eager(monkeypatch, counted, f_dtype):
    """EWC's F read in fp32 and the weight min(pull·F, 1) capped inside the compiled kernels: the per-tensor
    layout's multi-tensor program and the flat layout's one-segment kernel agree with the eager step within
    RecAdam's own tolerance (F changes them: some elements are capped); one more compiled variant each, reused
    across steps and hyperparameters without recompiling."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(fused_mod, "MULTI_MIN_SEGMENTS", 2)
    problem = per_tensor_problem()
    fishers = [heavy_tailed(a.shape, i, f_dtype) for i, a in enumerate(problem[1])]
    many = train_per_tensor(True, problem, fishers=fishers)
    assert counted.many == 12 and len(counted) == 36  # F's tensors in the one program, every step
    assert_close_to_eager(many, train_per_tensor(False, problem, fishers=fishers), torch.float32)
    assert not torch.equal(many[0][0], train_per_tensor(True, problem)[0][0])  # F was read
    flat = flat_problem()
    f = heavy_tailed(flat[1].shape, 9, f_dtype)
    fast = train_flat(True, flat, fisher=f)
    for a, b in zip(fast[:3], train_flat(False, flat, fisher=f)[:3]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    before = dict(counters["stats"])
    train_per_tensor(True, problem, fishers=fishers, anneal_k=1.0, pretrain_cof=7.0)
    train_flat(True, flat, fisher=f, anneal_k=1.0, pretrain_cof=7.0)
    assert dict(counters["stats"]) == before


@pytest.mark.gpu
@pytest.mark.parametrize("p_dtype", [torch.float32, torch.float16])
def test_fused_matches_eager_on_gpu(counted, p_dtype):
    """The Triton kernel inductor writes for CUDA, against the eager CUDA path."""
    p0, anchor, runs, grads = flat_problem()
    problem = (p0.cuda(), anchor.cuda(), runs, [g.cuda() for g in grads])
    eager = train_flat(False, problem, p_dtype=p_dtype)
    fast = train_flat(True, problem, p_dtype=p_dtype)
    assert counted
    torch.testing.assert_close(fast[1], eager[1], rtol=1e-6, atol=1e-7)
    tol = dict(rtol=1e-6, atol=1e-7) if p_dtype == torch.float32 else dict(rtol=2 ** -10, atol=2 ** -24)
    torch.testing.assert_close(fast[0].float(), eager[0].float(), **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("fisher", [False, True])
@pytest.mark.parametrize("p_dtype", [torch.float32, torch.float16])
def test_many_tensors_match_eager_on_gpu(counted, p_dtype, fisher):
    """The per-tensor layout's multi-tensor program on CUDA, against the eager CUDA path; with EWC's F (bf16, read
    in fp32, the weight capped in the Triton kernel) too."""
    ps0, anchors, grads = per_tensor_problem()
    problem = ([p.cuda() for p in ps0], [a.cuda() for a in anchors], [[g.cuda() for g in gs] for gs in grads])
    fs = [heavy_tailed(a.shape, i, torch.bfloat16).cuda() for i, a in enumerate(anchors)] if fisher else None
    fast = train_per_tensor(True, problem, p_dtype=p_dtype, fishers=fs)
    assert counted.many == 6  # the four anchored tensors, every step
    eager = train_per_tensor(False, problem, p_dtype=p_dtype, fishers=fs)
    assert_close_to_eager(fast, eager, p_dtype)


@pytest.mark.gpu
def test_cuda_graph_replays_the_many_tensor_program(monkeypatch, counted):
    """RecAdam(cuda_graph=True) (--recadam-fused cuda-graph): the per-tensor layout's program captured at step 1,
    then replayed while the gradients stay where they are; bit for bit the compiled calls' results (the same
    kernels on the same tensors)."""
    ps0, anchors, grads = per_tensor_problem()

    def train(graph):
        ps = [torch.nn.Parameter(p.cuda()) for p in ps0]
        opt = RecAdam([{"params": ps[:4], "pretrain_params": [a.cuda() for a in anchors]},
                       {"params": ps[4:], "anneal_w": 0.0}], **dict(HP, weight_decay=0.01), fused=True,
                      cuda_graph=graph)
        for p in ps:
            p.grad = torch.zeros_like(p)
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad.copy_(g)  # in place: the addresses the graph was captured with
            opt.step()
        torch.cuda.synchronize()
        return [p.detach().cpu() for p in ps] + [opt.state[p][n].cpu() for p in ps for n in ("exp_avg", "exp_avg_sq")]

    monkeypatch.setattr(fused_mod, "_graphs", {})
    monkeypatch.setattr(fused_mod, "_captures", {})
    plain = train(False)
    assert fused_mod._graphs == {}
    graphed = train(True)
    assert counted.many == 2 * len(grads)
    assert [e[2] for e in fused_mod._graphs.values()] == [len(grads) - 1]  # one capture, replayed ever after
    for a, b in zip(graphed, plain):
        assert torch.equal(a, b)
    assert not torch.equal(graphed[0], ps0[0])  # the weights moved
