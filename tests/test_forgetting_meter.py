"""The forgetting meter (--forgetting-probe, --forgetting-meter mlm|pairs) through the real fairseq-train.

Launches, two at a time: the mlm meter (plain Adam through --optimizer recadam -w 0, fairseq's own criterion,
validation and a checkpoint at updates 4, 8 and 12, TensorBoard, a forgetting budget for checkpoint_best.pt), the
same run without the meter, the pairs meter (sentence_prediction_recadam with fairseq's adam), and three bad
inputs. The expected values are computed here by hand: one sentence at a time, the full LM head, float64,
sklearn's AUC.
"""

import glob
import math
import os

import numpy as np
import pytest
import torch

from helpers import assert_one_line_error, fast_python, json_records, load_ckpt, run_jobs
from recadam_fairseq.core import probes
from recadam_fairseq.prepare import binarize_probe

VALIDATE = ["--validate-interval-updates", "4", "--save-interval-updates", "4", "--keep-interval-updates", "-1",
            "--log-format", "json", "--dropout", "0.1", "--attention-dropout", "0.1"]
# the mlm run and its twin without the meter: 12 updates at an lr that moves the tiny model, so the best accuracy
# (update 12) forgets more than BUDGET and the validations before it less (checked by the test, from the log)
MOVES = ["--lr", "3e-3"]
BUDGET = 0.009


def read_lines(path):
    with open(path) as f:
        return [x.strip() for x in f]


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("meter")
    raw, dict_txt = os.path.join(tiny.root, "raw"), os.path.join(tiny.lm_bin, "dict.txt")
    mlm, pairs = str(root / "probe-mlm"), str(root / "probe-pairs")
    binarize_probe.main(["--text", os.path.join(raw, "lm.valid"), "--dict", dict_txt, "--out", mlm])
    with open(root / "pairs.tsv", "w") as f:  # RTE's valid pairs: not_entailment read as contradiction
        for a, b, y in zip(*(read_lines(os.path.join(raw, f"RTE.valid.{c}")) for c in ("input0", "input1", "label"))):
            f.write(f"{a}\t{b}\t{'entailment' if y == 'entailment' else 'contradiction'}\n")
    binarize_probe.main(["--pairs", str(root / "pairs.tsv"), "--dict", dict_txt, "--out", pairs])
    # bad inputs: a dictionary without its last symbol; a probe of empty lines; a checkpoint without an LM head
    other_dict, other = str(root / "other.dict.txt"), str(root / "probe-other")
    with open(dict_txt) as f, open(other_dict, "w") as g:
        g.writelines(f.readlines()[:-1])
    binarize_probe.main(["--text", os.path.join(raw, "lm.valid"), "--dict", other_dict, "--out", other])
    empty = str(root / "probe-empty")
    binarize_probe.binarize(["", ""], empty, dict_txt)
    state = load_ckpt(tiny.pretrained)
    for k in ("encoder.lm_head.bias", "encoder.lm_head.layer_norm.bias"):
        state["model"][k] = torch.zeros_like(state["model"][k])
    ln = "encoder.lm_head.layer_norm.weight"
    state["model"][ln] = torch.ones_like(state["model"][ln])
    headless = str(root / "headless.pt")
    torch.save(state, headless)

    adam_w0 = ["--recadam-anneal-w", "0"]
    budget = ["--forgetting-budget", str(BUDGET), "--best-checkpoint-metric", "fgt_budget_accuracy",
              "--maximize-best-checkpoint-metric"]  # what finetune.sh's FORGETTING_BUDGET adds
    jobs = {
        "mlm": lambda: tiny.train(root / "mlm", *adam_w0, *VALIDATE, *MOVES, "--forgetting-probe", mlm, *budget,
                                  "--tensorboard-logdir", str(root / "tb"), updates=12, validate=True),
        "plain": lambda: tiny.train(root / "plain", *adam_w0, *VALIDATE, *MOVES, updates=12, validate=True),
        "pairs": lambda: tiny.train(root / "pairs", "--criterion", "sentence_prediction_recadam", *VALIDATE,
                                    "--forgetting-probe", pairs, "--forgetting-meter", "pairs", optimizer="adam",
                                    updates=4, validate=True),
        "dict": lambda: tiny.train(root / "dict", "--forgetting-probe", other, check=False),
        "empty": lambda: tiny.train(root / "empty", "--forgetting-probe", empty, check=False),
        "headless": lambda: tiny.train(root / "headless", "--forgetting-probe", mlm, "--restore-file", headless,
                                       check=False),
    }
    out = run_jobs([lambda k=k, job=job: {k: job()} for k, job in jobs.items()])
    return dict(root=root, mlm=mlm, pairs=pairs, other=other, empty=empty, **{f"log_{k}": v for k, v in out.items()})


