"""The tests' one helper layer: paths, shared flags, fairseq-train launches (one rank or N), the run plan
that spreads launches over the two xdist workers' cores, and the comparisons of saved runs.

Test modules import from here and from conftest's fixtures only: no test module imports another.
"""

import contextlib
import math
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Iterable, List, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/helpers/ -> the repository
USER_DIR = os.path.join(ROOT, "recadam_fairseq")
SCRIPTS = os.path.join(ROOT, "scripts")
TRAIN_ENTRY = os.path.join(ROOT, "tests", "train_entry.py")  # fairseq-train, --fp16 usable on CPU

# ----------------------------------------------------------------------------- flags every module shares
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # runs side by side on CI's 2 cores: no thread oversubscription
ADAM_W0 = ["--recadam-anneal-w", "0"]  # --optimizer recadam at w = 0: fairseq's adam bit for bit, with listeners
# RecAdam on the tiny model: lr 1e-3 needs lr·γ < 2; λ(t) crosses 1/2 at update 6 of 12
RECADAM = ["--recadam-anneal-k", "0.5", "--recadam-anneal-t0", "6", "--recadam-pretrain-cof", "500"]
# N ranks against one rank with --update-freq N: dropout off, so that both see the same computation up to the
# order of the gradient reduction
DIST_FLAGS = [*RECADAM, *NO_DROPOUT, "--batch-size", "8", "--log-format", "json", "--log-interval", "4"]
TINY_FT = ["--arch", "roberta_ft_tiny"]  # after TINY_ARCH: the last --arch wins, sizes agree
TINY_CA_MTL = ["--arch", "ca_mtl_roberta_tiny"]
LORA = ["--lora-rank", "4", "--lora-alpha", "16", "--lora-modules", "q,v,out,fc2"]


# ----------------------------------------------------------------------------- reading runs
def load_ckpt(path):
    import recadam_fairseq.safe_globals  # noqa: F401  (fairseq's checkpoint types)

    return torch.load(path, map_location="cpu", weights_only=True)


def json_records(log, kind):
    """fairseq --log-format json records of one kind (train_inner, valid, train) in a log's text."""
    from recadam_fairseq.engine.fairseq_log import parse_log_lines

    return parse_log_lines(log.splitlines())[kind]


def load_model(ckpt_path):
    """(the model, its task) as fairseq builds them from a checkpoint."""
    from fairseq import checkpoint_utils

    import recadam_fairseq.safe_globals  # noqa: F401

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(ckpt_path)])
    return models[0], task


def trainable_names(ckpt_path):
    """The order fairseq hands parameters to the optimizer (= optimizer state indices; tied tensors once)."""
    return [n for n, p in load_model(ckpt_path)[0].named_parameters() if p.requires_grad]


def anchors(opt_state):
    return [st["anchor"] for st in opt_state["state"].values() if "anchor" in st]


