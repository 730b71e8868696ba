"""scripts/glue/tune.sh: the forgetting-aware search (recadam_fairseq/launch/search.py, launch/space.py,
engine/trials.py).

In-process: the spaces and every one-line refusal, the fronts and picks against a computation by hand on synthetic
trials, the sampler's proposals under one seed. Through tune.sh: the tiny model's real fairseq-train (two methods,
three trials each, two at a time, then the picks over two seeds and the summary; a refused trial), and a fake
trainer whose scores are a function of its lr and knobs for what is about the study (Ctrl-C and the same command
again, a raised TRIALS, the pretend SLURM cluster)."""

import csv
import glob
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from helpers import ROOT, base_env, fast_python, fast_train, marked_bash_lines
from recadam_fairseq.engine import trials as T
from recadam_fairseq.launch import search, space, study
from recadam_fairseq.launch.spec import Stop

TUNE = os.path.join(ROOT, "scripts", "glue", "tune.sh")

# A trainer that trains nothing: it logs one validation whose accuracy and forgetting are smooth functions of its lr
# and RecAdam's k (a front to find), keeps a loadable checkpoint_last.pt, and notes each start in its run directory
# (fresh, or resumed from that checkpoint). FAKE_SLEEP: how long it "trains".
FAKE_TRAIN = r'''
import json, math, os, sys, time
import torch
argv = sys.argv[1:]
def flag(name, default=None):
    return argv[len(argv) - 1 - argv[::-1].index(name) + 1] if name in argv else default
save = flag("--save-dir")
os.makedirs(save, exist_ok=True)
last = os.path.join(save, "checkpoint_last.pt")
with open(os.path.join(save, "starts"), "a") as f:
    f.write(("resumed" if os.path.exists(last) else "fresh") + f" {os.getpid()}\n")
torch.save({"optimizer_history": [{"num_updates": 1}]}, last)
time.sleep(float(os.environ.get("FAKE_SLEEP") or 0))
lr = float(flag("--lr"))
if os.environ.get("FAKE_REFUSE") == "all" or lr > float(os.environ.get("FAKE_REFUSE") or "inf"):  # (before training)
    sys.exit("fake_train.py: error: " + ("unrecognized arguments: --bogus" if os.environ["FAKE_REFUSE"] == "all" else
                                         f"--lr {flag('--lr')} is more than this trainer takes"))
x, k = math.log10(lr) + 4, float(flag("--recadam-anneal-k", "1"))
acc, fgt = 80 + 10 * math.exp(-x * x), 0.01 * 10 ** x * (0.5 + k)
print('2026-01-01 | INFO | valid | ' + json.dumps({"epoch": 1, "valid_accuracy": f"{acc:.2f}",
      "valid_fgt_mlm_loss_delta": f"{fgt:.5f}", "valid_num_updates": "2"}))
'''


def fake_scores(lr, k=1.0):
    x = math.log10(lr) + 4
    return round(80 + 10 * math.exp(-x * x), 2), round(0.01 * 10 ** x * (0.5 + k), 5)


@pytest.fixture
def fake(tmp_path):
    """tune.sh's environment with the fake trainer: SST-2-like data without a training set, an unread checkpoint
    (ARCH, MAX_POSITIONS and FP16=0 given), a probe directory."""
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    (tmp_path / "glue-bin" / "SST-2-bin" / "input0").mkdir(parents=True)
    (tmp_path / "probe").mkdir()
    (tmp_path / "model.pt").write_text("")
    return base_env(ROBERTA_PATH=tmp_path / "model.pt", DATA_DIR=tmp_path / "glue-bin", SAVE_DIR=tmp_path / "runs",
                    FAIRSEQ_TRAIN=f"{fast_python()} {script}", ARCH="roberta_base", MAX_POSITIONS=512, FP16=0,
                    FORGETTING_PROBE=tmp_path / "probe", MAX_UPDATE=100, METHODS="adam recadam", SEEDS="1",
                    GRID_POLL_S="0.2")


