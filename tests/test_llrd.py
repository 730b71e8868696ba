"""Layer-wise learning-rate decay (--layer-lr-decay): the scale table, RecAdam's per-tensor / per-run lr
scales against a float64 reference, and the flag through the real fairseq-train on the tiny model
(2 encoder layers): the first update's size per layer, γ = 1 bit for bit, resume, samsgd, bad input."""

import math
import os

import pytest
import torch
from torch import nn

import recadam_fairseq.core.fused as fused_mod
from recadam_fairseq import RecAdam
from recadam_fairseq.core.conditional_modules import ConditionalBottleneck
from recadam_fairseq.core.errors import ConfigError
from recadam_fairseq.core.layer_lr import LayerLRPlan, exponent, num_layers, tensor_scales
from helpers import (ADAM_W0, F64, TINY_CA_MTL, assert_same_run, build_tiny, load_ckpt, one_error_line, ref_lambda,
                     run_plan)

G = 0.5  # γ of the end-to-end runs


# --------------------------------------------------------------------------- the scale table
ROBERTA_NAMES = [
    "encoder.sentence_encoder.embed_tokens.weight", "encoder.sentence_encoder.embed_positions.weight",
    "encoder.sentence_encoder.layernorm_embedding.weight", "encoder.sentence_encoder.emb_layer_norm.bias",
    *[f"encoder.sentence_encoder.layers.{l}.{t}" for l in range(12) for t in ("self_attn.q_proj.weight", "fc2.bias")],
    "encoder.sentence_encoder.layers.11.adapter.up.weight",  # CA-MTL's, inside the top layer
    "encoder.sentence_encoder.task_embedding.weight", "encoder.lm_head.dense.weight", "encoder.lm_head.bias",
    "classification_heads.sentence_classification_head.out_proj.weight",
]
NEW = ["encoder.sentence_encoder.layers.11.adapter.up.weight", "encoder.sentence_encoder.task_embedding.weight"]


def test_scale_table_of_roberta_names():
    assert num_layers(ROBERTA_NAMES) == 12
    want = {n: 13 for n in ROBERTA_NAMES[:4]}
    want.update({f"encoder.sentence_encoder.layers.{l}.{t}": 12 - l for l in range(12)
                 for t in ("self_attn.q_proj.weight", "fc2.bias")})
    want.update({n: 0 for n in ROBERTA_NAMES[-5:]})
    assert {n: exponent(n, 12, NEW) for n in ROBERTA_NAMES} == want
    # layers.1 is not layers.10-11; a top layer's tensor not new to CA-MTL gets γ¹
    assert exponent("encoder.sentence_encoder.layers.1.fc1.weight", 12) == 11
    assert exponent("encoder.sentence_encoder.layers.11.adapter.up.weight", 12) == 1


def test_scale_table_of_encoder_decoder_names():
    """fairseq's transformer / BART names: each stack decays from its own top, the embeddings below both."""
    from recadam_fairseq.core.layer_lr import stack_layers

    names = ["encoder.embed_tokens.weight", "encoder.embed_positions.weight", "decoder.embed_positions.weight",
             "encoder.layernorm_embedding.weight", "decoder.layernorm_embedding.bias",
             *[f"encoder.layers.{l}.fc1.weight" for l in range(6)], *[f"decoder.layers.{l}.fc1.weight" for l in range(3)],
             "decoder.layers.2.encoder_attn.k_proj.weight", "encoder.layer_norm.weight", "decoder.output_projection.weight"]
    assert stack_layers(names) == {"encoder": 6, "decoder": 3} and num_layers(names) == 6
    got = {n: exponent(n, stack_layers(names)) for n in names}
    assert got == {**{n: 7 for n in names[:5]}, **{f"encoder.layers.{l}.fc1.weight": 6 - l for l in range(6)},
                   **{f"decoder.layers.{l}.fc1.weight": 3 - l for l in range(3)},
                   "decoder.layers.2.encoder_attn.k_proj.weight": 1, "encoder.layer_norm.weight": 0,
                   "decoder.output_projection.weight": 0}
    # RoBERTa's names never read as an encoder-decoder's: sentence_encoder.layers is the stack "encoder"
    assert stack_layers(ROBERTA_NAMES) == {"encoder": 12}


