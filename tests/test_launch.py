"""recadam_fairseq/launch in-process: a run's spec (its command.sh, the rules for a directory that holds a run), the
scripts' variables, and the one grammar of run names that a user's grid, the task scripts and the comparison write
and the engine reads back. (The scripts themselves, end to end: tests/test_glue_scripts.py.)"""

import glob
import json
import os
import re
import subprocess

import pytest

from helpers import ROOT
from recadam_fairseq import catalogue
from recadam_fairseq.engine import methods
from recadam_fairseq.launch import spec as run_spec
from recadam_fairseq.launch.spec import Conflict, RunSpec, Stop
from recadam_fairseq.launch.variables import Variables


def make(tmp_path, *flags, lead=1):
    argv = ["fairseq-train", "data dir", "--lr", "2e-5", "--adam-betas", "(0.9, 0.98)", *flags]
    return RunSpec(argv, lead, str(tmp_path / "RTE" / "adam" / "seed1"), "RTE adam seed 1", "LR=2e-5",
                   "scripts/glue/finetune.sh", {"seed": 1})


def test_command_sh_runs_the_argv_through_bash(tmp_path):
    """command.sh, as bash reads it, runs the spec's argv word for word (quotes, spaces, a lone quote), from its cwd."""
    s = make(tmp_path, "--note", "it's", "--empty", "")
    s.argv[0] = "printf"
    s.argv[1:1] = ["%s\\n"]
    s.lead = 2
    s.write()
    out = subprocess.run(["bash", os.path.join(s.run_dir, "command.sh")], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:-1] == s.argv[2:]
    assert json.load(open(os.path.join(s.run_dir, "run.json"))) == {"seed": 1}


def test_a_run_directory_s_state(tmp_path):
    """new -> unfinished (a log) -> done; the same flags in another order are the same command; another value is a
    Conflict naming what changed, before and after a run finished; RESTART=1 makes it new and clears what ran."""
    s = make(tmp_path)
    assert s.state() == "new"
    s.write()
    other = make(tmp_path)
    other.argv[3] = "3e-5"
    assert other.state() == "new"  # command.sh alone (a dry run's): nothing started
    open(os.path.join(s.run_dir, "train.log"), "w").close()
    assert s.state() == "unfinished"
    with pytest.raises(Conflict):  # started (a log, no checkpoint yet) with another command
        other.state()
    open(os.path.join(s.run_dir, "checkpoint_last.pt"), "w").close()
    reordered = make(tmp_path)
    reordered.argv = reordered.argv[:2] + reordered.argv[4:] + reordered.argv[2:4]
    assert reordered.state() == "unfinished"
    other = make(tmp_path)
    other.argv[3] = "3e-5"
    with pytest.raises(Conflict, match=r"was started with another command \(was: --lr 2e-5; now: --lr 3e-5\): "
                                       r"RESTART=1 starts it over"):
        other.state()
    open(os.path.join(s.run_dir, "done"), "w").close()
    assert s.state() == "done" and other.state(restart=True) == "new"
    with pytest.raises(Conflict):
        other.state()
    s.clear()
    assert sorted(os.listdir(s.run_dir)) == ["command.sh", "run.json"]


@pytest.mark.parametrize("env,call,message", [
    ({"SEED": "-1"}, ("whole", "SEED", 1, 0), "SEED must be a non-negative integer, got '-1'"),
    ({"BATCH": "0"}, ("whole", "BATCH", 16), "BATCH must be a positive integer, got '0'"),
    ({"BATCH": "1.5"}, ("whole", "BATCH", 16), "BATCH must be a positive integer, got '1.5'"),
    ({"FP16": "yes"}, ("fp16",), "FP16 must be 0, 1 or auto, got 'yes'"),
    ({"FORGETTING_BUDGET": "lots"}, ("number", "FORGETTING_BUDGET", "the most"),
     "FORGETTING_BUDGET must be a number (the most), got 'lots'"),
])
def test_bad_variables_are_one_line(env, call, message):
    v = Variables(env, "finetune.sh")
    with pytest.raises(Stop) as e:
        getattr(v, call[0])(*call[1:])
    assert str(e.value) == message


