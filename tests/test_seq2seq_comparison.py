"""The domain-adaptation comparison (scripts/seq2seq/compare.py): its committed page and figure are what
--report-only draws from its committed JSON, byte for byte; its recorded commands are the launcher's; the rule and the
fragments of its pair."""

import json
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


def test_the_recorded_commands_are_the_launcher_s(monkeypatch, tmp_path):
    """Each run of docs/seq2seq-comparison.json is seq2seq/finetune.sh's RunSpec (launch/comparison.py, trained
    in-process: no finetune.sh) under the comparison's variables, line for line but --eval-bleu-start, which
    finetune.sh added after these runs (so a rerun trains them again); the Fisher and fairseq-validate commands are
    as recorded. The checkpoint's architecture is read from it, as the recorded runs read it."""
    from recadam_fairseq.compare.files import ROOT, rel
    from recadam_fairseq.launch import recipe

    with open(os.path.join(DOCS, seq2seq.NAME + ".json"), encoding="utf-8") as f:
        res = json.load(f)
    runs = {(r["label"], r["seed"]): r for r in res["runs"]}
    args = seq2seq.parse_args([])
    data = os.path.join(args.work, "data")
    pretrained = os.path.join(data, "pretrained.pt")
    lines = runs[("adam", 1)]["command"].splitlines()
    arch = [ln.strip(" \\") for ln in lines[lines.index("  --arch transformer \\") + 1:]]
    arch = " ".join(arch[:next(i for i, ln in enumerate(arch) if ln.startswith("--criterion"))])
    isfile = os.path.isfile
    monkeypatch.setattr(os.path, "isfile", lambda p: p == rel(pretrained) or isfile(p))
    monkeypatch.setattr(recipe, "checkpoint_arch",
                        lambda *a, **k: {"CKPT_ARCH": "transformer", "CKPT_ARCH_FLAGS": arch})
    monkeypatch.chdir(ROOT)
    for k, v in {"DRY_RUN": "1", "FP16": "0"}.items():  # the data is not here; the runs were on a CPU
        monkeypatch.setenv(k, v)
    for label, method, knobs in seq2seq.methods():
        for seed in res["settings"]["seeds"]:
            spec, _ = seq2seq.run_of(args, data, label, method, knobs, seed, os.path.join(data, "fisher-a.pt"),
                                     lambda msg: None)
            built = [ln for ln in seq2seq.portable(spec.command).splitlines() if ln != "  --eval-bleu-start \\"]
            assert built == runs[(label, seed)]["command"].splitlines(), (label, seed)
            assert rel(spec.run_dir) == runs[(label, seed)]["run_dir"]
    monkeypatch.setattr(seq2seq, "run", lambda *a, **k: None)
    assert seq2seq.portable(seq2seq.fisher_step(args, data)[1]) == res["fisher_command"]
    monkeypatch.setattr(seq2seq, "run", lambda cmd, logfile, env=None: open(logfile, "w").write(
        "valid on 'valid' subset | loss 1 | bleu 1.0\nvalid on 'test' subset | loss 1 | bleu 2.0\n"))
    cmd = seq2seq.validate(args, data, pretrained, str(tmp_path / "v.log"))[1]
    assert seq2seq.portable("fairseq-validate " + cmd) == res["pretrained"]["command"]


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