def load_model(path, data):
    from fairseq import checkpoint_utils

    import recadam_fairseq.safe_globals  # noqa: F401

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
    return models[0].eval(), task.source_dictionary


def sentences(probe):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    ds = MMapIndexedDataset(os.path.join(probe, "sentences"))
    return [ds[i].long() for i in range(len(ds))]


@torch.no_grad()
def mlm_by_hand(path, data, probe):
    """Bits per masked token and accuracy (%), one sentence at a time through the whole LM head, float64.
    The masking as documented: sentence i, randperm of its tokens but </s> from a generator seeded i, the
    first max(1, round(0.15 n)) masked."""
    model, d = load_model(path, data)
    nll, hit, n = 0.0, 0, 0
    for i, sent in enumerate(sentences(probe)):
        k = max(1, int(round(0.15 * (len(sent) - 1))))
        pos = 1 + torch.randperm(len(sent) - 1, generator=torch.Generator().manual_seed(i))[:k]
        tokens = torch.cat([torch.tensor([d.bos()]), sent])
        inp = tokens.clone()
        inp[pos] = d.index("<mask>")
        logp = torch.log_softmax(model(inp[None])[0][0].double(), -1)
        nll -= float(logp[pos, tokens[pos]].sum())
        hit += int((logp[pos].argmax(-1) == tokens[pos]).sum())
        n += k
    return nll / n / math.log(2), 100.0 * hit / n


def valid_records(log):
    return {int(r["valid_num_updates"]): r for r in json_records(log, "valid")}


def test_mlm_meter_at_theta_star_is_the_masked_lm_loss_by_hand(tiny, runs):
    import json

    with open(runs["root"] / "mlm" / "forgetting_meter.json") as f:
        start = json.load(f)["start"]
    loss, acc = mlm_by_hand(tiny.pretrained, tiny.lm_bin, runs["mlm"])
    assert start["mlm_loss"] == pytest.approx(loss, rel=1e-5)
    assert start["mlm_acc"] == pytest.approx(acc, abs=1e-6)


def test_mlm_meter_at_each_validation_is_that_checkpoint_s(tiny, runs):
    import json

    recs = valid_records(runs["log_mlm"][1])
    assert sorted(recs) == [4, 8, 12]
    with open(runs["root"] / "mlm" / "forgetting_meter.json") as f:
        start = json.load(f)["start"]
    by_hand = {}
    for upd in (4, 8, 12):
        loss, acc = by_hand[upd] = mlm_by_hand(str(runs["root"] / "mlm" / f"checkpoint_1_{upd}.pt"), tiny.cls_bin,
                                               runs["mlm"])
        r = recs[upd]
        assert float(r["valid_fgt_mlm_loss"]) == pytest.approx(loss, abs=2e-5)
        assert float(r["valid_fgt_mlm_acc"]) == pytest.approx(acc, abs=2e-5)
        assert float(r["valid_fgt_mlm_loss_delta"]) == pytest.approx(loss - start["mlm_loss"], abs=2e-5)
        assert float(r["valid_fgt_mlm_acc_delta"]) == pytest.approx(acc - start["mlm_acc"], abs=2e-5)
    assert abs(float(recs[8]["valid_fgt_mlm_loss_delta"])) > 5e-5  # the encoder moved: a change the log shows
    # each validation measured anew: a meter that logged update 4's measurement again at 12 fails the checks above,
    # as the two checkpoints' losses differ by more than their tolerance
    assert abs(by_hand[12][0] - by_hand[4][0]) > 1e-4


def test_meter_does_not_change_training(runs):
    a = load_ckpt(runs["root"] / "mlm" / "checkpoint_last.pt")["model"]
    b = load_ckpt(runs["root"] / "plain" / "checkpoint_last.pt")["model"]
    p0 = load_ckpt(runs["root"] / "mlm" / "checkpoint_1_4.pt")["model"]
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert any(not torch.equal(a[k], p0[k]) for k in a)  # it trained after the first measurement
    for upd, r in valid_records(runs["log_plain"][1]).items():  # the same task metrics at each validation
        assert r["valid_loss"] == valid_records(runs["log_mlm"][1])[upd]["valid_loss"]
        assert not [k for k in r if "fgt_" in k]


