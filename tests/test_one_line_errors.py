"""Mistakes stop before training with one line naming the flag, file or parameter, and no traceback.

Each case runs the real fairseq-train (tests/train_entry.py) on the tiny model; the plug-in's error
hook prints its ConfigError as ``train_entry.py: error: ...``. Other exceptions keep their traceback.
"""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from helpers import code_carrying, one_error_line, run_plan

from recadam_fairseq.tiny import make_tiny_roberta as tiny_roberta

CRIT = ["--criterion", "sentence_prediction_recadam"]


def label_data(tiny, root, train=None, valid=None):
    """cls-bin with its label files rewritten: {line: label} replacements in train / valid."""
    raw = os.path.join(tiny.root, "raw")
    out = os.path.join(root, "data")
    shutil.copytree(os.path.join(tiny.cls_bin, "input0"), os.path.join(out, "input0"))
    for split, change in (("train", train or {}), ("valid", valid or {})):
        with open(os.path.join(raw, f"cls.{split}.label")) as f:
            labels = f.read().split()
        for i, label in change.items():
            labels[i] = label
        with open(os.path.join(root, f"{split}.label"), "w") as f:
            f.write("\n".join(labels) + "\n")
    tiny_roberta.preprocess(["--only-source", "--workers", "1", "--trainpref", os.path.join(root, "train.label"),
                             "--validpref", os.path.join(root, "valid.label"), "--destdir", os.path.join(out, "label")])
    return out


def nan_checkpoint(tiny, path, name="encoder.sentence_encoder.layers.1.fc1.weight"):
    state = torch.load(tiny.pretrained, map_location="cpu", weights_only=False)
    state["model"][name][3, 5] = float("nan")
    torch.save(state, path)
    return name


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("mistakes")
    bad = str(root / "nan.pt")
    tensor = nan_checkpoint(tiny, bad)
    train_label = label_data(tiny, str(root / "train-label"), train={17: "2"})
    valid_label = label_data(tiny, str(root / "valid-label"), valid={9: "2"})
    refusal = code_carrying(root / "code.pt", root / "payload-ran")
    torch.save({"model": {"w": torch.zeros(2)}}, root / "bare.pt")  # read by the plug-in, not by fairseq (no history)
    # plain fairseq-train (fairseq's criterion and optimizer): the save directory is not made; fairscale's import
    # warnings (fairseq's, not the run's: the demo's .venv has no fairscale) are left out of the line count
    plain = {"optimizer": "adam", "restore": False, "env": {"PYTHONWARNINGS": "ignore::FutureWarning"}}
    cases = {
        "nan": ((*CRIT, "--recadam-pretrained-path", bad), {}),
        "k0": ((*CRIT, "--recadam-anneal-k", "0"), {}),
        "train_label": (CRIT, {"data": train_label, "optimizer": "adam"}),
        "valid_label": (CRIT, {"data": valid_label, "optimizer": "adam", "validate": True}),
        "restore": ((*CRIT, "--restore-file", str(root / "no-such.pt")), {"optimizer": "adam", "restore": False}),
        "rho0": (("--sam-type", "fisher-sam", "--rho", "0"), {"optimizer": "samsgd", "updates": 2}),
        "ewc_unread": ((*CRIT, "--ewc-fisher", "task"), {"optimizer": "adam"}),
        "code": (("--restore-file", str(root / "code.pt"), "--save-dir", str(root / "code" / "made")), plain),
        "code_ft": (("--finetune-from-model", str(root / "code.pt"), "--save-dir", str(root / "code_ft" / "made")),
                    plain),
        "code_fisher": ((*CRIT, "--ewc-fisher", str(root / "code.pt"), "--save-dir", str(root / "code_fisher" / "made")),
                        plain),
        "bare": (("--restore-file", str(root / "bare.pt")), plain),
    }

    def go(item):
        name, (extra, kw) = item
        save = root / name
        save.mkdir()
        (save / "checkpoint_last.pt").write_bytes(b"an earlier run's checkpoint") if name == "restore" else None
        # "k0" in a new interpreter: the plug-in's sys.excepthook ends fairseq-train itself (the others fork)
        return name, tiny.train(save, *extra, check=False, fresh=name == "k0", **kw)

    out = run_plan({item[0]: (lambda item=item: go(item)[1]) for item in cases.items()})
    return {"root": root, "out": out, "tensor": tensor, "bad": bad, "data": {"train": train_label, "valid": valid_label},
            "refusal": refusal}


