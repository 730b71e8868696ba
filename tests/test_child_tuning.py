"""ChildTuning (--child-tuning F|D): the core against float64 / numpy references (F's draw and rate; D's Fisher
sum and exact top-p with its tie rule; the packed mask), the listener in-process (three F updates of --optimizer
recadam, 1/p included, against a float64 Adam reference; D's state and its mismatches), and through the real
fairseq-train on the tiny model: ratio 1 equals the base bit for bit, D's masked weights stay at θ*, D's resume,
--fp16's flat tensor (samsgd), F's one mask per update under --update-freq 2 and its resume, 2 ranks, bad input."""

import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fairseq.logging import metrics
from fairseq.optim import build_optimizer

import recadam_fairseq.core.child_tuning as ct
from helpers import (ADAM_W0, DIST_FLAGS, NO_DROPOUT, ONE_THREAD, USER_DIR, Toy, assert_same_run, dumps, load_ckpt,
                     one_error_line, parse_config, run_plan)
from recadam_fairseq.core.errors import ConfigError
from recadam_fairseq.optim.child_tuning import ChildTuning

F64 = dict(dtype=torch.float64)


# --------------------------------------------------------------------------- F: the draw
def ref_keep(sizes, p, seed, update, chunk=None):
    """Bernoulli(p) keep masks, one per part: uniforms from one generator seeded by (seed, update), parts in order."""
    gen = torch.Generator().manual_seed(ct.draw_seed(seed, update))
    out = []
    for n in sizes:
        step = chunk or n
        out.append(torch.cat([torch.rand(min(step, n - s), generator=gen) < p for s in range(0, n, step)]))
    return out


def test_f_mask_keeps_a_p_fraction_and_depends_only_on_seed_and_update(monkeypatch):
    sizes, p = [5, 300, 1000, 7], 0.3
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(n, generator=gen, **F64) for n in sizes]
    seeded = lambda s, u: torch.Generator().manual_seed(ct.draw_seed(s, u))  # noqa: E731
    got = [g.clone() for g in grads]
    ct.mask_f_([(g, g.numel()) for g in got], p, seeded(7, 3))
    for g, w, keep in zip(grads, got, ref_keep(sizes, p, 7, 3)):
        assert torch.equal(w, torch.where(keep, g, 0.0))  # kept elements exact, the rest 0
    # the same draw on the runs of one flat tensor, and with a part that has no gradient in between
    flat = torch.cat(grads)
    views, off = [], 0
    for n in sizes:
        views.append((flat[off:off + n], n))
        off += n
    ct.mask_f_(views, p, seeded(7, 3))
    assert torch.equal(flat, torch.cat(got))
    partial = [g.clone() for g in grads]
    ct.mask_f_([(partial[0], 5), (None, 300), (partial[2], 1000), (partial[3], 7)], p, seeded(7, 3))
    assert torch.equal(partial[2], got[2]) and torch.equal(partial[3], got[3])
    # chunked draws follow the chunk rule
    monkeypatch.setattr(ct, "CHUNK", 64)
    chunked = [g.clone() for g in grads]
    ct.mask_f_([(g, g.numel()) for g in chunked], p, seeded(7, 3))
    for g, w, keep in zip(grads, chunked, ref_keep(sizes, p, 7, 3, chunk=64)):
        assert torch.equal(w, torch.where(keep, g, 0.0))
    # the rate, and a fresh mask per update / seed
    n = 200_000
    a, b, c = (ref_keep([n], p, s, u)[0] for s, u in ((7, 3), (7, 4), (8, 3)))
    assert abs(a.double().mean().item() - p) < 0.005  # σ = 0.001
    for other in (b, c):
        assert abs((a == other).double().mean().item() - (p * p + (1 - p) ** 2)) < 0.005  # independent draws
    assert len({ct.draw_seed(7, 3), ct.draw_seed(7, 4), ct.draw_seed(8, 3), ct.draw_seed(3, 7)}) == 4
    assert ct.draw_seed(7, 3) == ct.draw_seed(7, 3) < 2 ** 63


