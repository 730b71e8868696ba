"""The fairseq adapter in-process: config from fairseq's own parser, bad input, anchor binding."""

import dataclasses

import pytest
import torch
from fairseq.optim import build_optimizer

from helpers import Net, Toy, code_carrying, parse
from recadam_fairseq.core.anchor import AnchorError
from recadam_fairseq.optim.fairseq_recadam import FairseqRecAdamConfig


def pretrained_file(tmp_path, **kw):
    torch.manual_seed(0)
    path = tmp_path / "pretrained.pt"
    torch.save({"model": Net(head=False, **kw).state_dict()}, path)
    return path


def test_every_flag_has_help_text():
    for f in dataclasses.fields(FairseqRecAdamConfig):
        if f.name == "_name":  # fairseq's registry name, not a flag
            continue
        interpolated = isinstance(f.default, str) and f.default.startswith("${")
        assert interpolated or f.metadata.get("help"), f.name


def test_flags_reach_the_core_optimizer(tmp_path):
    cfg = parse("--adam-betas", "(0.8, 0.9)", "--adam-eps", "1e-7", "--weight-decay", "0.1",
                "--recadam-anneal-fun", "linear", "--recadam-anneal-k", "0.2", "--recadam-anneal-t0", "30",
                "--recadam-anneal-w", "0.5", "--recadam-pretrain-cof", "100")
    net = Net()
    opt = build_optimizer(cfg.optimizer, list(net.parameters()))
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["eps"], g["weight_decay"]) == (1e-4, (0.8, 0.9), 1e-7, 0.1)
    assert (g["anneal_fun"], g["anneal_k"], g["anneal_t0"], g["anneal_w"], g["pretrain_cof"]) == ("linear", 0.2, 30, 0.5, 100)
    assert type(g["anneal_fun"]) is str  # a plain str pickles into checkpoints; fairseq's enum does not
    defaults = parse().optimizer
    assert (defaults.recadam_anneal_fun, defaults.recadam_anneal_k, defaults.recadam_anneal_t0,
            defaults.recadam_anneal_w, defaults.recadam_pretrain_cof, defaults.adam_eps) == ("sigmoid", 0.5, 250, 1.0, 5000.0, 1e-8)


@pytest.mark.parametrize("value,fused,graph", [("auto", None, False), ("on", True, False), ("off", False, False),
                                               ("cuda-graph", True, True)])
def test_fused_flag_reaches_the_core(value, fused, graph):
    cfg = parse("--recadam-fused", value)
    opt = build_optimizer(cfg.optimizer, list(Net().parameters()))
    assert opt.optimizer.fused is fused and opt.optimizer.cuda_graph is graph
    assert parse().optimizer.recadam_fused == "auto"
    # the graph's replays need the gradients at fixed addresses: zero_grad zeroes them in place, else frees them
    net = Net()
    opt = build_optimizer(cfg.optimizer, list(net.parameters()))
    net.head(net.encoder(torch.ones(2, 3))).sum().backward()
    where = [p.grad.data_ptr() for p in net.parameters()]
    opt.zero_grad()
    if graph:
        assert all(p.grad is not None and not p.grad.any() for p in net.parameters())
        net.head(net.encoder(torch.ones(2, 3))).sum().backward()
        assert [p.grad.data_ptr() for p in net.parameters()] == where
    else:
        assert all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize("flags,match", [
    (["--recadam-anneal-k=-1"], r"invalid --recadam-anneal-k=-1.0"),
    (["--recadam-pretrain-cof=-5"], r"invalid --recadam-pretrain-cof=-5.0"),
    (["--adam-eps=-1e-6"], r"invalid --adam-eps=-1e-06"),
    (["--adam-betas", "(0.9, 1.0)"], r"invalid --adam-betas=\(0.9, 1.0\)"),
    (["--recadam-anneal-fun", "linear", "--recadam-anneal-t0", "0"], r"invalid --recadam-anneal-t0=0.0.*linear"),
    (["--recadam-anneal-w=-1"], r"invalid --recadam-anneal-w=-1.0"),
    (["--lr", "1e-3", "--recadam-pretrain-cof", "5000", "--recadam-anneal-fun", "linear", "--recadam-anneal-t0", "2"],
     r"--lr 0.001 x --recadam-pretrain-cof 5000 x \(w - λ\(1\)\) = 2.5 >= 2.*below 4000"),
])
def test_bad_flags_fail_at_build_naming_the_flag(flags, match):
    cfg = parse(*flags)
    with pytest.raises(ValueError, match=match):
        build_optimizer(cfg.optimizer, list(Net().parameters()))


