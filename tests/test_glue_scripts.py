"""scripts/glue: finetune.sh, grid.sh, summarize.py and the hydra configs.

Real fine-tuning runs of the tiny RoBERTa on CPU (RTE-like classification and an STS-B-like
regression set made from the tiny data), the grid twice, summarize.py on their logs, and the
hydra configs compared with what finetune.sh runs. Command-line details are checked with a fake
fairseq-train that records its argv (no training).

The real runs use the scripts' default criterion, sentence_prediction_recadam.
"""

import csv
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest
import torch

from helpers import (ROOT, USER_DIR, anchors, assert_same_run, base_env, code_carrying, fast_python,
                     fast_train, run_plan)
from recadam_fairseq.tiny import make_tiny_roberta as tiny_roberta

from recadam_fairseq import catalogue
from recadam_fairseq.launch import command as launch_command, glue as launch_glue
from recadam_fairseq.launch.spec import Stop
from recadam_fairseq.launch.variables import Variables

GLUE = os.path.join(ROOT, "scripts", "glue")
FINETUNE = os.path.join(GLUE, "finetune.sh")
GRID = os.path.join(GLUE, "grid.sh")
SUMMARIZE = os.path.join(GLUE, "summarize.py")
CONFIGS = os.path.join(GLUE, "configs")

CUDA = __import__("torch").cuda.is_available()

# fairseq's RoBERTa GLUE recipe: lr, batch, updates, warmup, classes, best-checkpoint metric
RECIPE = {
    "MNLI": ("1e-5", "32", "123873", "7432", "3", "accuracy"),
    "QNLI": ("1e-5", "32", "33112", "1986", "2", "accuracy"),
    "QQP": ("1e-5", "32", "113272", "28318", "2", "f1"),
    "RTE": ("2e-5", "16", "2036", "122", "2", "accuracy"),
    "SST-2": ("1e-5", "32", "20935", "1256", "2", "accuracy"),
    "MRPC": ("1e-5", "16", "2296", "137", "2", "f1"),
    "CoLA": ("1e-5", "16", "5336", "320", "2", "mcc"),
    "STS-B": ("2e-5", "16", "3598", "214", "1", "pearson"),
}
RECADAM_DEFAULTS = {"--recadam-anneal-fun": "sigmoid", "--recadam-anneal-k": "0.1", "--recadam-anneal-t0": "1000",
                    "--recadam-pretrain-cof": "5000"}
TINY_EXTRA = ["--cpu", "--batch-size", "8", "--max-tokens", "2000", "--num-workers", "0",
              "--validate-interval-updates", "4"]
REPORT = {"RTE": "--report-acc-and-f1", "STS-B": "--report-pearson-and-spearman"}  # sentence_prediction's flags


def run(cmd, env, cwd=None, check=None):
    proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check is not None and proc.returncode != check:
        raise AssertionError(f"{cmd[:3]} exited {proc.returncode}, expected {check}:\n{proc.stdout[-4000:]}")
    return proc


def recadam_criterion_registered():
    import argparse

    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.utils import import_user_module

    import_user_module(argparse.Namespace(user_dir=USER_DIR))
    return "sentence_prediction_recadam" in CRITERION_REGISTRY


def valid_values(log_text, metric, subset="valid"):
    """The metric of every validation in a fairseq json log (read here independently of summarize.py)."""
    return [float(v) for v in re.findall(rf'"{subset}_{metric}": "?([-\d.naN]+)"?', log_text)]


def flags(argv):
    """argv -> {flag: [values of each occurrence]}, and the positional args."""
    out, pos, i = defaultdict(list), [], 0
    while i < len(argv):
        if argv[i].startswith("--"):
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            out[argv[i]].append(argv[i + 1:j])
            i = j
        else:
            pos.append(argv[i])
            i += 1
    return out, pos


def last(fl, name):
    """The value argparse ends up with: the last occurrence."""
    vals = fl[name][-1]
    return vals[0] if len(vals) == 1 else vals


def command_sh_argv(path, train_words):
    """The argv a command.sh runs, parsed with shlex (a bash round trip is checked separately)."""
    return rendered_argv(open(path).read(), train_words)


def rendered_argv(text, train_words):
    """The argv of a rendered command (command.sh's text), parsed with shlex."""
    text = text.replace("\\\n", " ")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0].startswith("cd "), lines[0]
    argv = shlex.split(lines[1])
    assert argv[: len(train_words)] == train_words
    assert len(lines) == 2, lines
    return argv[len(train_words):]


# ------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def glue(tiny, tmp_path_factory):
    """The tiny GLUE data, and all the real training runs at once (3 at a time: they are mostly start-up).

    No architecture flags: finetune.sh reads them from the checkpoint; FP16 auto: fp32 on a CPU machine.
    Two more recadam runs are killed after their first checkpoint (the tests relaunch them).
    """
    root = tmp_path_factory.mktemp("glue")
    data = tiny.glue_bin
    runs = root / "runs"
    env = base_env(ROBERTA_PATH=tiny.pretrained, DATA_DIR=data, SAVE_DIR=runs, MAX_UPDATE=8,
                   SAVE_INTERVAL_UPDATES=4, FAIRSEQ_TRAIN=fast_train(),
                   OMP_NUM_THREADS=1,  # parallel runs on few cores: no thread oversubscription
                   **({"FP16": 0} if CUDA else {}))  # these runs are --cpu
    jobs = {}
    for task in ("RTE", "STS-B"):
        for method in ("adam", "recadam"):
            jobs[(task, method)] = ([FINETUNE, task, method, *TINY_EXTRA], env)
    coupled = True
    jobs[("RTE", "recadam-coupled")] = ([FINETUNE, "RTE", "recadam-coupled", *TINY_EXTRA], env)
    for kind in ("killed", "truncated"):  # the straight run's command, another SAVE_DIR, killed after a save
        jobs[kind] = ([FINETUNE, "RTE", "recadam", *TINY_EXTRA],
                      dict(env, SAVE_DIR=str(root / kind), RECADAM_EXIT_AFTER_SAVES="1"))
    # piped to head: the run's log and done marker must not depend on the terminal's pipe; with a probe of held-out
    # text (the meter leaves training as it was), for summarize.py --wise-ft on a run the scripts made
    from recadam_fairseq.prepare import binarize_probe

    binarize_probe.main(["--text", os.path.join(tiny.root, "raw", "lm.valid"), "--dict",
                         os.path.join(tiny.lm_bin, "dict.txt"), "--out", str(root / "probe")])
    piped = dict(env, SAVE_DIR=str(root / "piped"), FORGETTING_PROBE=str(root / "probe"))
    jobs["piped"] = (["bash", "-c", f"{shlex.quote(FINETUNE)} RTE adam {' '.join(TINY_EXTRA)} | head -3"], piped)
    grid_env = dict(env, KS="0.1 0.5", T0S="100", MAX_UPDATE="4")
    jobs["grid"] = ([GRID, "RTE", *TINY_EXTRA], grid_env)
    hydra_dir = root / "hydra"
    jobs["hydra"] = (hydra_cmd(tiny, hydra_dir), base_env(OMP_NUM_THREADS=1))

    def go(item):
        key, (cmd, e) = item
        t = time.time()
        cwd = hydra_dir if key == "hydra" else None  # the yaml works from any directory
        if cwd:
            cwd.mkdir()
        p = run(cmd, e, cwd=cwd)
        return key, (p.returncode, p.stdout, time.time() - t)

    results = run_plan({key: (lambda item=(key, job): go(item)[1]) for key, job in jobs.items()}, workers=3)
    return {"root": root, "data": data, "runs": runs, "env": env, "grid_env": grid_env, "results": results,
            "coupled": coupled, "hydra_dir": hydra_dir}


def hydra_cmd(tiny, out):
    arch = dict(zip(tiny_roberta.TINY_ARCH[::2], tiny_roberta.TINY_ARCH[1::2]))
    over = [f"model._name={arch.pop('--arch')}", f"task.max_positions={arch['--max-positions']}"]
    over += [f"+model.{k[2:].replace('-', '_')}={v}" for k, v in arch.items()]
    return [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", CONFIGS, "--config-name", "rte_recadam",
            f"checkpoint.finetune_from_model={tiny.pretrained}", f"common.user_dir={USER_DIR}",
            f"task.data={tiny.glue_bin}/RTE-bin", "common.fp16=false",
            "common.cpu=true", *over, "optimization.max_update=4", "lr_scheduler.warmup_updates=1",
            "dataset.batch_size=8", "dataset.num_workers=0", f"checkpoint.save_dir={out}/ckpt",
            f"hydra.run.dir={out}/hydra"]


def load_cfg(path):
    """A checkpoint's cfg. Not conftest.load_ckpt: fairseq stores STS-B's best pearson as a numpy
    scalar, which torch.load(weights_only=True) refuses; these files are the tests' own."""
    return torch.load(path, map_location="cpu", weights_only=False)["cfg"]


def run_summarize(runs_dir, *args):
    return subprocess.run([sys.executable, SUMMARIZE, str(runs_dir), *args], capture_output=True, text=True)


def result(glue, key):
    rc, out, _ = glue["results"][key]
    assert rc == 0, f"{key} failed ({rc}):\n{out[-5000:]}"
    return out


RUNS = [("RTE", "adam", "adam"), ("RTE", "recadam", "recadam-k0.1-t1000"),
        ("STS-B", "adam", "adam"), ("STS-B", "recadam", "recadam-k0.1-t1000")]


