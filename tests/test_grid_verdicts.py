"""summarize.py's answer to which method keeps the accuracy and forgets least, on a grid's runs with a probe
(recadam_fairseq/engine/verdicts.py, docs/forgetting-your-task.md): synthetic run directories with known numbers
(tests/helpers/grid_runs.py), the verdicts derived here by hand from the comparison's rule (docs/forgetting.md:
a gap counts beyond twice its standard error over the seeds, at least a floor), the figure's points, and runs
without a probe unchanged. No training: milliseconds, the figures a second or two."""

import csv
import json
import math
import os
import subprocess
import sys

import pytest

from helpers.grid_runs import GRID, write_grid
from recadam_fairseq.engine import summarize, verdicts
from recadam_fairseq.engine.read import find_runs, read_runs

FILES = ["summary.md", "summary.csv", "variants.csv", "runs.csv"]


def last(setting, i):
    """The seeds' values at the last validation (the best accuracy): i = 1 accuracy, 2 forgetting."""
    return [vs[-1][i] for vs in GRID[setting].values()]


def mean_sd(xs):
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def by_hand(setting):
    """(Δaccuracy, its noise, Δforgetting (positive: forgets less than Adam), its noise) against Adam, two seeds
    each: 2·sqrt(sd²/2 + sd_adam²/2), at least 0.5 points of accuracy and 0.005 bits."""
    out = []
    for i, floor in ((1, 0.5), (2, 0.005)):
        (m, s), (ma, sa) = mean_sd(last(setting, i)), mean_sd(last("adam", i))
        out += [m - ma if i == 1 else ma - m, max(2 * math.sqrt(s ** 2 / 2 + sa ** 2 / 2), floor)]
    return out


@pytest.fixture
def grid(tmp_path):
    root = write_grid(str(tmp_path / "runs"))
    runs = [r for d in find_runs(root) for r in read_runs(d, root)]
    return root, runs


def test_verdicts_by_hand(grid):
    """recadam t0 = 10 keeps Adam's accuracy and forgets less (the answer); t0 = 100 keeps it but forgets as much
    within the noise; llrd neither, and is dominated. The noise as computed here from the seeds' values."""
    root, runs = grid
    (a,) = verdicts.answer(runs, root).values()
    rows = {r["name"]: r for r in a["rows"]}
    assert list(rows) == ["adam", "recadam-k0.1-t10", "recadam-k0.1-t100", "llrd-d0.9"]  # the catalogue's order
    assert a["metric"] == "accuracy" and a["forgetting_metric"] == "mlm loss (bits)" and a["floors"] == (0.5, 0.005)
    expected = {"recadam-k0.1-t10": (True, True), "recadam-k0.1-t100": (True, False), "llrd-d0.9": (False, False)}
    for name, (keeps, less) in expected.items():
        d_acc, acc_noise, d_fgt, fgt_noise = by_hand(name)
        assert (d_acc >= -acc_noise, d_fgt > fgt_noise) == (keeps, less)
        r = rows[name]
        assert (r["keeps_accuracy"], r["forgets_less"]) == (keeps, less)
        assert r["d_accuracy"] == pytest.approx(d_acc) and r["d_forgetting"] == pytest.approx(-d_fgt)
        assert r["target_accuracy"] == pytest.approx(mean_sd(last(name, 1))[0])
        assert r["forgetting"] == pytest.approx(mean_sd(last(name, 2))[0])
        assert r["forgetting_std"] == pytest.approx(mean_sd(last(name, 2))[1])
    # t10 forgets 0.065 bits less than Adam against a noise of 0.022; llrd 3.5 points below against 2.24
    assert by_hand("recadam-k0.1-t10")[2:] == pytest.approx([0.065, 2 * math.sqrt(0.0001 + 0.000025)])
    assert by_hand("llrd-d0.9")[:2] == pytest.approx([-3.5, 2 * math.sqrt(1 + 0.25)])
    # the frontier: t10 (least forgetting among the accurate) and t100 (most accurate); Adam and llrd behind t10
    assert {n: (r["frontier"], r["rank"]) for n, r in rows.items()} == {
        "adam": (False, 2), "recadam-k0.1-t10": (True, 1), "recadam-k0.1-t100": (True, 1), "llrd-d0.9": (False, 2)}
    assert [r["name"] for r in verdicts.winners(a)] == ["recadam-k0.1-t10"]
    # Adam's curve: the mean over its seeds at each validation
    assert [(c["stopped_at"], c["target_accuracy"], round(c["forgetting"], 6)) for c in a["curve"]] == [
        (4, 71.0, 0.04), (8, 77.0, 0.08), (12, 81.0, 0.11)]