def test_forgetting_budget_makes_checkpoint_best_the_best_validation_within_it(runs, tmp_path):
    """--forgetting-budget (FORGETTING_BUDGET) with --best-checkpoint-metric fgt_budget_accuracy: checkpoint_best.pt is
    the best accuracy among the validations that forgot at most the budget (fairseq's tie rule: the later one), read
    here from the log, and not the best accuracy overall; summarize.py picks the same validation and names the file,
    and under another budget names the numbered checkpoint that holds its pick."""
    import csv
    import subprocess
    import sys

    from helpers import ROOT

    recs = valid_records(runs["log_mlm"][1])
    acc = {u: float(r["valid_accuracy"]) for u, r in recs.items()}
    forgot = {u: float(r["valid_fgt_mlm_loss_delta"]) for u, r in recs.items()}
    within = [u for u in sorted(acc) if forgot[u] <= BUDGET]
    want = max(within, key=lambda u: (acc[u], u))
    unbudgeted = max(acc, key=lambda u: (acc[u], u))
    assert want != unbudgeted, (acc, forgot)  # the budget binds: the case to test
    for u, r in recs.items():  # over the budget: the worst value, which fairseq never prefers
        assert float(r["valid_fgt_budget_accuracy"]) == (acc[u] if u in within else -math.inf)
    run = runs["root"] / "mlm"
    best = load_ckpt(run / "checkpoint_best.pt")
    kept = load_ckpt(run / f"checkpoint_1_{want}.pt")
    assert best["optimizer_history"][-1]["num_updates"] == want
    assert all(torch.equal(best["model"][k], kept["model"][k]) for k in kept["model"])
    summarize = os.path.join(ROOT, "scripts", "glue", "summarize.py")
    line = subprocess.run([sys.executable, summarize, "--run", str(run)], capture_output=True, text=True).stdout
    assert line.startswith(f"best dev accuracy {acc[want]:g} at update {want} of 12 within its forgetting budget "
                           f"{BUDGET:g} (checkpoint_best.pt), 3 validations"), line
    for budget, pick, name in ((BUDGET, want, "checkpoint_best.pt"), (1.0, unbudgeted, f"checkpoint_1_{unbudgeted}.pt")):
        out = tmp_path / str(budget)
        subprocess.run([sys.executable, summarize, str(run), "--out", str(out), "--forgetting-budget", str(budget)],
                       check=True, capture_output=True)
        with open(out / "runs.csv") as f:
            (row,) = csv.DictReader(f)
        assert (int(row["best_update"]), row["checkpoint"]) == (pick, name)


def test_the_terminal_says_which_way_the_forgetting_went(runs):
    """The task scripts' validation line (launch/progress.py) and end line (summarize.py --run) say which way the
    probe's measure moved since θ*, from the logged change: the pair AUC "fell" when its delta is negative (forgot),
    the masked-LM loss "rose" when its delta is positive (forgot), each by the change's size."""
    from recadam_fairseq.engine.write import run_line
    from recadam_fairseq.launch.progress import progress_line

    for key, meter, verb in (("log_pairs", "pair AUC", {-1: "fell", 1: "rose"}),
                             ("log_mlm", "mlm loss", {-1: "fell", 1: "rose"})):
        log = runs[key][1]
        delta = "valid_fgt_pairs_auc_delta" if "pairs" in key else "valid_fgt_mlm_loss_delta"
        recs = valid_records(log)
        lines = [progress_line(ln) for ln in log.splitlines() if '"valid_num_updates"' in ln]
        assert len(lines) == len(recs) >= 1
        for (_, r), line in zip(sorted(recs.items()), lines):
            d = float(r[delta])
            unit = " bits" if "mlm" in key else ""
            said = f"{meter} unchanged" if d == 0 else f"{meter} {verb[1 if d > 0 else -1]} by {abs(d):.4g}{unit}"
            assert line.endswith(f", {said} since θ*") or f", {said} since θ*, over the budget" in line, line
    end = run_line(str(runs["root"] / "mlm"), "accuracy")
    assert "; there: mlm loss " in end and end.endswith(" since θ*"), end


