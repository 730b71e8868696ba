"""Shared fixtures: a tiny pretrained RoBERTa + tiny classification data, made once per session."""

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import recadam_fairseq
from recadam_fairseq.tools import make_tiny_roberta as tiny_roberta
from recadam_fairseq.tools import plot_run

# In-process tests use fairseq's registries; a test module may have imported the core (no fairseq)
# first, after which --user-dir skips the package: register explicitly, as a notebook user would.
recadam_fairseq.register()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(ROOT, "recadam_fairseq")
SCRIPTS = os.path.join(ROOT, "scripts")
TRAIN_ENTRY = os.path.join(ROOT, "tests", "train_entry.py")  # fairseq-train, --fp16 usable on CPU


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class Tiny:
    """Paths of the generated tiny setup, and a runner for fairseq-train on it."""

    def __init__(self, root):
        self.root = str(root)
        self.pretrained = os.path.join(self.root, "pretrained.pt")
        self.cls_bin = os.path.join(self.root, "cls-bin")
        self.lm_bin = os.path.join(self.root, "lm-bin")
        self.glue_bin = os.path.join(self.root, "glue-bin")  # SST-2-bin, RTE-bin, STS-B-bin

    def finetune_args(self, save_dir, *extra, optimizer="recadam", updates=12, restore=True, validate=False,
                      device="cpu", data=None):
        args = [
            data or self.cls_bin, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
            "--num-classes", "2", "--init-token", "0", "--separator-token", "2",
            *tiny_roberta.TINY_ARCH,
            "--optimizer", optimizer, "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-6",
            "--lr", "1e-3", "--lr-scheduler", "fixed", "--max-update", str(updates),
            "--batch-size", "16", "--seed", "7", "--num-workers", "0",
            "--save-dir", str(save_dir), "--no-epoch-checkpoints",
            "--user-dir", USER_DIR, "--log-format", "simple", "--log-interval", "1",
        ]
        if optimizer == "recadam":  # lr 1e-3 needs lr·γ < 2 (the authors' γ = 5000 goes with lr ~1e-5)
            args[args.index("--optimizer") + 2:args.index("--optimizer") + 2] = ["--recadam-pretrain-cof", "500"]
        if not validate:
            args.append("--disable-validation")
        if device == "cpu":
            args.append("--cpu")
        if restore:
            args += ["--restore-file", self.pretrained, "--reset-optimizer", "--reset-dataloader", "--reset-meters"]
        return args + list(extra)

    def train(self, save_dir, *extra, check=True, env=None, **kw):
        """Run the real fairseq-train entry point (``env``: extra environment); return (returncode, log text)."""
        os.makedirs(save_dir, exist_ok=True)
        log = os.path.join(str(save_dir), "train.log")
        cmd = [sys.executable, TRAIN_ENTRY, *self.finetune_args(save_dir, *extra, **kw)]
        with open(log, "w") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=self.root,
                                  env=None if env is None else {**os.environ, **env})
        text = open(log).read()
        if check and proc.returncode != 0:
            raise AssertionError(f"fairseq-train failed ({proc.returncode}):\n{text[-4000:]}")
        return proc.returncode, text


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    tiny_roberta.main([str(root)])
    return Tiny(root)


def json_records(log, kind):
    """fairseq --log-format json records of one kind (train_inner, valid, train) in a log's text."""
    return plot_run.parse_log_lines(log.splitlines())[kind]


def load_ckpt(path):
    import recadam_fairseq.safe_globals  # noqa: F401  (fairseq's checkpoint types)

    return torch.load(path, map_location="cpu", weights_only=True)


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


def free_port():
    """A TCP port free on this machine (for --distributed-init-method tcp://127.0.0.1:PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_config(*argv):
    """fairseq-train's command line -> its OmegaConf config, as fairseq-train builds it."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), list(argv)))


def run_jobs(jobs, workers=2):
    """Call ``jobs`` (each returns a dict of results) ``workers`` at a time: one dict of them all."""
    out = {}
    with ThreadPoolExecutor(workers) as pool:
        for part in pool.map(lambda job: job(), jobs):
            out.update(part)
    return out


def assert_one_line_error(run, save_dir, message, kept=None):
    """A tiny.train(..., check=False) run stopped before training with the one line ``message``, writing no
    checkpoint; ``kept``: {file name: its bytes before the run} of checkpoints already there, left as they were."""
    rc, log = run
    assert rc == 1 and "Traceback" not in log, log[-3000:]
    assert [ln for ln in log.splitlines() if ln.startswith("train_entry.py: error: ")] == [
        "train_entry.py: error: " + message]
    kept = kept or {}
    assert sorted(f for f in os.listdir(save_dir) if f.endswith(".pt")) == sorted(kept)
    for name, data in kept.items():
        with open(os.path.join(save_dir, name), "rb") as f:
            assert f.read() == data, name
