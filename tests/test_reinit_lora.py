"""--arch roberta_ft_*: --reinit-layers and LoRA (--lora-rank, --lora-alpha, --lora-modules).

Unit: core/lora.py against float64 formulas written here. In process: the models fairseq's task
builds, loaded from the tiny pretrained checkpoint through fairseq's load_state_dict (no flag =
RoBERTa's tensors; fresh LoRA = RoBERTa's outputs bit for bit; the re-init marker). End to end, the
real fairseq-train (11 processes, two at a time): no flag trains as --arch roberta; the re-initialised
layer after 0 updates; RecAdam's anchor and resume; LoRA's frozen tensors, merge into plain fairseq,
resume, --fp16 layouts, 2 ranks = --update-freq 2; one bad flag as one line.
"""

import math
import os
import re
import shutil

import numpy as np
import pytest
import torch

from helpers import (LORA, NO_DROPOUT, TINY_FT, assert_one_line_error, build_tiny, code_carrying, load_ckpt,
                     random_tokens, run_jobs)
from recadam_fairseq.core import lora
from recadam_fairseq.core.errors import ConfigError
from recadam_fairseq.use import interpolate as wise
from recadam_fairseq.use import merge_lora

HEAD = "sentence_classification_head"
TOP = "encoder.sentence_encoder.layers.1."  # the tiny model has 2 layers
ATOL = 1e-5  # 2 ranks vs --update-freq 2: fp32 sums in another order (as tests/test_distributed.py)
SEED = 7  # conftest's fine-tuning seed: fairseq-train seeds torch before it builds the model


