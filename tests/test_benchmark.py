"""Smoke test of scripts/benchmark.py (timings are not asserted: benchmarks, not timed tests)."""

import json
import os

import pytest
import torch

from helpers import ROOT

from recadam_fairseq.bench import main as bench
from recadam_fairseq.bench.workloads import build_workload


PERFORMANCE = os.path.join(ROOT, "docs", "performance.md")


def test_a_benchmark_stopped_midway_keeps_what_finished(tmp_path, monkeypatch):
    """The GPU pass stops a stage at its time budget (a KeyboardInterrupt): the workloads done stay."""
    real, calls = bench.benchmark_workload, []

    def stop_at_the_second(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(bench, "benchmark_workload", stop_at_the_second)
    md, js = tmp_path / "b.md", tmp_path / "b.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--quick", "--layouts", "flat", "per-tensor", "--rounds", "1", "--impls", "recadam",
                    "--out-md", str(md), "--out-json", str(js)])
    saved = json.loads(js.read_text())
    assert saved["complete"] is False and {r["layout"] for r in saved["rows"]} == {"flat"}
    assert md.read_text().startswith("**Partial: not yet run: per-tensor/tiny.**")


def test_benchmark_quick_writes_markdown_and_json(tmp_path):
    (tmp_path / "docs").mkdir()
    md, js, doc = tmp_path / "docs" / "b.md", tmp_path / "b.json", tmp_path / "docs" / "performance.md"
    with open(PERFORMANCE, encoding="utf-8") as f:
        doc.write_text(f.read(), encoding="utf-8")
    rc = bench.main(["--quick", "--layouts", "flat", "--rounds", "1", "--impls", "recadam", "recadam-foreach",
                     "recadam-ewc", "torch-adamw-fused", "--out-md", str(md), "--out-json", str(js), "--doc", str(doc)])
    assert rc == 0
    assert json.loads(js.read_text())["complete"] is True
    rows = {r["impl"]: r for r in json.loads(js.read_text())["rows"]}
    assert set(rows) == {"recadam", "recadam-foreach", "recadam-ewc", "torch-adamw-fused", "copy", "anchor_distance()"}
    for name, words in (("recadam", 1), ("recadam-foreach", 1), ("recadam-ewc", 2)):
        r = rows[name]
        assert r["median_ms"] > 0 and r["ratio_vs_fastest_adam"] > 0
        # RecAdam moves Adam's 7 words per element plus θ* (and EWC's F) per anchored one: the bandwidth column
        # uses them
        moved = 7 * 4 * r["numel"] + words * 4 * r["anchored"]
        assert abs(r["gbps"] * r["median_ms"] / 1e3 * 1e9 - moved) < 1e-3 * r["numel"]
    # state held between steps, from the optimizers' own tensors: Adam m, v; RecAdam + θ*; EWC + F, one fp32
    # word per anchored element each (the step counters' bytes aside)
    mb = 4 / 2**20
    r = rows["recadam"]
    assert rows["torch-adamw-fused"]["state_mb"] == pytest.approx(2 * r["numel"] * mb, abs=1e-3)
    assert r["state_mb"] == pytest.approx((2 * r["numel"] + r["anchored"]) * mb, abs=1e-3)
    assert rows["recadam-ewc"]["state_mb"] - r["state_mb"] == pytest.approx(r["anchored"] * mb, abs=1e-3)
    assert (f"flat/tiny: recadam-ewc {rows['recadam-ewc']['median_ms']:.2f} ms = "
            f"{rows['recadam-ewc']['median_ms'] / rows['recadam-foreach']['median_ms']:.2f}x recadam-foreach") in md.read_text()
    assert f"F adds {r['anchored'] * mb:.1f} MB" in md.read_text()
    # the fused update allocates no chunk temporaries; the eager one holds a few 2M-element buffers
    assert rows["recadam"]["peak_extra_mb"] < 1 < rows["recadam-foreach"]["peak_extra_mb"]
    text = md.read_text()
    assert "| flat | tiny (2.02M) | recadam |" in text and "compiling the fused update" in text
    # docs/performance.md's table is generated between its markers, the rest left as it was; its link to the
    # full report is relative to the page
    new = doc.read_text(encoding="utf-8")
    table = new.split(bench.README_START)[1].split(bench.README_END)[0]
    assert "| flat | tiny (2.0M) | " in table and "(1.00x)" in table
    assert f"full table: [{md}](b.md)." in table
    with open(PERFORMANCE, encoding="utf-8") as f:
        old = f.read()
    assert new.split(bench.README_START)[0] == old.split(bench.README_START)[0]
    assert new.split(bench.README_END)[1] == old.split(bench.README_END)[1]


def test_doc_flag(tmp_path, capsys):
    """--doc names the page; a page without the markers stops before any timing."""
    page = tmp_path / "page.md"
    page.write_text(f"# x\n{bench.README_START}\nold\n{bench.README_END}\n")
    assert bench.parse_args(["--doc", str(page)]).doc == str(page)
    (tmp_path / "bare.md").write_text("# no markers\n")
    with pytest.raises(SystemExit):
        bench.parse_args(["--doc", str(tmp_path / "bare.md")])
    assert f"--doc {tmp_path / 'bare.md'}: no <!-- benchmark:start -->" in capsys.readouterr().err


def test_a_size_in_elements_is_one_flat_tensor(capsys):
    """--sizes 0.01M times one flat tensor of 10,000 elements (the issue's 25M tensor is --sizes 25M); a number
    with the per-tensor layout or --llrd, or a size that is neither, stops before any timing."""
    w = build_workload("flat", "0.01M", torch.device("cpu"))
    assert [p.shape for p in w.params] == [(10000,)] and w.numel == 10000 and w.anchored == 9990
    assert bench.parse_args(["--sizes", "tiny", "25M", "--layouts", "flat"]).sizes == ["tiny", "25M"]
    for argv, says in ((["--sizes", "25M"], "--sizes 25M: a number of elements has no model's tensors"),
                       (["--sizes", "25M", "--layouts", "flat", "--llrd"], "without --llrd"),
                       (["--sizes", "25", "--layouts", "flat"], "--sizes: size '25': one of tiny, base, large"),
                       (["--sizes", "0.0000001M", "--layouts", "flat"], "--sizes: size '0.0000001M': one of")):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert says in capsys.readouterr().err