def test_budget_flags_go_together_in_one_line():
    """--forgetting-budget without the meter or without --best-checkpoint-metric fgt_budget_METRIC, or the metric
    without the budget: one line each, before training."""
    from types import SimpleNamespace

    from recadam_fairseq.core.errors import ConfigError
    from recadam_fairseq.meters.forgetting_meter import check_budget

    def cfg(budget, best):
        return SimpleNamespace(forgetting_budget=budget, best_checkpoint_metric=best, maximize_best_checkpoint_metric=True)

    check_budget(cfg(0.01, "fgt_budget_accuracy"), True)
    check_budget(cfg(None, "accuracy"), False)
    for c, metered, message in (
            (cfg(0.01, "fgt_budget_accuracy"), False, "--forgetting-budget 0.01 needs the forgetting meter: "
                                                      "--forgetting-probe DIR"),
            (cfg(0.01, "accuracy"), True, "--forgetting-budget 0.01: checkpoint_best.pt follows --best-checkpoint-metric "
                                          "accuracy, which ignores the budget; give --best-checkpoint-metric "
                                          "fgt_budget_accuracy"),
            (cfg(None, "fgt_budget_mcc"), True, "--best-checkpoint-metric fgt_budget_mcc: the forgetting meter logs it "
                                                "with --forgetting-budget X")):
        with pytest.raises(ConfigError) as e:
            check_budget(c, metered)
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_mlm_meter_reaches_tensorboard(runs):
    event_acc = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    logdir = runs["root"] / "tb" / "valid"
    assert glob.glob(str(logdir / "events.out.tfevents.*"))
    acc = event_acc.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    recs = valid_records(runs["log_mlm"][1])
    for tag in ("fgt_mlm_loss", "fgt_mlm_acc", "fgt_mlm_loss_delta", "fgt_mlm_acc_delta", "fgt_budget_accuracy"):
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert sorted(got) == [4, 8, 12], tag
        for step, value in got.items():
            assert value == pytest.approx(float(recs[step][f"valid_{tag}"]), rel=1e-6, abs=1e-9), (tag, step)


def test_pairs_meter_is_the_zero_shot_auc_by_hand(tiny, runs):
    from sklearn.metrics import roc_auc_score

    import json

    pairs = np.load(os.path.join(runs["pairs"], "pairs.npz"))
    model, d = load_model(tiny.pretrained, tiny.lm_bin)
    with torch.no_grad():
        emb = []
        for sent in sentences(runs["pairs"]):
            h = model(torch.cat([torch.tensor([d.bos()]), sent])[None], features_only=True)[0][0]
            emb.append(h.double().mean(0))
    emb = torch.stack(emb)
    cos = torch.nn.functional.cosine_similarity(emb[pairs["premise"]], emb[pairs["hypothesis"]], dim=-1).numpy()
    want = roc_auc_score(pairs["label"], cos)
    with open(runs["root"] / "pairs" / "forgetting_meter.json") as f:
        start = json.load(f)["start"]
    assert start["pairs_auc"] == pytest.approx(want, abs=1e-6)
    rec = valid_records(runs["log_pairs"][1])[4]
    assert float(rec["valid_fgt_pairs_auc_delta"]) == pytest.approx(float(rec["valid_fgt_pairs_auc"]) - want, abs=2e-5)
    # at update 4: the comparison's measure.py on that checkpoint (its SNLI AUC, here on this probe) logs the same
    from recadam_fairseq.compare import measure

    at4, _ = measure.load(str(runs["root"] / "pairs" / "checkpoint_1_4.pt"), tiny.cls_bin)
    auc4 = measure.snli_auc(at4, runs["pairs"])["auc"]
    assert float(rec["valid_fgt_pairs_auc"]) == pytest.approx(auc4, abs=2e-5) and abs(auc4 - want) > 1e-3
    # the probe binarized from the pair file: rows back to its sentences
    lines = [ln.split("\t") for ln in read_lines(runs["root"] / "pairs.tsv")]
    d_lines = [" ".join(d[int(t)] for t in s[:-1]) for s in sentences(runs["pairs"])]
    assert [d_lines[i] for i in pairs["premise"]] == [x[0] for x in lines]
    assert [d_lines[i] for i in pairs["hypothesis"]] == [x[1] for x in lines]
    assert list(pairs["label"]) == [int(x[2] == "entailment") for x in lines]