# --------------------------------------------------------------------------- D: Fisher and the exact top-p
def ref_fisher(batches, clip):
    """numpy float64: Σ over batches of each tensor's g², g first clipped to norm ``clip`` (torch's rule)."""
    sums = [np.zeros(g.shape) for g in batches[0]]
    for gs in batches:
        for s, g in zip(sums, gs):
            g = g.numpy().copy()
            if clip > 0:
                g *= min(1.0, clip / (np.linalg.norm(g) + 1e-6))
            s += g * g
    return sums


def ref_top(values, ratio):
    """The top max(1, ⌊ratio·N⌋) by a full sort: larger first, then the lower index (tensor order, row-major)."""
    flat = np.concatenate([v.reshape(-1) for v in values])
    k = max(1, int(flat.size * ratio))
    keep = np.zeros(flat.size, dtype=bool)
    keep[np.lexsort((np.arange(flat.size), -flat))[:k]] = True
    out, off = [], 0
    for v in values:
        out.append(keep[off:off + v.size].reshape(v.shape))
        off += v.size
    return out


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_d_fisher_and_top_p_match_a_numpy_reference(clip):
    gen = torch.Generator().manual_seed(1)
    shapes = [(4, 6), (6,), (3, 5)]
    batches = [[torch.randn(s, generator=gen, **F64) * (1 + i) for i, s in enumerate(shapes)] for _ in range(5)]
    acc = ct.FisherSum([torch.zeros(s, **F64) for s in shapes], clip=clip)
    for gs in batches:
        assert acc.add(gs)
    assert acc.batches == 5
    want = ref_fisher(batches, clip)
    for s, w in zip(acc.sums, want):
        np.testing.assert_allclose(s.numpy(), w, rtol=1e-12, atol=0)
    for ratio in (0.3, 0.25, 0.01, 1.0):
        got = ct.d_mask(acc.sums, ratio)
        ref = ref_top(want, ratio)
        assert all(np.array_equal(g.numpy(), r) for g, r in zip(got, ref)), ratio
        assert sum(int(g.sum()) for g in got) == max(1, int(45 * ratio))
    if clip:  # the clip changed the ranking (the third tensor's gradients are the largest)
        assert not all(np.array_equal(a, b) for a, b in zip(ref_top(want, 0.3), ref_top(ref_fisher(batches, 0), 0.3)))


def test_d_ties_go_to_the_earliest_elements():
    gen = torch.Generator().manual_seed(2)
    fisher = [torch.randint(0, 4, s, generator=gen).double() for s in ((5, 7), (9,), (4, 4))]  # many ties
    for ratio in (0.1, 0.3, 0.5, 0.77):
        got = ct.d_mask(fisher, ratio)
        assert all(np.array_equal(g.numpy(), r) for g, r in zip(got, ref_top([f.numpy() for f in fisher], ratio)))
    # all equal: the first k elements
    keep = ct.d_mask([torch.zeros(3, 4), torch.zeros(5)], 0.5)
    assert keep[0].reshape(-1).tolist() == [True] * 8 + [False] * 4 and not keep[1].any()
    with pytest.raises(FloatingPointError, match="not finite"):
        ct.d_mask([torch.tensor([1.0, float("inf")])], 0.5)


def test_d_fp16_fisher_unscales_and_skips_an_overflowed_batch():
    p = torch.zeros(6, dtype=torch.float16)
    acc = ct.FisherSum([p])
    g = torch.tensor([1e-4, 2.0, -3.0, 0.5, 0.0, 7.0]).half()
    scale = 2.0 ** 10
    assert not acc.add([torch.tensor([1.0, float("inf"), 0, 0, 0, 0]).half()], scale, check_finite=True)
    assert acc.batches == 0 and not acc.sums[0].any()
    assert acc.add([(g.float() * scale).half()], scale, check_finite=True)
    assert acc.sums[0].dtype == torch.float32
    torch.testing.assert_close(acc.sums[0], g.float() ** 2, rtol=1e-3, atol=0)
    assert acc.sums[0][0] > 0  # 1e-4² survives: squared in fp32 after unscaling


@pytest.mark.parametrize("n", [1, 8, 13, 64])
def test_packed_mask_round_trip(n):
    mask = torch.rand(n, generator=torch.Generator().manual_seed(n)) < 0.4
    packed = ct.pack_bits(mask.view(1, n))
    assert packed.dtype == torch.uint8 and packed.numel() == (n + 7) // 8
    assert np.array_equal(np.unpackbits(packed.numpy())[:n].astype(bool), mask.numpy())  # numpy's bit order
    assert torch.equal(ct.unpack_bits(packed, (1, n)), mask.view(1, n))
    assert ct.checksum([packed]) == ct.checksum([packed.clone()])
    with pytest.raises(ValueError, match="packed bytes"):
        ct.unpack_bits(packed, (n + 8,))