def test_no_pull_means_no_stability_limit():
    """constant λ = w: w − λ = 0, nothing pulls, any γ is fine (the fairseq-adam equivalence)."""
    cfg = parse("--lr", "1e-3", "--recadam-anneal-fun", "constant")
    build_optimizer(cfg.optimizer, list(Net().parameters()))


def test_bad_choice_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse("--recadam-anneal-fun", "cosine")
    assert "--recadam-anneal-fun" in capsys.readouterr().err


def test_binding_anchors_pretrained_names_only(tmp_path):
    path = pretrained_file(tmp_path)
    net = Net()
    net.load_state_dict(torch.load(path)["model"], strict=False)  # what --restore-file does
    cfg = parse(restore=path)
    opt = build_optimizer(cfg.optimizer, list(net.parameters()))
    with pytest.raises(RuntimeError, match=r"step\(\) before all_reduce_grads"):
        opt.step()
    opt.all_reduce_grads(net)
    core = opt.optimizer
    assert torch.equal(core.anchor_of(net.encoder.weight), net.encoder.weight.detach())
    assert core.anchor_of(net.head.weight) is None and core.anchor_of(net.head.bias) is None
    assert core.anchor_of(net.encoder.weight).data_ptr() != net.encoder.weight.data_ptr()  # a copy


def test_pretrained_path_overrides_the_loaded_weights(tmp_path):
    path = pretrained_file(tmp_path)
    net = Net()  # random init: the authors' preferred strategy
    cfg = parse("--recadam-pretrained-path", str(path), "--recadam-anchor-dtype", "bf16")
    opt = build_optimizer(cfg.optimizer, list(net.parameters()))
    opt.all_reduce_grads(net)
    want = torch.load(path)["model"]["encoder.weight"]
    got = opt.optimizer.anchor_of(net.encoder.weight)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.bfloat16())


def test_anchor_source_reads_the_model_state_of_the_pretrained_file(tmp_path):
    """What the coupled criterion uses (it has no optimizer that read the file at build)."""
    from recadam_fairseq.plumbing.anchor_source import anchor_source

    path = pretrained_file(tmp_path)
    source, state, from_file = anchor_source(parse("--recadam-pretrained-path", str(path)).optimizer)
    assert from_file and set(state) == {"encoder.weight", "encoder.bias"}


@pytest.mark.parametrize("make,match", [
    (lambda p: None, r"--recadam-pretrained-path .*missing.pt: no such file"),
    (lambda p: p.write_bytes(b"\x00garbage" * 10), r"not a torch checkpoint .*; load only files you trust$"),
    (lambda p: torch.save({"weights": torch.zeros(2)}, p), r"not a fairseq checkpoint"),
    (lambda p: code_carrying(p, p.parent / "payload-ran"), r"missing.pt: refused: loading it would import posix.system"),
])
def test_bad_pretrained_file_fails_at_build(tmp_path, make, match):
    """θ*'s file (also the forgetting meter's: core.anchor.load_checkpoint), one line; a file carrying code never
    runs it."""
    path = tmp_path / "missing.pt"
    make(path)
    cfg = parse("--recadam-pretrained-path", str(path))
    with pytest.raises(AnchorError, match=match):
        build_optimizer(cfg.optimizer, list(Net().parameters()))
    assert not (tmp_path / "payload-ran").exists()


def test_every_file_torch_cannot_read_is_one_quiet_line(tmp_path):
    """core/checkpoint_file.py, every reader's load: a pickle of protocol 4 that carries code (torch's
    weights-only unpickler reads protocol 2 only) is refused without torch's two-line warning and never runs; a
    text file is no torch checkpoint in plain words (torch's own: KeyError: 101)."""
    import pickle
    import warnings

    from helpers import _Payload
    from recadam_fairseq.core.checkpoint_file import CheckpointFileError, load

    cases = {"raw4.pt": ("refused: a pickle torch.load's weights-only mode does not read (Unsupported operand 149; "
                         "torch.save writes protocol 2); load only files you trust"),
             "notes.pt": "not a torch checkpoint (neither torch.save's zip nor a pickle); load only files you trust"}
    with open(tmp_path / "raw4.pt", "wb") as f:
        pickle.dump({"model": _Payload(f"touch {tmp_path / 'payload-ran'}")}, f, protocol=4)
    (tmp_path / "notes.pt").write_text("hello\n")
    for name, says in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(CheckpointFileError) as e:
                load(str(tmp_path / name), name)
        assert str(e.value) == f"{name}: {says}"
    assert not (tmp_path / "payload-ran").exists()