# --------------------------------------------------------------------------- core/lora.py, float64
def _lora_linear(out_f=5, in_f=7, rank=3, alpha=6.0, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(in_f, out_f).double()
    w = lin.weight.detach().clone()
    mod = lora.add_lora(lin, rank, alpha)
    return lin, w, mod


def test_parametrized_weight_is_w_plus_scaled_ba_float64():
    lin, w, mod = _lora_linear()
    assert torch.equal(lin.weight, w)  # B = 0: the pretrained weight exactly
    assert not mod.lora_B.any() and mod.lora_A.abs().max() <= 1 / math.sqrt(7) and mod.lora_A.std() > 0.1
    assert not lin.parametrizations.weight.original.requires_grad and mod.lora_A.requires_grad
    assert float(mod.scaling) == 2.0 and mod.scaling.dtype == torch.float64
    with torch.no_grad():
        mod.lora_B.normal_()
    A, B = mod.lora_A.detach().numpy(), mod.lora_B.detach().numpy()
    want = w.numpy() + (B @ A) * (6.0 / 3)
    assert np.abs(lin.weight.detach().numpy() - want).max() < 1e-12
    x = torch.randn(4, 7, dtype=torch.float64)
    y = lin(x)
    assert np.abs(y.detach().numpy() - (x.numpy() @ want.T + lin.bias.detach().numpy())).max() < 1e-12
    y.sum().backward()
    assert lin.parametrizations.weight.original.grad is None and mod.lora_A.grad.abs().sum() > 0
    assert mod.lora_B.grad.abs().sum() > 0


def test_merged_state_dict_float64():
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    plain_names = list(net.state_dict())
    mod = lora.add_lora(net[0], 2, 8.0)
    with torch.no_grad():
        mod.lora_B.normal_()
    state = net.state_dict()
    assert lora.is_lora_state(state) and lora.lora_scaling(state) == 4.0
    merged = lora.merged_state_dict(state)
    assert sorted(merged) == sorted(plain_names) and not lora.is_lora_state(merged)
    key = "0.parametrizations.weight."
    want = state[key + "original"].numpy() + state[key + "0.lora_B"].numpy() @ state[key + "0.lora_A"].numpy() * 4.0
    assert np.abs(merged["0.weight"].numpy() - want).max() < 1e-12
    assert torch.equal(merged["0.weight"], net[0].weight)  # the forward's own computation, bit for bit
    assert all(merged[k] is state[k] for k in ("0.bias", "2.weight", "2.bias"))  # passed through
    plain = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    plain.load_state_dict(merged, strict=True)
    x = torch.randn(4, 6, dtype=torch.float64)
    assert torch.equal(plain(x), net(x))
    other = {"a": torch.ones(2)}
    assert lora.merged_state_dict(other) == other and lora.lora_scaling(other) is None
    with pytest.raises(ValueError, match="0.weight: a LoRA parametrization without its 0.lora_B tensor"):
        lora.lora_groups({k: v for k, v in state.items() if not k.endswith("lora_B")})


def test_lora_module_names():
    assert lora.parse_modules("q,v") == ["q", "v"]
    assert lora.parse_modules(" FC1 , q,fc1 ") == ["fc1", "q"]
    with pytest.raises(ConfigError, match=r"^--lora-modules 'q,query': unknown module 'query'; choose from "
                                          r"q,k,v,out,fc1,fc2"):
        lora.parse_modules("q,query")
    with pytest.raises(ConfigError, match="names no module"):
        lora.parse_modules(" , ")


# --------------------------------------------------------------------------- the model, in process
def _build(tiny, *extra, seed=SEED):
    """Model and task as fairseq-train builds them (seeded the same way; the task registers the head)."""
    return build_tiny(tiny, *extra, seed=seed)


def _load(model, state, cfg):
    model.load_state_dict(dict(state), strict=True, model_cfg=cfg)  # fairseq's path: upgrade, then torch's load
    return model



def _outputs(model, toks):
    model.eval()
    with torch.no_grad():
        feats, extra = model(toks, features_only=True, return_all_hiddens=True)
        return [feats, *extra["inner_states"], model(toks, classification_head_name=HEAD)[0]]


def _base_name(k):
    return k.replace(".parametrizations.weight.original", ".weight")


@pytest.fixture(scope="module")
def pretrained(tiny):
    return load_ckpt(tiny.pretrained)["model"]


@pytest.fixture(scope="module")
def fresh(tiny):
    """fairseq's RoBERTa (tiny), built as fairseq-train builds it at the run's seed: the fresh init."""
    return _build(tiny)


def test_no_flag_model_is_fairseqs_roberta(tiny, fresh):
    from fairseq.models.roberta import RobertaModel

    from recadam_fairseq.models.roberta_ft import RobertaFtModel

    rob, _, _ = fresh
    ft, _, _ = _build(tiny, *TINY_FT)
    assert type(ft) is RobertaFtModel and isinstance(ft, RobertaModel)
    a, b = rob.state_dict(), ft.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)  # same names, same random numbers
    assert [n for n, p in ft.named_parameters() if p.requires_grad] == [n for n, _ in rob.named_parameters()]


def test_fresh_lora_computes_the_pretrained_model(tiny, fresh, pretrained):
    rob, task, cfg = fresh
    rob = _load(_build(tiny)[0], pretrained, cfg)
    model, _, mcfg = _build(tiny, *TINY_FT, "--lora-rank", "4", "--lora-alpha", "16", "--lora-modules",
                            "q,k,v,out,fc1,fc2")
    _load(model, pretrained, mcfg)
    model.classification_heads.load_state_dict(rob.classification_heads.state_dict())
    state = model.state_dict()
    for k, v in pretrained.items():  # every pretrained tensor, bit for bit, under its parametrized name
        key = k if k in state else k[:-len(".weight")] + ".parametrizations.weight.original"
        assert torch.equal(state[key], v), k
    lora_names = [k for k in state if ".parametrizations." in k and not k.endswith("original")]
    assert len(lora_names) == 2 * 6 * 3  # 2 layers × 6 modules × (A, B, scaling)
    assert all(float(state[k]) == 4.0 for k in lora_names if k.endswith("scaling"))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {k for k in lora_names if not k.endswith("scaling")} | {
        k for k in state if k.startswith("classification_heads.")}
    toks = random_tokens(task)[0]
    for got, want in zip(_outputs(model, toks), _outputs(rob, toks)):
        assert torch.equal(got, want)  # B = 0: exactly the pretrained function
    # B != 0 moves the outputs (attention's fast path reads the parametrized q/k/v/out weights) ...
    with torch.no_grad():
        for k, p in model.named_parameters():
            if k.endswith("lora_B"):
                p.normal_(0, 0.05)
    moved = _outputs(model, toks)
    assert (moved[0] - _outputs(rob, toks)[0]).abs().max() > 1e-3
    # ... and its state dict loads into a model without LoRA as the merged weights: same outputs
    plain, _, pcfg = _build(tiny, *TINY_FT)
    _load(plain, model.state_dict(), pcfg)
    assert all(torch.equal(a, b) for a, b in zip(_outputs(plain, toks), moved))