def test_wise_ft_points_join_adam_s_row_over_its_seeds(grid):
    """summarize.py --wise-ft's points (each run's wise-ft.json, for the checkpoint the summary picks): per α the mean
    ± std over Adam's seeds, judged against Adam by the rule (here by hand), in summary.md's section."""
    root, _ = grid
    for seed, (acc, fgt) in {1: (76.0, 0.02), 2: (78.0, 0.04)}.items():
        run = os.path.join(root, "SST-2", "adam", f"seed{seed}")
        open(os.path.join(run, "checkpoint_1_12.pt"), "w").close()  # the best validation's weights, kept
        with open(os.path.join(run, "train.log"), "a") as f:
            f.write(f"2026-01-01 | INFO | fairseq.checkpoint_utils | Saved checkpoint {run}/checkpoint_1_12.pt "
                    "(epoch 1 @ 12 updates, score 80.0) (writing took 0.1 seconds)\n")
        with open(os.path.join(run, "wise-ft.json"), "w") as f:
            json.dump({"identity": {"checkpoint": "checkpoint_1_12.pt"}, "points": [
                {"alpha": 0.5, "metrics": {"accuracy": acc, "loss": 0.5}, "forgetting": fgt}]}, f)
    runs = [r for d in find_runs(root) for r in read_runs(d, root)]
    (a,) = verdicts.answer(runs, root).values()
    (p,) = a["adam"]["interpolated"]
    assert (p["alpha"], p["seeds"], p["target_accuracy"], p["forgetting"]) == (0.5, [1, 2], 77.0, pytest.approx(0.03))
    # against Adam (81 ± 1.41, 0.11 ± 0.014): 4 points below, beyond 2·√(1 + 1); 0.08 bits less, beyond 2·√2·0.01
    assert (p["keeps_accuracy"], p["forgets_less"]) == (False, True)
    assert "| adam | 0.5 | 2 | 77.00 ± 1.41 | +0.0300 ± 0.0141 | -4.00 | -0.0800 | no | yes |" in "\n".join(
        verdicts.markdown({"SST-2": a}))


def test_summarize_writes_the_plot_and_the_verdicts(grid, capsys):
    """summarize.py writes forgetting-SST-2.png, verdicts.csv and summary.md's section with the answer."""
    root, _ = grid
    summarize.main([root])
    printed = capsys.readouterr().out
    for name in FILES + ["verdicts.csv", "forgetting-SST-2.png"]:
        assert os.path.join(root, name) in printed.splitlines()[-1]
    md = open(os.path.join(root, "summary.md")).read()
    assert "## Which method forgets least" in md
    assert "![SST-2: dev accuracy against forgetting](forgetting-SST-2.png)" in md
    assert ("| recadam-k0.1-t10 | 2 | 81.00 ± 0.71 | +0.0450 ± 0.0071 | +0.00 | -0.0650 | yes | yes | yes (1) |"
            in md)
    assert ("**Answer**: recadam-k0.1-t10 (on the frontier) keeps Adam's accuracy within the seed noise and forgets "
            "less beyond it.") in md
    with open(os.path.join(root, "verdicts.csv")) as f:
        lines = {r["setting"]: r for r in csv.DictReader(f)}
    assert [(n, r["keeps_accuracy"], r["forgets_less"], r["frontier"]) for n, r in lines.items()] == [
        ("adam", "", "", "no"), ("recadam-k0.1-t10", "yes", "yes", "yes"), ("recadam-k0.1-t100", "yes", "no", "yes"),
        ("llrd-d0.9", "no", "no", "no")]
    assert lines["llrd-d0.9"]["forgetting"] == "0.09500" and lines["llrd-d0.9"]["d_metric"] == "-3.5000"
    import matplotlib.image

    assert matplotlib.image.imread(os.path.join(root, "forgetting-SST-2.png")).shape[0] > 300