def test_fairseq_adam_with_the_plugin_criterion_logs_its_distance_from_theta_star(tiny, runs):
    """The pairs run (fairseq's adam, sentence_prediction_recadam's decoupled objective) logs recadam_dist as RecAdam
    does: at update 4, Σ(θ − θ*)² of checkpoint_1_4.pt against the pretrained file in float64, over the model's
    tensors the checkpoint has (each stored tensor once: the LM head's weight is the tied embedding)."""
    logged = {int(r["num_updates"]): float(r["recadam_dist"]) for r in json_records(runs["log_pairs"][1], "train_inner")}
    assert sorted(logged) == [1, 2, 3, 4]  # --log-interval 1
    pre, now = load_ckpt(tiny.pretrained)["model"], load_ckpt(runs["root"] / "pairs" / "checkpoint_1_4.pt")["model"]
    seen, want = set(), 0.0
    for k, v in now.items():
        if k in pre and pre[k].shape == v.shape and v.data_ptr() not in seen:
            seen.add(v.data_ptr())
            want += float(((v.double() - pre[k].double()) ** 2).sum())
    assert logged[4] == pytest.approx(want, rel=1e-5) and logged[1] < logged[4]


def test_bad_probes_are_one_line_errors(tiny, runs):
    root = runs["root"]
    assert_one_line_error(runs["log_dict"], root / "dict", f"--forgetting-probe {runs['other']}: its dict.txt "
                          f"(103 symbols) is not the model's dictionary (105 symbols in the embeddings of "
                          f"{tiny.pretrained}): binarize the probe with the model's dict.txt (scripts/binarize_probe.py --dict)")
    # with the task (the GLUE criteria's install): symbol by symbol, so a reordered dictionary is caught too
    from fairseq.data import Dictionary

    from recadam_fairseq.meters import forgetting_meter
    from recadam_fairseq.core.errors import ConfigError

    meter = forgetting_meter.ForgettingMeter(None, forgetting_meter.load_probe(runs["mlm"], "mlm"))
    symbols = Dictionary.load(os.path.join(runs["mlm"], "dict.txt")).symbols
    meter.check_dictionary(symbols + ["<mask>"])
    with pytest.raises(ConfigError, match=r"dict.txt \(104 symbols\) is not the model's dictionary \(105 symbols\)"):
        meter.check_dictionary(symbols[:4] + symbols[5:] + symbols[4:5] + ["<mask>"])
    assert_one_line_error(runs["log_empty"], root / "empty",
                          f"--forgetting-probe {runs['empty']}: the probe is empty (no sentence in "
                          f"{runs['empty']}/sentences.bin)")
    assert_one_line_error(runs["log_headless"], root / "headless",
                          f"--forgetting-meter mlm: the checkpoint {root / 'headless.pt'} has an LM head at its "
                          f"initial values (it was made without one); use --forgetting-meter pairs with a sentence-pair "
                          f"probe")


def test_probe_math_against_references():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 50)
    s = np.round(rng.normal(size=50), 1)  # ties
    assert probes.roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    first = probes.mask_positions(21, 3)
    torch.manual_seed(12345)  # the global RNG moves between calls: a sentence's positions are its own draw
    torch.rand(7)
    assert torch.equal(probes.mask_positions(21, 3), first)
    # 15% of the 20 tokens before </s>, sorted, distinct, </s> (position 20) never masked; another sentence, another draw
    assert len(first) == 3 and len(set(first.tolist())) == 3 and first.tolist() == sorted(first.tolist())
    assert int(first.max()) < 20 and not torch.equal(probes.mask_positions(21, 4), first)
    assert len(probes.mask_positions(2, 0)) == 1 and probes.mask_positions(2, 0).tolist() == [0]