def test_reinit_replaces_the_top_layer_once(tiny, pretrained):
    model, _, cfg = _build(tiny, *TINY_FT, "--reinit-layers", "1")
    own = {k: v.clone() for k, v in model.state_dict().items()}
    state = _load(model, pretrained, cfg).state_dict()
    assert int(state["reinit_layers"]) == 1
    for k, v in state.items():
        if k.startswith(TOP):
            assert torch.equal(v, own[k]) and not torch.equal(v, pretrained[k]), k
        elif k in pretrained:
            assert torch.equal(v, pretrained[k]), k
    # the run's own checkpoint (it holds the marker) loads as it is
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    written = {k: v.clone() for k, v in model.state_dict().items()}
    again = _load(_build(tiny, *TINY_FT, "--reinit-layers", "1", seed=3)[0], written, cfg).state_dict()
    assert all(torch.equal(again[k], written[k]) for k in written)
    plain = _load(_build(tiny, *TINY_FT)[0], written, cfg).state_dict()  # without --reinit-layers: marker dropped
    assert "reinit_layers" not in plain and all(torch.equal(v, written[k]) for k, v in plain.items())


@pytest.mark.parametrize("flags, message", [
    (["--reinit-layers", "3"], "--reinit-layers 3: must be between 0 and the model's 2 encoder layers"),
    (["--reinit-layers", "-1"], "--reinit-layers -1: must be between 0"),
    (["--lora-rank", "-2"], r"--lora-rank -2: must be >= 1 \(0: LoRA off\)"),
    (["--lora-rank", "4", "--lora-alpha", "0"], r"--lora-alpha 0: must be > 0"),
    (["--lora-alpha", "16"], r"--lora-alpha has no effect without --lora-rank R"),
    (["--lora-modules", "q,k"], r"--lora-modules has no effect without --lora-rank R"),
    (["--lora-rank", "4", "--lora-modules", "q,ffn"], r"--lora-modules 'q,ffn': unknown module 'ffn'"),
    (["--lora-rank", "4", "--reinit-layers", "1"], r"--reinit-layers 1 with --lora-rank 4: LoRA freezes"),
    (["--lora-rank", "4", "--optimizer", "recadam"], r"--lora-rank 4 with --optimizer recadam: LoRA freezes"),
])
def test_bad_values_name_their_flag(tiny, flags, message):
    with pytest.raises(ConfigError, match="^" + message):
        _build(tiny, *TINY_FT, *flags)