@pytest.mark.parametrize("mode,ratio,batches,start", [
    ("G", 0.3, 0, "--child-tuning 'G': choose one of off, F, D"),
    ("D", 0.0, 0, "--child-tuning-ratio 0: must be in (0, 1]"),
    ("F", 1.5, 0, "--child-tuning-ratio 1.5: must be in (0, 1]"),
    ("D", float("nan"), 0, "--child-tuning-ratio nan: must be in (0, 1]"),
    ("D", 0.3, -1, "--child-tuning-fisher-batches -1: must be an integer >= 0"),
    ("D", 0.3, 2.5, "--child-tuning-fisher-batches 2.5: must be an integer >= 0"),
])
def test_bad_values_name_the_flag(mode, ratio, batches, start):
    with pytest.raises(ConfigError) as e:
        ct.check(mode, ratio, batches)
    assert str(e.value).startswith(start) and "\n" not in str(e.value)


def test_d_masks_the_encoder_layers_only():
    assert ct.d_eligible("encoder.sentence_encoder.layers.0.self_attn.q_proj.weight")
    assert ct.d_eligible("encoder.sentence_encoder.layers.11.final_layer_norm.bias")
    for name in ("encoder.sentence_encoder.embed_tokens.weight", "encoder.sentence_encoder.layernorm_embedding.weight",
                 "encoder.lm_head.layer_norm.weight", "classification_heads.sentence_classification_head.dense.weight"):
        assert not ct.d_eligible(name), name


# --------------------------------------------------------------------------- the listener in-process
def parse(*flags):
    return parse_config("--task", "dummy_lm", "--arch", "transformer_lm", "--user-dir", USER_DIR, "--optimizer",
                        "recadam", "--lr", "0.01", "--cpu", "--seed", "5", "--recadam-anneal-w", "0", *flags)


def test_f_updates_of_recadam_match_a_float64_adam_reference():
    """Three steps of --optimizer recadam --recadam-anneal-w 0 (plain Adam) with --child-tuning F: the kept
    gradient elements ×1/p, the rest 0, before the moments; ε large enough that 1/p shows."""
    p, eps, lr, (b1, b2) = 0.4, 0.05, 0.01, (0.9, 0.999)
    model = Toy().double()
    params = list(model.parameters())
    theta0 = [q.detach().clone() for q in params]
    cfg = parse("--child-tuning", "F", "--child-tuning-ratio", str(p), "--adam-eps", str(eps))
    opt = build_optimizer(cfg.optimizer, params)
    gen = torch.Generator().manual_seed(3)
    grads = [[0.1 * torch.randn(q.shape, generator=gen, **F64) for q in params] for _ in range(3)]
    try:
        for k, gs in enumerate(grads):
            metrics.reset()
            metrics.log_scalar("num_updates", k, weight=0)  # fairseq's count before update k + 1
            for q, g in zip(params, gs):
                q.grad = g.clone()
            opt.all_reduce_grads(model)
            opt.step()
    finally:
        metrics.reset()

    def reference(rescale):
        out = []
        for i, t in enumerate(theta0):
            x, m, v = t.clone(), torch.zeros_like(t), torch.zeros_like(t)
            for k, gs in enumerate(grads):
                keep = ref_keep([q.numel() for q in params], p, 5, k)[i].view(t.shape)
                g = torch.where(keep, gs[i], 0.0) * (1 / p if rescale else 1.0)
                m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
                x = x - lr * (1 - b2 ** (k + 1)) ** 0.5 / (1 - b1 ** (k + 1)) * m / (v.sqrt() + eps)
            out.append(x)
        return out

    for q, w, unscaled in zip(params, reference(True), reference(False)):
        torch.testing.assert_close(q.detach(), w, rtol=1e-13, atol=1e-15)
        assert not torch.allclose(w, unscaled, rtol=1e-4, atol=0)  # the 1/p is seen
    # an element masked in all three updates never moved (no moment)
    never = [~(a | b | c) for a, b, c in zip(*(ref_keep([q.numel() for q in params], p, 5, k) for k in range(3)))]
    assert sum(int(n.sum()) for n in never) > 5
    for q, t, n in zip(params, theta0, never):
        assert torch.equal(q.detach().reshape(-1)[n], t.reshape(-1)[n])


