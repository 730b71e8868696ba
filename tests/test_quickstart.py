"""The README's CPU quickstart, run exactly as printed (all but its `make demo` line, which is the set-up
this suite already ran), in a fresh directory that holds the repository's scripts and package; then the docs'
commands that follow it (docs/glue.md: predict.py and the Hugging Face export of its Adam run)."""

import os
import subprocess
import sys

from helpers import ROOT, marked_bash_lines

START, END = "<!-- quickstart:start -->", "<!-- quickstart:end -->"
AFTER = ("docs/glue.md", "<!-- after-quickstart:start -->", "<!-- after-quickstart:end -->")


def quickstart_lines(page="README.md", start=START, end=END):
    return marked_bash_lines(page, start, end)


def test_readme_quickstart_runs_as_printed(tmp_path, tiny):
    lines = quickstart_lines()
    assert lines[0].startswith("make demo")
    # the repository, as a user's clone would be: the commands are relative to its root
    for name in ("scripts", "recadam_fairseq", "data-prep"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    (tmp_path / "demo-out" / "tiny").mkdir(parents=True)  # what make demo made: this session's tiny model
    os.symlink(tiny.pretrained, tmp_path / "demo-out" / "tiny" / "pretrained.pt")
    os.symlink(tiny.glue_bin, tmp_path / "demo-out" / "tiny" / "glue-bin")
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), tmp_path / ".venv")  # this suite's venv
    after = quickstart_lines(*AFTER)  # the docs' commands on its runs, in the same shell (its exports)
    script = "set -euo pipefail\n" + "\n".join(lines[1:] + ["echo '== after the quickstart'; exec 2> after.err"]
                                                 + after) + "\n"
    env = {k: v for k, v in os.environ.items() if k not in ("ROBERTA_PATH", "DATA_DIR", "SAVE_DIR", "FP16")}
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert p.returncode == 0, (p.stdout + p.stderr)[-5000:]
    runs = tmp_path / "runs"
    done = sorted(str(d.relative_to(runs)) for d in runs.glob("*/*/*") if (d / "done").exists())
    assert done == ["SST-2/adam/seed1", "SST-2/recadam-k0.1-t10/seed1"], done
    summary = (runs / "summary.md").read_text()
    assert "| SST-2 | accuracy |" in summary, summary
    # both runs log their distance from θ* (Adam through the plug-in's criterion): the README's comparison
    from helpers import json_records

    dist = {name: float(json_records((runs / "SST-2" / name / "seed1" / "train.log").read_text(), "train_inner")[-1]
                        ["recadam_dist"]) for name in ("adam", "recadam-k0.1-t10")}
    assert 0 < dist["recadam-k0.1-t10"] < dist["adam"], dist
    # predict.py: two labelled lines, and nothing else (no library warnings); the export: its files and one line
    # saying that SST-2's label names are numbers
    out, err = p.stdout.split("== after the quickstart\n", 1)[1].splitlines(), (tmp_path / "after.err").read_text()
    assert [ln.split("\t")[0] in ("0", "1") and 0.5 <= float(ln.split("\t")[1]) <= 1 for ln in out[:2]] == [True] * 2
    assert err == "", err
    assert any("the label names are bare numbers" in ln for ln in out), out
    assert {"model.safetensors", "config.json"} <= set(os.listdir(tmp_path / "hf-sst2"))


def test_tiny_model_arch_flags_are_the_checkpoint_s(tiny):
    """`make_tiny_roberta.py --arch-flags` (docs/glue.md): the flags a hand-written fairseq-train command on
    the tiny model repeats, read back from its checkpoint."""
    import torch

    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_tiny_roberta.py"), "--arch-flags"],
                       capture_output=True, text=True, check=True)
    flags = p.stdout.split()
    model = torch.load(tiny.pretrained, map_location="cpu", weights_only=False)["cfg"]["model"]
    for flag, value in zip(flags[::2], flags[1::2]):
        key = "_name" if flag == "--arch" else flag[2:].replace("-", "_")
        assert str(getattr(model, key, None) if not isinstance(model, dict) else model.get(key)) == value, flag
    assert len(flags) == 12