class Toy(nn.Module):
    """RoBERTa's names, 2 layers; a CA-MTL adapter in layer 1; a head; a frozen tensor."""

    def __init__(self):
        super().__init__()
        se = nn.Module()
        se.embed_tokens = nn.Embedding(5, 3)
        se.layernorm_embedding = nn.LayerNorm(3)
        se.layers = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])
        se.layers[1].adapter = ConditionalBottleneck(3, 2, 3)
        se.layers[0].frozen = nn.Parameter(torch.zeros(2), requires_grad=False)
        self.encoder = nn.Module()
        self.encoder.sentence_encoder = se
        self.head = nn.Linear(3, 2)


def test_plan_per_tensor_copies_and_flat():
    model = Toy()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    g = 0.8
    want = {"encoder.sentence_encoder.embed_tokens.weight": g ** 3,
            "encoder.sentence_encoder.layernorm_embedding.weight": g ** 3,
            "encoder.sentence_encoder.layernorm_embedding.bias": g ** 3,
            "encoder.sentence_encoder.layers.0.weight": g ** 2, "encoder.sentence_encoder.layers.0.bias": g ** 2,
            "encoder.sentence_encoder.layers.1.weight": g, "encoder.sentence_encoder.layers.1.bias": g}
    expect = [want.get(n) for n, _ in named]  # None: the adapter (new) and the head
    assert sum(e is None for e in expect) == len(named) - 7 >= 8
    own = LayerLRPlan([p for _, p in named], model, g)  # the model's own tensors
    assert own.layers == 2 and own.scales == expect
    copies = LayerLRPlan([p.detach().clone() for _, p in named] + [torch.zeros(4)], model, g)  # + a criterion's
    assert copies.scales == expect + [None]
    flat = torch.zeros(sum(p.numel() for _, p in named) + 4)
    runs, off = [], 0
    for (n, p), e in zip(named, expect):
        if e is not None:
            if runs and runs[-1][2] == e and runs[-1][0] + runs[-1][1] == off:
                runs[-1][1] += p.numel()
            else:
                runs.append([off, p.numel(), e])
        off += p.numel()
    assert LayerLRPlan([flat], model, g).scales == [[tuple(r) for r in runs]]
    assert len(runs) == 3  # embeddings, layer 0, layer 1 (its adapter and the head: 1, left out)
    assert "embeddings ×0.512, layers 0..1 ×0.64..×0.8" in own.summary()
    assert tensor_scales([[("a", 0, 4)], [(None, 0, 2)]], {"a": 1.0}) == [None, None]


def test_ca_mtl_new_modules_keep_the_full_lr(tiny):
    """The real CA-MTL model (fairseq builds it): its conditional tensors, inside layers too, get lr."""
    ca, _, _ = build_tiny(tiny, *TINY_CA_MTL, tasks=["a", "b", "c"])
    named = [(n, p) for n, p in ca.named_parameters() if p.requires_grad]
    got = dict(zip([n for n, _ in named], LayerLRPlan([p for _, p in named], ca, G).scales))
    new = set(ca.conditional_tensor_names())
    assert any(".layers.1." in n for n in new) and new <= set(got)
    assert all(got[n] is None for n in new)
    assert got["encoder.sentence_encoder.layers.1.final_layer_norm.weight"] == G  # the pretrained part of a CLN
    assert got["encoder.sentence_encoder.layers.0.fc1.weight"] == G ** 2
    assert got["encoder.sentence_encoder.embed_tokens.weight"] == G ** 3


@pytest.mark.parametrize("gamma", [0.0, -0.5, 1.5, float("nan")])
def test_gamma_outside_0_1_and_a_model_without_layers(gamma):
    with pytest.raises(ConfigError, match=r"^--layer-lr-decay .*: must be in \(0, 1\]"):
        LayerLRPlan([], Toy(), gamma)
    with pytest.raises(ConfigError, match="no layers named"):
        LayerLRPlan([p for p in nn.Linear(2, 2).parameters()], nn.Linear(2, 2), 0.9)