# ----------------------------------------------------------------------------- config in-process
def parse_config(*argv):
    """fairseq-train's command line -> its OmegaConf config, as fairseq-train builds it."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), list(argv)))


def parse(*flags, restore=None):
    """A recadam config on a toy task and model (fairseq's dummy_lm, transformer_lm), for in-process checks."""
    argv = ["--task", "dummy_lm", "--arch", "transformer_lm", "--user-dir", USER_DIR,
            "--optimizer", "recadam", "--lr", "1e-4", "--cpu", *flags]
    if restore:
        argv += ["--restore-file", str(restore)]
    return parse_config(*argv)


class Net(torch.nn.Module):
    """A pretrained 'encoder' and a new 'head', as in fine-tuning."""

    def __init__(self, head=True, width=3):
        super().__init__()
        self.encoder = torch.nn.Linear(width, 4)
        if head:
            self.head = torch.nn.Linear(4, 2)


class Toy(torch.nn.Module):
    """RoBERTa's names: 2 encoder layers, embeddings, a head."""

    def __init__(self):
        super().__init__()
        se = torch.nn.Module()
        se.embed_tokens = torch.nn.Embedding(5, 3)
        se.layers = torch.nn.ModuleList([torch.nn.Linear(3, 4), torch.nn.Linear(4, 3)])
        self.encoder = torch.nn.Module()
        self.encoder.sentence_encoder = se
        self.head = torch.nn.Linear(3, 2)


def random_tokens(task, bsz=6, seed=0):
    """(rows of different lengths, right padded, bos ... eos, from the task's dictionary; their lengths)."""
    d = task.source_dictionary
    g = torch.Generator().manual_seed(seed)
    lengths = [9, 4, 7, 12, 6, 12][:bsz]
    toks = torch.full((bsz, max(lengths)), d.pad())
    for i, n in enumerate(lengths):
        toks[i, :n] = torch.randint(d.nspecial, len(d), (n,), generator=g)
        toks[i, 0], toks[i, n - 1] = d.bos(), d.eos()
    return toks, lengths


def build_tiny(tiny, *extra, seed=None, tasks=None):
    """The tiny classifier's (model, task, model config) as fairseq-train builds them (the task registers the
    head); ``extra``: more flags (--arch roberta_ft_tiny, ...); ``seed``: the RNG state the model is built with;
    ``tasks``: the task names --task glue_multitask would expose (CA-MTL's conditioned layers)."""
    from fairseq import tasks as fairseq_tasks

    from recadam_fairseq.tiny import make_tiny_roberta

    cfg = parse_config(tiny.cls_bin, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                       "--num-classes", "2", "--cpu", "--user-dir", USER_DIR, *make_tiny_roberta.TINY_ARCH, *extra)
    task = fairseq_tasks.setup_task(cfg.task)
    if tasks:
        task.mt_task_names = tasks
    if seed is None:
        return task.build_model(cfg.model), task, cfg.model
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return task.build_model(cfg.model), task, cfg.model


# ----------------------------------------------------------------------------- the core's float64 reference
F64 = dict(dtype=torch.float64)


def ref_lambda(fun, t, k, t0, w):
    """λ(t), computed independently of the implementation (torch's float64 sigmoid)."""
    if fun == "sigmoid":
        return w * torch.sigmoid(torch.tensor(k * (t - t0), dtype=torch.float64)).item()
    if fun == "linear":
        return min(1.0, t / t0) * w
    return w


class RefRecAdam:
    """The issue's equations as a plain per-tensor loop, one Python float op at a time."""

    def __init__(self, groups):
        # groups: list of dicts with params (float64 tensors), pretrain (list or None) and hparams
        self.groups = groups
        self.state = {}

    def step(self, grads):
        for gi, group in enumerate(self.groups):
            b1, b2 = group["betas"]
            for i, p in enumerate(group["params"]):
                g = grads[gi][i]
                if g is None:
                    continue
                st = self.state.setdefault((gi, i), {"t": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p)})
                st["t"] += 1
                t = st["t"]
                st["m"] = b1 * st["m"] + (1 - b1) * g
                st["v"] = b2 * st["v"] + (1 - b2) * g * g
                lr = group["lr"]
                s = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t) if group["correct_bias"] else lr
                anchor = None if group["pretrain"] is None else group["pretrain"][i]
                w = group["anneal_w"]
                upd = st["m"] / (st["v"].sqrt() + group["eps"])
                if anchor is not None and w > 0:
                    lam = ref_lambda(group["anneal_fun"], t, group["anneal_k"], group["anneal_t0"], w)
                    p_new = p - s * lam * upd
                    p_new = p_new - lr * (w - lam) * group["pretrain_cof"] * (p_new - anchor)
                else:
                    p_new = p - s * upd
                if group["weight_decay"] > 0:
                    p_new = p_new - lr * group["weight_decay"] * p_new
                p.copy_(p_new)


HP = dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0, correct_bias=True,
          anneal_fun="sigmoid", anneal_k=0.5, anneal_t0=4, anneal_w=1.0, pretrain_cof=30.0)