# --------------------------------------------------------------------------- fairseq-train
def _copy_resume_point(src, dst, name="checkpoint_1_3.pt"):
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, name), os.path.join(dst, "checkpoint_last.pt"))


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("reinit_lora")
    d = {k: str(root / k) for k in ("plain", "ft", "reinit0", "reinit", "reinit_resumed", "lora", "lora_resumed",
                                    "fp16", "ranks", "bad")}
    reinit = [*TINY_FT, "--reinit-layers", "1", "--recadam-anneal-k", "0.5", "--recadam-anneal-t0", "6",
              "--finetune-from-model", tiny.pretrained, "--save-interval-updates", "3", "--keep-interval-updates", "-1"]
    lora_flags = [*TINY_FT, *LORA, *NO_DROPOUT, "--batch-size", "8"]

    def straight_then_resumed(name, flags, **kw):
        out = {name: tiny.train(d[name], *flags, **kw)[1]}
        _copy_resume_point(d[name], d[name + "_resumed"])
        kw = dict(kw, restore=False)
        extra = [] if "--finetune-from-model" in flags else ["--restore-file", os.path.join(d[name + "_resumed"],
                                                                                              "checkpoint_last.pt")]
        out[name + "_resumed"] = tiny.train(d[name + "_resumed"], *flags, *extra, **kw)[1]
        return out

    jobs = [
        lambda: {"plain": tiny.train(d["plain"], optimizer="adam", updates=2)[1]},
        lambda: {"ft": tiny.train(d["ft"], *TINY_FT, optimizer="adam", updates=2)[1]},
        lambda: {"reinit0": tiny.train(d["reinit0"], *TINY_FT, "--reinit-layers", "1", "--lr", "0", optimizer="adam",
                                       updates=1)[1]},
        lambda: straight_then_resumed("reinit", reinit, updates=6, restore=False),
        lambda: straight_then_resumed("lora", [*lora_flags, "--update-freq", "2", "--save-interval-updates", "3",
                                               "--keep-interval-updates", "-1"], optimizer="adam", updates=6),
        lambda: {"fp16": tiny.train(d["fp16"], *TINY_FT, *LORA, "--fp16", optimizer="adam", updates=2)[1]},
        lambda: {"ranks": tiny.ranks(d["ranks"], 2, *lora_flags, optimizer="adam", updates=6)},
        lambda: {"bad": tiny.train(d["bad"], *TINY_FT, "--lora-rank", "8", "--lora-modules", "q,query",
                                   optimizer="adam", check=False)},
    ]
    return d, run_jobs(jobs)


def _model(save, name="checkpoint_last.pt"):
    return load_ckpt(os.path.join(save, name))["model"]


def _lines(log, what="roberta_ft: "):
    return [ln for ln in log.splitlines() if what in ln]