# --------------------------------------------------------------------------- RecAdam with lr scales
HP = dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.05, anneal_fun="sigmoid", anneal_k=0.5,
          anneal_t0=3, anneal_w=1.0, pretrain_cof=20.0)
FLAT_ANCHOR_RUNS = [(0, 12), (20, 25)]                       # anchored: [0, 12) and [20, 45) of 60
FLAT_SCALE_RUNS = [(5, 10, 0.3), (18, 6, 0.6), (40, 15, 0.8)]  # each crosses an anchored / plain boundary


def problem():
    """(shape, anchored, lr scale) per tensor, as element vectors: scale c and anchor mask per element."""
    gen = torch.Generator().manual_seed(3)
    specs = [((6, 7), True, 0.5), ((5,), False, 0.25), ((4, 3), True, None), ((60,), FLAT_ANCHOR_RUNS, FLAT_SCALE_RUNS)]
    out = []
    for shape, anchored, scale in specs:
        p = torch.randn(shape, generator=gen, **F64)
        n = p.numel()
        c = torch.ones(n, **F64)
        if isinstance(scale, list):
            for s, k, x in scale:
                c[s:s + k] = x
        elif scale is not None:
            c[:] = scale
        mask = torch.zeros(n, dtype=torch.bool)
        if anchored is True:
            mask[:] = True
        elif anchored:
            for s, k in anchored:
                mask[s:s + k] = True
        a = p.reshape(-1) + 0.2 * torch.randn(n, generator=gen, **F64)
        out.append(dict(p=p, c=c, mask=mask, a=a, anchored=anchored, scale=scale))
    grads = [[torch.randn(t["p"].shape, generator=gen, **F64) for t in out] for _ in range(6)]
    return out, grads


def reference(tensors, grads):
    """The module docstring's rule per element with lr·c: the Adam step, the pull and the decay."""
    b1, b2 = HP["betas"]
    out = []
    for i, t in enumerate(tensors):
        p, m, v = t["p"].reshape(-1).clone(), torch.zeros(t["p"].numel(), **F64), torch.zeros(t["p"].numel(), **F64)
        for step, gs in enumerate(grads):
            k = step + 1
            g = gs[i].reshape(-1)
            lr = HP["lr"] * (0.5 if step >= 3 else 1.0) * t["c"]
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            s = lr * math.sqrt(1 - b2 ** k) / (1 - b1 ** k)
            upd = m / (v.sqrt() + HP["eps"])
            lam = ref_lambda("sigmoid", k, HP["anneal_k"], HP["anneal_t0"], HP["anneal_w"])
            pulled = p - s * lam * upd
            pulled = pulled - lr * (HP["anneal_w"] - lam) * HP["pretrain_cof"] * (pulled - t["a"])
            p = torch.where(t["mask"], pulled, p - s * upd)
            p = p - lr * HP["weight_decay"] * p
        out.append(p.view(t["p"].shape))
    return out


def run_recadam(tensors, grads, **kw):
    ps = [nn.Parameter(t["p"].clone()) for t in tensors]
    opt = RecAdam([{"params": ps[:3]}, {"params": ps[3:]}], **HP, defer_anchors=True, **kw)  # the flat one apart
    for p, t in zip(ps, tensors):
        if t["anchored"] is True:
            opt.set_anchor(p, t["a"].view(p.shape).clone())
        elif t["anchored"]:
            opt.set_anchor(p, t["a"][t["mask"]].clone(), t["anchored"])
        opt.set_lr_scale(p, t["scale"])
    for step, gs in enumerate(grads):
        if step == 3:
            for group in opt.param_groups:
                group["lr"] *= 0.5
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()
    return ps, opt