def d_listener(ratio=0.25):
    model = Toy()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = SimpleNamespace(child_tuning="D", child_tuning_ratio=ratio, seed=1)
    return model, opt, ChildTuning(opt, cfg)


def test_d_state_round_trip_and_mismatches():
    model, opt, ct_a = d_listener()
    names = [n for n, _ in model.named_parameters() if ct.d_eligible(n)]
    gen = torch.Generator().manual_seed(4)
    ct_a.keep = {n: torch.rand(q.shape, generator=gen) < 0.5 for n, q in model.named_parameters() if n in names}
    want = {n: k.clone() for n, k in ct_a.keep.items()}
    before = ct_a.state_dict()
    ct_a.bind(model)
    st = ct_a.state_dict()
    assert set(st["keep"]) == set(names) == set(before["keep"])
    assert all(torch.equal(st["keep"][n], before["keep"][n]) for n in names)
    # a fresh listener takes the mask from the state: the same drop masks after binding, nothing recomputed
    model_b, opt_b, ct_b = d_listener()
    ct_b.load_state_dict(st)
    assert ct_b.first_call(None, (model_b,)) is None  # no Fisher passes (the criterion is never touched)
    ct_b.bind(model_b)
    assert all(torch.equal(ct_b.by_name[n].view(want[n].shape), ~want[n]) for n in names)
    for q, g in zip(model_b.parameters(), [torch.ones_like(q) for q in model_b.parameters()]):
        q.grad = g
    assert ct_b.before_step(2.0) == 2.0
    for n, q in model_b.named_parameters():
        assert torch.equal(q.grad, want[n].to(q.dtype) if n in want else torch.ones_like(q)), n
    # another ratio, another mode, another model: one line naming what to do
    with pytest.raises(ConfigError, match=r"^--child-tuning-ratio 0.3: the checkpoint's ChildTuning-D mask keeps 0.25"):
        d_listener(0.3)[2].load_state_dict(st)
    with pytest.raises(ConfigError, match=r"^--child-tuning D: the checkpoint's optimizer state was trained with "
                                          r"--child-tuning F: start a new optimizer state with --reset-optimizer"):
        d_listener()[2].load_state_dict({"mode": "F", "ratio": 0.25})
    other, _, ct_c = d_listener()
    other.encoder.sentence_encoder.layers.append(torch.nn.Linear(3, 3))
    ct_c.load_state_dict(st)
    with pytest.raises(ConfigError, match="the checkpoint's mask covers 4 tensors, this model's encoder layers have 6"):
        ct_c.bind(other)


# --------------------------------------------------------------------------- through fairseq-train
ADAM = ADAM_W0  # plain Adam (fairseq's adam bit for bit); weight decay 0 (the default)
P = 0.25


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("child_tuning")
    d = ["--child-tuning", "D", "--child-tuning-ratio", str(P)]
    F = [*ADAM, "--child-tuning", "F", "--child-tuning-ratio", "0.5", "--update-freq", "2"]
    cases = {
        "base": ((*ADAM,), dict(updates=2)),
        "ratio1": ((*ADAM, "--child-tuning", "D", "--child-tuning-ratio", "1", "--child-tuning-fisher-batches", "3"),
                   dict(updates=2)),
        "d": ((*ADAM, *d, *NO_DROPOUT, "--save-interval-updates", "2"), dict(updates=4)),
        "d-fp16": ((*d, *NO_DROPOUT, "--fp16"), dict(optimizer="samsgd", updates=2)),
        "f": ((*F, "--save-interval-updates", "1"), dict(updates=2)),
        "bad": ((*d[:2], "--child-tuning-ratio", "0"), dict(check=False)),
    }

    def run(name, extra, kw):
        return lambda: tiny.train(root / name, *extra, env=ONE_THREAD, **kw)

    def resumed(name, src, at, extra, updates):  # from a copy of src's update-`at` checkpoint
        def go():
            save = root / name
            save.mkdir()
            shutil.copy(root / src / f"checkpoint_1_{at}.pt", save / f"at{at}.pt")
            return tiny.train(save, *extra, "--restore-file", str(save / f"at{at}.pt"), updates=updates,
                              restore=False, env=ONE_THREAD)
        return go

    steps = {name: run(name, extra, kw) for name, (extra, kw) in cases.items()}
    steps["d-resumed"] = resumed("d-resumed", "d", 2, [*ADAM, *d, *NO_DROPOUT], 4)  # to 4 updates
    steps["f-resumed"] = resumed("f-resumed", "f", 1, F, 2)  # to 2 updates
    out = run_plan(steps, after={"d-resumed": "d", "f-resumed": "f"})
    return dict(root=root, out=out, pre=load_ckpt(tiny.pretrained)["model"],
                load=lambda *p: load_ckpt(root.joinpath(*p)))