def test_an_empty_variable_is_an_unset_one():
    v = Variables({"SEED": "", "LR": ""}, "finetune.sh")
    assert v.whole("SEED", 1, 0) == 1 and v.get("LR", "2e-5") == "2e-5" and v.fp16() == "auto"


def committed_runs():
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "forgetting*.json"))):
        with open(path) as f:
            record = json.load(f)
        for r in record.get("runs", []):
            yield os.path.basename(path), r


def test_the_comparison_s_committed_runs_read_back_in_the_grid_s_grammar():
    """Every run of the committed comparison pages (docs/forgetting*.json) is named in the catalogue's grammar: the
    engine's reader (catalogue.parse_run_name, as for a user's grid) gives its method and the knobs its spec set, and
    writing those back gives the name. R3F's λ and LoRA's rank were outside the grammar, and recadam-r3f's λ was read
    as λ(t)'s schedule."""
    n = 0
    for page, r in committed_runs():
        method, knobs = catalogue.parse_run_name(r["name"])
        spec = methods.parse(r["method"] + (":" + ",".join(f"{k}={v}" for k, v in knobs.items()) if knobs else ""))
        assert method == r["method"] and set(knobs) == set(methods.METHODS[method]), (page, r["name"], knobs)
        assert methods.setting_name(spec) == r["name"], (page, r["name"])
        n += 1
    assert n > 200
    assert catalogue.parse_run_name("recadam-r3f-k0.1-t50-g5000-lambda1") == (
        "recadam-r3f", {"k": "0.1", "t0": "50", "gamma": "5000", "lambda": "1"})
    assert catalogue.parse_run_name("recadam-k0.5-t250-linear") == ("recadam", {"k": "0.5", "t0": "250",
                                                                                 "anneal_fun": "linear"})


def test_the_task_scripts_names_are_the_same_grammar():
    """A task script's name (knobs at their defaults left out where the catalogue says) reads back to the values
    that made it, for every method and each knob turned off its default."""
    for m in catalogue.METHODS.values():
        for turned in [None, *m.knobs]:
            values = {k: catalogue.KNOBS[k].default for k in m.knobs}
            if turned and catalogue.KNOBS[turned].tag is not None and turned != "fisher":
                values[turned] = catalogue.KNOBS[turned].off_default
            name = m.run_name(values)
            method, knobs = catalogue.parse_run_name(name)
            assert method == m.name, name
            assert all(values[k] == v for k, v in knobs.items()), (name, knobs)
            shown = {k for k in m.knobs if catalogue.KNOBS[k].tag is not None and not (
                catalogue.KNOBS[k].tag_if_changed and values[k] == catalogue.KNOBS[k].default)}
            assert set(knobs) == shown, (name, knobs)