@pytest.mark.parametrize("path", ["foreach", "single", "fused", "fused-fails"])
def test_recadam_lr_scales_match_float64_reference(path, monkeypatch):
    tensors, grads = problem()
    rows = []
    if path == "fused-fails":  # compiling fails at the first step: every segment goes eager with its scale
        def broken(*args, **kw):
            raise RuntimeError("no C++ compiler here")

        for name, value in (("MIN_SEGMENT", 2), ("MULTI_MIN_SEGMENTS", 2), ("AUTO_MIN_NUMEL", 1),
                            ("_kernel", lambda key: broken), ("update_many", broken)):
            monkeypatch.setattr(fused_mod, name, value)
        with pytest.warns(UserWarning, match="failed to compile"):
            ps, _ = run_recadam(tensors, grads, fused=None)
        for p, w in zip(ps, reference(tensors, grads)):
            torch.testing.assert_close(p.detach(), w, rtol=1e-13, atol=1e-13)
        return
    if path == "fused":  # every segment through the compiled kernels; separate tensors in one call, a row each
        monkeypatch.setattr(fused_mod, "MIN_SEGMENT", 2)
        monkeypatch.setattr(fused_mod, "MULTI_MIN_SEGMENTS", 2)
        many = fused_mod.update_many
        monkeypatch.setattr(fused_mod, "update_many", lambda segs, s, **kw: (rows.append(tuple(s.shape)), many(segs, s, **kw)))
    ps, opt = run_recadam(tensors, grads, foreach=path != "single", fused=path == "fused")
    if path == "fused":  # A (×0.5) and D (×1), anchored: one call with a row each, every step
        assert rows == [(2, 8)] * len(grads)
    want = reference(tensors, grads)
    for p, w in zip(ps, want):
        torch.testing.assert_close(p.detach(), w, rtol=1e-13, atol=1e-13)
    # the scales are no saved state: the state dict is the one without them
    st = opt.state_dict()
    assert all(set(s) <= {"step", "exp_avg", "exp_avg_sq", "anchor", "anchor_runs"} for s in st["state"].values())
    assert set(st["param_groups"][1]) == set(RecAdam([nn.Parameter(torch.zeros(1))], **HP, defer_anchors=True).state_dict()["param_groups"][0])
    # without scales: everything as before, and lr·c changed the result where c != 1
    plain, _ = run_recadam([dict(t, scale=None) for t in tensors], grads, foreach=path != "single", fused=path == "fused")
    assert torch.equal(plain[2], ps[2]) and not torch.equal(plain[0], ps[0])


def test_set_lr_scale_normalises_and_checks():
    p = nn.Parameter(torch.zeros(10))
    opt = RecAdam([p], anneal_w=0.0)
    opt.set_lr_scale(p, [(0, 4, 0.5), (4, 6, 0.5)])
    assert opt.lr_scale_of(p) == 0.5  # one run over the tensor: a number
    opt.set_lr_scale(p, [(2, 3, 0.5)])
    assert opt.lr_scale_of(p) == [(0, 2, 1.0), (2, 5, 0.5), (5, 10, 1.0)]
    opt.set_lr_scale(p, 1.0)
    assert opt.lr_scale_of(p) is None
    for bad in ([(3, 2, 0.5), (2, 2, 0.5)], [(8, 5, 0.5)], [(0, 2, 0.0)], [(0, 2, float("inf"))]):
        with pytest.raises(ValueError, match="lr scale"):
            opt.set_lr_scale(p, bad)


# --------------------------------------------------------------------------- through fairseq-train
ADAM = ADAM_W0  # plain Adam (bit for bit fairseq's adam)
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.98, 1e-6  # conftest's finetune_args