GROUP_SPECS = [
    dict(anneal_w=1.0),
    dict(anneal_w=0.0),                                   # plain Adam group (classifier-like)
    dict(anneal_w=0.6, weight_decay=0.05, anneal_fun="linear", anneal_t0=5),
    dict(anneal_w=1.0, correct_bias=False, anneal_fun="constant"),
    dict(anneal_w=1.0, anneal_k=1.0, anneal_t0=1000),     # λ≈0 for the whole run: pure recall
]
CORE_SHAPES = [(3, 4), (5,), (2, 3, 2)]


def make_problem(seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for spec in GROUP_SPECS:
        h = dict(HP, **spec)
        params = [torch.randn(s, generator=gen, **F64).to(dtype) for s in CORE_SHAPES]
        pretrain = [p + 0.3 * torch.randn(p.shape, generator=gen, **F64).to(dtype) for p in params]
        groups.append(dict(h, params=params, pretrain=pretrain))
    return groups, gen


def grads_for(groups, gen, step):
    out = []
    for gi, group in enumerate(groups):
        gs = []
        for i, p in enumerate(group["params"]):
            # some tensors have no gradient on some steps: their own t must lag
            gs.append(None if (3 * i + gi + step * step) % 5 == 0 else torch.randn(p.shape, generator=gen, **F64).to(p.dtype))
        out.append(gs)
    return out


def run_pair(foreach, steps=12, fused=False):
    """RecAdam (``foreach``, ``fused``) and the reference loop on the same problem: (params, reference params,
    the optimizer)."""
    from recadam_fairseq import RecAdam

    groups, gen = make_problem()
    ref_groups = [dict(g, params=[p.clone() for p in g["params"]]) for g in groups]
    ref = RefRecAdam(ref_groups)
    torch_params = [[torch.nn.Parameter(p.clone()) for p in g["params"]] for g in groups]
    opt = RecAdam(
        [dict({k: v for k, v in g.items() if k not in ("params", "pretrain")},
              params=tp, pretrain_params=g["pretrain"]) for g, tp in zip(groups, torch_params)],
        foreach=foreach, fused=fused,
    )
    for step in range(steps):
        grads = grads_for(groups, gen, step)
        if step == 5:  # lr changed between steps, as a scheduler does
            for g in opt.param_groups:
                g["lr"] *= 0.5
            for g in ref_groups:
                g["lr"] *= 0.5
        for tp, gs in zip(torch_params, grads):
            for p, g in zip(tp, gs):
                p.grad = None if g is None else g.clone()
        opt.step()
        ref.step(grads)
    return torch_params, [g["params"] for g in ref_groups], opt


# ----------------------------------------------------------------------------- fairseq's fp16 wrappers, in-process
FP16_STEPS = 6
FP16_HP = dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01, anneal_fun="sigmoid",
               anneal_k=0.5, anneal_t0=3, anneal_w=1.0, pretrain_cof=50.0)
FP16_FLAGS = ["--lr", "1e-2", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-6", "--weight-decay", "0.01",
              "--recadam-anneal-k", "0.5", "--recadam-anneal-t0", "3", "--recadam-pretrain-cof", "50",
              "--fp16-init-scale", "1", "--fp16-scale-window", "1000"]
FP16_MODES = {
    "fp16-flat": ["--fp16"],
    "fp16-per-param": ["--fp16", "--fp16-no-flatten-grads"],
    "memory-efficient-fp16": ["--fp16", "--memory-efficient-fp16"],
    # fairseq never flattens bf16 and keeps no loss scale; in fairseq-train --bf16 also means --tpu
    # (fairseq 0.12's options.py), so these layouts are reachable in-process only, off a TPU
    "bf16": ["--bf16"],
    "memory-efficient-bf16": ["--memory-efficient-bf16"],
}
FP16_HALF = {mode: torch.bfloat16 if "bf16" in mode else torch.float16 for mode in FP16_MODES}


def fp16_grads(gen, net):
    return [torch.randn(p.shape, generator=gen) for p in net.parameters()]


