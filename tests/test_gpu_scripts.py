"""The GPU pass's scripts (scripts/gpu/), on CPU: what a device session runs must not first fail there.

The end-to-end overhead script runs at tiny size in fp32 with one method per family; its figures
are CPU noise here, so the assertions are on what it records, not on speed.
"""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, fast_python

E2E = os.path.join(ROOT, "scripts", "gpu", "e2e_overhead.py")
RUN_SH = os.path.join(ROOT, "scripts", "gpu", "run.sh")
PERFORMANCE = os.path.join(ROOT, "docs", "performance.md")
START, END = "<!-- gpu-e2e:start -->", "<!-- gpu-e2e:end -->"


def _e2e(*args, cwd):
    return subprocess.run([fast_python(), E2E, *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def e2e_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    doc = out / "performance.md"  # a copy of docs/performance.md: the page the GPU table goes into
    with open(PERFORMANCE, encoding="utf-8") as f:
        doc.write_text(f.read(), encoding="utf-8")
    proc = _e2e("--size", "tiny", "--precision", "fp32", "--device", "cpu", "--methods", "recadam", "ca-mtl",
                "--updates", "4", "--log-interval", "1", "--batch-size", "8", "--train-size", "32", "--rounds", "1",
                "--warmup-runs", "0",
                "--work", str(out / "work"), "--out-md", str(out / "e2e.md"), "--out-json", str(out / "e2e.json"),
                "--doc", str(doc), cwd=str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "e2e.json").read_text()), doc.read_text(encoding="utf-8")


def test_every_method_and_its_base_get_a_row(e2e_run):
    _, result, _ = e2e_run
    rows = {r["method"]: r for r in result["rows"]}
    assert result["complete"]
    assert list(rows) == ["adam", "recadam", "mt-roberta", "ca-mtl"]  # bases added before their methods
    assert rows["recadam"]["base"] == "adam" and rows["ca-mtl"]["base"] == "mt-roberta"
    for r in rows.values():
        assert r["ms_per_update"] > 0 and r["rounds"] == 1 and r["updates"] == 4
        assert r["peak_mib"] is None  # CPU: no CUDA allocator to ask
    assert rows["adam"]["ratio_vs_base"] == 1.0
    assert rows["recadam"]["ratio_vs_base"] == pytest.approx(rows["recadam"]["ms_per_update"] / rows["adam"]["ms_per_update"])
    # the anchor RecAdam should add: the trained parameters once, in fp32 (fairseq's own count)
    assert rows["recadam"]["trained_params"] > 0
    assert rows["recadam"]["anchor_mib"] == pytest.approx(4 * rows["recadam"]["trained_params"] / 2**20)
    assert rows["adam"]["anchor_mib"] is None


def test_commands_are_the_plug_ins_flags(e2e_run):
    _, result, _ = e2e_run
    cmd = {r["method"]: r["command"] for r in result["rows"]}
    assert cmd["recadam"][0] == "fairseq-train"
    assert cmd["recadam"][cmd["recadam"].index("--optimizer") + 1] == "recadam"
    assert cmd["adam"][cmd["adam"].index("--optimizer") + 1] == "adam"
    assert cmd["ca-mtl"][cmd["ca-mtl"].index("--arch") + 1] == "ca_mtl_roberta"
    assert cmd["mt-roberta"][cmd["mt-roberta"].index("--arch") + 1] == "roberta"
    for c in (cmd["ca-mtl"], cmd["mt-roberta"]):
        assert c[c.index("--task") + 1] == "glue_multitask"
    assert all("--cpu" in c and "--restore-file" in c for c in cmd.values())


def test_table_goes_into_the_performance_page_block(e2e_run):
    out, _, doc = e2e_run
    md = (out / "e2e.md").read_text().rstrip("\n")
    with open(PERFORMANCE, encoding="utf-8") as f:
        old = f.read()
    head, tail = old.split(START)[0], old.split(END)[1]
    assert doc == f"{head}{START}\n{md}\n{END}{tail}"  # the block replaced, the rest of the page as it was
    assert "| recadam | adam |" in md and "| ca-mtl | mt-roberta |" in md


def test_fisher_pass_against_adams_training_per_example():
    """In-process, two rounds' recorded runs: EWC's row says its Fisher pass's seconds (the median), per example, and
    against adam's training per example (adam's median ms / update over the batch size); a row without one says
    nothing of it."""
    from types import SimpleNamespace

    from recadam_fairseq.bench import e2e_overhead as e2e

    def run(s, fisher=None):
        return {"s_per_update": s, "peak_bytes": None, "trained": 10, "command": [], "fisher_s": fisher,
                "fisher_examples": 1024 if fisher else None}

    runs = {"adam": [run(0.040), run(0.048)], "recadam-coupled": [run(0.050), run(0.052)],
            "ewc": [run(0.06, 4.1), run(0.06, 3.9)]}
    rows = {r["method"]: r for r in e2e.summarize(SimpleNamespace(batch_size=32, updates=60), runs)}
    ewc = rows["ewc"]
    assert ewc["fisher_s"] == 4.0 and ewc["fisher_ms_per_example"] == pytest.approx(4000 / 1024)
    assert ewc["fisher_vs_adam_per_example"] == pytest.approx((4000 / 1024) / (44.0 / 32))
    assert e2e.fisher_cell(ewc) == "4.0 s Fisher (3.91 ms an example, 2.8x adam's training per example)"
    assert e2e.fisher_cell(rows["adam"]) == "–" and "fisher_ms_per_example" not in rows["adam"]


@pytest.mark.parametrize("args, message", [
    (["--precision", "fp16", "--device", "cpu"], "--precision fp16 needs a GPU"),
    (["--updates", "3", "--log-interval", "2"], "needs at least 2 log intervals"),
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--methods", "adamw"], "invalid choice: 'adamw'"),
])
def test_bad_input_is_refused_before_any_run(tmp_path, args, message):
    proc = _e2e("--work", str(tmp_path / "work"), *args, cwd=str(tmp_path))
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "work").exists()