def test_each_task_script_is_a_line_over_the_launcher():
    """The task scripts hold no logic: at most 25 lines of bash code each (their help is their comment), no eval; the
    demos name no fairseq-train flag."""
    for script in ("scripts/glue/finetune.sh", "scripts/glue/grid.sh", "scripts/glue/multitask.sh",
                   "scripts/seq2seq/finetune.sh", "scripts/demo.sh", "scripts/ewc_demo.sh"):
        with open(os.path.join(ROOT, script)) as f:
            code = [ln for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
        assert not [ln for ln in code if re.search(r"(^|[;&|(]\s*)eval\b", ln)], script
        if "demo" in script:  # the demos' runs are the launcher's: no fairseq-train flag of their own
            assert not [ln for ln in code if any(f in ln for f in ("--optimizer", "--recadam", "--task", "--lr"))]
        else:
            assert len(code) <= 25, script
    assert not os.path.exists(os.path.join(ROOT, "scripts", "glue", "common.sh"))


def test_quote_is_bash_s():
    for word in ["plain", "", "a b", "it's", "(0.9, 0.98)", "$HOME", "*"]:
        out = subprocess.run(["bash", "-c", f"printf %s {run_spec.quote(word)}"], capture_output=True, text=True)
        assert out.stdout == word


def test_a_multitask_dry_run_without_a_readable_checkpoint_writes_its_command(tmp_path):
    """DRY_RUN=1 only writes the command: a checkpoint it cannot read is a warning, and FREEZE (which needs the
    checkpoint's layers) is not checked, as the shell script did."""
    from recadam_fairseq.launch import multitask

    (tmp_path / "model.pt").write_bytes(b"")
    said = []
    v = Variables({"DRY_RUN": "1", "ROBERTA_PATH": str(tmp_path / "model.pt"), "DATA_DIR": str(tmp_path / "none"),
                   "SAVE_DIR": str(tmp_path / "runs"), "FP16": "0"}, "multitask.sh", say=said.append)
    s = multitask.build(v, [])
    assert s.run_dir == f"{tmp_path}/runs/MTL/roberta_base-uncertainty-adam/seed1"
    assert "--freeze-encoder-layers" in s.argv and s.argv[s.argv.index("--max-update") + 1] == "5000"
    assert said[0] == f"warning: no {tmp_path / 'none'}; assuming 1000 updates per epoch"
    assert said[1].startswith(f"warning: ROBERTA_PATH={tmp_path / 'model.pt'}: ")


def test_multitask_and_translation_variables(tmp_path):
    """multitask.sh names a run by its method's knobs (a K sweep's runs do not share a directory) and shows glue_avg
    in its progress lines; seq2seq/finetune.sh takes WARMUP=0 as no warmup; LR is checked as a number by both."""
    from recadam_fairseq.launch import multitask, translation

    (tmp_path / "model.pt").write_bytes(b"")
    base = {"DRY_RUN": "1", "ROBERTA_PATH": str(tmp_path / "model.pt"), "DATA_DIR": str(tmp_path / "none"),
            "SAVE_DIR": str(tmp_path / "runs"), "FP16": "0", "METHOD": "recadam"}
    quiet = dict(say=lambda msg: None)
    runs = [multitask.build(Variables(dict(base, K=k), "multitask.sh", **quiet), []) for k in ("0.1", "0.5")]
    assert [os.path.basename(os.path.dirname(r.run_dir)) for r in runs] == [
        "roberta_base-uncertainty-recadam-k0.1-t1000", "roberta_base-uncertainty-recadam-k0.5-t1000"]
    assert runs[0].metric == "glue_avg"
    with pytest.raises(Stop, match="LR must be a number \\(the learning rate\\), got '2e-5x'"):
        multitask.build(Variables(dict(base, LR="2e-5x"), "multitask.sh", **quiet), [])
    mt = {"DRY_RUN": "1", "PRETRAINED": str(tmp_path / "model.pt"), "DATA": str(tmp_path / "none"), "FP16": "0",
          "ARCH": "transformer", "SAVE_DIR": str(tmp_path / "runs")}
    s = translation.build(Variables(dict(mt, WARMUP="0", MAX_UPDATE="100"), "finetune.sh", **quiet), "adam", [])
    assert s.argv[s.argv.index("--warmup-updates") + 1] == "0"
    s = translation.build(Variables(dict(mt, MAX_UPDATE="100"), "finetune.sh", **quiet), "adam", [])
    assert s.argv[s.argv.index("--warmup-updates") + 1] == "6"
    with pytest.raises(Stop, match="LR must be a number"):
        translation.build(Variables(dict(mt, LR="fast"), "finetune.sh", **quiet), "adam", [])


def test_a_trainer_that_cannot_run_is_one_line(tmp_path, capsys):
    """FAIRSEQ_TRAIN naming no command: the script's one line (exit 2), no traceback, no done marker."""
    from recadam_fairseq.launch import command

    data = tmp_path / "glue-bin" / "RTE-bin" / "input0"
    data.mkdir(parents=True)
    (tmp_path / "model.pt").write_bytes(b"")
    env = {"ROBERTA_PATH": str(tmp_path / "model.pt"), "DATA_DIR": str(tmp_path / "glue-bin"), "ARCH": "roberta_base",
           "MAX_POSITIONS": "512", "FP16": "0", "SAVE_DIR": str(tmp_path / "runs"),
           "FAIRSEQ_TRAIN": str(tmp_path / "no-such-trainer")}
    rc = command.main(["finetune", os.path.join(ROOT, "scripts", "glue", "finetune.sh"), "RTE", "adam"], env=env)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"finetune.sh: error: cannot run {tmp_path / 'no-such-trainer'} (No such file or "
                               f"directory): set FAIRSEQ_TRAIN"]
    assert not os.path.exists(tmp_path / "runs" / "RTE" / "adam" / "seed1" / "done")