def run_wrapper(mode, tmp_path, anchor_dtype="fp32", device="cpu", extra=()):
    """recadam inside fairseq's fp16 wrapper of ``mode`` (FP16_MODES), in-process: Net with a pretrained encoder,
    FP16_STEPS steps on fixed half-rounded gradients. Returns (the net, the wrapper)."""
    from fairseq import optim

    torch.manual_seed(0)
    pre = Net(head=False)
    restore = tmp_path / "pre.pt"
    torch.save({"model": pre.state_dict()}, restore)
    torch.manual_seed(1)
    net = Net()
    net.load_state_dict(pre.state_dict(), strict=False)
    net = net.to(device, FP16_HALF[mode])
    cfg = parse(*FP16_FLAGS, *FP16_MODES[mode], "--recadam-anchor-dtype", anchor_dtype, *extra, restore=restore)
    params = list(net.parameters())
    if mode.startswith("memory-efficient"):
        opt = optim.MemoryEfficientFP16Optimizer.build_optimizer(cfg, params)
    else:
        opt = optim.FP16Optimizer.build_optimizer(cfg, params)
    gen = torch.Generator().manual_seed(5)
    for _ in range(FP16_STEPS):
        opt.zero_grad()
        for p, g in zip(params, fp16_grads(gen, net)):
            p.grad = g.to(device, FP16_HALF[mode])
        opt._needs_sync = True  # what opt.backward(loss) records: fp16 grads are copied to fp32 at step()
        opt.all_reduce_grads(net)
        opt.step()
    return net, opt


def flat_params(net):
    """Every parameter of ``net`` in fp32, back to back."""
    return torch.cat([p.detach().float().reshape(-1) for p in net.parameters()])


# ----------------------------------------------------------------------------- fairseq's own small models, in-process
def criterion(name="sentence_prediction_r3f", **over):
    """A registered criterion ``name`` built in-process from its config dataclass (``over``: its fields)."""
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY

    cfg = CRITERION_DATACLASS_REGISTRY[name](**over)
    return CRITERION_REGISTRY[name](cfg, task=type("Task", (), {})())


def stock_roberta(classes=3, dropout=0.0):
    """fairseq's own RobertaModel (roberta arch), tiny, no dropout by default: the clean and noised passes
    differ by the noise only."""
    from argparse import Namespace

    from fairseq.data import Dictionary
    from fairseq.models.roberta import RobertaModel

    d = Dictionary()
    for i in range(20):
        d.add_symbol(f"w{i}")
    args = Namespace(encoder_layers=2, encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=2,
                     max_positions=32, dropout=dropout, attention_dropout=dropout, activation_dropout=0.0,
                     pooler_dropout=dropout)
    torch.manual_seed(0)
    model = RobertaModel.build_model(args, type("Task", (), {"source_dictionary": d})())
    model.register_classification_head("sentence_classification_head", num_classes=classes)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(d.nspecial, len(d), (5, 9), generator=g)
    src[:, 0] = d.bos()
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((5,), 9)},
              "target": torch.randint(0, classes, (5,), generator=g), "ntokens": 45}
    return model.train(), sample


def transformer(dropout=0.3):
    """fairseq's own transformer, 1+1 layers of width 16, shared embeddings; a batch with padded targets."""
    from argparse import Namespace

    from fairseq.data import Dictionary
    from fairseq.models.transformer import TransformerModel, base_architecture

    d = Dictionary()
    for i in range(20):
        d.add_symbol(f"w{i}")
    args = Namespace(encoder_layers=1, decoder_layers=1, encoder_embed_dim=16, decoder_embed_dim=16,
                     encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32, encoder_attention_heads=2,
                     decoder_attention_heads=2, dropout=dropout, attention_dropout=dropout,
                     max_source_positions=32, max_target_positions=32, share_all_embeddings=True)
    base_architecture(args)
    task = type("Task", (), {"source_dictionary": d, "target_dictionary": d})()
    torch.manual_seed(0)
    model = TransformerModel.build_model(args, task)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(d.nspecial, len(d), (4, 6), generator=g)
    src[:, -1] = d.eos()
    target = torch.full((4, 5), d.pad())
    for i, n in enumerate((5, 2, 4, 3)):
        target[i, :n] = torch.randint(d.nspecial, len(d), (n,), generator=g)
        target[i, n - 1] = d.eos()
    prev = torch.full_like(target, d.pad())
    prev[:, 0] = d.eos()
    prev[:, 1:] = target[:, :-1].masked_fill(target[:, :-1] == d.eos(), d.pad())
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((4,), 6), "prev_output_tokens": prev},
              "target": target, "ntokens": int(target.ne(d.pad()).sum())}
    return model.train(), sample, task, d.pad()