def assert_key_lists_what_is_drawn(fig, panels):
    """The key (the axes without a frame) names the frontier over all methods only when a panel draws its red line
    (two points or more), a method's frontier joined only when one is, the edge marks only when one is drawn."""
    (key,) = [ax for ax in fig.axes if not ax.axison]
    said = [t.get_text() for t in key.get_legend().get_texts()]
    lines = [ln for ax in panels.values() for ln in ax.lines]
    red = any(ln.get_color() == "red" and len(ln.get_xdata()) > 1 for ln in lines)
    joined = any(ln.get_marker() in ("None", "") and ln.get_linestyle() == "-" and len(ln.get_xdata()) > 1
                 for ln in lines)
    edge = any(ln.get_marker() in (">", "<", "^", "v") for ln in lines)
    assert ("frontier over all methods" in said) == red, said
    assert ("a method's settings, its frontier joined" in said) == joined, said
    assert any(t.startswith("off the scale") for t in said) == edge, said


def test_the_figure_holds_the_grid_s_points(grid):
    """The figure (engine/plot.py's) of the answer: a panel per family with Adam's point and its curve along its
    validations in each, each setting at (its forgetting, its accuracy), the grid's axis texts."""
    from recadam_fairseq.engine import plot

    root, runs = grid
    (a,) = verdicts.answer(runs, root).values()
    fig, panels, _ = plot.figure(a["rows"] + a["curve"], None, a["updates"], verdicts.figure_text(a))
    assert list(panels) == ["recadam", "llrd"]
    for ax in panels.values():  # the forgetting axis under the panels it is of (not under Adam's updates panel)
        assert ax.get_xlabel().replace("\n", " ").startswith("forgetting: mlm loss (bits) since θ*, positive = forgot")
    assert fig._supxlabel is None
    assert fig._supylabel.get_text() == "dev accuracy" and fig._suptitle.get_text().startswith("SST-2: ")
    assert_key_lists_what_is_drawn(fig, panels)
    said = [t.get_text() for ax in fig.axes if not ax.axison for t in ax.get_legend().get_texts()]
    assert "frontier over all methods" in said and "a method's settings, its frontier joined" in said
    # Adam and one setting worse on both axes: the frontier is Adam's point alone, nothing joined, nothing listed
    worse = {1: [(12, 70.0, 0.20)], 2: [(12, 71.0, 0.21)]}
    small = write_grid(str(root) + "-small", grid={"adam": GRID["adam"], "llrd-d0.9": worse})
    (b,) = verdicts.answer([r for d in find_runs(small) for r in read_runs(d, small)], small).values()
    small_fig, small_panels, _ = plot.figure(b["rows"] + b["curve"], None, b["updates"], verdicts.figure_text(b))
    assert_key_lists_what_is_drawn(small_fig, small_panels)
    said = [t.get_text() for ax in small_fig.axes if not ax.axison for t in ax.get_legend().get_texts()]
    assert "frontier over all methods" not in said and "a method's settings" in said

    def points(ax):
        return {tuple(round(float(v), 4) for v in xy) for line in ax.lines if line.get_marker() == "o"
                for xy in line.get_xydata()}

    assert points(panels["recadam"]) == {(0.11, 81.0), (0.045, 81.0), (0.105, 83.0)}
    assert points(panels["llrd"]) == {(0.11, 81.0), (0.095, 77.5)}
    for ax in panels.values():  # Adam's validations, grey and dotted, ending at its point (its best: update 12)
        (curve,) = [line for line in ax.lines if line.get_linestyle() == ":" and line.get_marker() == "."]
        assert [tuple(round(float(v), 4) for v in xy) for xy in curve.get_xydata()] == [
            (0.04, 71.0), (0.08, 77.0), (0.11, 81.0)]
    # the key's "a method's settings" in the colour a panel's first method is drawn in (black is Adam's)
    (key,) = [ax for ax in fig.axes if not ax.axison]
    (entry,) = [h for h, t in zip(key.get_legend().legend_handles, key.get_legend().get_texts())
                if t.get_text().startswith("a method's settings")]
    colours = {ln.get_color() for ln in panels["llrd"].lines if ln.get_marker() == "o"}
    assert entry.get_color() == "tab:blue" and colours == {"black", "tab:blue"}, colours
    plot.pyplot().close(fig)