def tune(env, *args, check=0):
    p = subprocess.run([TUNE, "SST-2", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert check is None or p.returncode == check, p.stdout[-4000:]
    return p


def read_trials(save_dir, task="SST-2"):
    with open(os.path.join(save_dir, task, "search", "trials.csv"), newline="") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------- in-process
BAD = [
    ({"METHODS": "adam recadm"}, "METHODS: unknown METHOD 'recadm' (did you mean recadam?)"),
    ({"TRIALS": "0"}, "TRIALS must be a positive integer, got '0'"),
    ({"K_RANGE": "1 0.1"}, "K_RANGE='1 0.1': an empty range (LOW must be below HIGH; to fix the value, set K instead)"),
    ({"K_RANGE": "0.1"}, "K_RANGE='0.1': give LOW HIGH, e.g. K_RANGE=\"0.01 1\""),
    ({"GAMMA_RANGE": "0 100"}, "GAMMA_RANGE='0 100': searched on a log scale, LOW must be above 0"),
    ({"METHODS": "adam llrd", "LLRD_RANGE": "0.5 1.5"}, "LLRD_RANGE='0.5 1.5': the lr decay must be in (0, 1]"),
    ({"T0_RANGE": "0.5 2"}, "T0_RANGE='0.5 2': fractions of the run's updates, in (0, 1]"),
    ({"LR_RANGE": "-1 1"}, "LR_RANGE='-1 1': searched on a log scale, LOW must be above 0"),
    ({"RHO_RANGE": "0.01 0.1"}, "RHO_RANGE: none of METHODS (adam recadam) has rho"),
    ({"K": "0.1", "K_RANGE": "0.01 1"}, "K=0.1 fixes it and K_RANGE searches it: give one"),
    ({"LR": "1e-4"}, "METHODS: adam has nothing to search (LR set): unset LR to search it"),
    ({"FORGETTING_PROBE": ""}, "FORGETTING_PROBE is not set: forgetting is the search's second objective"),
    ({"RESTART": "1"}, "RESTART=1: not taken by tune.sh"),
    ({"METHODS": "fsam", "KEEP_RATIO_RANGE": "0.05 0.5"}, "KEEP_RATIO_RANGE: keep_ratio is not searched (its value is "
                                                          "not in a run's name: two trials would share"),
    ({"KK_RANGE": "0.01 1"}, "KK_RANGE: no knob is searched so (did you mean K_RANGE?)"),
]


@pytest.mark.parametrize("env, message", BAD, ids=[m.split(":")[0].split("=")[0] for _, m in BAD])
def test_bad_input_is_one_line_before_anything(fake, env, message):
    with pytest.raises(Stop) as e:
        search.Search("SST-2", [], {**fake, **env})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_tune_sh_says_it_in_one_line(fake, capsys, monkeypatch):
    """tune.sh's command line: a Stop is `tune.sh: error: ...` (exit 2) and nothing is written; another command's
    *_RANGE variables are none of its business."""
    monkeypatch.setattr(os, "environ", {**fake, "TRIALS": "0", "DATE_RANGE": "2020 2021"})
    assert search.main(["SST-2"]) == 2
    assert capsys.readouterr().err == "tune.sh: error: TRIALS must be a positive integer, got '0'\n"
    assert not os.path.exists(fake["SAVE_DIR"])


def test_the_spaces_and_a_study_made_for_another_search(fake):
    s = search.Search("SST-2", [], {**fake, "METHODS": "adam recadam llrd", "K": "0.2", "LLRD_RANGE": "0.6 0.9"})
    dims = {m: [(d.var, d.low, d.high, d.log) for d in ms.dims] for m, ms in s.spaces.items()}
    assert dims == {"adam": [("LR", 1e-5, 1e-3, True)],
                    "recadam": [("LR", 1e-5, 1e-3, True), ("T0", 0.05, 0.8, False), ("GAMMA", 100, 1e4, True)],
                    "llrd": [("LR", 1e-5, 1e-3, True), ("LLRD", 0.6, 0.9, False)]}
    assert s.spaces["recadam"].pinned == {"k": "0.2"} and (s.task, s.metric, s.updates) == ("SST-2", "accuracy", 100)
    assert s.space_text("recadam") == "LR 1e-05 to 0.001 (log), T0 0.05 to 0.8 of 100 updates, GAMMA 100 to 10000 (log), " \
                                     "fixed K=0.2"
    s.study.open(print)
    del s  # (its lock goes with it)
    same = {"METHODS": "adam recadam llrd", "K": "0.2", "LLRD_RANGE": "0.6 0.9"}
    for env, what in (({"METHODS": "adam recadam", "K": "0.2"}, "METHODS adam recadam llrd, not METHODS adam recadam"),
                      (dict(same, MAX_UPDATE="50"), "MAX_UPDATE 100, not MAX_UPDATE 50"),
                      (dict(same, SEEDS="2 1"), "SEEDS' first 1, not SEEDS' first 2"),
                      (dict(same, SEARCH_SEED="3"), "SEARCH_SEED 0, not SEARCH_SEED 3"),
                      (dict(same, LLRD_RANGE="0.7 0.9"), "llrd's ranges LR 1e-05 to 0.001 (log), LLRD 0.6 to 0.9, not "
                                                         "llrd's ranges LR 1e-05 to 0.001 (log), LLRD 0.7 to 0.9")):
        with pytest.raises(Stop, match=re.escape(f"holds a search made for {what}: give the same, or another SAVE_DIR")):
            search.Search("SST-2", [], {**fake, **env}).study.open(print)


def test_fronts_and_picks_by_hand():
    def trial(method, n, acc=None, fgt=None, state="complete"):
        return {"method": method, "number": n, "state": state, "values": {"LR": "1e-4"}, "metric": acc,
                "forgetting": fgt, "run_dir": f"r/{method}{n}/seed1", "setting": f"{method}{n}", "reason": ""}

    recs = [trial("adam", 0, 80, 0.05), trial("adam", 1, 82, 0.06), trial("adam", 2, 81, 0.07),  # 2: under 1
            trial("adam", 3, 79, 0.04), trial("adam", 4, state="diverged"),
            trial("recadam", 0, 81.6, 0.02), trial("recadam", 1, 81.4, 0.01), trial("recadam", 2, 83, 0.05),
            trial("recadam", 3, 80, 0.03), trial("recadam", 4, 81.6, 0.02),  # 3: under 0; 4: 0's twin
            trial("llrd", 0, state="refused")]
    fronts = {m: [r["number"] for r in f] for m, f in T.fronts(recs).items()}
    # by hand: a trial is off its method's front when another is at least as good on both and better on one
    assert fronts == {"adam": [1, 0, 3], "recadam": [2, 0, 4, 1], "llrd": []}
    assert T.reference(recs)["number"] == 1  # Adam's best: 82
    picks = {m: [(r["number"], r["why"]) for r in p] for m, p in T.picks(recs, floor=0.5).items()}
    # within 0.5 of 82: adam's 82 (also its best), recadam's 83 and 81.6 (the least forgetting: 0.02, trial 0 first)
    assert picks == {"adam": [(1, "least forgetting within the floor, best metric")],
                     "recadam": [(0, "least forgetting within the floor"), (2, "best metric")], "llrd": []}
    assert [(r["number"], r["why"]) for r in T.picks(recs, floor=1.0)["recadam"]] == [
        (1, "least forgetting within the floor"), (2, "best metric")]  # 81.4 is within 1 of 82
    assert T.picks([r for r in recs if r["method"] != "adam"], 0.5)["recadam"][0]["number"] == 2  # the reference: 83
    rows, fields = T.csv_rows(recs, T.fronts(recs))
    assert fields[:4] == ["method", "trial", "state", "LR"] and [r["front"] for r in rows[:5]] == ["yes", "yes", "", "yes", ""]
    from recadam_fairseq.engine.trials_plot import x_range

    # the figure's forgetting axis ends at the boxplot's whisker, Q3 + 1.5 IQR, by hand: 0, .01, .02, .03, .04, .37
    # have Q1 = .0125, Q3 = .0375 (linear between ranks), so the whisker is .075 and .37 is drawn at the edge of an
    # axis ending at .04; a front point is never cut; fewer than 4 trials are all drawn
    xs = [0.0, 0.01, 0.02, 0.03, 0.04, 0.37]
    assert x_range(xs, [0.0]) == (0.0, 0.04) and x_range(xs, [0.0, 0.37]) == (0.0, 0.37)
    assert x_range(xs[:2] + [0.37], [0.0]) == (0.0, 0.37)
    tiny = [-0.00057, -0.00055, -0.00043, -0.00036, -0.00013, -0.00009]  # every trial at chance: none far off
    assert x_range(tiny, [-0.00057, -0.00055]) == (-0.00057, -0.00009)

def test_the_same_seed_proposes_the_same_trials(fake, tmp_path):
    """Two studies under one SEARCH_SEED draw the same trials, past the random start (their TPE fits the same told
    scores); another seed draws others; a new launcher on a study goes on without drawing a trial again."""
    def draw(save, seed, n, tell=True):
        s = search.Search("SST-2", [], {**fake, "SAVE_DIR": str(save), "SEARCH_SEED": str(seed)})
        s.study.open(print)
        out = []
        for _ in range(n):
            number, values = s.study.ask("recadam")
            out.append(values)
            if tell:
                acc, fgt = fake_scores(float(values["LR"]), float(values["K"]))
                s.study.tell("recadam", number, {"state": "complete", "metric": acc, "forgetting": fgt})
        return out

    first = draw(tmp_path / "a", 7, study.STARTUP + 2)
    assert draw(tmp_path / "b", 7, study.STARTUP + 2) == first
    assert len({v["LR"] for v in first}) == len(first)  # (each draw its own: the seed moves with the trials)
    assert draw(tmp_path / "c", 8, 1)[0] != first[0]
    assert set(first[0]) == {"LR", "K", "T0", "GAMMA"} and 5 <= int(first[0]["T0"]) <= 80  # a fraction of 100
    more = draw(tmp_path / "a", 7, 3)
    assert not [v for v in more if v in first]
    # a lower TRIALS than the trials run is refused; a trial whose launcher stopped between drawing its parameters and
    # keeping its values is rebuilt from them
    s = search.Search("SST-2", [], {**fake, "SAVE_DIR": str(tmp_path / "a"), "SEARCH_SEED": "7", "TRIALS": "3"})
    s.study.open(print)
    with pytest.raises(Stop, match="TRIALS=3: the search has 10 trials of recadam already: TRIALS only grows"):
        s.plan(s.study.records())
    trial = s.study.studies["adam"].ask()
    trial.suggest_float("lr", 1e-5, 1e-3, log=True)  # drawn, not kept: its launcher stopped here
    (orphan,) = [r for r in s.study.records() if r["method"] == "adam"]
    assert orphan["state"] == "running" and orphan["values"] == {"LR": space.three_figures(trial.params["lr"])}


def test_three_figures_is_one_text_a_value():
    cases = {2.3e-05: "2.3e-05", 0.000127: "1.27e-04", 0.00099996: "0.001", 0.001: "0.001", 0.0518: "0.0518",
             57.0: "57", 1234.5: "1230", 9999.6: "10000", 10000.0: "10000"}
    assert {x: space.three_figures(x) for x in cases} == cases


# --------------------------------------------------------------------------- tune.sh
@pytest.fixture(scope="module")
def probe(tiny, tmp_path_factory):
    from recadam_fairseq.prepare import binarize_probe

    out = str(tmp_path_factory.mktemp("probe") / "probe")
    binarize_probe.main(["--text", os.path.join(tiny.root, "raw", "lm.valid"), "--dict",
                         os.path.join(tiny.lm_bin, "dict.txt"), "--out", out])
    return out


def tiny_env(tiny, probe, save, **kw):
    return base_env(**{**dict(ROBERTA_PATH=tiny.pretrained, DATA_DIR=tiny.glue_bin, SAVE_DIR=save,
                              FORGETTING_PROBE=probe, FAIRSEQ_TRAIN=fast_train(), OMP_NUM_THREADS=1, MAX_UPDATE=8,
                              SAVE_INTERVAL_UPDATES=4, LR_RANGE="1e-4 1e-3", GAMMA_RANGE="10 100"), **kw})


def test_a_search_on_the_tiny_model_as_printed(tiny, probe, tmp_path):
    """docs/search.md's block as printed (but its `make demo`, this suite's set-up): two methods x three trials of
    real fairseq-train, two at a time (their runs overlap), equal budgets; each trial's scores are what the engine
    reads from its run; the picks over seeds 1 and 2 (a seed-1 run is the trial's own: no retraining) and the summary
    with the verdicts against Adam's best pick and the figures; the same command again trains nothing."""
    lines = marked_bash_lines("docs/search.md", "<!-- tune-tiny:start -->", "<!-- tune-tiny:end -->")
    assert lines[0].startswith("make demo") and "scripts/glue/tune.sh SST-2" in lines[-1]
    for name in ("scripts", "recadam_fairseq"):  # the repository, as a user's clone would be
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    (tmp_path / "demo-out" / "tiny").mkdir(parents=True)  # what make demo made: this session's tiny model and probe
    os.symlink(tiny.pretrained, tmp_path / "demo-out" / "tiny" / "pretrained.pt")
    os.symlink(tiny.glue_bin, tmp_path / "demo-out" / "tiny" / "glue-bin")
    os.symlink(probe, tmp_path / "demo-out" / "probe")
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), tmp_path / ".venv")
    env = base_env(FAIRSEQ_TRAIN=fast_train())  # (the suite's fairseq-train: forked, not a fresh interpreter)
    script = "set -euo pipefail\n" + "\n".join(lines[1:]) + "\n"
    p = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert p.returncode == 0, (p.stdout + p.stderr)[-5000:]
    save = tmp_path / "tune-runs"
    trials = read_trials(save)
    assert [(t["method"], t["state"]) for t in trials] == [("adam", "complete")] * 3 + [("recadam", "complete")] * 3
    spans = []
    from recadam_fairseq.engine.read import read_run

    for t in trials:
        t["run_dir"] = str(tmp_path / t["run_dir"])  # (relative: SAVE_DIR=tune-runs)
        argv = open(os.path.join(t["run_dir"], "command.sh")).read().split()
        assert argv[argv.index("--max-update") + 1] == "20" and argv[argv.index("--lr") + 1] == t["LR"]  # equal budgets
        r = read_run(t["run_dir"], str(save))
        assert (float(t["metric"]), float(t["forgetting"])) == (round(r["best"], 4), round(r["forgetting"], 5))
        spans.append((os.stat(os.path.join(t["run_dir"], "command.sh")).st_mtime,
                      os.stat(os.path.join(t["run_dir"], "done")).st_mtime))
    assert any(max(a[0], b[0]) < min(a[1], b[1]) for i, a in enumerate(spans) for b in spans[i + 1:]), spans
    assert "6 of 6 trials ended, 0 running, 0 left" in p.stdout
    md = open(save / "SST-2" / "search" / "summary.md").read()
    assert md.startswith("# Search: SST-2\n") and "| adam | 3 / 0 / 0 |" in md and "| recadam | 3 / 0 / 0 |" in md
    assert "### SST-2: dev accuracy against forgetting (mlm loss (bits) since θ*)" in md
    seed2 = glob.glob(str(save / "SST-2" / "*" / "seed2"))  # the picks' second seed; their first: the trial's run
    assert seed2 and all(os.path.join(os.path.dirname(d), "seed1") in {t["run_dir"] for t in trials} for d in seed2)
    assert all(f"| {os.path.basename(os.path.dirname(d))} | 2 |" in md for d in seed2), md
    for name in ("search-SST-2.png", "forgetting-SST-2.png", "verdicts.csv"):
        assert (save / "SST-2" / "search" / name).stat().st_size > 0
    p = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "6 ended before, 0 to run" in p.stdout and "confirming" not in p.stdout and "== " not in p.stdout, p.stdout