# ----------------------------------------------------------------------------- launching fairseq-train
def free_port():
    """A TCP port free on this machine (for --distributed-init-method tcp://127.0.0.1:PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def distributed_args(world, rank, port, device="cpu", backend="legacy_ddp", one_gpu=False):
    """One rank's flags: CPU ranks over gloo; GPU ranks one card each over NCCL, or (``one_gpu``) all on cuda:0
    over gloo (NCCL refuses two ranks on one device)."""
    args = ["--distributed-world-size", str(world), "--distributed-rank", str(rank),
            "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn",
            "--device-id", str(rank if device == "cuda" and not one_gpu else 0), "--ddp-backend", backend]
    return args + (["--distributed-backend", "gloo"] if device == "cpu" or one_gpu else [])


def launch(argv_of_rank: Callable[[int], List[str]], save, world=1, env=None, cwd=None, timeout=600,
           entry=TRAIN_ENTRY, check=True, fresh=False):
    """fairseq-train once per rank (``argv_of_rank(rank)``: that rank's arguments, its distributed flags
    included), all at once; each rank's output in SAVE/rank<R>.log (one rank: SAVE/train.log). Returns
    [(returncode, log)] by rank; ``check``: every rank must succeed. Each rank forks from the tests' fork server
    (``fast_python()``); ``fresh``: a new interpreter for each rank."""
    os.makedirs(save, exist_ok=True)
    python = sys.executable if fresh else fast_python()
    env = dict(os.environ, **(env or {}))
    names = [os.path.join(save, "train.log" if world == 1 else f"rank{rank}.log") for rank in range(world)]
    procs = []
    for rank in range(world):
        with open(names[rank], "w") as f:
            procs.append(subprocess.Popen([python, entry, *argv_of_rank(rank)], stdout=f, stderr=subprocess.STDOUT,
                                          env=env, cwd=cwd))
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = [(p.returncode, open(name).read()) for name, p in zip(names, procs)]
    if check:
        for r, (rc, text) in enumerate(out):
            assert rc == 0, f"rank {r} of {save} failed ({rc}):\n{text[-4000:]}"
    return out


def launch_ranks(args, save, world, device="cpu", backend="legacy_ddp", one_gpu=False, **kw):
    """``args`` (a fairseq-train command without distributed flags) on ``world`` ranks; one rank: as given."""
    port = free_port()
    return launch(lambda r: list(args) + (distributed_args(world, r, port, device, backend, one_gpu) if world > 1
                                          else []), save, world, **kw)


def dumps(save, world):
    """What each rank ended with (RECADAM_DUMP_DIR=save, tests/train_entry.py): weights and optimizer state."""
    return [torch.load(os.path.join(save, f"rank{r}.pt"), map_location="cpu", weights_only=True) for r in range(world)]


def tiny_classifier_args(arch=True):
    """The tiny classifier's fairseq-train arguments, without the optimizer, save dir and data (``arch``: with its
    architecture flags)."""
    from recadam_fairseq.launch import recipe, tiny_train

    return [*tiny_train.CLASSIFIER, *recipe.TOKENS, *(tiny_train.ARCH["tiny"] if arch else [])]


class Tiny:
    """The session's tiny setup (tests/conftest.py's ``tiny`` fixture): its paths, and fairseq-train on it."""

    def __init__(self, root):
        self.root = str(root)
        self.pretrained = os.path.join(self.root, "pretrained.pt")
        self.cls_bin = os.path.join(self.root, "cls-bin")
        self.lm_bin = os.path.join(self.root, "lm-bin")
        self.glue_bin = os.path.join(self.root, "glue-bin")  # SST-2-bin, RTE-bin, STS-B-bin

    def finetune_args(self, save_dir, *extra, optimizer="recadam", updates=12, restore=True, validate=False,
                      device="cpu", data=None):
        from recadam_fairseq.launch import tiny_train

        # lr 1e-3 needs lr·γ < 2 for RecAdam (the authors' γ = 5000 goes with lr ~1e-5)
        gamma = ["--recadam-pretrain-cof", "500"] if optimizer == "recadam" else []
        return tiny_train.finetune(
            data or self.cls_bin, save_dir, *extra, pretrained=self.pretrained if restore else None, user_dir=USER_DIR,
            optimizer=["--optimizer", optimizer, *gamma], lr="1e-3", updates=updates, batch_size=16, seed=7,
            cpu=device == "cpu", save=True, validate=validate, log_format="simple", log_interval=1)

    def train(self, save_dir, *extra, check=True, env=None, fresh=False, **kw):
        """One fairseq-train run (tests/train_entry.py; ``env``: extra environment; ``fresh``: in a new
        interpreter, not forked): (returncode, log text)."""
        ((rc, log),) = launch(lambda _: self.finetune_args(save_dir, *extra, **kw), save_dir, env=env,
                              cwd=self.root, check=False, fresh=fresh)
        if check and rc != 0:
            raise AssertionError(f"fairseq-train failed ({rc}):\n{log[-4000:]}")
        return rc, log

    def ranks(self, save_dir, world, *extra, device="cpu", backend="legacy_ddp", one_gpu=False, env=None,
              timeout=600, **kw):
        """fairseq-train on ``world`` ranks (one: as ``train``), every rank dumping its final weights and optimizer
        state (``dumps``); returns the ranks' logs."""
        out = launch_ranks(self.finetune_args(save_dir, *extra, device=device, **kw), save_dir, world, device=device,
                           backend=backend, one_gpu=one_gpu, env={"RECADAM_DUMP_DIR": str(save_dir), **(env or {})},
                           cwd=self.root, timeout=timeout)
        return [log for _, log in out]