def test_truncated_checkpoint_fails_at_build(tmp_path):
    path = pretrained_file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    cfg = parse("--recadam-pretrained-path", str(path))
    with pytest.raises(AnchorError, match=r"pretrained.pt: cut short \(no zip directory at its end\)"):
        build_optimizer(cfg.optimizer, list(Net().parameters()))


def test_model_and_checkpoint_disagree(tmp_path):
    path = pretrained_file(tmp_path, width=5)
    net = Net(width=3)
    cfg = parse("--recadam-pretrained-path", str(path))
    opt = build_optimizer(cfg.optimizer, list(net.parameters()))
    with pytest.raises(AnchorError, match=r"parameter encoder.weight has shape \(4, 5\) in the pretrained checkpoint but \(4, 3\) in the model"):
        opt.all_reduce_grads(net)

    other = tmp_path / "other.pt"
    torch.save({"model": {"decoder.embed.weight": torch.zeros(3)}}, other)
    cfg = parse("--recadam-pretrained-path", str(other))
    opt = build_optimizer(cfg.optimizer, list(net.parameters()))
    with pytest.raises(AnchorError, match=r"no parameter in common with the model .*wrong file"):
        opt.all_reduce_grads(net)


def test_bad_value_from_a_hydra_yaml_names_the_config_key():
    """fairseq-hydra-train merges the yaml into the same config nodes the flags fill."""
    from omegaconf import OmegaConf

    cfg = parse()
    yaml = OmegaConf.create("optimizer:\n  recadam_anneal_k: -0.5\n  recadam_pretrain_cof: 1000\n")
    cfg.optimizer = OmegaConf.merge(cfg.optimizer, yaml.optimizer)
    with pytest.raises(ValueError, match=r"invalid --recadam-anneal-k=-0.5 \(optimizer.recadam_anneal_k\)"):
        build_optimizer(cfg.optimizer, list(Net().parameters()))


def test_non_finite_gradients_never_reach_the_anchor(tmp_path):
    """fairseq sees the non-finite norm and stops (fp32) before stepping; θ* stays as built even if
    a step ran on such gradients."""
    path = pretrained_file(tmp_path)
    net = Net()
    net.load_state_dict(torch.load(path)["model"], strict=False)
    opt = build_optimizer(parse(restore=path).optimizer, list(net.parameters()))
    for p in net.parameters():
        p.grad = torch.full_like(p, float("nan"))
    opt.all_reduce_grads(net)
    assert not torch.isfinite(opt.clip_grad_norm(0.0))  # what fairseq's Trainer checks
    before = opt.optimizer.anchor_of(net.encoder.weight).clone()
    opt.step()
    assert torch.isnan(net.encoder.weight).all()
    assert torch.equal(opt.optimizer.anchor_of(net.encoder.weight), before)


# --------------------------------------------------------------------------- θ*'s source (plumbing/anchor_source.py)
def test_recadam_checkpoints_are_told_by_the_components_with_recadam_flags():
    """A checkpoint is fine-tuned by recadam when its optimizer or criterion takes the --recadam-* flags
    (R-Drop's criterion included): the registries say which, no list of names to keep up to date."""
    from recadam_fairseq.plumbing.anchor_source import recadam_components, recadam_updates

    assert recadam_components() == {"FairseqRecAdam", "SentencePredictionRecAdamCriterion", "GlueMultitaskCriterion",
                                     "SentencePredictionR3FCriterion", "SentencePredictionRDropCriterion",
                                     "LabelSmoothedCrossEntropyRecAdamCriterion"}

    def written_by(**names):
        last = {"optimizer_name": "FairseqAdam", "criterion_name": "SentencePredictionCriterion", **names}
        return {"optimizer_history": [{**last, "num_updates": 7}]}

    assert recadam_updates({}) == recadam_updates(written_by()) == 0
    assert recadam_updates(written_by(optimizer_name="FairseqRecAdam")) == 7
    assert recadam_updates(written_by(criterion_name="SentencePredictionRDropCriterion")) == 7


