"""Smoke test of scripts/benchmark.py (timings are not asserted: benchmarks, not timed tests)."""

import json
import os

from conftest import ROOT, _load_script


def test_benchmark_quick_writes_markdown_and_json(tmp_path):
    bench = _load_script("benchmark")
    md, js, readme = tmp_path / "b.md", tmp_path / "b.json", tmp_path / "README.md"
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme.write_text(f.read(), encoding="utf-8")
    rc = bench.main(["--quick", "--layouts", "flat", "--rounds", "1", "--impls", "recadam", "recadam-foreach",
                     "torch-adamw-fused", "--out-md", str(md), "--out-json", str(js), "--readme", str(readme)])
    assert rc == 0
    rows = {r["impl"]: r for r in json.loads(js.read_text())["rows"]}
    assert set(rows) == {"recadam", "recadam-foreach", "torch-adamw-fused", "copy", "anchor_distance()"}
    for name in ("recadam", "recadam-foreach"):
        r = rows[name]
        assert r["median_ms"] > 0 and r["ratio_vs_fastest_adam"] > 0
        # RecAdam moves 8 words per element (Adam's 7 plus θ*): the bandwidth column uses them
        assert abs(r["gbps"] * r["median_ms"] / 1e3 * 1e9 - (7 * 4 * r["numel"] + 4 * r["anchored"])) < 1e-3 * r["numel"]
    # the fused update allocates no chunk temporaries; the eager one holds a few 2M-element buffers
    assert rows["recadam"]["peak_extra_mb"] < 1 < rows["recadam-foreach"]["peak_extra_mb"]
    text = md.read_text()
    assert "| flat | tiny (2.02M) | recadam |" in text and "compiling the fused update" in text
    # the README's performance table is generated between its markers, the rest left as it was
    new = readme.read_text(encoding="utf-8")
    table = new.split(bench.README_START)[1].split(bench.README_END)[0]
    assert "| flat | tiny (2.0M) | " in table and "(1.00x)" in table
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        old = f.read()
    assert new.split(bench.README_START)[0] == old.split(bench.README_START)[0]
    assert new.split(bench.README_END)[1] == old.split(bench.README_END)[1]