def test_the_terminal_says_how_the_run_did_and_nothing_else(glue):
    """The terminal: the start line, one line per validation, the end line with the best dev score and
    where (read here from train.log); fairseq's config dump and Hydra's warnings only in the log. A run
    piped to `head` keeps its whole log and is marked done."""
    out = result(glue, ("RTE", "adam")).splitlines()
    run_dir = glue["runs"] / "RTE" / "adam" / "seed1"
    log = (run_dir / "train.log").read_text()
    scores = valid_values(log, "accuracy")
    best = max(scores)
    update = re.findall(r'"valid_accuracy": "?([-\d.]+)"?.*?"valid_num_updates": "?(\d+)', log)
    at = [u for v, u in update if float(v) == best][-1]  # of equal scores the later: fairseq's checkpoint_best.pt
    assert out[-1] == (f"== done: {run_dir} (best dev accuracy {best:g} at update {at} of 8 (checkpoint_best.pt), "
                       f"{len(scores)} validations)")
    kept = torch.load(run_dir / "checkpoint_best.pt", map_location="cpu", weights_only=False)
    assert kept["optimizer_history"][-1]["num_updates"] == int(at)  # the file the line names holds that update
    assert f"== RTE adam seed 1 -> {run_dir}" in out
    assert [line for line in out if line.startswith("  valid at update")] == [
        line for line in out[1:-1] if "valid" in line] and len(scores) == 2
    assert "'_name'" in log and "UserWarning" in log  # what the terminal is spared
    assert not [line for line in out if "'_name'" in line or "Warning" in line or " | INFO | " in line], out
    assert len(out) <= 8, out
    out = result(glue, "piped").splitlines()
    piped = glue["root"] / "piped" / "RTE" / "adam" / "seed1"
    assert len([line for line in out if not line.startswith("finetune.sh: ")]) == 3  # head's; stderr is not cut
    assert (piped / "done").exists()
    plog = (piped / "train.log").read_text()
    assert "done training" in plog and valid_values(plog, "accuracy") == scores  # the same seed and data
    assert valid_values(plog, "fgt_mlm_loss_delta") and not valid_values(log, "fgt_mlm_loss_delta")


def test_summarize_wise_ft_on_a_run_the_scripts_made(glue, tmp_path):
    """summarize.py --wise-ft on the piped run (finetune.sh RTE adam with FORGETTING_PROBE; the scripts' criterion,
    sentence_prediction_recadam, which the scoring process registers): its point at α 0.5 in wise-ft.json and the
    summary's WiSE-FT table; a run that cannot be scored (its meter's values at θ* gone) is one line naming it and
    why, and the summary is still written."""
    piped = glue["root"] / "piped"
    run = piped / "RTE" / "adam" / "seed1"
    p = run_summarize(piped, "--wise-ft", "0.5")
    assert p.returncode == 0, p.stdout + p.stderr
    saved = json.loads((run / "wise-ft.json").read_text())
    assert [q["alpha"] for q in saved["points"]] == [0.5] and 0 <= saved["points"][0]["metrics"]["accuracy"] <= 100
    assert "| adam | 0.5 | 1 |" in (piped / "summary.md").read_text()
    other = tmp_path / "runs" / "RTE" / "adam" / "seed1"
    shutil.copytree(run, other)
    (other / "wise-ft.json").unlink()
    (other / "forgetting_meter.json").unlink()
    p = run_summarize(tmp_path / "runs", "--wise-ft", "0.5")
    assert p.returncode == 0 and (tmp_path / "runs" / "summary.md").is_file(), p.stdout + p.stderr
    assert p.stderr.strip().splitlines()[-1] == (
        f"summarize.py: --wise-ft: RTE/adam/seed1 not scored: {other}: no forgetting_meter.json with values at θ* "
        f"(a run with --forgetting-probe writes it)")