# The processes the task scripts and the comparison start that import torch and fairseq (fairseq-train, measure.py,
# prelaunch.py reading a checkpoint, ...): forked from a server that imported them once (helpers/fork_server.py).
# A light script starts faster fresh (~35 ms), and a test of what a fresh interpreter prints (import-time warnings,
# the one-line error of a real start-up) keeps sys.executable.
def fast_python():
    """A ``python`` whose ``python SCRIPT ARGS`` forks from this worker's server (helpers/fork_server.py)."""
    from helpers import fork_server

    return fork_server.python()


def fast_train(script=TRAIN_ENTRY):
    """FAIRSEQ_TRAIN for the task scripts: ``script`` (the tests' fairseq-train) through ``fast_python()``."""
    return f"{fast_python()} {script}"


@contextlib.contextmanager
def fast_interpreter():
    """sys.executable as ``fast_python()`` (fairseq-train beside it) for an in-process tool, such as the comparison,
    that starts ``sys.executable SCRIPT`` and its directory's fairseq-train."""
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "executable", fast_python())
        yield


def marked_bash_lines(page, start, end):
    """The non-empty lines of the ```bash block between a page's markers (a walk-through the suite runs as printed)."""
    import re

    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    block = text.split(start, 1)[1].split(end, 1)[0]
    code = re.search(r"```bash\n(.*?)```", block, re.S).group(1)
    return [ln for ln in code.splitlines() if ln.strip()]