def test_adam_s_curve_is_its_validations_not_its_point(tmp_path):
    """Adam's seeds at their best at different validations (8 and 12): its point is their mean (at update "10"), and
    its curve the mean of its validations at 4, 8 and 12, in that order, without that point among them (it was
    drawn as one: 8 -> "10" -> 12 zigzagged); Adam's panel along its updates the same."""
    from recadam_fairseq.engine import plot

    adam = {1: [(4, 70.0, 0.03), (8, 80.0, 0.07), (12, 79.0, 0.10)], 2: [(4, 72.0, 0.05), (8, 78.0, 0.09),
                                                                         (12, 82.0, 0.12)]}
    root = write_grid(str(tmp_path / "runs"), grid={"adam": adam, "llrd-d0.9": GRID["llrd-d0.9"]})
    (a,) = verdicts.answer([r for d in find_runs(root) for r in read_runs(d, root)], root).values()
    assert (a["adam"]["at_update"], a["adam"]["target_accuracy"], a["adam"]["forgetting"]) == (
        10.0, 81.0, pytest.approx(0.095))
    fig, panels, _ = plot.figure(a["rows"] + a["curve"], None, a["updates"], verdicts.figure_text(a))
    (curve,) = [ln for ln in panels["llrd"].lines if ln.get_linestyle() == ":" and ln.get_marker() == "."]
    assert [tuple(round(float(v), 4) for v in xy) for xy in curve.get_xydata()] == [
        (0.04, 71.0), (0.08, 79.0), (0.11, 80.5)]
    (updates,) = [ax for ax in fig.axes if ax.get_xlabel() == "updates"]
    assert [list(ln.get_xdata()) for ln in updates.lines if ln.get_marker() == "o"] == [[4, 8, 12]]
    plot.pyplot().close(fig)


def test_a_grid_of_adam_alone_has_nothing_to_compare_with(tmp_path):
    """Only Adam's runs: its row, and an answer saying there is nothing to weigh it against (not that no setting
    keeps its accuracy)."""
    root = write_grid(str(tmp_path / "runs"), grid={"adam": GRID["adam"]})
    answers = verdicts.answer([r for d in find_runs(root) for r in read_runs(d, root)], root)
    md = "\n".join(verdicts.markdown(answers))
    assert "| adam | 2 | 81.00 ± 1.41 |" in md and "no setting keeps" not in md, md
    assert ("**Answer**: nothing to compare Adam with: no other method's runs logged the probe (run them beside "
            "Adam's with the same probe, e.g. METHODS=\"adam recadam llrd\" for grid.sh).") in md, md


