"""Your own model and data (docs/forgetting-your-task.md#on-your-own-model-and-data): tiny Hugging Face BERT,
RoBERTa and XLM-R with their masked-LM heads (tests/helpers/hf_models.py, built offline) converted and checked
against transformers' forward; TSV, CSV and JSONL tasks prepared with each tokenizer and read back against the
tokenizer's own ids; a pair probe from a file of sentence pairs; bad input as one line; the page's walk-through
block as printed, under a task name of the user's."""

import json
import os
import shutil
import subprocess

import pytest

from helpers import ROOT, base_env, fast_python, fast_train, marked_bash_lines
from recadam_fairseq.prepare import convert_hf as conv
from recadam_fairseq.prepare import hf_source, prepare_task, verify_hf

MODELS = ("bert", "roberta", "xlmr")


@pytest.fixture(scope="module")
def converted(hf, tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    return {name: conv.convert(hf[name], str(root / name))["out"] for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
def test_converted_model_is_the_original(hf, converted, name):
    """Hidden states and masked-LM logits against transformers' forward of the original (float64): to fp32 rounding
    (1e-5) with the original's LayerNorm eps set to fairseq's 1e-5; with its own eps (1e-12) 2% of a hidden state
    at most, the eps being what differs (10 times the rounding); the same top word for every token with the same eps
    (with the original's own, a near tie of two words in these random weights may swap: 1 of 252 did once)."""
    v = verify_hf.verify(hf[name], converted[name])
    assert v["layers"] == 3 and v["lm_head"] and v["family"] == ("bert" if name == "bert" else "roberta")
    assert v["abs_same_eps"] < 1e-5 and v["rel_same_eps"] < 1e-5 and v["rel"] < 2e-2, v
    assert v["abs"] > 10 * v["abs_same_eps"] and v["cos"] < 1e-5, v
    assert v["mlm_abs_same_eps"] < 1e-5 and v["mlm_top1_same_eps"] == 1.0 and v["mlm_top1"] >= 0.98, v
    arch = json.load(open(os.path.join(converted[name], "arch.json")))
    assert arch["lm_head"] and arch["arch_args"][arch["arch_args"].index("--max-positions") + 1] == "64"


def read_binarized(data_dir, kind, split):
    from fairseq.data import data_utils

    return data_utils.load_indexed_dataset(os.path.join(data_dir, kind, split), None)


@pytest.mark.parametrize("name, fmt", [("bert", "tsv"), ("bert", "csv"), ("bert", "jsonl"), ("roberta", "tsv"),
                                       ("roberta", "csv"), ("roberta", "jsonl")])
def test_prepared_task_is_the_tokenizer_s_ids(hf, converted, tmp_path, name, fmt):
    """prepare_task.py on each format with each tokenizer: input0 holds each text's ids from the model's own
    tokenizer (its vocabulary's, in fairseq's numbering) then </s>; label/ the classes in sorted order; labels.json
    says the task's name, classes and metric."""
    from tokenizers import Tokenizer

    data = hf["data"]
    assert prepare_task.main(["--model", converted[name], "--task-name", "Reviews", "--train", f"{data}/train.{fmt}",
                              "--valid", f"{data}/dev.{fmt}", "--text-column", "text", "--label-column", "label",
                              "--out", str(tmp_path)]) == 0
    task = tmp_path / "Reviews-bin"
    meta = json.loads((task / "labels.json").read_text())
    assert (meta["task"], meta["num_classes"], meta["metric"]) == ("Reviews", 2, "accuracy")
    assert meta["id2label"] == {"0": "negative", "1": "positive"} and meta["prepared"]["train"]["unk"] == 0
    source = hf_source.read_model(hf[name])
    b2f = hf_source.vocab_order(source.vocab, hf[name], source.family)[2]
    tok = Tokenizer.from_file(os.path.join(hf[name], "tokenizer.json"))
    rows = [ln.split("\t") for ln in open(f"{data}/dev.tsv", encoding="utf-8").read().splitlines()[1:]]
    got, labels = read_binarized(task, "input0", "valid"), read_binarized(task, "label", "valid")
    assert len(got) == len(rows) == 32
    for i, row in enumerate(rows):
        ids = tok.encode(row[0], add_special_tokens=False).ids
        assert got[i].tolist() == b2f[ids].tolist() + [2], (i, row[0])  # fairseq-preprocess's </s>
        assert int(labels[i][0]) - 4 == ["negative", "positive"].index(row[3])  # after the label dict's specials


def test_pairs_regression_and_the_recipe_of_a_task_of_yours(hf, converted, tmp_path):
    """Sentence pairs (input1) and a regression target (label/<split>.label) from a CSV; the task scripts' plan of a
    name of the user's: its classes and metric from labels.json, the small-task recipe over its 96 examples (10
    epochs of 6 batches of 16), --regression-target for a regression."""
    from recadam_fairseq.launch import prelaunch

    data = hf["data"]
    assert prepare_task.main(["--model", converted["xlmr"], "--task-name", "Similar", "--train", f"{data}/train.csv",
                              "--valid", f"{data}/dev.csv", "--text-column", "pair_a", "--text2-column", "pair_b",
                              "--label-column", "score", "--regression", "--out", str(tmp_path)]) == 0
    task = tmp_path / "Similar-bin"
    assert len(read_binarized(task, "input1", "train")) == 96
    scores = (task / "label" / "valid.label").read_text().split()
    assert scores[0] == repr(float(open(f"{data}/dev.tsv").read().splitlines()[1].split("\t")[4]))
    plan = prelaunch.task_plan("Similar", str(tmp_path))
    assert plan == dict(TASK="Similar", RECIPE_LR="2e-5", RECIPE_BATCH=16, RECIPE_TOTAL=60, RECIPE_WARMUP=4,
                        NUM_CLASSES=1, METRIC="pearson", TASK_FLAGS=["--regression-target"])
    assert prelaunch.task_plan("sts-b")["TASK_FLAGS"] == ["--regression-target"]  # GLUE's, as before
    with pytest.raises(prelaunch.Stop, match=r"unknown TASK 'Other': not a GLUE task .* nor one of yours"):
        prelaunch.task_plan("Other", str(tmp_path))
    # data missing: the command that makes it, a task of the user's or GLUE's
    (task / "input0" / "train.idx").unlink()
    with pytest.raises(prelaunch.Stop, match=r"\(make it with data-prep/prepare_task.py --task-name Similar\)$"):
        prelaunch.train_examples(str(tmp_path), "Similar")
    with pytest.raises(prelaunch.Stop, match=r"\(make it with data-prep/prepare_glue.py --tasks RTE\)$"):
        prelaunch.train_examples(str(tmp_path), "RTE")


def test_bad_input_is_one_line_and_leaves_nothing(hf, converted, tmp_path, capsys):
    """Each bad input stops before anything is written: a missing column, a label column with one value (classes or
    a regression's), an empty label, a file
    without a header, a tokenizer that makes most words <unk> (BERT's WordPiece on Cyrillic text), an unsupported
    model type (at the conversion)."""
    data = hf["data"]
    one = tmp_path / "one.tsv"
    one.write_text("text\tlabel\nthe movie\tpositive\na film\tpositive\n")
    bare = tmp_path / "bare.tsv"
    bare.write_text("the movie was great\tpositive\na terrible film\tnegative\n")
    blank = tmp_path / "blank.tsv"
    blank.write_text("text\tlabel\nthe movie\tpositive\ni loved it\t\na film\tnegative\n")
    flat = tmp_path / "flat.tsv"
    flat.write_text("text\tlabel\nthe movie\t3.5\na film\t3.5\n")
    foreign = tmp_path / "foreign.tsv"
    foreign.write_text("text\tlabel\nфильм был отличный\tpositive\nскучный сюжет\tnegative\n")
    cases = [
        ([f"{data}/train.tsv", "--text-column", "review"],
         f"{data}/train.tsv: no column 'review' in its header row ('text\\tpair_a\\tpair_b\\tlabel\\tscore'); the "
         f"file needs a header row naming its columns"),
        ([str(one), "--text-column", "text"],
         f"{one}: column 'label' has one value ('positive') in every example: nothing to classify (a number to "
         f"predict: --regression)"),
        ([str(blank), "--text-column", "text"],
         f"{blank}: example 2: column 'label' is empty (every example needs a label)"),
        ([str(flat), "--text-column", "text", "--regression"],
         f"{flat}: column 'label' has one value in every example: nothing to regress on (pearson and spearman are "
         f"undefined)"),
        ([str(bare), "--text-column", "text"],
         f"{bare}: no column 'text', 'label' in its header row ('the movie was great\\tpositive'); the file needs a "
         f"header row naming its columns"),
        ([str(foreign), "--text-column", "text"],
         f"{foreign}: 100.0% of its 5 tokens are <unk> (more than --max-unk 5%): the model's tokenizer does not fit "
         f"this text (another language or script, or the wrong --model)"),
    ]
    for (train, *cols), message in cases:
        assert prepare_task.main(["--model", converted["bert"], "--task-name", "Reviews", "--train", train,
                                  "--valid", train, *cols, "--label-column", "label", "--out",
                                  str(tmp_path / "out")]) == 1
        assert capsys.readouterr().err == f"prepare_task.py: error: {message}\n"
        assert not (tmp_path / "out" / "Reviews-bin").exists()
    gpt2 = tmp_path / "gpt2"
    shutil.copytree(hf["roberta"], gpt2)
    cfg = json.loads((gpt2 / "config.json").read_text())
    (gpt2 / "config.json").write_text(json.dumps(dict(cfg, model_type="gpt2")))
    assert conv.main(["--model-dir", str(gpt2), "--out", str(tmp_path / "gpt2-fs")]) == 1
    assert capsys.readouterr().err == (f"convert_hf_to_fairseq: error: {gpt2}/config.json: model_type 'gpt2': "
                                       f"supported are bert, roberta, xlm-roberta (fairseq's RoBERTa holds the BERT "
                                       f"and RoBERTa families' encoders)\n")
    assert not (tmp_path / "gpt2-fs").exists()


def test_pair_probe_from_a_file_of_sentence_pairs(hf, converted, tmp_path, capsys):
    """scripts/binarize_probe.py --pairs FILE --model DIR: the header row skipped, each sentence tokenized by the model's
    tokenizer once, the pairs' rows and labels; a masked-LM probe of a model converted without its head is one
    line."""
    import numpy as np
    from fairseq.data import data_utils
    from tokenizers import Tokenizer

    from recadam_fairseq.prepare import binarize_probe

    pairs = os.path.join(hf["data"], "pairs.tsv")
    info = binarize_probe.main(["--pairs", pairs, "--model", converted["roberta"], "--out", str(tmp_path / "probe")])
    rows = [ln.split("\t") for ln in open(pairs, encoding="utf-8").read().splitlines()[1:]]
    assert info["pairs"] == len(rows) == 16 and info["skipped"] == 0
    npz = np.load(tmp_path / "probe" / "pairs.npz")
    items = data_utils.load_indexed_dataset(str(tmp_path / "probe" / "sentences"), None)
    tok = Tokenizer.from_file(os.path.join(hf["roberta"], "tokenizer.json"))
    for i, (a, b, y) in enumerate(rows):
        assert items[int(npz["premise"][i])].tolist() == tok.encode(a, add_special_tokens=False).ids + [2]
        assert items[int(npz["hypothesis"][i])].tolist() == tok.encode(b, add_special_tokens=False).ids + [2]
        assert int(npz["label"][i]) == int(y)
    headless = tmp_path / "headless"
    shutil.copytree(converted["roberta"], headless)
    arch = json.loads((headless / "arch.json").read_text())
    (headless / "arch.json").write_text(json.dumps(dict(arch, lm_head=False)))
    with pytest.raises(SystemExit):
        binarize_probe.main(["--text", pairs, "--model", str(headless), "--out", str(tmp_path / "mlm")])
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"binarize_probe.py: error: --text with --model {headless}: a masked-LM probe needs the model's own "
        f"masked-LM head, and this one was converted from a checkpoint without one: make a --pairs probe")


PAGE = "docs/forgetting-your-task.md"


def test_the_own_model_walk_through_as_printed(hf, tmp_path):
    """The page's block as printed, on the tiny BERT and a TSV of reviews under the task name Reviews (no GLUE task):
    converted (and checked), prepared, the pair probe, grid.sh's adam and recadam runs with it, summarize.py --wise-ft:
    the summary's section for Reviews with both settings, verdicts.csv, forgetting-Reviews.png and Adam's WiSE-FT
    point at α 0.5."""
    lines = marked_bash_lines(PAGE, "<!-- own-model:start -->", "<!-- own-model:end -->")
    assert [ln.split()[1] for ln in lines[:3]] == ["data-prep/convert_hf_to_fairseq.py", "data-prep/prepare_task.py",
                                                   "scripts/binarize_probe.py"]
    work = tmp_path / "work"
    env = base_env(HF_MODEL=hf["bert"], TRAIN_FILE=f"{hf['data']}/train.tsv", VALID_FILE=f"{hf['data']}/dev.tsv",
                   TEXT_COLUMN="text", LABEL_COLUMN="label", TASK_NAME="Reviews", PROBE_PAIRS=f"{hf['data']}/pairs.tsv",
                   WORK=work, METHODS="adam recadam", SEEDS="1", MAX_UPDATE=6, LR="1e-4", KS="0.5", T0S="3",
                   SAVE_INTERVAL_UPDATES=3, FP16=0, OMP_NUM_THREADS=1, FAIRSEQ_TRAIN=fast_train(),
                   PATH=os.path.dirname(fast_python()) + os.pathsep + os.environ["PATH"])
    p = subprocess.run(["bash", "-c", "set -euo pipefail\n" + "\n".join(lines)], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "verify on 6 sentences" in p.stdout and "Reviews: ran 2, skipped 0, failed 0" in p.stdout
    runs = work / "runs"
    assert sorted(d.name for d in (runs / "Reviews").iterdir()) == ["adam", "recadam-k0.5-t3"]
    md = (runs / "summary.md").read_text()
    assert "### Reviews: dev accuracy against forgetting (pair AUC since θ*)" in md, md
    assert "| adam | 1 |" in md and "| recadam-k0.5-t3 | 1 |" in md and "| adam | 0.5 | 1 |" in md, md
    verdicts = (runs / "verdicts.csv").read_text().splitlines()
    assert verdicts[0].startswith("task,") and {ln.split(",")[0] for ln in verdicts[1:]} == {"Reviews"}
    assert (runs / "forgetting-Reviews.png").stat().st_size > 10_000
    assert json.loads((runs / "Reviews" / "adam" / "seed1" / "wise-ft.json").read_text())["points"][0]["alpha"] == 0.5
    assert "UserWarning" not in p.stderr and "Warning:" not in p.stdout, p.stderr[-2000:]
    # then the search's block, after it in the same shell: two trials a method on the prepared data and probe
    search = marked_bash_lines(PAGE, "<!-- search:start -->", "<!-- search:end -->")
    p = subprocess.run(["bash", "-c", "set -euo pipefail\n" + "\n".join(search)], cwd=ROOT, env=dict(env, TRIALS="2"),
                       capture_output=True, text=True)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    md = (work / "tune" / "Reviews" / "search" / "summary.md").read_text()
    assert md.startswith("# Search: Reviews") and "| adam | 2 / 0 / 0 |" in md and "| recadam | 2 / 0 / 0 |" in md, md
    assert "tune.sh: warning: KS=0.5 is grid.sh's" in p.stderr and "pair AUC since θ*" in md


def test_a_model_without_tokenizer_json_gets_one_from_its_vocabulary(hf, tmp_path):
    """A BERT directory with vocab.txt and no tokenizer.json: the conversion writes one through transformers' own
    slow-to-fast conversion, tokenizing as the original's tokenizer.json does."""
    from tokenizers import Tokenizer

    orig = Tokenizer.from_file(f"{hf['bert']}/tokenizer.json")
    bare = tmp_path / "bare"
    shutil.copytree(hf["bert"], bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # (the latter names the fast class that needs it)
        (bare / name).unlink()
    vocab = orig.get_vocab()
    (bare / "vocab.txt").write_text("".join(t + "\n" for t in sorted(vocab, key=vocab.get)))
    out = conv.convert(str(bare), str(tmp_path / "out"))["out"]
    text = ["the movie was great, wasn't it?", "A terrible FILM", "zzzq"]  # (the last: [UNK])
    made = Tokenizer.from_file(f"{out}/tokenizer.json")
    assert [e.ids for e in made.encode_batch(text)] == [e.ids for e in orig.encode_batch(text)]