def test_the_anchor_leaves_fairseqs_loggers_as_they_are(tmp_path, caplog):
    """core/anchor.py touches no logger; the adapter re-runs the model's upgrade with the models' logger
    (fairseq.models) at errors only, and puts its level back. fairseq's own logger is never changed."""
    import inspect
    import logging

    from recadam_fairseq.core import anchor as core_anchor

    assert "logging" not in inspect.getsource(core_anchor)
    seen = []

    class Upgrading(Net):
        def upgrade_state_dict_named(self, state, name):
            seen.append((logging.getLogger("fairseq").level, logging.getLogger("fairseq.models.toy").getEffectiveLevel()))
            logging.getLogger("fairseq.models.toy").info("upgraded once more")
            logging.getLogger("fairseq.models.toy").error("an error still shows")

    path = pretrained_file(tmp_path)
    net = Upgrading()
    net.load_state_dict(torch.load(path)["model"], strict=False)
    fairseq_log, models_log = logging.getLogger("fairseq"), logging.getLogger("fairseq.models")
    before = fairseq_log.level, models_log.level
    fairseq_log.setLevel(logging.INFO)
    caplog.set_level(logging.INFO)
    try:
        opt = build_optimizer(parse(restore=path).optimizer, list(net.parameters()))
        opt.all_reduce_grads(net)
        assert seen == [(logging.INFO, logging.ERROR)]
        assert (fairseq_log.level, models_log.level) == (logging.INFO, before[1])
    finally:
        fairseq_log.setLevel(before[0])
    assert "an error still shows" in caplog.text and "upgraded once more" not in caplog.text
    assert opt.optimizer.anchor_of(net.encoder.weight) is not None


# --------------------------------------------------------------------------- the listeners' order (plumbing/events.py)
ALL_LISTENERS = ["--sam-type", "sam", "--child-tuning", "F", "--layer-lr-decay", "0.9"]


def build_with_listeners(monkeypatch, tmp_path, optimizer, *flags):
    """(optimizer, model, the first-call callbacks it registered): fairseq's config, no global hook left."""
    from recadam_fairseq.plumbing import events

    first_calls = []
    monkeypatch.setattr(events, "on_first_training_call", first_calls.append)
    model = Toy()  # RoBERTa's names: what LLRD and ChildTuning read
    path = tmp_path / "pretrained.pt"
    torch.save({"model": {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}}, path)
    cfg = parse("--optimizer", optimizer, "--restore-file", str(path), *flags)
    return build_optimizer(cfg.optimizer, list(model.parameters())), model, first_calls


@pytest.mark.parametrize("optimizer,keys", [("recadam", ["child_tuning", "sam", "anchoring", "layer_lr"]),
                                            ("samsgd", ["child_tuning", "sam", "layer_lr"])])
def test_listeners_run_in_the_declared_order(monkeypatch, tmp_path, optimizer, keys):
    """Every event reaches the listeners in the order events.LISTENERS declares."""
    import functools

    from recadam_fairseq.plumbing.events import LISTENERS

    opt, model, _ = build_with_listeners(monkeypatch, tmp_path, optimizer, *ALL_LISTENERS)
    assert [k for k, _ in opt.listeners()] == keys == [k for k in LISTENERS if k in keys]
    seen = []

    def logged(key, event, fn, *args):
        seen.append((event, key))
        return fn(*args)

    for key, listener in opt.listeners():
        for event in ("before_reduce", "after_reduce", "before_step", "after_step"):
            if hasattr(listener, event):
                setattr(listener, event, functools.partial(logged, key, event, getattr(listener, event)))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.all_reduce_grads(model)
    opt.step()
    for event in ("before_reduce", "after_reduce", "before_step", "after_step"):
        ran = [k for e, k in seen if e == event]
        assert ran == [k for k in keys if k in ran], (event, ran)
    assert [k for e, k in seen if e == "before_reduce"] == keys  # each binds at the first reduction


def test_first_call_hooks_follow_the_listeners_order(monkeypatch, tmp_path):
    """ChildTuning-D's Fisher passes run before SAM's first pass 1 moves θ: their first-call hooks are
    registered as the listeners are added."""
    opt, _, first_calls = build_with_listeners(monkeypatch, tmp_path, "recadam", "--sam-type", "sam",
                                               "--child-tuning", "D")
    child_tuning = dict(opt.listeners())["child_tuning"]
    assert [getattr(f, "__self__", None) for f in first_calls] == [child_tuning, None]
    assert first_calls[1].__qualname__.startswith("connect.")  # sam_support's


def test_listen_refuses_an_undeclared_key_or_another_order(monkeypatch, tmp_path):
    opt, _, _ = build_with_listeners(monkeypatch, tmp_path, "recadam")
    with pytest.raises(ValueError, match="'norm_clip': not in events.LISTENERS"):
        opt.listen("norm_clip", object())
    with pytest.raises(ValueError, match=r"'sam' added after \['anchoring'\]"):
        opt.listen("sam", object())