def unpack(packed, shape):
    """The saved mask, by numpy's bit order (independent of the core's unpacking)."""
    n = int(np.prod(shape))
    return torch.from_numpy(np.unpackbits(packed.numpy())[:n].astype(bool)).view(shape)


def log_line(log, start):
    lines = [ln.split(" | ")[-1] for ln in log.splitlines() if start in ln]
    assert len(lines) == 1, (start, lines)
    return lines[0]


def test_ratio_one_is_the_base_bit_for_bit(runs):
    """D at p = 1 runs its Fisher passes (3 batches) before the first forward: the global RNG, the gradients and
    the trainer's batches are put back, and the all-ones mask changes nothing."""
    base, one = runs["load"]("base", "checkpoint_last.pt"), runs["load"]("ratio1", "checkpoint_last.pt")
    assert_same_run(base, one, listeners=False)  # (the ratio-1 run's mask beside it)
    log = runs["out"]["ratio1"][1]
    assert "Fisher information of 3 batches (48 examples, 1 rank)" in log
    assert all(b.all() for b in (unpack(v, (v.numel() * 8,)) for v in one["last_optimizer_state"]["child_tuning"]["keep"].values()))


def check_d_mask(ckpt, pre, half):
    """The saved mask keeps exactly ⌊p·N⌋ of the encoder layers' N elements; every other element of those
    tensors is still θ* (weight decay 0, no pull); the other pretrained tensors moved. Returns the masks."""
    keep = {n: unpack(b, ckpt["model"][n].shape) for n, b in ckpt["last_optimizer_state"]["child_tuning"]["keep"].items()}
    layers = [n for n in pre if ".sentence_encoder.layers." in n]
    assert sorted(keep) == sorted(layers) and len(layers) == 32
    total = sum(pre[n].numel() for n in layers)
    assert sum(int(k.sum()) for k in keep.values()) == int(total * P)
    moved_kept = 0
    for n in layers:
        theta0 = pre[n].half().float() if half else pre[n]
        after = ckpt["model"][n]
        assert torch.equal(after[~keep[n]], theta0[~keep[n]]), n
        moved_kept += int((after != theta0)[keep[n]].sum())
    assert moved_kept > 0.9 * int(total * P)
    for n in ("encoder.sentence_encoder.embed_positions.weight", "encoder.sentence_encoder.layernorm_embedding.weight"):
        assert (ckpt["model"][n] != (pre[n].half().float() if half else pre[n])).float().mean() > 0.2, n  # unmasked
    return keep


def test_d_masked_weights_stay_at_the_pretrained_ones(runs):
    ckpt = runs["load"]("d", "checkpoint_last.pt")
    check_d_mask(ckpt, runs["pre"], half=False)
    log = runs["out"]["d"][1]
    assert "Fisher information of 16 batches (256 examples, 1 rank) over 32 encoder-layer tensors" in log  # default 0
    assert "the elements of" not in log
    line = log_line(log, "child-tuning D: mask from the Fisher information")
    assert f"16,736 of the 66,944 elements of 32 encoder-layer tensors take the gradient (p = {P:g})" in line


def test_d_resumes_bit_for_bit_without_recomputing_the_fisher(runs):
    straight, resumed = runs["load"]("d", "checkpoint_last.pt"), runs["load"]("d-resumed", "checkpoint_last.pt")
    assert_same_run(straight, resumed)
    a, b = (c["last_optimizer_state"]["child_tuning"] for c in (straight, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a["keep"][n], b["keep"][n]) for n in a["keep"])
    log = runs["out"]["d-resumed"][1]
    assert "Fisher information of" not in log
    crc = log_line(runs["out"]["d"][1], "child-tuning D: mask from the Fisher").split("crc32 ")[1]
    assert log_line(log, "child-tuning D: mask from the checkpoint").endswith(f"crc32 {crc}")


