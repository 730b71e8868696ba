"""The tests' one helper layer: paths, shared flags, fairseq-train launches (one rank or N), the run plan
that spreads launches over the two xdist workers' cores, and the comparisons of saved runs.

Test modules import from here and from conftest's fixtures only: no test module imports another.
"""

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Iterable, List, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(ROOT, "recadam_fairseq")
SCRIPTS = os.path.join(ROOT, "scripts")
TRAIN_ENTRY = os.path.join(ROOT, "tests", "train_entry.py")  # fairseq-train, --fp16 usable on CPU

# ----------------------------------------------------------------------------- flags every module shares
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # runs side by side on CI's 2 cores: no thread oversubscription
ADAM_W0 = ["--recadam-anneal-w", "0"]  # --optimizer recadam at w = 0: fairseq's adam bit for bit, with listeners
# RecAdam on the tiny model: lr 1e-3 needs lr·γ < 2; λ(t) crosses 1/2 at update 6 of 12
RECADAM = ["--recadam-anneal-k", "0.5", "--recadam-anneal-t0", "6", "--recadam-pretrain-cof", "500"]
TINY_FT = ["--arch", "roberta_ft_tiny"]  # after TINY_ARCH: the last --arch wins, sizes agree
TINY_CA_MTL = ["--arch", "ca_mtl_roberta_tiny"]
LORA = ["--lora-rank", "4", "--lora-alpha", "16", "--lora-modules", "q,v,out,fc2"]


# ----------------------------------------------------------------------------- reading runs
def load_ckpt(path):
    import recadam_fairseq.safe_globals  # noqa: F401  (fairseq's checkpoint types)

    return torch.load(path, map_location="cpu", weights_only=True)


def json_records(log, kind):
    """fairseq --log-format json records of one kind (train_inner, valid, train) in a log's text."""
    from recadam_fairseq.tools import plot_run

    return plot_run.parse_log_lines(log.splitlines())[kind]


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
           entry=TRAIN_ENTRY, check=True):
    """fairseq-train once per rank (``argv_of_rank(rank)``: that rank's arguments, its distributed flags
    included), all at once; each rank's output in SAVE/rank<R>.log. Returns [(returncode, log)] by rank;
    ``check``: every rank must succeed."""
    os.makedirs(save, exist_ok=True)
    env = dict(os.environ, **(env or {}))
    procs, files = [], []
    for rank in range(world):
        f = open(os.path.join(save, f"rank{rank}.log"), "w")
        procs.append(subprocess.Popen([sys.executable, entry, *argv_of_rank(rank)], stdout=f,
                                      stderr=subprocess.STDOUT, env=env, cwd=cwd))
        files.append(f)
    for p in procs:
        p.wait(timeout=timeout)
    for f in files:
        f.close()
    out = [(p.returncode, open(os.path.join(save, f"rank{r}.log")).read()) for r, p in enumerate(procs)]
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


# ----------------------------------------------------------------------------- comparing runs
def assert_same_weights(a, b):
    """Two state dicts, every tensor bit for bit (and the same names)."""
    assert a.keys() == b.keys() and a, "nothing to compare" if not a else sorted(a.keys() ^ b.keys())
    for k in a:
        assert torch.equal(a[k], b[k]), k


def assert_same_state(a, b, where="state"):
    """Two (nested) optimizer states, bit for bit: tensors, lists, numbers and every listener's own entry."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        assert torch.is_tensor(a) and torch.is_tensor(b) and torch.equal(a, b), where
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


def assert_same_run(a, b):
    """Two checkpoints (or dumps) of the same run: weights, the optimizer's moments, anchors and steps, and
    every listener's state (SAM, ChildTuning), bit for bit. Refuses to compare runs that hold no state."""
    opt = "last_optimizer_state" if "last_optimizer_state" in a else "optimizer"
    assert a[opt]["state"], "no optimizer state to compare: the runs did not train"
    assert_same_weights(a["model"], b["model"])
    assert_same_state(a[opt], b[opt], opt)


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