# The env vars the task scripts (scripts/glue, scripts/seq2seq) read: their tests start from none of them set.
SCRIPT_ENV = ["ROBERTA_PATH", "DATA_DIR", "SAVE_DIR", "ARCH", "MAX_UPDATE", "LR", "BATCH", "SEED", "FP16",
              "NUM_GPUS", "USER_DIR", "FAIRSEQ_TRAIN", "K", "T0", "GAMMA", "ANNEAL_FUN", "CRITERION", "DRY_RUN",
              "KS", "T0S", "SEEDS", "METHODS", "RHO", "KEEP_RATIO", "MASK_ITER_E", "MAX_POSITIONS",
              "SAVE_INTERVAL_UPDATES", "RESTART", "PYTHON", "RECADAM_EXIT_AFTER_SAVES", "TASKS", "SAMPLING",
              "METHOD", "FREEZE", "EPOCHS", "FORGETTING_PROBE", "FORGETTING_METER"]


def base_env(**kw):
    """This process's environment without any variable a task script reads (the catalogue's knobs too), plus ``kw``."""
    from recadam_fairseq import catalogue

    drop = set(SCRIPT_ENV) | {k.var for k in catalogue.KNOBS.values()}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({k: str(v) for k, v in kw.items()})
    return env


def multitask_args(mt, save_dir, *extra, tasks, updates=12, optimizer="adam", restore=True, data=None):
    """fairseq-train --task glue_multitask on ``mt`` (root, data: the GLUE bins, pretrained) for ``tasks``."""
    from recadam_fairseq.tiny import make_tiny_roberta as tiny_roberta

    args = [str(data or mt.data), "--task", "glue_multitask", "--mt-tasks", ",".join(tasks),
            "--criterion", "glue_multitask", *tiny_roberta.TINY_ARCH,
            "--optimizer", optimizer, "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-6",
            "--lr", "1e-3", "--lr-scheduler", "fixed", "--max-update", str(updates),
            "--batch-size", "4", "--required-batch-size-multiple", "1", "--seed", "3", "--num-workers", "0", "--cpu",
            "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--user-dir", USER_DIR,
            "--log-format", "json", "--log-interval", "1",
            "--best-checkpoint-metric", "glue_avg", "--maximize-best-checkpoint-metric"]
    if optimizer == "recadam":
        args += ["--recadam-pretrain-cof", "500"]
    if restore:
        args += ["--restore-file", mt.pretrained, "--reset-optimizer", "--reset-dataloader", "--reset-meters"]
    return args + list(extra)


def train_multitask(mt, save_dir, *extra, check=True, **kw):
    """One --task glue_multitask run (``multitask_args``): (returncode, log text)."""
    ((rc, log),) = launch(lambda _: multitask_args(mt, save_dir, *extra, **kw), save_dir, cwd=str(mt.root), check=False)
    if check and rc != 0:
        raise AssertionError(f"fairseq-train failed ({rc}):\n{log[-4000:]}")
    return rc, log


# ----------------------------------------------------------------------------- the run plan
def run_plan(steps: Dict[str, Callable[[], object]], after: Optional[Dict[str, str]] = None, workers=2):
    """Run ``steps`` (name -> a call) ``workers`` at a time: a step named in ``after`` (name -> the step it needs)
    runs once that one is done, in the same worker. Returns {name: what the call returned}. A step that
    raises stops its chain; the error is raised once every chain has ended."""
    after = dict(after or {})
    missing = [n for n in list(after) + list(after.values()) if n not in steps]
    assert not missing, f"run_plan: unknown steps {missing}"
    first = [n for n in steps if n not in after]
    chains, done = [], {}
    for head in first:
        chain, cur = [head], head
        while True:
            nxt = [n for n, dep in after.items() if dep == cur]
            assert len(nxt) <= 1, f"run_plan: {cur} is needed by {nxt}: give each step one follower"
            if not nxt:
                break
            cur = nxt[0]
            chain.append(cur)
        chains.append(chain)
    assert sum(map(len, chains)) == len(steps), "run_plan: a cycle in after"

    def go(chain):
        out = {}
        for n in chain:
            out[n] = steps[n]()
        return out

    errors = []
    with ThreadPoolExecutor(workers) as pool:
        for fut in [pool.submit(go, c) for c in chains]:
            try:
                done.update(fut.result())
            except Exception as e:  # noqa: BLE001 - raised below, after the other chains ended
                errors.append(e)
    if errors:
        raise errors[0]
    return done