def test_finetune_sh_passes_the_probe_and_summarize_picks_within_a_budget(tiny, runs, tmp_path):
    import csv
    import subprocess
    import sys

    from helpers import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORGETTING_", "CRITERION", "DRY_RUN"))}
    env.update(ROBERTA_PATH=tiny.pretrained, DATA_DIR=tiny.glue_bin, SAVE_DIR=str(tmp_path / "dry"), DRY_RUN="1",
               FP16="0", PYTHON=fast_python(), FORGETTING_PROBE=runs["pairs"], FORGETTING_METER="pairs")
    finetune = os.path.join(ROOT, "scripts", "glue", "finetune.sh")
    p = subprocess.run([finetune, "SST-2", "adam"], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert f"--forgetting-probe {runs['pairs']} --forgetting-meter pairs" in " ".join(p.stdout.split(" \\\n  "))
    p = subprocess.run([finetune, "SST-2", "adam"], env=dict(env, FORGETTING_BUDGET="0.05"), capture_output=True,
                       text=True)
    command = " ".join(p.stdout.split(" \\\n  "))
    assert "--forgetting-budget 0.05" in command and "--best-checkpoint-metric fgt_budget_accuracy " in command, p.stderr
    p = subprocess.run([finetune, "SST-2", "adam"], env={k: v for k, v in dict(env, FORGETTING_BUDGET="0.05").items()
                                                         if k not in ("FORGETTING_PROBE", "FORGETTING_METER")}, capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip().endswith("FORGETTING_BUDGET=0.05 needs FORGETTING_PROBE=DIR "
                                                           "(scripts/binarize_probe.py)"), p.stderr
    p = subprocess.run([finetune, "SST-2", "adam"], env=dict(env, CRITERION="sentence_prediction"),
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip().endswith("CRITERION=sentence_prediction with METHOD adam has "
                                                           "neither (leave CRITERION unset)"), p.stderr

    # two validations: the better score forgot more; a budget between them picks the other one
    run = tmp_path / "runs" / "SST-2" / "adam" / "seed1"
    run.mkdir(parents=True)
    (run / "done").write_text("")
    (run / "train.log").write_text(
        '{"valid_accuracy": "80", "valid_fgt_mlm_loss_delta": "0.5", "valid_num_updates": "4"}\n'
        '{"valid_accuracy": "70", "valid_fgt_mlm_loss_delta": "0.1", "valid_num_updates": "8"}\n')
    summarize = os.path.join(ROOT, "scripts", "glue", "summarize.py")
    out = tmp_path / "out"
    subprocess.run([sys.executable, summarize, str(tmp_path / "runs"), "--out", str(out), "--forgetting-budget", "0.2"],
                   check=True, capture_output=True)
    with open(out / "runs.csv") as f:
        (row,) = csv.DictReader(f)
    assert (float(row["best"]), int(row["best_update"]), float(row["forgetting"])) == (70, 8, 0.1)  # not 80 at 4
    assert "## Forgetting at the chosen validation" in (out / "summary.md").read_text()


def test_wise_ft_points_score_as_the_run_scored_itself(runs, tmp_path, monkeypatch):
    """summarize.py --wise-ft (tools/wise_points.py): at α = 1 a checkpoint's point is what the run logged at its
    update (fairseq's validation; the meter against the values at θ* the run kept), at α = 0 θ* forgets nothing; a
    checkpoint's points are measured once; summarize.py scores Adam's chosen checkpoint and judges the points."""
    import json
    import shutil
    import subprocess
    import sys

    from helpers import ROOT
    from recadam_fairseq.tools import wise_points

    recs = valid_records(runs["log_mlm"][1])
    run = tmp_path / "runs" / "SST-2" / "adam" / "seed1"  # the mlm run (Adam, w = 0) as a grid's run
    shutil.copytree(runs["root"] / "mlm", run)
    (run / "train.log").write_text(runs["log_mlm"][1])
    (run / "done").write_text("")
    out = wise_points.points(str(run), str(run / "checkpoint_1_8.pt"), [1.0, 0.0])
    theta_star, at_8 = out["points"]
    assert at_8["metrics"]["accuracy"] == float(recs[8]["valid_accuracy"])
    assert at_8["forgetting"] == pytest.approx(float(recs[8]["valid_fgt_mlm_loss_delta"]), abs=2e-5) != 0
    assert theta_star["forgetting"] == pytest.approx(0.0, abs=2e-5)
    monkeypatch.setattr(wise_points, "load", lambda *a: pytest.fail("a recorded point was measured again"))
    assert wise_points.points(str(run), str(run / "checkpoint_1_8.pt"), [0.0, 1.0]) == out

    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "glue", "summarize.py"), str(tmp_path / "runs"),
                    "--wise-ft", "0.5"], check=True, capture_output=True)
    with open(run / "wise-ft.json") as f:
        saved = json.load(f)
    (point,) = saved["points"]
    # the run was trained with a budget: its checkpoint_best.pt holds the validation the summary picks
    assert saved["identity"]["checkpoint"] == "checkpoint_best.pt" and point["alpha"] == 0.5
    md = (tmp_path / "runs" / "summary.md").read_text()
    assert (f"| adam | 0.5 | 1 | {point['metrics']['accuracy']:.2f} (1 seed) | {point['forgetting']:+.4f} (1 seed) |"
            in md), md
    assert (tmp_path / "runs" / "forgetting-SST-2.png").is_file()