def _same_run(a, b):
    """Same weights and optimizer state, bit for bit."""
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    sa, sb = a["last_optimizer_state"]["state"], b["last_optimizer_state"]["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    for i in sa:
        for n, v in sa[i].items():
            assert (torch.equal(v, sb[i][n]) if torch.is_tensor(v) else v == sb[i][n]), (i, n)


def test_no_flag_trains_as_fairseqs_roberta(runs, pretrained):
    d, logs = runs
    a, b = _model(d["plain"]), _model(d["ft"])
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    loss = re.compile(r"train_inner \| .* loss=([\d.]+),")
    assert loss.findall(logs["plain"]) == loss.findall(logs["ft"]) and len(loss.findall(logs["ft"])) == 2
    assert not torch.equal(a[TOP + "fc1.weight"], pretrained[TOP + "fc1.weight"])  # it trained
    assert load_ckpt(os.path.join(d["ft"], "checkpoint_last.pt"))["cfg"]["model"].arch == "roberta_ft_tiny"


def test_reinit_top_layer_starts_from_the_fresh_init(runs, fresh, pretrained):
    d, logs = runs
    state = _model(d["reinit0"])  # adam at lr 0, one update: the weights as fairseq-train loaded them
    init = fresh[0].state_dict()
    top = [k for k in state if k.startswith(TOP)]
    assert len(top) == 16
    for k in top:
        assert torch.equal(state[k], init[k]) and not torch.equal(state[k], pretrained[k]), k
    for k, v in pretrained.items():
        if not k.startswith(TOP):
            assert torch.equal(state[k], v), k
    assert int(state["reinit_layers"]) == 1
    (line,) = _lines(logs["reinit0"])
    assert line.endswith("roberta_ft: --reinit-layers 1: encoder.sentence_encoder.layers.1 re-initialised (16 "
                         "tensors, 33,472 elements, BERT's init as a fresh model), not loaded from the checkpoint; "
                         "--optimizer recadam treats them as new (plain Adam, not pulled toward θ*)")
    assert sum(init[k].numel() for k in top) == 33472


def test_reinit_with_recadam_anchors_the_rest_and_resumes_exactly(runs, fresh, pretrained):
    d, logs = runs
    m = re.search(r"recadam: pretrained weights θ\* from --finetune-from-model \S+: anchored (\d+) tensors "
                  r"\([\d,]+ elements\); not anchored, plain Adam: (\d+) tensors \([\d,]+ elements\): (.*)$",
                  logs["reinit"], re.M)
    assert m, logs["reinit"][-3000:]
    free = m.group(3).strip().split(", ")
    params = [k for k, _ in fresh[0].named_parameters()]  # the tied lm_head.weight once
    assert sorted(free) == sorted(k for k in params if k.startswith((TOP, "classification_heads.")))
    assert int(m.group(1)) == len([k for k in params if k in pretrained and not k.startswith(TOP)])
    assert len(_lines(logs["reinit"], "layers.1 re-initialised (")) == 1
    # relaunched from its checkpoint after 3 updates: loaded as it is, then the same run bit for bit
    assert not _lines(logs["reinit_resumed"], "layers.1 re-initialised (")
    assert _lines(logs["reinit_resumed"], "roberta_ft: the checkpoint was written by a --reinit-layers 1 run: "
                                          "loaded as it is")
    assert "θ* restored from the checkpoint's optimizer state" in logs["reinit_resumed"]
    _same_run(load_ckpt(os.path.join(d["reinit"], "checkpoint_last.pt")),
              load_ckpt(os.path.join(d["reinit_resumed"], "checkpoint_last.pt")))


def test_lora_trains_only_a_b_and_the_head(runs, pretrained):
    d, logs = runs
    mid, last = _model(d["lora"], "checkpoint_1_3.pt"), _model(d["lora"])
    for k, v in last.items():
        if k in pretrained or _base_name(k) in pretrained:
            assert torch.equal(v, pretrained[_base_name(k)]), k  # frozen, bit for bit
    moved = {k for k in last if not torch.equal(last[k], mid[k])}
    trained = {k for k in last if k.endswith(("lora_A", "lora_B")) or k.startswith("classification_heads.")}
    assert moved == trained and len(trained) == 2 * 4 * 2 + 4
    # A [4, in], B [out, 4] on q, v, out (64 × 64) and fc2 (64 × 128), 2 layers: 4,608; the head: 4,290
    assert "num. trained: 8,898)" in logs["lora"]
    assert _lines(logs["lora"], "roberta_ft: 8 pretrained weights frozen under LoRA")


def test_lora_merged_checkpoint_loads_in_plain_fairseq(runs, tiny, tmp_path, pretrained):
    from fairseq import checkpoint_utils
    from fairseq.models.roberta import RobertaModel

    d, _ = runs
    merged = str(tmp_path / "merged.pt")
    script = merge_lora
    script.main([os.path.join(d["lora"], "checkpoint_last.pt"), merged])  # in process
    with pytest.raises(SystemExit, match=r"pretrained.pt: not a LoRA checkpoint"):
        script.main([tiny.pretrained, str(tmp_path / "x.pt")])
    refusal = code_carrying(tmp_path / "code.pt", tmp_path / "payload-ran")
    with pytest.raises(SystemExit) as e:
        script.main([str(tmp_path / "code.pt"), str(tmp_path / "x.pt")])
    assert str(e.value) == f"merge_lora.py: error: {tmp_path / 'code.pt'}: {refusal}"
    assert not (tmp_path / "payload-ran").exists() and not (tmp_path / "x.pt").exists()
    state = load_ckpt(merged)
    assert not lora.is_lora_state(state["model"]) and "last_optimizer_state" not in state
    assert state["cfg"]["model"].arch == "roberta" and not hasattr(state["cfg"]["model"], "lora_rank")
    assert set(state["model"]) == set(pretrained) | {k for k in state["model"] if k.startswith("classification_heads.")}
    over = {"data": tiny.cls_bin}
    last = os.path.join(d["lora"], "checkpoint_last.pt")
    (unmerged,), _, task = checkpoint_utils.load_model_ensemble_and_task([last], arg_overrides=over)
    (plain,), _, _ = checkpoint_utils.load_model_ensemble_and_task([merged], arg_overrides=over)
    assert type(plain) is RobertaModel and type(unmerged).__name__ == "RobertaFtModel"
    toks = random_tokens(task)[0]
    got, want = _outputs(plain, toks), _outputs(unmerged, toks)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    base = _load(_build(tiny)[0], pretrained, None)  # LoRA moved the function: the comparison is not vacuous
    assert (_outputs(base, toks)[0] - want[0]).abs().max() > 1e-4
    # WiSE-FT of a LoRA run interpolates its merged weights: α = 1 is the merged model, 0.5 the mean with θ*
    outs = [str(tmp_path / f"wise{a}.pt") for a in ("1", "0.5")]
    for a, out in zip(("1", "0.5"), outs):
        assert wise.main([last, "--pretrained", tiny.pretrained, "--alpha", a, "--out", out]) == 0
    one, half = (load_ckpt(o)["model"] for o in outs)
    assert all(torch.equal(one[k], v) for k, v in state["model"].items())
    q = "encoder.sentence_encoder.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(state["model"][q], pretrained[q])  # B·A moved it
    assert torch.allclose(half[q].double(), (pretrained[q].double() + state["model"][q].double()) / 2, atol=1e-7)
    (wplain,), _, _ = checkpoint_utils.load_model_ensemble_and_task([outs[0]], arg_overrides=over)
    assert type(wplain) is RobertaModel and all(torch.equal(a, b) for a, b in zip(_outputs(wplain, toks), want))


def test_lora_resume_is_bit_exact(runs):
    d, logs = runs
    assert not _lines(logs["lora_resumed"], "frozen under LoRA")  # its own checkpoint: A, B loaded, not fresh
    _same_run(load_ckpt(os.path.join(d["lora"], "checkpoint_last.pt")),
              load_ckpt(os.path.join(d["lora_resumed"], "checkpoint_last.pt")))


def test_lora_with_fp16(runs, pretrained, name="fp16"):
    """fairseq's flat fp32 master copy holds A, B and the head only; the frozen tensors stay as loaded."""
    d, logs = runs
    losses = [float(x) for x in re.findall(r"train_inner \| .* loss=([\d.]+),.*loss_scale=", logs[name])]
    assert len(losses) == 2 and all(np.isfinite(losses))
    state = _model(d[name])
    for k, v in pretrained.items():
        key = k if k in state else k[:-len(".weight")] + ".parametrizations.weight.original"
        assert torch.equal(state[key], v.half()), k
    assert all(state[k].any() for k in state if k.endswith("lora_B"))


def test_lora_two_ranks_equal_update_freq_two(runs, pretrained):
    d, _ = runs
    two, one = _model(d["ranks"]), _model(d["lora"])
    assert list(two) == list(one)
    assert all(torch.allclose(two[k].double(), one[k].double(), rtol=0, atol=ATOL) for k in one)
    b = [k for k in one if k.endswith("lora_B")]
    assert min(one[k].abs().max().item() for k in b) > 100 * ATOL  # B moved from 0: not vacuous


def test_bad_flag_stops_with_one_line(runs):
    d, logs = runs
    assert_one_line_error(logs["bad"], d["bad"], "--lora-modules 'q,query': unknown module 'query'; choose from "
                          "q,k,v,out,fc1,fc2 (comma-separated)")