def run_jobs(jobs, workers=2):
    """``jobs`` (each returns a dict of results) through the run plan: one dict of them all."""
    out = {}
    for part in run_plan(dict(enumerate(jobs)), workers=workers).values():
        out.update(part)
    return out


class _Payload:
    """Unpickled, it would run a shell command: what a checkpoint from anyone may carry."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def code_carrying(path, marker):
    """A fairseq-looking checkpoint at ``path`` whose unpickling would create ``marker`` (``os.system``, which pickle
    names posix.system): every reader must refuse it without running it. Returns the refusal's words."""
    torch.save({"model": {"w": torch.zeros(2)}, "cfg": {"x": _Payload(f"touch {marker}")}}, str(path))
    return ("refused: loading it would import posix.system, which torch.load's weights-only mode does not do (a "
            "checkpoint needs only tensors and plain values); load only files you trust")


# ----------------------------------------------------------------------------- comparing runs
def assert_same_weights(a, b):
    """Two state dicts, every tensor bit for bit (and the same names)."""
    assert a.keys() == b.keys() and a, "nothing to compare" if not a else sorted(a.keys() ^ b.keys())
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k}: max |diff| {(a[k].double() - b[k].double()).abs().max()}"


def assert_same_state(a, b, where="state"):
    """Two (nested) optimizer states, bit for bit: tensors, lists, numbers and every listener's own entry."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        assert torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, sorted(a.keys() ^ set(b)))
        for k in a:
            assert_same_state(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def assert_same_run(a, b, listeners=True):
    """Two checkpoints (or dumps) of the same run: weights, the optimizer's moments, anchors and steps, and
    (``listeners``) everything else the optimizer saved (SAM's, ChildTuning's state, the loss scale, the param
    groups), bit for bit. Refuses to compare runs that hold no state."""
    opt = "last_optimizer_state" if "last_optimizer_state" in a else "optimizer"
    assert a[opt]["state"], "no optimizer state to compare: the runs did not train"
    assert_same_weights(a["model"], b["model"])
    if listeners:
        assert_same_state(a[opt], b[opt], opt)
    else:
        assert_same_state(a[opt]["state"], b[opt]["state"], f"{opt}['state']")


def one_error_line(log, prog="train_entry.py"):
    """The one ``PROG: error: ...`` line a run printed (no traceback), without its prefix."""
    assert "Traceback" not in log, log[-3000:]
    lines = [ln for ln in log.splitlines() if ln.startswith(f"{prog}: error: ")]
    assert len(lines) == 1, log[-3000:]
    return lines[0][len(f"{prog}: error: "):]


def assert_one_line_error(run, save_dir, message, kept=None):
    """A tiny.train(..., check=False) run stopped before training with the one line ``message``, writing no
    checkpoint; ``kept``: {file name: its bytes before the run} of checkpoints already there, left as they were."""
    rc, log = run
    assert rc == 1, log[-3000:]
    assert one_error_line(log) == message
    kept = kept or {}
    assert sorted(f for f in os.listdir(save_dir) if f.endswith(".pt")) == sorted(kept)
    for name, data in kept.items():
        with open(os.path.join(save_dir, name), "rb") as f:
            assert f.read() == data, name


def relative_gap(a, b, start, keys: Optional[Iterable[str]] = None):
    """‖(a − start) − (b − start)‖ / ‖b − start‖ over the floating-point weights all three hold."""
    keys = [k for k in (keys or b) if b[k].is_floating_point() and k in start and k in a]
    cat = lambda d: torch.cat([d[k].double().reshape(-1) for k in keys])  # noqa: E731
    moved = (cat(b) - cat(start)).norm()
    assert moved > 0, "b did not move from start"
    return float((cat(a) - cat(b)).norm() / moved)