def layer_scale(name):
    """The issue's rule for the tiny model (L = 2), written out."""
    if ".sentence_encoder.layers.0." in name:
        return G ** 2
    if ".sentence_encoder.layers.1." in name:
        return G
    if any(f".sentence_encoder.{e}." in name for e in ("embed_tokens", "embed_positions", "layernorm_embedding")):
        return G ** 3
    return 1.0


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("llrd")
    # the pretrained file with a classification head (its first step is checked too: scale 1)
    pre = torch.load(tiny.pretrained, map_location="cpu", weights_only=False)
    gen = torch.Generator().manual_seed(0)
    for n, shape in (("dense.weight", (64, 64)), ("dense.bias", (64,)), ("out_proj.weight", (2, 64)),
                     ("out_proj.bias", (2,))):
        pre["model"][f"classification_heads.sentence_classification_head.{n}"] = 0.02 * torch.randn(shape, generator=gen)
    torch.save(pre, root / "pre.pt")
    decay = ["--layer-lr-decay", str(G), "--restore-file", str(root / "pre.pt")]
    cases = {
        "fp32": ((*ADAM, *decay, "--save-interval-updates", "1"), dict(updates=4)),
        "fp16": ((*ADAM, *decay, "--fp16"), dict(updates=1)),
        "samsgd": (decay, dict(optimizer="samsgd", updates=1)),
        "base": (ADAM, dict(updates=2)),  # γ = 1 against this
        "gamma1": ((*ADAM, "--layer-lr-decay", "1"), dict(updates=2)),
        "resumed": ((*ADAM, *decay), dict(updates=2)),
        "gamma0": ((*ADAM, "--layer-lr-decay", "0"), dict(check=False)),
        "gamma1.5": (("--layer-lr-decay", "1.5"), dict(check=False)),
        "samsgd-fp16": ((*decay, "--fp16"), dict(optimizer="samsgd", check=False)),
    }

    steps = {name: (lambda name=name, extra=extra, kw=kw: tiny.train(root / name, *extra, **kw))
             for name, (extra, kw) in cases.items()}
    # relaunch the 2-update run: fairseq resumes from its checkpoint_last.pt up to 4 updates
    steps["resumed-to-4"] = lambda: tiny.train(root / "resumed", *ADAM, *decay[:2], "--restore-file",
                                               str(root / "resumed" / "checkpoint_last.pt"), updates=4, restore=False)
    out = run_plan(steps, after={"resumed-to-4": "resumed"})
    out["resumed"] = out.pop("resumed-to-4")
    return dict(root=root, out=out, pre=pre["model"], load=lambda *p: load_ckpt(root.joinpath(*p)))


def parameter_names(model_state):
    """The trainable parameters in fairseq's order (lm_head.weight is embed_tokens, tied; version is a buffer)."""
    return [k for k in model_state if not k.endswith(".version") and k != "encoder.lm_head.weight"]


def first_step_sizes(pre, ckpt, half):
    """Per parameter: the largest relative miss of |Δθ| = lr·scale over its elements after the first update,
    and how many elements were checked. Adam's first step is lr·scale·g/(|g| + ε/√(1−β2)) (g = m/(1−β1) from
    the saved moment): short of lr·scale by at most lr·scale·ε'/|g|; the new weight is rounded in its dtype
    (fp16: checked only where half an ulp is under a fifth of the step)."""
    model, state = ckpt["model"], ckpt["last_optimizer_state"]["state"]
    names = parameter_names(model)
    if len(state) == 1:  # --fp16: one flat tensor, the parameters back to back
        (flat,) = state.values()
        sizes = [model[n].numel() for n in names]
        assert flat["exp_avg"].numel() == sum(sizes)
        moments = dict(zip(names, flat["exp_avg"].split(sizes)))
    else:  # one state per tensor that had a gradient (lm_head's had none)
        moments = {names[int(i)]: s["exp_avg"].reshape(-1) for i, s in state.items() if "exp_avg" in s}
    eps = EPS / math.sqrt(1 - BETA2)
    out = {}
    for n, m in moments.items():
        g = m.double().abs() / (1 - BETA1)
        dtype = torch.float16 if half else torch.float32  # fairseq saves the fp16 model's weights as fp32
        before, after = pre[n].to(dtype).reshape(-1), model[n].reshape(-1)
        assert torch.equal(after.to(dtype).to(after.dtype), after)
        step = (after.double() - before.double()).abs()
        x = after.to(dtype).abs()
        slack = (torch.nextafter(x, torch.tensor(math.inf, dtype=dtype)) - x).double() / 2
        want = LR * layer_scale(n)
        ok = (g > 10 * eps) & (slack < 0.2 * want)  # the step is within 10% of lr·scale there
        if ok.any():
            miss = ((step[ok] - want).abs() - slack[ok] - want * eps / g[ok]).clamp(min=0) / want
            out[n] = (miss.max().item(), int(ok.sum()))
    return out