def test_runs_that_cannot_learn_are_said_before_training(glue):
    """The recipe's 10 epochs on a small data set, a warmup as long as the run, T0 past its end: one line
    each, before anything is trained, whatever set the numbers."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    n = len(MMapIndexedDataset(os.path.join(glue["data"], "SST-2-bin", "input0", "train")))
    end = 10 * -(-n // int(RECIPE["SST-2"][1]))  # 10 epochs of ceil(n / batch) updates
    env = {k: v for k, v in glue["env"].items() if k != "MAX_UPDATE"}
    env["SAVE_DIR"] = str(glue["root"] / "cannot-learn")  # its dry runs' command.sh: not among the real runs
    p = run([FINETUNE, "SST-2", "recadam"], dict(env, DRY_RUN="1"), check=0)
    warnings = [line for line in p.stdout.splitlines() if line.startswith("finetune.sh: warning")]
    assert warnings == [
        f"finetune.sh: warning: the recipe's 10 epochs are about {end} updates on this data, not its 20935: the lr "
        f"schedule (warmup 1256, decay to 0 at 20935) is cut short; MAX_UPDATE={end} scales it to the data",
        f"finetune.sh: warning: the warmup (1256 updates) is not shorter than the run ({end} updates): the lr never "
        f"reaches LR=1e-5",
        f"finetune.sh: warning: T0=1000 is not before the run's end ({end} updates): λ(t) stays below 1/2, so "
        f"RecAdam barely moves the encoder; give T0 < {end}"]
    p = run([FINETUNE, "SST-2", "recadam"], dict(env, DRY_RUN="1", MAX_UPDATE=str(end), T0="10"), check=0)
    assert "finetune.sh: warning" not in p.stdout, p.stdout


@pytest.mark.parametrize("task,method,name", RUNS)
def test_finetune_runs_on_tiny_data(glue, task, method, name):
    result(glue, (task, method))
    run_dir = glue["runs"] / task / name / "seed1"
    assert (run_dir / "done").exists() and (run_dir / "command.sh").exists()
    log = (run_dir / "train.log").read_text()
    metric = RECIPE[task][5]
    assert len(valid_values(log, metric)) >= 2, "validations at updates 4 and 8"
    assert ("recadam: pretrained weights" in log) == (method == "recadam")
    cfg = load_cfg(run_dir / "checkpoint_last.pt")
    assert cfg["optimizer"]["_name"] == ("recadam" if method == "recadam" else "adam")
    assert cfg["task"]["max_positions"] == 64, "the checkpoint's, not the recipe's 512"
    assert (cfg["model"].arch, cfg["model"].encoder_layers, cfg["model"].encoder_embed_dim) == ("roberta", 2, 64)
    assert cfg["lr_scheduler"]["total_num_update"] == 8 and cfg["optimization"]["max_update"] == 8
    assert cfg["lr_scheduler"]["warmup_updates"] == 1, "122 or 214 scaled to 8 updates rounds to 0: kept at 1"
    assert cfg["optimization"]["lr"] == [2e-5]
    assert cfg["checkpoint"]["best_checkpoint_metric"] == metric
    assert cfg["task"]["num_classes"] == int(RECIPE[task][4])
    assert cfg["criterion"]["regression_target"] == (task == "STS-B")
    assert cfg["common"]["fp16"] is False and cfg["common"]["seed"] == 1
    assert cfg["dataset"]["batch_size"] == 8 and cfg["dataset"]["required_batch_size_multiple"] == 1
    if method == "recadam":
        o = cfg["optimizer"]
        assert (str(o["recadam_anneal_fun"]), o["recadam_anneal_k"], o["recadam_anneal_t0"],
                o["recadam_pretrain_cof"]) == ("sigmoid", 0.1, 1000, 5000)
    # command.sh is the command that ran
    argv = command_sh_argv(run_dir / "command.sh", shlex.split(fast_train()))
    assert argv[-len(TINY_EXTRA):] == list(TINY_EXTRA)
    assert CUDA or "finetune.sh: no CUDA device here: training in fp32 (FP16=0)" in result(glue, (task, method))
    assert json.loads((run_dir / "run.json").read_text())["task"] == task


def test_recadam_coupled_runs(glue):
    result(glue, ("RTE", "recadam-coupled"))
    run_dir = glue["runs"] / "RTE" / "recadam-coupled-k0.1-t1000" / "seed1"
    log = (run_dir / "train.log").read_text()
    assert (run_dir / "done").exists()
    assert "recadam (coupled objective)" in log
    assert valid_values(log, "accuracy") and valid_values(log, "f1")


def test_hydra_config_trains(glue):
    """fairseq-hydra-train with scripts/glue/configs/rte_recadam.yaml, on the tiny model."""
    out = result(glue, "hydra")
    assert "recadam: pretrained weights" in out
    assert valid_values(out, "accuracy")
    cfg = load_cfg(glue["hydra_dir"] / "ckpt" / "checkpoint_last.pt")
    assert cfg["task"]["data"] == os.path.join(glue["data"], "RTE-bin")
    assert cfg["optimizer"]["recadam_anneal_k"] == 0.1 and cfg["criterion"]["recadam_anneal_k"] == 0.1


def test_grid_runs_then_skips(glue):
    out = result(glue, "grid")
    names = ["recadam-k0.1-t100", "recadam-k0.5-t100"]
    for name in names:
        assert (glue["runs"] / "RTE" / name / "seed1" / "done").exists(), out[-3000:]
    assert "grid.sh: RTE: ran 2, skipped 0, failed 0" in out
    before = {n: (glue["runs"] / "RTE" / n / "seed1" / "done").stat().st_mtime_ns for n in names}
    p = run([GRID, "RTE", *TINY_EXTRA], glue["grid_env"], check=0)
    skips = [ln for ln in p.stdout.splitlines() if ln.startswith("skip ")]
    assert len(skips) == 2 and all(any(n in s for s in skips) for n in names), p.stdout
    assert "ran 0, skipped 2" in p.stdout
    assert before == {n: (glue["runs"] / "RTE" / n / "seed1" / "done").stat().st_mtime_ns for n in names}


def _final_state(run_dir):
    """checkpoint_last.pt (not helpers.load_ckpt: fairseq stores STS-B's best pearson as a numpy scalar)."""
    return torch.load(run_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)


def test_killed_run_resumes_bit_for_bit(glue):
    """Killed after its first checkpoint (update 4 of 8), the same command continues it: the final weights,
    moments, θ* and step counts equal the uninterrupted run's. The second run's checkpoint_last.pt is
    truncated to 0 bytes first (a kill during fairseq's copy): it is set aside, and the numbered
    checkpoint written before the copy takes its place."""
    straight = glue["runs"] / "RTE" / "recadam-k0.1-t1000" / "seed1"
    result(glue, ("RTE", "recadam"))
    dirs = {k: glue["root"] / k / "RTE" / "recadam-k0.1-t1000" / "seed1" for k in ("killed", "truncated")}
    for kind, d in dirs.items():
        rc, out, _ = glue["results"][kind]
        assert rc == 137 and not (d / "done").exists(), out[-3000:]
        assert sorted(p.name for p in d.glob("*.pt")) == ["checkpoint_1_4.pt", "checkpoint_best.pt",
                                                          "checkpoint_last.pt"]
    (dirs["truncated"] / "checkpoint_last.pt").write_bytes(b"")

    def relaunch(kind):
        return run([FINETUNE, "RTE", "recadam", *TINY_EXTRA], dict(glue["env"], SAVE_DIR=str(glue["root"] / kind)),
                   check=0).stdout

    out = run_plan({kind: (lambda kind=kind: relaunch(kind)) for kind in dirs})
    d = dirs["killed"]
    assert f"finetune.sh: resuming {glue['root']}/killed/RTE/recadam-k0.1-t1000/seed1 from checkpoint_last.pt " \
           f"(update 4)" in out["killed"]
    line = [ln for ln in out["truncated"].splitlines() if ln.startswith("finetune.sh: ")][-1]
    assert re.fullmatch(r"finetune\.sh: .*checkpoint_last\.pt: an empty file; set aside as "
                        r"checkpoint_last\.pt\.bad-\d{8}-\d{6}; resuming .*/truncated/.* from checkpoint_1_4\.pt "
                        r"\(update 4\)", line), line
    assert len(list(dirs["truncated"].glob("checkpoint_last.pt.bad-*"))) == 1, "set aside, not deleted"
    want = _final_state(straight)
    assert want["optimizer_history"][-1]["num_updates"] == 8 and anchors(want["last_optimizer_state"])
    for kind, d in dirs.items():
        assert (d / "done").exists()
        log = (d / "train.log").read_text()
        assert "loading pretrained model from" in log.split("resuming")[0], "the first launch: --finetune-from-model"
        got = _final_state(d)
        assert got["optimizer_history"][-1]["num_updates"] == 8
        assert_same_run(got, want)  # weights, moments, θ*, steps


def test_resume_sets_aside_only_a_checkpoint_cut_short(tmp_path, monkeypatch):
    """A cut-short checkpoint_last.pt is set aside for the newest complete one; a checkpoint that cannot be
    read for another reason (one that carries code; this Python has no torch) stops, and nothing is moved."""
    from recadam_fairseq.launch import prelaunch  # what the task scripts ask before a run

    for n, name in ((4, "checkpoint_1_4.pt"), (4, "checkpoint_best.pt"), (2, "checkpoint_1_2.pt")):
        torch.save({"optimizer_history": [{"num_updates": n}], "model": {}}, tmp_path / name)
    good = (tmp_path / "checkpoint_1_4.pt").read_bytes()
    (tmp_path / "checkpoint_last.pt").write_bytes(good[: len(good) // 2])  # a kill during fairseq's copy
    line = prelaunch.resume(str(tmp_path))
    assert re.fullmatch(rf".*checkpoint_last\.pt: cut short \(no zip directory at its end\); set aside as "
                        rf"checkpoint_last\.pt\.bad-\d{{8}}-\d{{6}}; resuming {tmp_path} from checkpoint_1_4\.pt "
                        rf"\(update 4\)", line), line
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == good
    assert prelaunch.resume(str(tmp_path)) == f"resuming {tmp_path} from checkpoint_last.pt (update 4)"
    code = tmp_path / "code" / "checkpoint_last.pt"
    code.parent.mkdir()
    refusal = code_carrying(code, tmp_path / "payload-ran")
    with pytest.raises(prelaunch.Stop) as e:
        prelaunch.resume(str(code.parent))
    assert str(e.value) == f"{code}: {refusal}" and os.listdir(code.parent) == ["checkpoint_last.pt"]
    assert not (tmp_path / "payload-ran").exists()

    def no_torch(module):
        raise prelaunch.Stop(f"PYTHON=x cannot import {module}")

    monkeypatch.setattr(prelaunch, "need", no_torch)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(prelaunch.Stop, match="cannot import torch"):
        prelaunch.resume(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == before


def test_rerun_of_finished_or_changed_run(glue):
    """A finished run is not trained again, and says its score as it did when it ended; another command for a
    started run stops, naming RESTART=1; RESTART=1 starts it over."""
    score = result(glue, ("RTE", "adam")).splitlines()[-1].split(" (", 1)[1][:-1]  # "== done: RUN (SCORE)"
    env = glue["env"]
    run_dir = glue["runs"] / "RTE" / "adam" / "seed1"
    before = (run_dir / "checkpoint_last.pt").stat().st_mtime_ns
    p = run([FINETUNE, "RTE", "adam", *TINY_EXTRA], env, check=0)
    assert p.stdout.splitlines()[-1] == f"== already done: {run_dir} ({score}; RESTART=1 trains it again)"
    p = run([FINETUNE, "RTE", "adam", *TINY_EXTRA], dict(env, LR="3e-5"), check=2)
    msg = [ln for ln in p.stdout.splitlines() if "error" in ln]
    assert msg == [f"finetune.sh: error: {run_dir} was started with another command (was: --lr 2e-5; now: --lr 3e-5): "
                   f"RESTART=1 starts it over with this one, or choose another SAVE_DIR"], p.stdout
    assert (run_dir / "checkpoint_last.pt").stat().st_mtime_ns == before and "LR=2e-5" in \
        (run_dir / "command.sh").read_text(), "nothing touched"


# ------------------------------------------------------------------------- summarize.py


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_summarize_real_runs(glue, tmp_path):
    for key in glue["results"]:
        if key not in ("killed", "truncated"):  # (test_killed_run_resumes_bit_for_bit)
            result(glue, key)
    out = tmp_path / "summary"
    p = run([sys.executable, SUMMARIZE, str(glue["runs"]), "--out", str(out)], base_env(), check=0)
    md = (out / "summary.md").read_text()
    assert md in p.stdout

    # the best dev metric per run, straight from the logs
    best = {}
    for log in glue["runs"].glob("*/*/seed1/train.log"):
        task, name = log.parts[-4], log.parts[-3]
        best[(task, name)] = max(x for x in valid_values(log.read_text(), RECIPE[task][5]) if x == x)  # not nan
    runs = {(r["task"], r["path"].split(os.sep)[1]): r for r in read_csv(out / "runs.csv")}
    assert set(runs) == set(best)
    for key, value in best.items():
        assert float(runs[key]["best"]) == pytest.approx(value) and runs[key]["status"] == "done"
        assert runs[key]["metric"] == RECIPE[key[0]][5]
    assert runs[("STS-B", "adam")]["other"].startswith("spearman="), "STS-B also shows spearman"

    table = {r["task"]: r for r in read_csv(out / "summary.csv")}
    assert list(table) == ["RTE", "STS-B", "GLUE avg"]
    methods = ["adam", "recadam", "recadam-coupled"]
    assert [c[: -len("_mean")] for c in table["RTE"] if c.endswith("_mean")] == methods
    assert table["RTE"]["metric"] == "accuracy" and table["STS-B"]["metric"] == "pearson"
    for task in ("RTE", "STS-B"):
        assert float(table[task]["adam_mean"]) == pytest.approx(best[(task, "adam")])
        assert table[task]["adam_n"] == "1" and table[task]["adam_std"] == ""
    # recadam on RTE: three configs (the default and the 2x1 grid); the one with the best mean is shown
    rte = {n: v for (t, n), v in best.items() if t == "RTE" and n.startswith("recadam-k")}
    assert len(rte) == 3
    top = max(sorted(rte), key=rte.get)
    assert float(table["RTE"]["recadam_mean"]) == pytest.approx(rte[top])
    assert "recadam-" + table["RTE"]["recadam_config"] == top
    avg = (best[("RTE", "adam")] + best[("STS-B", "adam")]) / 2
    assert float(table["GLUE avg"]["adam_mean"]) == pytest.approx(avg)
    assert float(table["GLUE avg"]["recadam_mean"]) == pytest.approx(
        (rte[top] + best[("STS-B", "recadam-k0.1-t1000")]) / 2)

    variants = read_csv(out / "variants.csv")
    rv = [v for v in variants if v["task"] == "RTE" and v["method"] == "recadam"]
    assert sorted((v["k"], v["t0"]) for v in rv) == [("0.1", "100"), ("0.1", "1000"), ("0.5", "100")]
    assert [v["chosen"] for v in rv].count("True") == 1

    assert "| task | metric | " + " | ".join(methods) + " |" in md
    assert re.search(rf"\| RTE \| accuracy \| {best[('RTE', 'adam')]:.2f} \(n=1\) \|", md)
    assert "## RecAdam: best (k, t0) per task" in md
    k, t0 = re.fullmatch(r"recadam-k(.+)-t(.+)", top).groups()
    assert re.search(rf"\| RTE \| recadam \| {re.escape(k)} \| {t0} \|", md)
    assert "### RTE recadam: mean accuracy per (k, t0)" in md
    assert "Unfinished" not in md


def test_summarize_unfinished_and_broken_runs(glue, tmp_path):
    result(glue, ("RTE", "adam"))
    runs = tmp_path / "runs"
    shutil.copytree(glue["runs"] / "RTE" / "adam", runs / "RTE" / "adam", ignore=shutil.ignore_patterns("*.pt"))
    src = runs / "RTE" / "adam" / "seed1"
    # seed2: killed after its first validation (log cut in the middle of a line)
    crashed = runs / "RTE" / "adam" / "seed2"
    shutil.copytree(src, crashed)
    (crashed / "done").unlink()
    log = (crashed / "train.log").read_text()
    cut = log.index('"valid_num_updates": "4"}') + 30
    (crashed / "train.log").write_text(log[:cut] + '\n{"epoch": 1, "valid_loss": "0.9", "valid_acc\n')
    # seed3: only a dry run (command.sh); seed4: no validation in its log yet
    (runs / "RTE" / "adam" / "seed3").mkdir()
    shutil.copy(src / "command.sh", runs / "RTE" / "adam" / "seed3")
    (runs / "RTE" / "adam" / "seed4").mkdir()
    (runs / "RTE" / "adam" / "seed4" / "train.log").write_text("garbage {\"x\n{not json}\n")

    p = run([sys.executable, SUMMARIZE, str(runs)], base_env(), check=0)
    rows = {r["seed"]: r for r in read_csv(runs / "runs.csv")}
    assert {s: rows[s]["status"] for s in rows} == {"1": "done", "2": "unfinished", "3": "not started",
                                                      "4": "unfinished"}
    first = valid_values(log, "accuracy")[0]
    assert float(rows["2"]["best"]) == pytest.approx(first) and rows["2"]["last_update"] == "4"
    assert rows["4"]["best"] == "" and "no validation" in rows["4"]["note"]
    table = {r["task"]: r for r in read_csv(runs / "summary.csv")}
    assert table["RTE"]["adam_n"] == "1", "unfinished runs are not counted"
    md = (runs / "summary.md").read_text()
    assert "## Unfinished runs" in md and "RTE/adam/seed2 | unfinished | 4/8" in md, p.stdout

    p = run([sys.executable, SUMMARIZE, str(runs), "--include-unfinished", "--out", str(tmp_path / "all")],
            base_env(), check=0)
    table = {r["task"]: r for r in read_csv(tmp_path / "all" / "summary.csv")}
    assert table["RTE"]["adam_n"] == "2", "seed1 and seed2's best so far"

    p = run([sys.executable, SUMMARIZE, str(tmp_path / "nothing-here")], base_env())
    assert p.returncode != 0 and "no such directory" in p.stdout
    (tmp_path / "empty").mkdir()
    p = run([sys.executable, SUMMARIZE, str(tmp_path / "empty")], base_env())
    assert p.returncode != 0 and "no runs under" in p.stdout


def test_summarize_mnli_mismatched_and_metrics(tmp_path):
    """Synthetic logs: MNLI's valid1 row, CoLA's mcc, seeds' mean and std, the best config by mean."""
    def write(path, lines, done=True):
        path.mkdir(parents=True)
        (path / "train.log").write_text("".join(f"2026-01-01 | INFO | valid | {json.dumps(x)}\n" for x in lines))
        if done:
            (path / "done").write_text("")

    def v(n, **m):
        return {"epoch": 1, **{f"valid_{k}": str(x) for k, x in m.items()}, "valid_num_updates": str(n)}

    def v1(n, acc):
        return {"epoch": 1, "valid1_accuracy": str(acc), "valid1_num_updates": str(n)}

    r = tmp_path / "runs"
    write(r / "MNLI/adam/seed1", [v(10, accuracy=80), v1(10, 79), v(20, accuracy=85), v1(20, 86)])
    write(r / "MNLI/adam/seed2", [v(10, accuracy=81), v1(10, 82)])
    write(r / "CoLA/recadam-k0.1-t100/seed1", [v(5, accuracy=70, mcc=40), v(10, accuracy=75, mcc=38)])
    write(r / "CoLA/recadam-k0.1-t100/seed2", [v(5, accuracy=70, mcc=50)])
    write(r / "CoLA/recadam-k1-t250/seed1", [v(5, accuracy=90, mcc=44)])
    write(r / "CoLA/recadam-k1-t250/seed2", [v(5, accuracy=90, mcc=47)])
    run([sys.executable, SUMMARIZE, str(r)], base_env(), check=0)
    table = {x["task"]: x for x in read_csv(r / "summary.csv")}
    assert list(table) == ["MNLI", "MNLI-mm", "CoLA", "GLUE avg"]
    assert float(table["MNLI"]["adam_mean"]) == pytest.approx(83.0)
    assert float(table["MNLI"]["adam_std"]) == pytest.approx(2 ** 0.5 * 2, abs=1e-4)  # written with 4 decimals
    assert float(table["MNLI-mm"]["adam_mean"]) == pytest.approx(84.0)
    assert table["CoLA"]["metric"] == "mcc"
    assert float(table["CoLA"]["recadam_mean"]) == pytest.approx(45.5) and table["CoLA"]["recadam_config"] == "k1-t250"
    assert float(table["GLUE avg"]["adam_mean"]) == pytest.approx(83.0), "MNLI-mm is not in the average"
    runs = {x["path"]: x for x in read_csv(r / "runs.csv")}
    assert runs[os.path.join("CoLA", "recadam-k0.1-t100", "seed1")]["other"] == "accuracy=70"
    md = (r / "summary.md").read_text()
    assert "| CoLA | recadam | 1 | 250 | k1-t250 | 45.50 ± 2.12 (n=2) | 2 |" in md
    assert "| **GLUE avg** |  | 83.00 (1/2 tasks) | 45.50 (1/2 tasks) |" in md


def test_summarize_names_the_file_that_holds_the_chosen_validation(tmp_path):
    """Synthetic log: fairseq's save lines and validations (its best_<metric>), the files a run keeps. The pick is
    checkpoint_best.pt only where fairseq's rule put that validation there (the later of equal bests); an earlier
    pick (a budget) is its numbered checkpoint if kept, else none (an epoch's end under --no-epoch-checkpoints),
    never the checkpoint_best.pt or checkpoint_last.pt its save line named, which later saves rewrote."""
    run_dir = tmp_path / "runs" / "RTE" / "adam" / "seed1"
    run_dir.mkdir(parents=True)
    for name in ("checkpoint_best.pt", "checkpoint_last.pt", "checkpoint_1_8.pt"):
        (run_dir / name).write_bytes(b"")
    (run_dir / "done").write_text("")
    rows = [(4, 60, 0.1, "checkpoint_best.pt"), (8, 70, 0.2, "checkpoint_1_8.pt"), (10, 70, 0.3, "checkpoint_best.pt"),
            (12, 65, 0.4, "checkpoint_last.pt")]  # update, accuracy, forgetting, the file the save line names
    lines, best = [], None
    for n, acc, fgt, named in rows:
        best = acc if best is None else max(best, acc)
        lines.append(f"2026-01-01 | INFO | fairseq.checkpoint_utils | Saved checkpoint {run_dir}/{named} (epoch 1 @ {n} "
                     f"updates, score {acc}) (writing took 0.01 seconds)")
        lines.append("2026-01-01 | INFO | valid | " + json.dumps(
            {"epoch": 1, "valid_accuracy": str(acc), "valid_fgt_mlm_loss_delta": str(fgt), "valid_num_updates": str(n),
             **({"valid_best_accuracy": str(best)} if n > 4 else {})}))
    (run_dir / "train.log").write_text("\n".join(lines) + "\n")
    for budget, pick, name in ((None, 10, "checkpoint_best.pt"), ("0.25", 8, "checkpoint_1_8.pt"),
                               ("0.15", 4, "none (no checkpoint of update 4 kept)")):
        out = tmp_path / f"out-{budget}"
        run_args = [] if budget is None else ["--forgetting-budget", budget]
        run([sys.executable, SUMMARIZE, str(tmp_path / "runs"), "--out", str(out), *run_args], base_env(), check=0)
        (row,) = read_csv(out / "runs.csv")
        assert (int(row["best_update"]), row["checkpoint"]) == (pick, name), budget


# ------------------------------------------------------------------------- command lines (fake trainer)

FAKE_TRAIN = r'''
import json, os, sys
argv = sys.argv[1:]
save = argv[len(argv) - 1 - argv[::-1].index("--save-dir") + 1]
os.makedirs(save, exist_ok=True)
with open(os.path.join(save, "argv.json"), "w") as f:
    json.dump(argv, f)
print('2026-01-01 | INFO | valid | {"epoch": 1, "valid_accuracy": "50", "valid_num_updates": "1"}')
if os.environ.get("FAKE_SLEEP"):  # grid.sh's JOBS: when the run trained, and on which GPUs
    import time
    start = time.time()
    with open(os.path.join(save, "attempts"), "a") as f:  # (a requeued job trains again)
        f.write(f"{start} {os.getpid()}\n")
    time.sleep(float(os.environ["FAKE_SLEEP"]))
    with open(os.path.join(save, "ran.json"), "w") as f:
        json.dump([start, time.time(), os.environ.get("CUDA_VISIBLE_DEVICES")], f)
sys.exit(int(os.environ.get("FAKE_RC", "0")))
'''


@pytest.fixture
def fake(tmp_path):
    """finetune.sh's environment with a fake fairseq-train that records its argv."""
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    data = tmp_path / "glue-bin"
    for task in RECIPE:
        (data / f"{task}-bin" / "input0").mkdir(parents=True)
    model = tmp_path / "model.pt"
    model.write_text("")
    # ARCH and MAX_POSITIONS given and fp32: the script does not read the (empty) checkpoint or probe for a GPU
    env = base_env(ROBERTA_PATH=model, DATA_DIR=data, SAVE_DIR=tmp_path / "runs",
                   FAIRSEQ_TRAIN=f"{sys.executable} {script}", ARCH="roberta_large", MAX_POSITIONS=512, FP16=0)

    def finetune(task, method, *extra, check=0, **kw):
        e = dict(env, **{k: str(v) for k, v in kw.items()})
        p = run([FINETUNE, task, method, *extra], e, check=check)
        if check != 0:
            return p, None, None
        run_dir = re.search(r"^== done: (\S+)", p.stdout, re.M).group(1)
        return p, run_dir, json.loads(open(os.path.join(run_dir, "argv.json")).read())

    def plan(task, method, *extra, **kw):
        """(run directory, argv, run.json) finetune.sh would give fairseq-train, built in-process (nothing written)."""
        e = dict(env, **{k: str(v) for k, v in kw.items()})
        s = launch_glue.build(Variables(e, "finetune.sh", say=lambda msg: None), task, method, list(extra))
        return s.run_dir, s.argv[s.lead:], s.run_json

    finetune.env, finetune.tmp, finetune.plan = env, tmp_path, plan
    return finetune


@pytest.mark.parametrize("task", list(RECIPE))
def test_recipe_per_task(fake, task):
    lr, bsz, total, warmup, ncls, metric = RECIPE[task]
    run_dir, argv, _ = fake.plan(task.lower(), "adam")  # task names are case-insensitive
    assert run_dir == os.path.join(fake.env["SAVE_DIR"], task, "adam", "seed1")
    fl, pos = flags(argv)
    assert pos == [os.path.join(fake.env["DATA_DIR"], f"{task}-bin")]
    expect = {"--lr": lr, "--batch-size": bsz, "--total-num-update": total, "--max-update": total,
              "--warmup-updates": warmup, "--num-classes": ncls, "--best-checkpoint-metric": metric,
              "--max-epoch": "10", "--max-positions": "512", "--max-tokens": "4400", "--dropout": "0.1",
              "--attention-dropout": "0.1", "--weight-decay": "0.1", "--adam-betas": "(0.9, 0.98)",
              "--adam-eps": "1e-06", "--clip-norm": "0.0", "--lr-scheduler": "polynomial_decay",
              "--init-token": "0", "--separator-token": "2", "--required-batch-size-multiple": "1",
              "--finetune-from-model": fake.env["ROBERTA_PATH"], "--arch": "roberta_large", "--seed": "1",
              "--criterion": "sentence_prediction_recadam", "--user-dir": USER_DIR, "--log-format": "json",
              "--save-dir": run_dir, "--task": "sentence_prediction",
              # a checkpoint (and validation) every tenth of the run, at most every 2000 updates; the newest kept
              "--save-interval-updates": str(min(2000, (int(total) + 5) // 10)), "--keep-interval-updates": "1"}
    assert {k: last(fl, k) for k in expect} == expect
    for switch in ("--find-unused-parameters", "--maximize-best-checkpoint-metric", "--no-epoch-checkpoints"):
        assert fl[switch] == [[]], switch
    # resumable: fairseq's --finetune-from-model, not --restore-file with --reset-*; fp32 (FP16=0)
    assert not any(f.startswith("--reset") or f.startswith("--fp16") or f == "--restore-file" for f in fl)
    assert ("--regression-target" in fl) == (task == "STS-B")
    assert (last(fl, "--valid-subset") if "--valid-subset" in fl else None) == \
        ("valid,valid1" if task == "MNLI" else None)
    assert "--distributed-world-size" not in fl and not any(f.startswith("--report") for f in fl)
    assert not any(f.startswith("--recadam") for f in fl)


def test_method_flags(fake):
    _, adam, _ = fake.plan("RTE", "adam")
    run_dir, rec, _ = fake.plan("RTE", "recadam")
    run_dir_c, coupled, _ = fake.plan("RTE", "recadam-coupled")
    assert run_dir.endswith(os.path.join("RTE", "recadam-k0.1-t1000", "seed1"))
    assert run_dir_c.endswith(os.path.join("RTE", "recadam-coupled-k0.1-t1000", "seed1"))
    # what each method adds to adam's command line
    def diff(a, b):
        fa, fb = flags(a)[0], flags(b)[0]
        return {k: fb[k] for k in fb if k != "--save-dir" and fb[k] != fa.get(k)}

    recadam_flags = {k: [[v]] for k, v in RECADAM_DEFAULTS.items()}
    assert diff(adam, rec) == {"--optimizer": [["recadam"]], **recadam_flags}
    assert diff(adam, coupled) == {"--recadam-objective": [["coupled"]], **recadam_flags}
    assert last(flags(adam)[0], "--optimizer") == last(flags(coupled)[0], "--optimizer") == "adam"
    assert last(flags(coupled)[0], "--criterion") == "sentence_prediction_recadam"


def test_sam_method_flags(fake):
    """grid.sh runs sam and fsam once per seed, recadam-fsam once per (k, t0) (their flags per METHOD:
    test_every_method_through_finetune_is_the_catalogue_s; their run names read back: tests/test_catalogue.py)."""
    # grid.sh: sam and fsam once per seed, recadam-fsam once per (k, t0)
    env = dict(fake.env, KS="0.1 0.5", T0S="100", SEEDS="1", METHODS="sam fsam recadam-fsam",
               SAVE_DIR=os.path.join(fake.tmp, "grid-sam"))
    run([GRID, "RTE"], env, check=0)
    runs = os.path.join(env["SAVE_DIR"], "RTE")
    assert sorted(os.path.relpath(os.path.dirname(d), runs) for d in glob_done(runs)) == sorted(
        os.path.join(n, "seed1") for n in ("sam-rho0.05", "fsam-rho0.05", "recadam-fsam-k0.1-t100-rho0.05",
                                           "recadam-fsam-k0.5-t100-rho0.05"))


def test_baseline_method_flags(fake):
    """The baselines' one-line errors, grid.sh and summarize.py (their flags, run directories and run.json
    per METHOD: test_every_method_through_finetune_is_the_catalogue_s)."""
    with pytest.raises(Stop, match="METHOD rdrop uses CRITERION=sentence_prediction_rdrop"):
        fake.plan("RTE", "rdrop", CRITERION="sentence_prediction_r3f")
    # an arch without a roberta_ft twin stops in one line naming ARCH
    with pytest.raises(Stop, match="has no roberta_ft twin.*ARCH=roberta_ft_base"):
        fake.plan("RTE", "lora", ARCH="transformer")
    # grid.sh takes them (recadam-* once per (k, t0))
    env = dict(fake.env, KS="0.1", T0S="100", SEEDS="1", METHODS="llrd recadam-reinit lora recadam-rdrop",
               SAVE_DIR=os.path.join(fake.tmp, "grid-baselines"))
    run([GRID, "RTE"], env, check=0)
    runs = os.path.join(env["SAVE_DIR"], "RTE")
    assert sorted(os.path.relpath(os.path.dirname(d), runs) for d in glob_done(runs)) == sorted(
        os.path.join(n, "seed1") for n in ("llrd-d0.9", "recadam-reinit-k0.1-t100-n2", "lora-r8-a8",
                                           "recadam-rdrop-k0.1-t100-a1.0"))


# a value off its default for every knob (R3F_EPS, which the scripts leave implicit, included)
def test_every_method_through_finetune_is_the_catalogue_s(fake):
    """Each METHOD (recadam_fairseq/catalogue.py), its knobs off their defaults through their variables:
    what finetune.sh adds to adam's command, its run directory and run.json settings are the catalogue's."""
    _, adam, _ = fake.plan("MRPC", "adam")
    base = flags(adam)[0]
    off = {k: knob.off_default for k, knob in catalogue.KNOBS.items()}
    assert all(v and v != catalogue.KNOBS[k].default for k, v in off.items()), off
    off["fisher"] = str(fake.tmp / off["fisher"])  # (a file: made here, absolute; read for its form only)
    torch.save({"fisher": {"w": torch.ones(2)}}, off["fisher"])
    for name in catalogue.names(scripts=True):
        m = catalogue.get(name)
        values = {k: off[k] for k in m.knobs}
        run_dir, argv, meta = fake.plan("MRPC", name, **{catalogue.KNOBS[k].var: v for k, v in values.items()})
        got = {k: v for k, v in flags(argv)[0].items() if k not in ("--save-dir", "--arch", "--lr") and base.get(k) != v}
        want = {k: v for k, v in flags(m.all_flags(values))[0].items() if base.get(k) != v}
        assert got == want, name
        assert last(flags(argv)[0], "--arch") == ("roberta_ft_large" if m.needs_ft else "roberta_large")
        assert flags(argv)[0]["--lr"] == [[m.lr or RECIPE["MRPC"][0]]]
        assert os.path.basename(os.path.dirname(run_dir)) == m.run_name(values)
        assert {k: meta[k] for k in m.settings(values)} == m.settings(values) and meta["method"] == name
    run_dir, _, _ = fake.plan("MRPC", "recadam+r3f")  # the old spelling, still taken: the same method and directory
    assert os.path.basename(os.path.dirname(run_dir)) == "recadam-r3f-k0.1-t1000"


R3F_FLAGS = {"--criterion": [["sentence_prediction_r3f"]], "--noise-type": [["uniform"]], "--r3f-lambda": [["0.7"]]}


def test_r3f_method_flags(fake):
    """r3f / r4f / recadam-r3f: the seed's R3F flags on fairseq's recipe; R3F's own RTE recipe."""
    _, adam, _ = fake.plan("MRPC", "adam")
    got = {m: fake.plan("MRPC", m) for m in ("r3f", "r4f", "recadam-r3f")}
    assert {m: os.path.relpath(d, fake.env["SAVE_DIR"]) for m, (d, _, _) in got.items()} == {
        "r3f": "MRPC/r3f/seed1", "r4f": "MRPC/r4f/seed1", "recadam-r3f": "MRPC/recadam-r3f-k0.1-t1000/seed1"}

    def diff(a, b):
        fa, fb = flags(a)[0], flags(b)[0]
        return {k: fb[k] for k in fb if k != "--save-dir" and fb[k] != fa.get(k)}

    assert diff(adam, got["r3f"][1]) == R3F_FLAGS
    assert diff(adam, got["r4f"][1]) == {**R3F_FLAGS, "--spectral-norm-classification-head": [[]]}
    assert diff(adam, got["recadam-r3f"][1]) == {**R3F_FLAGS, "--optimizer": [["recadam"]],
                                                 **{k: [[v]] for k, v in RECADAM_DEFAULTS.items()}}
    meta = got["recadam-r3f"][2]
    assert meta["r3f_lambda"] == "0.7" and meta["noise_type"] == "uniform" and meta["k"] == "0.1"
    assert "k" not in got["r3f"][2]
    # RTE: the R3F example's recipe (lr 1e-5, batch 8, 3120 updates, 187 warmup); adam keeps RoBERTa's
    _, rte, _ = fake.plan("RTE", "r4f")
    fl = flags(rte)[0]
    assert {k: last(fl, k) for k in ("--lr", "--batch-size", "--total-num-update", "--warmup-updates")} == {
        "--lr": "1e-5", "--batch-size": "8", "--total-num-update": "3120", "--warmup-updates": "187"}
    with pytest.raises(Stop, match="METHOD r3f uses CRITERION=sentence_prediction_r3f"):
        fake.plan("RTE", "r3f", CRITERION="sentence_prediction")


def test_grid_and_summarize_carry_r3f_methods(fake):
    env = dict(fake.env, KS="0.1", T0S="100", METHODS="r3f r4f recadam-r3f")
    p = run([GRID, "RTE"], env, check=0)
    assert "ran 3, skipped 0, failed 0" in p.stdout
    runs = os.path.join(env["SAVE_DIR"], "RTE")
    assert sorted(os.listdir(runs)) == ["r3f", "r4f", "recadam-r3f-k0.1-t100"]
    p = run([sys.executable, SUMMARIZE, env["SAVE_DIR"]], base_env(), check=0)
    rows = {r["method"]: r for r in read_csv(os.path.join(env["SAVE_DIR"], "runs.csv"))}
    assert set(rows) == {"r3f", "r4f", "recadam-r3f"}
    assert (rows["recadam-r3f"]["k"], rows["recadam-r3f"]["t0"]) == ("0.1", "100") and rows["r3f"]["k"] == ""
    assert all(float(r["best"]) == 50 for r in rows.values())  # the fake run's valid_accuracy
    summary = {r["task"]: r for r in read_csv(os.path.join(env["SAVE_DIR"], "summary.csv"))}
    assert [c[: -len("_mean")] for c in summary["RTE"] if c.endswith("_mean")] == ["r3f", "r4f", "recadam-r3f"]


def test_env_overrides(fake):
    run_dir, argv, _ = fake.plan("MNLI", "recadam", "--max-tokens", "1000", "--lr", "7e-6", LR="3e-5", BATCH=8, SEED=3,
                            FP16=0, NUM_GPUS=4, ARCH="roberta_base", K=0.5, T0=250, GAMMA=1000, ANNEAL_FUN="linear",
                            MAX_UPDATE=1000, USER_DIR="/some/user_dir", CRITERION="my_crit")
    assert run_dir == os.path.join(fake.env["SAVE_DIR"], "MNLI", "recadam-k0.5-t250-g1000-linear", "seed3")
    fl, _ = flags(argv)
    assert argv[-4:] == ["--max-tokens", "1000", "--lr", "7e-6"], "extra args come last"
    assert last(fl, "--max-tokens") == "1000" and last(fl, "--lr") == "7e-6" and fl["--lr"][0] == ["3e-5"]
    assert {k: last(fl, k) for k in ("--batch-size", "--seed", "--distributed-world-size", "--arch",
                                     "--recadam-anneal-k", "--recadam-anneal-t0", "--recadam-pretrain-cof",
                                     "--recadam-anneal-fun", "--user-dir", "--criterion", "--total-num-update",
                                     "--max-update", "--warmup-updates")} == {
        "--batch-size": "8", "--seed": "3", "--distributed-world-size": "4", "--arch": "roberta_base",
        "--recadam-anneal-k": "0.5", "--recadam-anneal-t0": "250", "--recadam-pretrain-cof": "1000",
        "--recadam-anneal-fun": "linear", "--user-dir": "/some/user_dir", "--criterion": "my_crit",
        "--total-num-update": "1000", "--max-update": "1000", "--warmup-updates": "60"}  # 7432 * 1000 / 123873
    assert "--fp16" not in fl and "--fp16-init-scale" not in fl
    # a SAVE_DIR ending in / is joined as the shell joined it: a run started by the bash scripts resumes
    assert fake.plan("RTE", "adam", SAVE_DIR=f"{fake.tmp}/r/")[0] == f"{fake.tmp}/r//RTE/adam/seed1"
    _, argv, _ = fake.plan("QQP", "adam", MAX_UPDATE=1000)
    assert last(flags(argv)[0], "--warmup-updates") == "250"  # 28318 * 1000 / 113272


@pytest.mark.parametrize("task,flag", [("CoLA", "--report-mcc"), ("MRPC", "--report-acc-and-f1"),
                                       ("QQP", "--report-acc-and-f1"), ("STS-B", "--report-pearson-and-spearman"),
                                       ("RTE", None)])
def test_sentence_prediction_gets_its_metric_flag(fake, task, flag):
    _, argv, _ = fake.plan(task, "adam", CRITERION="sentence_prediction")
    assert [f for f in flags(argv)[0] if f.startswith("--report")] == ([flag] if flag else [])


def test_command_sh_reruns_the_same_command(fake):
    _, run_dir, argv = fake("RTE", "recadam", "--note", "it's a \"test\" $HOME", "(0.9, 0.98)")
    assert command_sh_argv(os.path.join(run_dir, "command.sh"), shlex.split(fake.env["FAIRSEQ_TRAIN"])) == argv
    os.remove(os.path.join(run_dir, "argv.json"))
    run(["bash", os.path.join(run_dir, "command.sh")], fake.env, cwd="/", check=0)  # it cds to where it ran
    assert json.loads(open(os.path.join(run_dir, "argv.json")).read()) == argv


def test_dry_run_writes_only_command_sh(fake):
    p = run([FINETUNE, "SST-2", "recadam"], dict(fake.env, DRY_RUN="1", ROBERTA_PATH="/no/such/model.pt"), check=0)
    run_dir = os.path.join(fake.env["SAVE_DIR"], "SST-2", "recadam-k0.1-t1000", "seed1")
    assert sorted(os.listdir(run_dir)) == ["command.sh"]
    assert p.stdout.endswith(open(os.path.join(run_dir, "command.sh")).read())
    assert "warning: ROBERTA_PATH=/no/such/model.pt: no such file" in p.stdout


def test_fp16_is_never_asked_of_a_machine_without_cuda(fake):
    """FP16=1 writes fairseq's fp16 recipe (a dry run writes it without looking for a GPU); FP16 auto
    (the default) asks torch: on a CPU machine fp32, said in one line; FP16=1 there stops naming FP16=0."""
    fp16 = {"--fp16": [[]], "--fp16-init-scale": [["4"]], "--threshold-loss-scale": [["1"]],
            "--fp16-scale-window": [["128"]]}
    env = dict(fake.env, DRY_RUN="1", FP16="1", PYTHON=fast_python())
    run([FINETUNE, "RTE", "adam"], env, check=0)
    argv = command_sh_argv(os.path.join(fake.env["SAVE_DIR"], "RTE", "adam", "seed1", "command.sh"),
                           shlex.split(fake.env["FAIRSEQ_TRAIN"]))
    fl = flags(argv)[0]
    assert {k: fl[k] for k in fp16} == fp16
    if CUDA:
        return
    p = run([FINETUNE, "RTE", "adam"], dict(fake.env, FP16="auto", PYTHON=fast_python()), check=0)
    assert p.stdout.count("finetune.sh: no CUDA device here: training in fp32 (FP16=0)") == 1
    assert not [f for f in json.load(open(os.path.join(fake.env["SAVE_DIR"], "RTE", "adam", "seed1", "argv.json")))
                if f.startswith("--fp16")]
    p = run([FINETUNE, "RTE", "adam"], dict(fake.env, FP16="1", PYTHON=fast_python(), SAVE_DIR=str(fake.tmp / "x")),
            check=2)
    assert p.stdout.strip().splitlines() == [
        "finetune.sh: error: FP16=1 needs a CUDA device and torch sees none here: use FP16=0 (fp32)"]
    assert not os.path.exists(fake.tmp / "x")


def test_failed_training_leaves_no_done_marker(fake):
    p, _, _ = fake("RTE", "adam", check=3, FAKE_RC=3)
    run_dir = os.path.join(fake.env["SAVE_DIR"], "RTE", "adam", "seed1")
    assert "fairseq-train failed (exit 3)" in p.stdout
    assert not os.path.exists(os.path.join(run_dir, "done"))
    assert "valid_accuracy" in open(os.path.join(run_dir, "train.log")).read()


@pytest.mark.parametrize("args,env,message", [
    (["RTE"], {}, "expected TASK METHOD"),
    (["WNLI", "adam"], {}, "unknown TASK 'WNLI'"),
    (["RTE", "sgd"], {}, "unknown METHOD 'sgd'"),
    (["RTE", "recadm"], {}, "unknown METHOD 'recadm' (did you mean recadam?)"),
    (["RTE", "recadam-ewc"], {"EWC_FISHER": "/no/such.pt"}, "EWC_FISHER=/no/such.pt: no such file (write one with "
                                                            "scripts/fisher.py, or EWC_FISHER=task)"),
    (["RTE", "adam"], {"ROBERTA_PATH": None}, "ROBERTA_PATH is not set"),
    (["RTE", "adam"], {"ROBERTA_PATH": "/no/such.pt"}, "ROBERTA_PATH=/no/such.pt: no such file"),
    (["RTE", "adam"], {"ROBERTA_PATH": "/"}, "ROBERTA_PATH=/ is a directory: give the checkpoint file in it"),
    (["RTE", "adam"], {"RHO": "x"}, None),  # a knob of another method is not read
    (["RTE", "sam"], {"RHO": "big"}, "RHO='big' is not a number"),
    (["RTE", "adam"], {"DATA_DIR": "/no/such/dir"}, "no data at /no/such/dir/RTE-bin"),
    (["RTE", "adam"], {"FP16": "yes"}, "FP16 must be 0, 1 or auto"),
    (["RTE", "adam"], {"SAVE_INTERVAL_UPDATES": "0"}, "SAVE_INTERVAL_UPDATES must be a positive integer"),
    (["RTE", "adam"], {"MAX_POSITIONS": "x"}, "MAX_POSITIONS must be a positive integer"),
    (["RTE", "adam"], {"MAX_UPDATE": "0"}, "MAX_UPDATE must be a positive integer"),
])
def test_finetune_errors(fake, args, env, message, capsys):
    """finetune.sh's command line in-process (launch/command.py: the script's one line runs it): exit 2 and the
    error as the last line, before anything is written."""
    e = {k: v for k, v in fake.env.items() if not (k in env and env[k] is None)}
    e.update({k: v for k, v in env.items() if v is not None})
    if message is None:
        fake.plan(*args, **{k: v for k, v in env.items() if v is not None})
        return
    rc = launch_command.main(["finetune", FINETUNE, *args], env=e)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(f"finetune.sh: error: {message}"), err
    assert not os.path.exists(fake.env["SAVE_DIR"]), "nothing written"


def test_a_checkpoint_carrying_code_is_refused_in_one_line(fake):
    """ROBERTA_PATH read for its architecture: a file that carries code stops finetune.sh in one line (the plug-in's
    words: what, why, to load only files you trust), before anything is written; the code never runs."""
    path = fake.tmp / "model-code.pt"
    refusal = code_carrying(path, fake.tmp / "payload-ran")
    p = run([FINETUNE, "RTE", "adam"], dict(fake.env, ROBERTA_PATH=str(path), ARCH="", MAX_POSITIONS=""))
    assert p.returncode == 2 and p.stdout.splitlines()[-1] == f"finetune.sh: error: ROBERTA_PATH={path}: {refusal}"
    assert not os.path.exists(fake.env["SAVE_DIR"]) and not (fake.tmp / "payload-ran").exists()


def test_ewc_from_the_scripts(fake):
    """--help lists the catalogue's METHODs (ewc and recadam-ewc among them) and EWC_FISHER; EWC_FISHER=FILE runs in
    a run directory of its own (the file's name), not the task Fisher's; a file that carries code stops in one line
    before anything is written (the plug-in's words), and its code never runs."""
    p = run([FINETUNE, "--help"], fake.env, check=0)
    listed = p.stdout.split("METHOD (the catalogue", 1)[1].split("\n", 1)[1].split("The methods' knobs", 1)[0].split()
    assert listed == catalogue.names(scripts=True) and {"ewc", "recadam-ewc"} <= set(listed)
    assert "  EWC_FISHER [task]  --ewc-fisher: " in p.stdout
    code = fake.tmp / "code-fisher.pt"
    refusal = code_carrying(code, fake.tmp / "payload-ran")
    p = run([FINETUNE, "RTE", "ewc"], dict(fake.env, EWC_FISHER=str(code)), check=2)
    assert p.stdout.splitlines()[-1] == f"finetune.sh: error: EWC_FISHER={code}: {refusal}", p.stdout
    assert not os.path.exists(fake.env["SAVE_DIR"]) and not (fake.tmp / "payload-ran").exists()
    fisher = fake.tmp / "rte-fisher.pt"
    torch.save({"fisher": {"w": torch.ones(2)}}, fisher)  # read for its form; its tensors are the plug-in's to check
    for method in ("ewc", "recadam-ewc"):
        task_dir, task_argv, _ = fake.plan("RTE", method)
        file_dir, file_argv, _ = fake.plan("RTE", method, EWC_FISHER=str(fisher))
        assert os.path.basename(os.path.dirname(task_dir)) == f"{method}-k0.1-t1000"
        assert os.path.basename(os.path.dirname(file_dir)) == f"{method}-k0.1-t1000-Frte-fisher"
        assert (last(flags(task_argv)[0], "--ewc-fisher"), last(flags(file_argv)[0], "--ewc-fisher")) == ("task", str(fisher))


def test_grid_resumes_and_reports_failures(fake):
    env = dict(fake.env, KS="0.1 0.5", T0S="100", SEEDS="1 2", METHODS="adam recadam")
    p = run([GRID, "RTE", "--extra", "x"], env, check=0)
    runs = os.path.join(env["SAVE_DIR"], "RTE")
    expected = sorted(os.path.join(runs, n, f"seed{s}") for s in (1, 2)
                      for n in ("adam", "recadam-k0.1-t100", "recadam-k0.5-t100"))
    assert sorted(os.path.dirname(d) for d in glob_done(runs)) == expected
    assert "ran 6, skipped 0, failed 0" in p.stdout
    assert json.loads(open(os.path.join(expected[0], "argv.json")).read())[-2:] == ["--extra", "x"]

    # an unfinished run (killed: log and an empty checkpoint_last.pt, no done marker) continues: the empty
    # file is set aside (no complete checkpoint is left: fairseq starts from the pretrained model)
    unfinished = os.path.join(runs, "recadam-k0.5-t100", "seed2")
    os.remove(os.path.join(unfinished, "done"))
    open(os.path.join(unfinished, "checkpoint_last.pt"), "w").close()
    open(os.path.join(unfinished, "train.log"), "w").write("before the kill\n")
    # without the extra args: another command for all six, the five finished ones too (not "skip"): one line each,
    # finetune.sh's, in the grid's order, and nothing trained or touched (the empty file is not set aside yet)
    before = tree_state(env["SAVE_DIR"])
    p = run([GRID, "RTE"], env)
    order = [os.path.join(runs, n, f"seed{s}") for s in (1, 2) for n in ("adam", "recadam-k0.1-t100", "recadam-k0.5-t100")]
    assert p.returncode == 2 and p.stdout.splitlines() == [
        f"grid.sh: error: {d} was started with another command (was: --extra x; now: nothing): RESTART=1 starts it "
        f"over with this one, or choose another SAVE_DIR" for d in order] + ["grid.sh: RTE: nothing trained"], p.stdout
    assert tree_state(env["SAVE_DIR"]) == before
    # the same command: the finished runs are skipped, the unfinished one resumes
    p = run([GRID, "RTE", "--extra", "x"], env, check=0)
    assert p.stdout.count("skip ") == 5 and f"resume {unfinished} (unfinished)" in p.stdout
    assert "checkpoint_last.pt: an empty file; set aside as checkpoint_last.pt.bad-" in p.stdout
    assert f"no complete checkpoint in {unfinished}: starting from the pretrained model" in p.stdout
    assert "ran 1, skipped 5" in p.stdout
    assert os.path.exists(os.path.join(unfinished, "done"))
    assert not os.path.exists(os.path.join(unfinished, "checkpoint_last.pt"))
    assert [f for f in os.listdir(unfinished) if f.startswith("checkpoint_last.pt.bad-")], "set aside, not deleted"
    log = open(os.path.join(unfinished, "train.log")).read()
    assert log.startswith("before the kill\n") and "valid_accuracy" in log, "the log goes on"

    # RESTART=1 starts a run over: its checkpoints, log and done marker go
    open(os.path.join(unfinished, "checkpoint_1_4.pt"), "w").close()
    p = run([FINETUNE, "RTE", "recadam"], dict(env, K="0.5", T0="100", SEED="2", RESTART="1"), check=0)  # no extras
    assert f"finetune.sh: RESTART=1: starting {unfinished} over" in p.stdout
    assert not [f for f in os.listdir(unfinished) if f.startswith("checkpoint")]
    assert "before the kill" not in open(os.path.join(unfinished, "train.log")).read()

    # a failing run does not stop the grid; the failures are listed and the exit status is 1
    env_fail = dict(env, SAVE_DIR=os.path.join(fake.tmp, "runs-fail"), FAKE_RC="1", SEEDS="1")
    p = run([GRID, "RTE"], env_fail, check=1)
    assert "ran 3, skipped 0, failed 3" in p.stdout
    assert p.stdout.count("run failed:") == 3 and not glob_done(env_fail["SAVE_DIR"])


def test_grid_runs_jobs_at_a_time(fake):
    """JOBS=2: two runs train side by side (their times overlap), each on a GPU of its own from CUDA_VISIBLE_DEVICES;
    each line carries its run's name, a line after each run counts what ended, runs and is left; all end done."""
    env = dict(fake.env, JOBS="2", METHODS="adam llrd", SEEDS="1 2", FAKE_SLEEP="1.5", CUDA_VISIBLE_DEVICES="4,7")
    p = run([GRID, "RTE"], env)
    runs = os.path.join(env["SAVE_DIR"], "RTE")
    names = [f"{m}/seed{s}" for s in (1, 2) for m in ("adam", "llrd-d0.9")]
    ran = {n: json.load(open(os.path.join(runs, n, "ran.json"))) for n in names}
    assert len(glob_done(runs)) == 4 and "grid.sh: RTE: ran 4, skipped 0, failed 0" in p.stdout
    (a0, a1, ga), (b0, b1, gb) = ran["adam/seed1"], ran["llrd-d0.9/seed1"]
    assert max(a0, b0) < min(a1, b1) and {ga, gb} == {"4", "7"}, ran  # side by side, a GPU each
    assert f"[adam/seed1] == done: {runs}/adam/seed1" in p.stdout
    ends = re.findall(r"^grid\.sh: RTE: (\d) of 4 ended, (\d) running, (\d) left$", p.stdout, re.M)
    assert [int(e[0]) for e in ends] == [1, 2, 3, 4] and ends[-1] == ("4", "0", "0")
    p = run([GRID, "RTE"], dict(env, JOBS="0"), check=2)
    assert p.stdout == "grid.sh: error: JOBS must be a positive integer, got '0'\n"
    # GPUs are never shared: more runs, or a run's more GPUs, than the machine has is one line before anything runs
    fresh = dict(env, SAVE_DIR=os.path.join(fake.tmp, "runs-gpus"))
    p = run([GRID, "RTE"], dict(fresh, JOBS="3"), check=2)
    assert p.stdout == ("grid.sh: error: JOBS=3 runs of NUM_GPUS=1 GPU need 3 GPUs, this machine has 2 (4,7): "
                        "JOBS=2 or fewer\n")
    p = run([GRID, "RTE"], dict(fresh, NUM_GPUS="3"), check=2)
    assert p.stdout == "grid.sh: error: NUM_GPUS=3: a run's GPUs, but this machine has 2 (4,7): NUM_GPUS=2 or fewer\n"
    assert not os.path.exists(fresh["SAVE_DIR"])


def test_ctrl_c_ends_a_grid_and_its_trainers(fake):
    """A real SIGINT to the grid's process group (the terminal's Ctrl-C) while two runs train side by side: exit 130,
    one line and no traceback, no "run failed" line, no trainer left running, no run marked done; the same command
    then resumes both and trains the rest."""
    env = dict(fake.env, JOBS="2", METHODS="adam llrd", SEEDS="1 2", FAKE_SLEEP="30", CUDA_VISIBLE_DEVICES="")
    runs = os.path.join(env["SAVE_DIR"], "RTE")
    grid = subprocess.Popen([GRID, "RTE"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    first = [os.path.join(runs, n, "seed1", "attempts") for n in ("adam", "llrd-d0.9")]
    deadline = time.time() + 60
    while not all(os.path.exists(a) for a in first) and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(grid.pid, signal.SIGINT)
    out, _ = grid.communicate(timeout=60)
    assert grid.returncode == 130, out
    assert "Traceback" not in out and "failed" not in out, out
    assert out.splitlines()[-1] == "grid.sh: interrupted: the runs under way ended; the same command goes on from there"
    pids = [int(open(a).read().split()[1]) for a in first]
    for pid in pids:  # the trainers ended with the grid
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not glob_done(runs) and not os.path.exists(os.path.join(runs, "adam", "seed2"))
    p = run([GRID, "RTE"], dict(env, FAKE_SLEEP="0.1"))
    assert p.stdout.count("resume ") == 2 and "ran 4, skipped 0, failed 0" in p.stdout and len(glob_done(runs)) == 4


def test_grid_sends_runs_as_submitit_jobs(fake):
    """CLUSTER=local: every run a job through submitit's own executor (the SLURM path's code but the scheduler), a
    line as each ends, all done; a job's checkpoint() (submitit's call on a timeout or a preemption) requeues the same
    command, which resumes the run; a failed job is listed with its log."""
    from recadam_fairseq.launch import runs as runs_mod  # (submitit: make's set-up installs it)

    env = dict(fake.env, CLUSTER="local", METHODS="adam llrd", SEEDS="1", GRID_POLL_S="0.2")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    p = run([GRID, "RTE"], env)
    runs = os.path.join(env["SAVE_DIR"], "RTE")
    assert len(glob_done(runs)) == 2 and "grid.sh: RTE: ran 2, skipped 0, failed 0" in p.stdout
    assert re.search(rf"^grid\.sh: RTE: 2 runs sent to local \(job \d+\); their logs: {runs}/\.submitit$", p.stdout,
                     re.M), p.stdout
    ended = re.findall(r"^grid\.sh: RTE: (\S+) done; (\d) of 2 ended$", p.stdout, re.M)
    assert sorted(n for n, _ in ended) == ["adam/seed1", "llrd-d0.9/seed1"] and ended[-1][1] == "2", p.stdout
    assert "== done:" in "".join(open(f).read() for f in glob.glob(f"{runs}/.submitit/*_log.out"))
    job = runs_mod.SpecJob(None, {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0", "K": "0.1"})
    again = job.checkpoint()
    assert again.function is job and job.env == {"K": "0.1"}
    p = run([GRID, "RTE"], dict(env, SAVE_DIR=os.path.join(fake.tmp, "runs-fail"), FAKE_RC="1", METHODS="adam"),
            check=1)
    assert "grid.sh: run failed: " in p.stdout and "ran 1, skipped 0, failed 1" in p.stdout
    p = run([GRID, "RTE"], dict(env, CLUSTER="pbs"), check=2)
    assert "grid.sh: error: CLUSTER=pbs: slurm (SLURM jobs through submitit) or local" in p.stdout
    fresh = os.path.join(fake.tmp, "runs-bad")  # a job's resources are checked before any run directory is made
    p = run([GRID, "RTE"], dict(env, TIME_MIN="0", SAVE_DIR=fresh), check=2)
    assert p.stdout.strip() == "grid.sh: error: TIME_MIN must be a positive integer, got '0'" and not os.path.exists(fresh)


def test_grid_on_a_pretend_slurm_cluster(fake, tmp_path):
    """CLUSTER=slurm with a real submitit against stand-in sbatch / srun / sacct / scancel (tests/helpers/fake_slurm.py):
    one job array, its sbatch file with the partition, time, GPUs and CPUs asked for and submitit's requeue signal;
    every run done, its log in SAVE_DIR/TASK/.submitit."""
    from helpers import fake_slurm

    fake_slurm.install(str(tmp_path / "bin"), str(tmp_path / "slurm-state"))
    env = dict(fake.env, CLUSTER="slurm", PARTITION="debug", TIME_MIN="30", CPUS_PER_RUN="2", METHODS="adam llrd",
               SEEDS="1", GRID_POLL_S="0.2", FAKE_SLURM_STATE=str(tmp_path / "slurm-state"),
               PATH=f"{tmp_path / 'bin'}{os.pathsep}{fake.env['PATH']}")
    p = run([GRID, "RTE"], env)
    runs = os.path.join(env["SAVE_DIR"], "RTE")
    assert len(glob_done(runs)) == 2 and "grid.sh: RTE: ran 2, skipped 0, failed 0" in p.stdout, p.stdout
    assert "2 runs sent to slurm (job 1000)" in p.stdout
    (sbatch,) = glob.glob(f"{runs}/.submitit/*.sh") or glob.glob(f"{runs}/.submitit/**/*.sh", recursive=True)
    text = open(sbatch).read()
    for line in ("#SBATCH --array=0-1%2", "#SBATCH --partition=debug", "#SBATCH --time=30", "#SBATCH --gpus-per-node=1",
                 "#SBATCH --cpus-per-task=2", "#SBATCH --signal=USR2@90"):
        assert line in text, text
    assert sorted(n for n in os.listdir(tmp_path / "slurm-state") if "." not in n) == ["1000_0", "1000_1", "next"]
    states = lambda: [open(tmp_path / "slurm-state" / n).read() for n in ("1000_0", "1000_1")]  # noqa: E731
    deadline = time.time() + 20  # (a job's state is written once its script exits, after submitit saw its result)
    while states() != ["COMPLETED"] * 2 and time.time() < deadline:
        time.sleep(0.1)
    assert states() == ["COMPLETED"] * 2
    logs = [open(f"{runs}/.submitit/1000_{i}_0_log.out").read() for i in (0, 1)]  # srun's --output, per task
    assert all("== done: " + runs in log for log in logs)


def test_a_preempted_slurm_job_is_requeued_and_its_run_ends(fake, tmp_path):
    """The pretend cluster signals a running job as SLURM does before preempting it (USR2): submitit checkpoints the
    job (FinetuneJob.checkpoint: the same command), requeues it with scontrol, the first attempt's trainer is stopped
    and the second trains the run to its end; the grid reports it done."""
    import time

    from helpers import fake_slurm

    state = tmp_path / "slurm-state"
    fake_slurm.install(str(tmp_path / "bin"), str(state))
    env = dict(fake.env, CLUSTER="slurm", METHODS="adam", SEEDS="1", GRID_POLL_S="0.2", FAKE_SLEEP="3",
               FAKE_SLURM_STATE=str(state), PATH=f"{tmp_path / 'bin'}{os.pathsep}{fake.env['PATH']}")
    grid = subprocess.Popen([GRID, "RTE"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = os.path.join(env["SAVE_DIR"], "RTE", "adam", "seed1")
    attempts = os.path.join(run_dir, "attempts")
    deadline = time.time() + 60
    while not (os.path.exists(attempts) and glob.glob(f"{state}/*.task")) and time.time() < deadline:
        time.sleep(0.1)
    (task,) = glob.glob(f"{state}/*.task")
    job = os.path.basename(task)[:-len(".task")]
    subprocess.run([str(tmp_path / "bin" / "scancel"), "--signal", "USR2", job], env=env, check=True)
    out, _ = grid.communicate(timeout=60)
    assert grid.returncode == 0 and "grid.sh: RTE: ran 1, skipped 0, failed 0" in out, out
    # (the pretend cluster writes COMPLETED once the job's script has exited: the grid may have read the result first)
    deadline = time.time() + 30
    while open(state / job).read().startswith("RUNNING") and time.time() < deadline:
        time.sleep(0.1)
    assert open(state / (job + ".requeued")).read() == "1" and open(state / job).read() == "COMPLETED"
    assert len(open(attempts).read().splitlines()) == 2 and os.path.exists(os.path.join(run_dir, "done"))
    log = "".join(open(f).read() for f in glob.glob(f"{env['SAVE_DIR']}/RTE/.submitit/*_log.err"))
    assert "Caught signal SIGUSR2" in log and "this job is preempted" in log, log  # (the requeue: scontrol's count)


def tree_state(root):
    """{path: (size, mtime)} of every file under root."""
    return {os.path.join(d, f): (os.stat(os.path.join(d, f)).st_size, os.stat(os.path.join(d, f)).st_mtime_ns)
            for d, _, files in os.walk(root) for f in files}


def glob_done(root):
    return [os.path.join(d, "done") for d, _, files in os.walk(root) if "done" in files]


def test_grid_errors(fake):
    p = run([GRID], fake.env)
    assert p.returncode == 2 and "expected TASK" in p.stdout
    p = run([GRID, "WNLI"], fake.env)
    assert p.returncode == 2 and "unknown TASK 'WNLI'" in p.stdout
    p = run([GRID, "RTE"], dict(fake.env, METHODS="recadam sgd"))
    assert p.returncode == 2 and "grid.sh: error: METHODS: unknown METHOD 'sgd'" in p.stdout
    assert not os.path.exists(fake.env["SAVE_DIR"])


# ------------------------------------------------------------------------- hydra configs

STEMS = {"mnli": "MNLI", "qnli": "QNLI", "qqp": "QQP", "rte": "RTE", "sst2": "SST-2", "mrpc": "MRPC",
         "cola": "CoLA", "stsb": "STS-B"}
SECTIONS = ["common", "task", "checkpoint", "distributed_training", "dataset", "optimizer", "lr_scheduler",
            "optimization", "criterion"]
# Paths legitimately differ: the yaml leaves user_dir and data to the command line, and
# fairseq-hydra-train's save_dir is inside its output directory.
PATH_KEYS = {"common.user_dir", "task.data", "checkpoint.save_dir", "optimizer.save_dir", "criterion.save_dir"}
# What the comparison must cover at least (the recipe and RecAdam's hyperparameters).
MUST = ["optimization.lr", "dataset.batch_size", "optimization.max_update", "lr_scheduler.total_num_update",
        "lr_scheduler.warmup_updates", "optimizer.weight_decay", "optimizer.adam_betas", "optimizer.adam_eps",
        "optimization.clip_norm", "optimizer.recadam_anneal_fun", "optimizer.recadam_anneal_k",
        "optimizer.recadam_anneal_t0", "optimizer.recadam_pretrain_cof", "checkpoint.best_checkpoint_metric",
        "checkpoint.maximize_best_checkpoint_metric", "task.num_classes", "common.fp16", "dataset.max_tokens",
        "task.max_positions", "distributed_training.find_unused_parameters", "optimization.max_epoch"]
CONFIG_FILES = sorted(f for f in os.listdir(CONFIGS) if f.endswith(".yaml"))


def test_configs_exist():
    assert {"rte_recadam.yaml", "sst2_recadam.yaml"} <= set(CONFIG_FILES)


def normalize(key, v):
    from omegaconf import OmegaConf

    if OmegaConf.is_config(v):
        v = OmegaConf.to_container(v)
    if key.endswith("adam_betas") and isinstance(v, str):
        v = eval(v)  # "(0.9,0.98)" vs "(0.9, 0.98)"
    if isinstance(v, (list, tuple)):
        return [normalize(key, x) for x in v]
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return float(v)
    return str(v)  # enums


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_hydra_config_matches_finetune(name, tmp_path):
    """The yaml, composed as fairseq-hydra-train composes it, against finetune.sh's command parsed by
    fairseq's own argparse (convert_namespace_to_omegaconf): every key of the sections, but paths."""
    from fairseq import options
    from fairseq.dataclass.initialize import add_defaults, hydra_init
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    stem, method = name[: -len(".yaml")].split("_", 1)
    task, method = STEMS[stem], method.replace("_", "-")
    recadam_criterion_registered()  # the user-dir, as --user-dir imports it
    env = base_env(ROBERTA_PATH="/x/model.pt", DATA_DIR="/x/glue-bin", SAVE_DIR=tmp_path, DRY_RUN=1, FP16=1)
    spec = launch_glue.build(Variables(env, "finetune.sh", say=lambda msg: None), task, method, [])  # in-process: the plan
    argv = rendered_argv(spec.command, ["fairseq-train"])
    assert argv == spec.argv[spec.lead:], "command.sh runs the argv"
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    cli = convert_namespace_to_omegaconf(args)

    hydra_init(name[: -len(".yaml")])
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.1"):  # fairseq's hydra_main assumes 1.1
        yml = compose(config_name=name[: -len(".yaml")], overrides=["checkpoint.finetune_from_model=/x/model.pt"])
    add_defaults(yml)

    assert yml.criterion._name == "sentence_prediction_recadam"
    sections = SECTIONS
    compared, diffs = set(), []
    for sec in sections:
        for key in sorted(set(yml[sec]) | set(cli[sec])):
            full = f"{sec}.{key}"
            if full in PATH_KEYS:
                continue
            a = OmegaConf.select(yml, full, default="<absent>")
            b = OmegaConf.select(cli, full, default="<absent>")
            if normalize(full, a) != normalize(full, b):
                diffs.append(f"{full}: yaml {a!r} != finetune.sh {b!r}")
            compared.add(full)
    assert not diffs, "\n".join(diffs)
    assert set(MUST) <= compared
    assert (yml.model._name, yml.model.dropout, yml.model.attention_dropout) == \
        (args.arch, args.dropout, args.attention_dropout)
    assert OmegaConf.select(yml, "task.regression_target") == (task == "STS-B")