def result(runs, name, rc_zero=False):
    rc, log = runs["out"][name]
    assert (rc == 0) == rc_zero, log[-3000:]
    ckpts = [f for f in os.listdir(runs["root"] / name) if f.endswith(".pt")]
    assert rc_zero or ckpts in ([], ["checkpoint_last.pt"]), ckpts  # nothing saved
    return log


def test_non_finite_pretrained_weights(runs):
    msg = one_error_line(result(runs, "nan"))
    assert msg.startswith(f"--recadam-pretrained-path {runs['bad']}: parameter {runs['tensor']} holds 1 NaN")


def test_sigmoid_slope_zero(runs):
    assert one_error_line(result(runs, "k0")).startswith("--recadam-anneal-k 0: the sigmoid λ(t)")


@pytest.mark.parametrize("split,example", [("train", 17), ("valid", 9)])
def test_labels_the_head_cannot_take(runs, split, example):
    msg = one_error_line(result(runs, f"{split}_label"))
    where = os.path.join(runs["data"][split], "label", f"{split}.bin")
    if split == "train":
        assert msg == (f"{where}, example {example}: label '2' (line 3 of label/dict.txt) is class index 2, but "
                       f"--num-classes 2 gives the head "
                       f"classes 0-1; set --num-classes 3")
    else:
        assert msg.startswith(f"{where}, example {example}: a label that ") and "(binarized as <unk>)" in msg


def test_missing_restore_file_with_a_plugin_component(runs):
    msg = one_error_line(result(runs, "restore"))
    assert msg == f"--restore-file {runs['root'] / 'no-such.pt'}: no such file (fairseq would train from random weights)"
    assert (runs["root"] / "restore" / "checkpoint_last.pt").read_bytes() == b"an earlier run's checkpoint"


@pytest.mark.parametrize("flag", ["--restore-file", "--finetune-from-model", "--ewc-fisher"])
def test_plain_fairseq_train_refuses_a_checkpoint_carrying_code_in_one_line(runs, flag):
    """fairseq-train with neither the plug-in's criterion nor its optimizer (only --user-dir): a checkpoint that
    carries code stops the run in one line saying why, before fairseq makes --save-dir or logs a line; the code
    never runs. (fairseq makes the directory before it builds any component: the plug-in reads the file at its
    import, plumbing/restore_check.py.) So does a Fisher file of --ewc-fisher (with the plug-in's criterion)."""
    name = {"--restore-file": "code", "--finetune-from-model": "code_ft", "--ewc-fisher": "code_fisher"}[flag]
    rc, log = runs["out"][name]
    assert rc == 1 and log.splitlines() == [f"train_entry.py: error: {flag} {runs['root'] / 'code.pt'}: "
                                            f"{runs['refusal']}"], log[-3000:]
    assert not (runs["root"] / name / "made").exists() and not (runs["root"] / "payload-ran").exists()


def test_the_fisher_file_under_each_spelling_is_read_at_the_import(tmp_path, monkeypatch):
    """plumbing/restore_check.py in-process: --ewc-fisher's file is read whether the flag is given as FILE, =FILE or
    Hydra's criterion./optimizer. key, a missing one too (nothing else checks it before fairseq makes --save-dir);
    task and '' (off) name no file."""
    import types

    from recadam_fairseq.core.errors import ConfigError
    from recadam_fairseq.plumbing import restore_check

    monkeypatch.setitem(sys.modules, "fairseq_cli.train", types.ModuleType("fairseq_cli.train"))  # a trainer's process
    missing, other, good = (str(tmp_path / n) for n in ("missing.pt", "other.pt", "good.pt"))
    torch.save({"model": {"w": torch.ones(2)}}, other)
    torch.save({"fisher": {"w": torch.ones(2)}}, good)
    save = ["--save-dir", str(tmp_path / "save")]
    cases = {missing: "no such file (write one with scripts/fisher.py, or use --ewc-fisher task)",
             other: "not a Fisher file (scripts/fisher.py writes a dict with a non-empty 'fisher')"}
    for path, says in cases.items():
        for spelled in (["--ewc-fisher", path], [f"--ewc-fisher={path}"], [f"criterion.ewc_fisher={path}"],
                        [f"+optimizer.ewc_fisher={path}"]):
            with pytest.raises(ConfigError) as e:
                restore_check.check(spelled + save)
            assert str(e.value) == f"--ewc-fisher {path}: {says}", spelled
    for value in (good, "task", ""):
        restore_check.check(["--ewc-fisher", value, *save])