@pytest.mark.parametrize("run,half", [("fp32", False), ("fp16", True), ("samsgd", False)])
def test_first_update_moves_each_layer_by_its_lr(runs, run, half):
    ckpt = runs["load"](run, "checkpoint_1_1.pt" if run == "fp32" else "checkpoint_last.pt")
    sizes = first_step_sizes(runs["pre"], ckpt, half)
    assert all(miss < 1e-4 for miss, _ in sizes.values()), sizes  # fp32 round-off inside Adam: ~1e-6
    # every scale was checked on many elements: embeddings γ³, layer 0 γ², layer 1 γ, the head 1
    checked = {}
    for n, (_, k) in sizes.items():
        checked[layer_scale(n)] = checked.get(layer_scale(n), 0) + k
    assert set(checked) == {G ** 3, G ** 2, G, 1.0} and min(checked.values()) >= 30, checked
    if run == "samsgd":  # fairseq's Adam, one inner step per scale = recadam at w = 0 (weight decay 0), bit for bit
        recadam = runs["load"]("fp32", "checkpoint_1_1.pt")["model"]
        assert all(torch.equal(v, recadam[k]) for k, v in ckpt["model"].items())
    log = runs["out"][run][1]
    lines = [ln for ln in log.splitlines() if "--layer-lr-decay 0.5 over 2 encoder layers" in ln]
    assert len(lines) == 1 and lines[0].endswith("embeddings ×0.125, layers 0..1 ×0.25..×0.5, the rest (heads, "
                                                 "lm_head, new modules) ×1")


def test_gamma_one_is_the_run_without_the_flag(runs):
    base, one = runs["load"]("base", "checkpoint_last.pt"), runs["load"]("gamma1", "checkpoint_last.pt")
    assert_same_run(base, one)
    assert "encoder layers: embeddings" not in runs["out"]["gamma1"][1]  # off: no scales, no line
    # recadam at w = 0 (plain Adam) stores no θ*: no anchor in the state, and the log says so
    assert not any("anchor" in st for st in one["last_optimizer_state"]["state"].values())
    assert "recadam: --recadam-anneal-w 0: plain Adam; the pretrained weights θ* are not stored" in runs["out"]["gamma1"][1]


def test_resume_recomputes_the_scales_bit_for_bit(runs):
    straight, resumed = runs["load"]("fp32", "checkpoint_last.pt"), runs["load"]("resumed", "checkpoint_last.pt")
    assert {s.get("step") for s in resumed["last_optimizer_state"]["state"].values()} == {4}  # w = 0: no θ*-only states
    assert_same_run(straight, resumed)  # the state holds no scale: the same keys as without the flag
    assert runs["out"]["resumed"][1].count("--layer-lr-decay 0.5 over 2 encoder layers") == 1


@pytest.mark.parametrize("run,start", [
    ("gamma0", "--layer-lr-decay 0: must be in (0, 1]"),
    ("gamma1.5", "--layer-lr-decay 1.5: must be in (0, 1]"),
    ("samsgd-fp16", "--layer-lr-decay 0.5 with --optimizer samsgd needs one optimizer tensor per parameter, but "
                    "--fp16 hands it one flat tensor: add --fp16-no-flatten-grads"),
])
def test_bad_input_stops_in_one_line(runs, run, start):
    rc, log = runs["out"][run]
    assert rc != 0 and one_error_line(log).startswith(start)
    assert not [f for f in os.listdir(runs["root"] / run) if f.endswith(".pt")]  # nothing trained, nothing saved
