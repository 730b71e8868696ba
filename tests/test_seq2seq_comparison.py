"""The domain-adaptation comparison (scripts/seq2seq/compare.py): its committed page and figure are what
--report-only draws from its committed JSON, byte for byte; the rule and the fragments of its pair."""

import os
import shutil

import pytest

from recadam_fairseq.compare import seq2seq
from recadam_fairseq.tiny import make_text_translation as mtt

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


def test_fisher_per_example_loss_on_translation():
    """scripts/fisher.py's per-example loss on translation (fisher_source.seq2seq_per_example): each target
    sentence's NLL; their sum is fairseq's label_smoothed_cross_entropy nll_loss, a row alone gives its own."""
    import argparse

    import torch
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
    from fairseq.data import Dictionary
    from fairseq.models.transformer import TransformerModel, base_architecture
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    from recadam_fairseq.criterions.fisher_source import seq2seq_per_example

    d = Dictionary()
    for w in "abcdefgh":
        d.add_symbol(w)
    task = TranslationTask(TranslationConfig(), d, d)
    args = argparse.Namespace(encoder_layers=1, decoder_layers=1, encoder_embed_dim=8, decoder_embed_dim=8,
                              encoder_ffn_embed_dim=16, decoder_ffn_embed_dim=16, encoder_attention_heads=2,
                              decoder_attention_heads=2, max_source_positions=16, max_target_positions=16)
    base_architecture(args)
    torch.manual_seed(0)
    model = TransformerModel.build_model(args, task).eval()
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    pad, eos = d.pad(), d.eos()

    def sample(src, src_len, prev, tgt):
        return {"net_input": {"src_tokens": torch.tensor(src), "src_lengths": torch.tensor(src_len),
                              "prev_output_tokens": torch.tensor(prev)}, "target": torch.tensor(tgt),
                "ntokens": int(torch.tensor(tgt).ne(pad).sum())}

    both = sample([[5, 6, eos], [pad, 7, eos]], [3, 2], [[eos, 5, 6, 7], [eos, 8, 9, pad]],
                  [[5, 6, 7, eos], [8, 9, eos, pad]])
    per = seq2seq_per_example(crit)(model, both)
    _, _, out = crit(model, both)
    assert per.shape == (2,) and torch.allclose(per.sum(), out["nll_loss"], rtol=1e-5)
    alone = seq2seq_per_example(crit)(model, sample([[7, eos]], [2], [[eos, 8, 9]], [[8, 9, eos]]))
    assert torch.allclose(alone[0], per[1], rtol=1e-4)
    assert seq2seq_per_example(object()) is None