def test_a_checkpoint_only_fairseq_cannot_read_is_one_line(runs):
    """A file the plug-in reads but fairseq's loader cannot (no optimizer history): fairseq's own failure, as one
    line naming the file (plumbing/errors_hook.py)."""
    msg = one_error_line(result(runs, "bare"))
    assert msg == f"{runs['root'] / 'bare.pt'}: fairseq cannot read it as a checkpoint (KeyError: 'best_loss')"


def test_a_fisher_nothing_reads(runs):
    assert one_error_line(result(runs, "ewc_unread")) == (
        "--ewc-fisher task: with --recadam-objective decoupled F weighs --optimizer recadam's pull, and this "
        "optimizer has none, so F would be ignored; use --optimizer recadam or --recadam-objective coupled")


def test_sam_with_rho_zero_runs_the_base_optimizer(runs):
    log = result(runs, "rho0", rc_zero=True)
    notes = [ln for ln in log.splitlines() if "--sam-type fisher-sam with --rho 0" in ln]
    assert len(notes) == 1 and notes[0].endswith("ε is 0, so no second pass is run (the base optimizer's update "
                                                 "alone)")
    assert "sam: fisher-sam on" not in log, "no SAM controller attached"


def test_hook_prints_ours_as_one_line_and_chains_the_rest(tmp_path):
    """The hook itself, in a fresh interpreter: ours as one line; an error raised from ours, and a foreign
    one, keep their tracebacks."""
    code = """
import sys
import recadam_fairseq.plumbing.errors_hook as h
from recadam_fairseq.core.errors import ConfigError
h.install(); h.install()  # once
kind = sys.argv[1]
if kind == "ours":
    raise ConfigError("--rho must be >= 0,\\n got -1")
if kind == "wrapped":
    try:
        raise ConfigError("--eps must be >= 0")
    except ConfigError as e:
        raise RuntimeError("fairseq wrapped it") from e
if kind == "bf16":  # what fairseq-train --bf16 runs off a TPU (its options.py sets --tpu)
    from fairseq import utils
    utils.get_tpu_device()
raise KeyError("not ours")
"""
    script = tmp_path / "prog.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "RECADAM_TRACEBACK"}
    out = {k: subprocess.run([sys.executable, str(script), k], capture_output=True, text=True, env=env)
           for k in ("ours", "wrapped", "foreign", "bf16")}
    assert out["ours"].returncode == 1 and out["ours"].stderr == "prog.py: error: --rho must be >= 0, got -1\n"
    for value, traceback in (("1", True), ("0", False), ("", False)):  # RECADAM_TRACEBACK=1: ours with its traceback
        p = subprocess.run([sys.executable, str(script), "ours"], capture_output=True, text=True,
                           env={**env, "RECADAM_TRACEBACK": value})
        assert p.returncode == 1 and ("Traceback" in p.stderr) == traceback, (value, p.stderr)
        assert ("ConfigError: --rho must be >= 0" in p.stderr) == traceback and ("prog.py: error" in p.stderr) != traceback
    assert "Traceback" in out["wrapped"].stderr and "--eps must be >= 0" in out["wrapped"].stderr \
        and "fairseq wrapped it" in out["wrapped"].stderr
    assert out["foreign"].returncode == 1 and "Traceback" in out["foreign"].stderr and "KeyError" in out["foreign"].stderr
    # fairseq's own start-up failure from a flag: one line saying what to change
    assert out["bf16"].returncode == 1 and "Traceback" not in out["bf16"].stderr
    assert out["bf16"].stderr.splitlines()[-1].startswith("prog.py: error: --bf16: fairseq 0.12 runs --bf16 and "
                                                          "--memory-efficient-bf16 on TPUs only")