def test_runs_without_a_probe_are_summarized_as_before(tmp_path, capsys):
    """The same grid without the forgetting meter: the four files, no section, no plot, no verdicts.csv."""
    root = write_grid(str(tmp_path / "runs"), probe=False)
    runs = [r for d in find_runs(root) for r in read_runs(d, root)]
    assert verdicts.answer(runs, root) == {}
    summarize.main([root])
    assert capsys.readouterr().out.splitlines()[-1] == "wrote " + ", ".join(os.path.join(root, n) for n in FILES)
    assert sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n))) == sorted(FILES)
    assert "forgets least" not in open(os.path.join(root, "summary.md")).read()


def test_a_grid_without_adam_has_no_verdicts(tmp_path):
    """Without Adam's runs: the settings, their frontier, and the line saying why there are no verdicts."""
    root = write_grid(str(tmp_path / "runs"), grid={k: v for k, v in GRID.items() if k != "adam"})
    runs = [r for d in find_runs(root) for r in read_runs(d, root)]
    answers = verdicts.answer(runs, root)
    (a,) = answers.values()
    assert a["adam"] is None and a["curve"] == [] and not any("keeps_accuracy" in r for r in a["rows"])
    md = verdicts.markdown(answers)
    assert "**Answer**" not in "\n".join(md) and ("No adam runs with the probe: no verdicts against Adam. To add them: "
                                                 "METHODS=\"adam ...\" scripts/glue/grid.sh SST-2 with the grid's other "
                                                 "variables.") in md


def no_adam_line(runs, root):
    """summary.md's line on a task whose runs lack Adam's (``runs`` without them)."""
    (line,) = [ln for ln in verdicts.markdown(verdicts.answer([r for r in runs if r["method"] != "adam"], root))
               if ln.startswith("No adam runs")]
    return line


def test_translation_forgets_in_bleu(tmp_path):
    """scripts/seq2seq/finetune.sh's runs (run.json names bleu; --eval-bleu-start's bleu_delta on the original
    domain's subset valid1): the forgetting is BLEU's fall there, its floor 0.5 BLEU."""
    import json

    root = str(tmp_path / "runs")
    values = {"adam": [(30.0, -6.0), (31.0, -7.0)], "recadam-k0.1-t10": [(30.5, -2.0), (30.0, -2.5)]}
    for setting, seeds in values.items():
        for seed, (bleu, delta) in enumerate(seeds, 1):
            run = os.path.join(root, "mt-bin", setting, f"seed{seed}")
            os.makedirs(run)
            with open(os.path.join(run, "run.json"), "w") as f:
                json.dump({"metric": "bleu"}, f)
            with open(os.path.join(run, "train.log"), "w") as f:
                f.write(json.dumps({"valid_bleu": bleu, "valid_num_updates": "20"}) + "\n")
                f.write(json.dumps({"valid1_bleu": 20 + delta, "valid1_bleu_delta": delta, "valid1_num_updates": "20"})
                        + "\n")
            open(os.path.join(run, "done"), "w").close()
    runs = [r for d in find_runs(root) for r in read_runs(d, root)]
    (a,) = verdicts.answer(runs, root).values()
    assert a["metric"] == "bleu" and a["forgetting_metric"] == "BLEU on valid1" and a["floors"] == (0.5, 0.5)
    r = a["rows"][1]
    assert r["name"] == "recadam-k0.1-t10" and r["forgetting"] == pytest.approx(2.25)
    assert r["keeps_accuracy"] and r["forgets_less"]  # 30.25 against 30.5 (noise 1.58); 4.25 less against 1.27
    assert [(c["stopped_at"], round(c["forgetting"], 6)) for c in a["curve"]] == [(20, 6.5)]
    # without Adam's runs: the seq2seq script adds them, one run per seed (grid.sh and its METHODS are GLUE's)
    assert no_adam_line(runs, root) == ("No adam runs with the probe: no verdicts against Adam. To add them: "
                                        "scripts/seq2seq/finetune.sh adam with these runs' DATA, PRETRAINED and other "
                                        "variables, once for each of SEED=1 SEED=2.")