def test_missing_doc_markers_stop_before_any_run(tmp_path):
    (tmp_path / "page.md").write_text("no markers\n")
    proc = _e2e("--device", "cpu", "--precision", "fp32", "--doc", str(tmp_path / "page.md"),
                "--work", str(tmp_path / "work"), cwd=str(tmp_path))
    assert proc.returncode != 0 and f"--doc {tmp_path / 'page.md'}: no <!-- gpu-e2e:start --> ... <!-- gpu-e2e:end --> markers" in proc.stderr
    assert not (tmp_path / "work").exists()


def test_run_sh_checks_the_install_refuses_unknown_stages_and_skips_what_the_budget_cannot_hold(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path))
    proc = subprocess.run(["bash", RUN_SH, "tests", "nope"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "unknown stage 'nope'" in proc.stderr
    assert not os.listdir(tmp_path)  # refused before any stage ran
    # the check runs first; a 1-second budget cannot hold the tests: skipped, exit 124
    proc = subprocess.run(["bash", RUN_SH, "check", "tests"], capture_output=True, text=True,
                          env=dict(env, RECADAM_GPU_BUDGET_S="1"))
    assert proc.returncode == 124, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "fairseq 0.12" in proc.stdout and "recadam_fairseq from " + ROOT in proc.stdout
    assert "== tests: skipped" in (tmp_path / "gpu-tests.log").read_text()


def test_forgetting_pack_round_trip(tmp_path):
    """forgetting_pack.py: the converted model split into two carries under a device call's 64 MiB and
    put back byte for byte with its mtime (so verify.json / baseline.json stay valid); a missing
    carry or a wrong model stops with one line."""
    work, there = tmp_path / "work", tmp_path / "there"
    (work / "pretrained").mkdir(parents=True)
    model = work / "pretrained" / "model.pt"
    model.write_bytes(os.urandom(3001))
    os.utime(model, ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    (work / "pretrained" / "verify.json").write_text("{}")
    for d in ("data", "data-tweets", "data-nli"):
        (work / d / "glue").mkdir(parents=True)
        (work / d / "baseline.json").write_text(d)
    script = os.path.join(ROOT, "scripts", "gpu", "forgetting_pack.py")

    def call(what, w):
        env = dict(os.environ, RECADAM_FORGETTING_WORK=str(w), RECADAM_FGPACK_DIR=str(tmp_path))
        return subprocess.run([sys.executable, script, what], env=env, capture_output=True, text=True)

    assert call("pack", work).returncode == 0
    parts = [(tmp_path / p / "model.pt.part").read_bytes() for p in (".fgpack0", ".fgpack1")]
    assert parts[0] + parts[1] == model.read_bytes() and abs(len(parts[0]) - len(parts[1])) <= 1
    assert not (tmp_path / ".fgpack0" / "data" / "glue").exists()  # run.py makes the layouts again
    proc = call("unpack", there)
    assert proc.returncode == 0, proc.stderr
    got = there / "pretrained" / "model.pt"
    assert got.read_bytes() == model.read_bytes() and got.stat().st_mtime_ns == model.stat().st_mtime_ns
    assert (there / "data-nli" / "baseline.json").read_text() == "data-nli"
    (tmp_path / ".fgpack1" / "model.pt.part").write_bytes(b"x")
    proc = call("unpack", tmp_path / "again")
    assert proc.returncode != 0 and "sha256 differs" in proc.stderr.strip().splitlines()[-1]
    (tmp_path / ".fgpack1" / "model.pt.part").unlink()
    proc = call("unpack", tmp_path / "again")
    assert proc.returncode != 0 and "carry .fgpack0 and .fgpack1" in proc.stderr
