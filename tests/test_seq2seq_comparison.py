"""The domain-adaptation comparison (scripts/seq2seq/compare.py): its committed page and figure are what
--report-only draws from its committed JSON, byte for byte; the rule and the fragments of its pair."""

import os
import shutil

import pytest

from recadam_fairseq.compare import seq2seq
from recadam_fairseq.tools import make_text_translation as mtt

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")


def test_report_only_regenerates_the_committed_page_and_figure(tmp_path):
    pytest.importorskip("matplotlib")
    name = seq2seq.NAME
    shutil.copy(os.path.join(DOCS, name + ".json"), tmp_path / (name + ".json"))
    assert seq2seq.main(["--report-only", "--docs", str(tmp_path)]) == 0
    for ext in ("md", "png", "json"):
        with open(os.path.join(DOCS, f"{name}.{ext}"), "rb") as f:
            assert (tmp_path / f"{name}.{ext}").read_bytes() == f.read(), f"docs/{name}.{ext} differs"


def test_the_rule_and_the_fragments():
    assert mtt.translate(["the", "film", "it's", "!"]) == ["EHT", "MLIF", "S'TI", "!"]
    vocab = {"the", "film", "is", "good", "."}
    # runs of in-vocabulary words, cut at 12, shorter than 3 dropped
    assert mtt.fragments(["The film is good. Awful plot", "good good", "the " * 14], vocab) == [
        ["the", "film", "is", "good", "."], ["the"] * 12]