def test_multitask_runs_are_read_at_glue_avg_s_validation(tmp_path):
    """multitask.sh's runs (MTL/<NAME>/seed<N>): each task's row carries the forgetting at the validation with the
    best glue_avg (where every task is read), and Adam's curve its task's head-prefixed metric."""
    import json

    root = str(tmp_path / "runs")
    # (update, glue_avg, sst_2 accuracy, forgetting): glue_avg's best is update 8, not the last
    logs = {"adam": [(4, 70.0, 71.0, 0.05), (8, 80.0, 81.0, 0.10), (12, 75.0, 90.0, 0.20)],
            "recadam-k0.1-t10": [(4, 71.0, 72.0, 0.01), (8, 81.0, 82.0, 0.02), (12, 76.0, 91.0, 0.03)]}
    for name, validations in logs.items():
        run = os.path.join(root, "MTL", name, "seed1")
        os.makedirs(run)
        with open(os.path.join(run, "train.log"), "w") as f:
            for n, avg, acc, fgt in validations:
                f.write(json.dumps({"valid_glue_avg": avg, "valid_sst_2_accuracy": acc, "valid_fgt_mlm_loss_delta": fgt,
                                    "valid_num_updates": str(n)}) + "\n")
        open(os.path.join(run, "done"), "w").close()
    runs = [r for d in find_runs(root) for r in read_runs(d, root)]
    assert [(r["task"], r["best"], r["forgetting"]) for r in runs] == [("SST-2", 81.0, 0.10), ("SST-2", 82.0, 0.02)]
    (a,) = verdicts.answer(runs, root).values()
    assert [round(c["forgetting"], 6) for c in a["curve"]] == [0.05, 0.10, 0.20]
    assert a["rows"][1]["forgets_less"] and a["rows"][1]["keeps_accuracy"]  # one seed each: the floors alone
    assert no_adam_line(runs, root) == ("No adam runs with the probe: no verdicts against Adam. To add them: "
                                        "METHOD=adam scripts/glue/multitask.sh with these runs' TASKS, FORGETTING_PROBE "
                                        "and other variables, once for each of SEED=1.")


PAGE = "docs/forgetting-your-task.md"