def test_d_on_the_fp16_flat_tensor_with_samsgd(runs):
    """samsgd (fairseq's Adam) on --fp16's one flat fp32 tensor; the Fisher of fp16 gradients under a loss
    scale ranks as the fp32 one does, up to the elements at the threshold."""
    keep16 = check_d_mask(runs["load"]("d-fp16", "checkpoint_last.pt"), runs["pre"], half=True)
    keep32 = check_d_mask(runs["load"]("d", "checkpoint_last.pt"), runs["pre"], half=False)
    same = sum(int((keep16[n] & keep32[n]).sum()) for n in keep16)
    assert same > 0.99 * int(66944 * P), same  # measured: 16,732 of 16,736
    assert "fp16 loss scale" in log_line(runs["out"]["d-fp16"][1], "Fisher information of 16 batches")


def test_f_draws_one_mask_per_update_and_resumes_bit_for_bit(runs):
    """--update-freq 2: each update's gradient is masked once, by the draw of (seed 7, update); an element
    moves only when its update kept it (after 2 updates: kept by the first or the second). Resumed after
    update 1, the run draws the same second mask: bit for bit."""
    pre = runs["pre"]
    first, last = runs["load"]("f", "checkpoint_1_1.pt")["model"], runs["load"]("f", "checkpoint_last.pt")
    names = [k for k in first if not k.endswith(".version") and k != "encoder.lm_head.weight"]
    sizes = [first[n].numel() for n in names]
    keep0, keep1 = ({n: k.view(first[n].shape) for n, k in zip(names, ref_keep(sizes, 0.5, 7, u))} for u in (0, 1))
    big = [n for n in names if ".layers." in n and n.endswith("proj.weight")]
    assert len(big) == 8
    for n in names:
        if n not in pre:
            continue
        moved1, moved2 = first[n] != pre[n], last["model"][n] != pre[n]
        assert not (moved1 & ~keep0[n]).any(), n
        assert not (moved2 & ~(keep0[n] | keep1[n])).any(), n
        if n in big:  # every kept element moves: 1/2 after one update, 3/4 after two
            assert 0.45 < moved1.float().mean() < 0.55 and 0.7 < moved2.float().mean() < 0.8, n
    assert "child-tuning F: each update keeps each of the 86,699 gradient elements with probability 0.5" in runs["out"]["f"][1]
    resumed = runs["load"]("f-resumed", "checkpoint_last.pt")
    assert_same_run(last, resumed)
    assert resumed["last_optimizer_state"]["child_tuning"] == {"mode": "F", "ratio": 0.5}


def test_d_mask_is_the_same_on_two_ranks(tiny, tmp_path, monkeypatch):
    """2 CPU ranks (gloo): each sums the Fisher of its shard (2 batches), the sums are added, rank 0's mask is
    broadcast; both ranks hold the same mask (each rank's dump) and end with the same weights."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    save = tmp_path / "two"
    logs = tiny.ranks(save, 2, *DIST_FLAGS, "--child-tuning", "D", "--child-tuning-ratio", str(P),
                  "--child-tuning-fisher-batches", "2", "--max-update", "2")
    r0, r1 = dumps(save, 2)
    k0, k1 = r0["optimizer"]["child_tuning"]["keep"], r1["optimizer"]["child_tuning"]["keep"]
    assert len(k0) == 32 and all(torch.equal(k0[n], k1[n]) for n in k0)
    assert all(torch.equal(v, r1["model"][k]) for k, v in r0["model"].items())
    assert "Fisher information of 4 batches (32 examples, 2 ranks)" in logs[0]  # rank 1 logs warnings only


def test_bad_ratio_stops_in_one_line(runs):
    rc, log = runs["out"]["bad"]
    assert rc != 0 and one_error_line(log).startswith("--child-tuning-ratio 0: must be in (0, 1]")
    assert not [f for f in os.listdir(runs["root"] / "bad") if f.endswith(".pt")]