def test_a_refused_trial_is_recorded_with_its_reason(tiny, probe, tmp_path):
    """RecAdam at lr x γ >= 2 is refused by the plug-in before training: the trial is recorded with the plug-in's
    one line and does not count; after TRIALS refusals the method is asked no more."""
    save = tmp_path / "runs"
    p = tune(tiny_env(tiny, probe, save, METHODS="recadam", TRIALS=1, LR_RANGE="0.01 0.02", GAMMA="5000",
                      GAMMA_RANGE=""), check=1)
    (t,) = read_trials(save)
    assert t["state"] == "refused" and "overshoots them and diverges" in t["reason"], t
    assert "recadam #0 refused: recadam: --lr" in p.stdout
    assert "recadam: 1 trials refused, no more asked" in p.stdout and "no trial completed, nothing to confirm" in p.stdout


def test_ctrl_c_then_the_same_command_then_more_trials(fake):
    """A real SIGINT to tune.sh's process group while trials train: exit 130, no traceback; the same command ends
    with exactly three complete trials a method, those complete before the kill unchanged, the killed ones' runs
    resumed from their checkpoints and nothing trained twice; TRIALS=4 adds one trial a method."""
    env = dict(fake, TRIALS="3", JOBS="2", FAKE_SLEEP="1.5")
    proc = subprocess.Popen([TUNE, "SST-2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    trials_csv = os.path.join(env["SAVE_DIR"], "SST-2", "search", "trials.csv")
    deadline = time.time() + 60
    while time.time() < deadline:  # two trials ended, two more under way (one with its checkpoint)
        ended = open(trials_csv).read().count(",complete,") if os.path.exists(trials_csv) else 0
        running = [d for d in glob.glob(os.path.join(env["SAVE_DIR"], "SST-2", "*-lr*", "seed1"))
                   if os.path.exists(os.path.join(d, "checkpoint_last.pt")) and not os.path.exists(os.path.join(d, "done"))]
        if ended >= 2 and running:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in out, out
    assert out.splitlines()[-1] == "tune.sh: interrupted: the trials under way ended; the same command goes on from there"
    before = read_trials(env["SAVE_DIR"])
    tune(dict(env, FAKE_SLEEP="0"))
    after = read_trials(env["SAVE_DIR"])
    assert [t["state"] for t in after] == ["complete"] * 6
    kept = lambda rows: {(t["method"], t["trial"]): {k: v for k, v in t.items() if k != "front"}  # noqa: E731
                         for t in rows if t["state"] == "complete"}  # (a later trial may push one off its front)
    assert len(kept(before)) >= 2 and kept(before).items() <= kept(after).items()
    for t in after:
        acc, fgt = fake_scores(float(t["LR"]), float(t.get("K") or 1))
        assert (float(t["metric"]), float(t["forgetting"])) == (acc, fgt)
    starts = {t["run_dir"]: open(os.path.join(t["run_dir"], "starts")).read().split()[::2] for t in after}
    # nothing trains twice: a run is started once, or started and resumed once (a trial the kill stopped)
    assert all(v in (["fresh"], ["fresh", "resumed"]) for v in starts.values()), starts
    assert all(starts[t["run_dir"]] == ["fresh"] for t in before if t["state"] == "complete")
    assert all(starts[d] == ["fresh", "resumed"] for d in running)
    tune(dict(env, FAKE_SLEEP="0", TRIALS="4"))
    more = read_trials(env["SAVE_DIR"])
    assert [(t["method"], t["state"]) for t in more] == [("adam", "complete")] * 4 + [("recadam", "complete")] * 4
    assert kept(after).items() <= kept(more).items()
    assert all(open(os.path.join(t["run_dir"], "starts")).read().split()[::2] == starts[t["run_dir"]] for t in after)


def test_refused_trials_are_drawn_again_and_a_refusal_of_every_trial_stops(fake):
    """A trial the trainer refuses before training (its one line) is recorded with its reason and does not count: the
    method still gets TRIALS trained ones. A refusal that names none of the trial's values would meet every trial:
    the search stops with it, one line (exit 2)."""
    p = tune(dict(fake, METHODS="adam", TRIALS="3", FAKE_REFUSE="4e-5"))
    trials = read_trials(fake["SAVE_DIR"])
    refused = [t for t in trials if t["state"] == "refused"]
    assert len([t for t in trials if t["state"] == "complete"]) == 3 and refused, p.stdout
    assert all(t["reason"] == f"--lr {t['LR']} is more than this trainer takes" for t in refused)
    assert all(float(t["LR"]) <= 4e-5 for t in trials if t["state"] == "complete")
    p = tune(dict(fake, METHODS="adam", SAVE_DIR=fake["SAVE_DIR"] + "-all", FAKE_REFUSE="all"), check=2)
    assert p.stdout.splitlines()[-1] == ("tune.sh: error: adam #0 refused, not for its values: unrecognized arguments: "
                                         "--bogus"), p.stdout


def test_every_method_trains_the_same_updates(fake, tmp_path):
    """RTE: R3F's recipe is its example's (batch 8, 3120 updates), Adam's fairseq's (16, 2036): every trial of either
    runs the first method's 2036 updates, and a line says the batches differ."""
    (tmp_path / "glue-bin" / "RTE-bin" / "input0").mkdir(parents=True)
    said = []
    env = {k: v for k, v in fake.items() if k != "MAX_UPDATE"}
    s = search.Search("RTE", [], {**env, "METHODS": "adam r3f"})
    s.v.say = said.append
    specs = [s.build(m, {"LR": "1e-4"}) for m in ("adam", "r3f")]
    assert [sp.argv[sp.argv.index("--max-update") + 1] for sp in specs] == ["2036", "2036"] and s.updates == 2036
    assert [sp.argv[sp.argv.index("--batch-size") + 1] for sp in specs] == ["16", "8"]


def test_a_search_on_a_pretend_slurm_cluster(fake, tmp_path):
    """CLUSTER=slurm: each trial a SLURM job through the real submitit (tests/helpers/fake_slurm.py), carrying its
    spec; search/jobs.json records each run's job; every trial complete."""
    from helpers import fake_slurm

    fake_slurm.install(str(tmp_path / "bin"), str(tmp_path / "slurm-state"))
    env = dict(fake, CLUSTER="slurm", METHODS="adam", TRIALS="2", JOBS="2", FAKE_SLURM_STATE=str(tmp_path / "slurm-state"),
               PATH=f"{tmp_path / 'bin'}{os.pathsep}{fake['PATH']}")
    p = tune(env)
    trials = read_trials(env["SAVE_DIR"])
    assert [t["state"] for t in trials] == ["complete", "complete"], p.stdout
    assert sorted(int(n) for n in os.listdir(tmp_path / "slurm-state") if n.isdigit()) == [1000, 1001]
    assert "adam #0 sent to slurm (job 100" in p.stdout
    sent = json.load(open(os.path.join(env["SAVE_DIR"], "SST-2", "search", "jobs.json")))
    assert sorted(sent.values()) == ["1000", "1001"] and set(sent) == {t["run_dir"] for t in trials}
    logs = glob.glob(os.path.join(env["SAVE_DIR"], "SST-2", "search", ".submitit", "*_log.out"))
    assert len(logs) == 2 and all("== done: " in open(f).read() for f in logs)