def test_the_page_s_walk_through_as_printed(tmp_path):
    """docs/forgetting-your-task.md's commands, as printed but for `make demo` (the set-up) and with DRY_RUN=1 (the
    grid's six runs are not trained here): in a directory laid out as the repository after `make demo`, grid.sh
    plans the six runs, each with the probe; then the page's summarize.py line, on synthetic runs of that layout,
    writes the files it names and the section's table with the header and columns the page shows."""
    from helpers import ROOT, base_env, marked_bash_lines

    lines = marked_bash_lines(PAGE, "<!-- your-task:start -->", "<!-- your-task:end -->")
    assert lines[0].startswith("make demo") and "grid.sh SST-2" in lines[2] and "summarize.py probe-runs" in lines[3]
    for name in ("scripts", "recadam_fairseq"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    os.symlink(os.path.dirname(os.path.dirname(os.path.abspath(sys.executable))), tmp_path / ".venv")
    (tmp_path / "demo-out" / "tiny" / "glue-bin" / "SST-2-bin" / "input0").mkdir(parents=True)
    (tmp_path / "demo-out" / "tiny" / "pretrained.pt").write_text("")  # a stand-in: ARCH given, it is not read
    (tmp_path / "demo-out" / "probe").mkdir()
    env = base_env(DRY_RUN=1, ARCH="roberta_base", MAX_POSITIONS=512, FP16=0, OMP_NUM_THREADS=1)  # the scripts' python:
    # the .venv's, a fresh one each (light: ARCH given, no checkpoint is read)

    def shell(*commands):
        p = subprocess.run(["bash", "-c", "set -euo pipefail\n" + "\n".join(commands)], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
        assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
        return p.stdout

    assert "SST-2: ran 6, skipped 0, failed 0" in shell(*lines[1:3])
    runs = tmp_path / "probe-runs" / "SST-2"
    planned = sorted(str(d.relative_to(runs)) for d in runs.glob("*/seed*"))
    assert planned == [f"{s}/seed{n}" for s in ("adam", "llrd-d0.9", "recadam-k0.1-t10") for n in (1, 2)]
    for d in planned:
        assert "--forgetting-probe demo-out/probe" in (runs / d / "command.sh").read_text()
    write_grid(str(tmp_path / "probe-runs"))  # what the six runs (and one more setting) log, done
    out = shell(lines[1], lines[3])
    written = lines[3].split("#", 1)[1].strip().split(", ")
    assert all(os.path.isfile(tmp_path / f) for f in written) and all(f in out for f in written)
    page = open(os.path.join(ROOT, PAGE), encoding="utf-8").read()
    shown = [ln[2:] for ln in page.split("\n## On your own model")[0].splitlines() if ln.startswith("> ")]  # not MiniLM's
    md = (tmp_path / "probe-runs" / "summary.md").read_text().splitlines()
    assert all(ln in md for ln in shown[:3])  # the heading, the table's header and rule
    assert [ln.split(" | ")[0] for ln in shown if ln.startswith("| ") and not ln.startswith("| setting")] == [
        "| adam", "| recadam-k0.1-t10", "| llrd-d0.9"]
    assert shown[-1].startswith("**Answer**: ") and any(ln.startswith("**Answer**: ") for ln in md)


def test_a_run_of_no_catalogue_method_gets_no_verdicts(tmp_path, capsys):
    """summarize.py on one run's directory (its name says no method): its table as before, no figure."""
    root = write_grid(str(tmp_path / "runs"), grid={"adam": GRID["adam"]})
    run = os.path.join(root, "SST-2", "adam", "seed1")
    summarize.main([run, "--out", str(tmp_path / "out")])
    assert sorted(os.listdir(tmp_path / "out")) == sorted(FILES)


def test_the_executor_runs_every_job_and_reports_every_failure_at_the_end():
    """engine/execute.py (both comparisons' plans): results in the plan's order whatever the start order, each
    run recorded (on_done) as it ends, a failed run does not stop the others and every failure's text is in the
    error; a bug (any other exception) stops the plan: the runs not started yet never start."""
    import threading

    from recadam_fairseq.engine.execute import RunError, execute

    started, done, recorded = [], [], threading.Event()

    def job(i, fail=None):
        def run(say):
            started.append(i)
            if i == 2:  # started first, it ends only once run 0, beside it, has ended and been recorded
                assert recorded.wait(10), "run 0 did not run beside it, or was not recorded as it ended"
            if fail:
                raise fail(f"run {i} failed")
            return i * 10
        return run

    def on_done(i, r, say):
        done.append((i, r))
        if i == 0:
            recorded.set()

    assert execute([job(0), job(1), job(2)], jobs=2, order=[2, 0, 1], on_done=on_done) == [0, 10, 20]
    assert sorted(started[:2]) == [0, 2] and done[0] == (0, 0) and sorted(done) == [(0, 0), (1, 10), (2, 20)]
    started.clear()
    with pytest.raises(RunError) as e:
        execute([job(0, RunError), job(1), job(3, RunError)], jobs=1)
    assert started == [0, 1, 3] and str(e.value) == "run 0 failed\n\nrun 3 failed"
    started.clear()
    with pytest.raises(KeyError):
        execute([job(0, KeyError), job(1), job(3)], jobs=1)
    assert started == [0]


# ------------------------------------------------------------------ the judge's edges (ties, the budget's bound)
def _setting(name, accuracy, forgot, method=None):
    """A final setting as stats.frontier / pareto_ranks take it (``forgot``: its forgetting, positive = forgot)."""
    return {"name": name, "method": method or name, "target_accuracy": accuracy, "forgetting": forgot}


def test_ties_on_the_frontier_and_in_the_ranking():
    from recadam_fairseq.engine import stats

    twins = [_setting("a", 90.0, 0.01), _setting("b", 90.0, 0.01)]  # equal on both axes: neither dominates
    tied_worse = _setting("c", 90.0, 0.02)  # a's accuracy, forgot more: below them
    other = _setting("d", 89.0, 0.001)  # less accurate, forgot less: on the frontier too
    rows = twins + [tied_worse, other]
    stats.frontier(rows)
    assert [r["frontier"] for r in rows] == [True, True, False, True]
    assert stats.pareto_ranks(rows) == {"a": 1, "b": 1, "d": 1, "c": 2}  # (and it ends)
    assert stats.pareto_ranks(twins) == {"a": 1, "b": 1}
    assert stats.pareto_ranks([tied_worse, _setting("e", 91.0, 0.02)]) == {"e": 1, "c": 2}


def test_a_validation_at_the_budget_exactly_is_within_it():
    from recadam_fairseq.core.forgetting import DELTAS, within_budget
    from recadam_fairseq.engine.aggregate import best_of

    key, (_, sign) = next(iter(DELTAS.items()))
    budget = 0.02
    entries = [{"accuracy": "91", key: str(sign * budget)},  # forgot the budget exactly: counts
               {"accuracy": "95", key: str(sign * (budget + 1e-6))},  # forgot past it: left out
               {"accuracy": "80", key: str(sign * 0.0)}]
    assert within_budget(budget, budget) and not within_budget(budget + 1e-6, budget) and not within_budget(None, 1)
    best, at = best_of(entries, "accuracy", budget=budget)
    assert best == 91.0 and at is entries[0]
    assert best_of(entries, "accuracy")[0] == 95.0  # no budget: every validation


def test_a_one_seed_answer_says_only_the_floors_stand_for_the_noise(grid):
    root, runs = grid
    (two,) = verdicts.answer(runs, root).values()
    (one,) = verdicts.answer([r for r in runs if r["seed"] == 1], root).values()
    md2, md1 = "\n".join(verdicts.task_markdown(two)), "\n".join(verdicts.task_markdown(one))
    assert "within the seed noise" in md2 and "only the floors" not in md2
    assert "within the seed noise" not in md1
    assert "within the floors and forget" in md1 and "one seed a setting: only the floors stand for the noise" in md1
    assert "(1 seed)" in md1 and " ± 0.00 " not in md1, "one seed has no spread: not ± 0"
    assert "81.00 ± 0.00" not in md1 and "± 0.71" in md2


def test_a_diverged_run_leaves_the_scale_of_a_metric_logged_x100(grid):
    """A grid's metrics are logged x100: a setting near chance (50) is drawn off the panels' scale, as the comparison
    draws one below 0.6 of its fractions (before, 0.6 was applied to 50 and the run squeezed the rest into a corner);
    only an accuracy has that chance level (a CoLA MCC of 55 is no diverged run; BLEU has none)."""
    from recadam_fairseq.engine import plot

    root, _ = grid
    diverged = {1: [(12, 50.0, 0.02)], 2: [(12, 51.0, 0.02)]}
    d = write_grid(str(root) + "-diverged", grid={**GRID, "reinit-n2": diverged})
    (a,) = verdicts.answer([r for x in find_runs(d) for r in read_runs(x, d)], d).values()
    text = verdicts.figure_text(a)
    assert text["min_accuracy"] == 60.0
    _, ylim, off = plot.chart_limits(a["rows"], text["min_accuracy"])
    assert [r["name"] for r in off] == ["reinit-n2"] and ylim[0] > 70
    assert all(verdicts.figure_text(dict(a, metric=m))["min_accuracy"] is None for m in ("bleu", "mcc", "f1"))
