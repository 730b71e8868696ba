"""Using a fine-tuned model: scripts/glue/predict.py (use/predict.py), the README's snippet, the Hugging Face export.

Two tiny runs, a few updates each: a LoRA run on the tiny RTE (sentence pairs) and a multi-task run on
SST-2, RTE and STS-B (a regression); an interpolated checkpoint made from the first. Every expected
number comes from fairseq itself: the model loaded with checkpoint_utils and run on the binarized dev
sets that fairseq-preprocess wrote from the same sentences (no code of use/predict.py on that path).
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from helpers import LORA, NO_DROPOUT, ROOT, TINY_FT, code_carrying, load_ckpt, train_multitask
from helpers.glue_files import WORDS, write_bpe

from recadam_fairseq.use import export_hf, predict

PREDICT = os.path.join(ROOT, "scripts", "glue", "predict.py")
HEAD = "sentence_classification_head"


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    lora = root / "runs" / "RTE" / "lora" / "seed1"
    tiny.train(lora, *TINY_FT, *LORA, *NO_DROPOUT, optimizer="adam", updates=4,
               validate=True, data=os.path.join(tiny.glue_bin, "RTE-bin"))
    mt = root / "runs" / "MTL" / "tiny" / "seed1"
    train_multitask(SimpleNamespace(root=tiny.root, data=tiny.glue_bin, pretrained=tiny.pretrained), mt, *NO_DROPOUT,
                    tasks=["SST-2", "RTE", "STS-B"], updates=4)
    wise = root / "wise.pt"
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "interpolate.py"), str(lora / "checkpoint_best.pt"),
                    "--pretrained", tiny.pretrained, "--alpha", "0.5", "--out", str(wise)], check=True,
                   capture_output=True)
    return SimpleNamespace(root=root, lora=lora, mt=mt, wise=wise)


def raw_rows(tiny, task, pair):
    """The dev sentences (pairs) that fairseq-preprocess binarized into <task>-bin/input*/valid."""
    cols = [open(os.path.join(tiny.root, "raw", f"{task}.valid.input{k}")).read().splitlines()
            for k in range(2 if pair else 1)]
    return [list(r) for r in zip(*cols)]


def fairseq_dev_logits(ckpt, data_bin, head, regression, num_classes):
    """(logits, label names, right-padded tokens) of the dev set through fairseq's own sentence_prediction datasets."""
    from fairseq import checkpoint_utils
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask

    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(ckpt)])
    model = models[0].eval()
    cfg = SentencePredictionConfig(data=data_bin, num_classes=num_classes, regression_target=regression,
                                   classification_head_name=head, seed=1, no_shuffle=True, init_token=0,
                                   separator_token=2)
    task = SentencePredictionTask.setup_task(cfg)
    ds = task.load_dataset("valid")
    sample = ds.collater([ds[i] for i in range(len(ds))])
    with torch.no_grad():
        logits, _ = model(**sample["net_input"], classification_head_name=head)
    d = task.label_dictionary
    names = None if regression else [d.string([i + d.nspecial]) for i in range(num_classes)]
    return logits.float(), names, sample["net_input"]["src_tokens"]


def run_predict(*args, stdin=None):
    return subprocess.run([sys.executable, PREDICT, *map(str, args), "--cpu"], input=stdin, capture_output=True,
                          text=True, cwd=ROOT)


def assert_labels(out, logits, names):
    rows = [line.split("\t") for line in out.splitlines()]
    probs = logits.softmax(-1)
    assert [r[0] for r in rows] == [names[int(k)] for k in probs.argmax(-1)]
    assert [float(r[1]) for r in rows] == pytest.approx(probs.max(-1).values.tolist(), abs=2e-6)
    assert len(rows) == len(logits)


def test_labels_pairs_of_a_lora_run_from_its_directory(tiny, runs, tmp_path):
    assert any(".parametrizations." in k for k in load_ckpt(runs.lora / "checkpoint_best.pt")["model"])  # LoRA
    rows = raw_rows(tiny, "RTE", pair=True)
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{a}\t{b}\n" for a, b in rows))
    proc = run_predict(runs.lora, tsv)  # a fresh interpreter: what a user's terminal shows
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no library's warnings (fairscale's FutureWarnings at fairseq's import)
    logits, names, _ = fairseq_dev_logits(runs.lora / "checkpoint_best.pt", os.path.join(tiny.glue_bin, "RTE-bin"),
                                       HEAD, False, 2)
    assert sorted(names) == ["entailment", "not_entailment"]
    assert_labels(proc.stdout, logits, names)


def test_interpolated_checkpoint_from_stdin_with_data(tiny, runs):
    rows = raw_rows(tiny, "RTE", pair=True)[:9]
    proc = run_predict(runs.wise, "-", "--data", os.path.join(tiny.glue_bin, "RTE-bin"),
                       stdin="".join(f"{a}\t{b}\n" for a, b in rows))
    assert proc.returncode == 0, proc.stderr
    logits, names, _ = fairseq_dev_logits(runs.wise, os.path.join(tiny.glue_bin, "RTE-bin"), HEAD, False, 2)
    assert_labels(proc.stdout, logits[:9], names)


def test_multitask_run_labels_and_scores_by_task_name(tiny, runs, tmp_path):
    clf = predict.Classifier.load(str(runs.mt), task_name="sts-b", cpu=True)
    rows = raw_rows(tiny, "STS-B", pair=True)
    logits, _, _ = fairseq_dev_logits(runs.mt / "checkpoint_best.pt", os.path.join(tiny.glue_bin, "STS-B-bin"),
                                   "sts_b", True, 1)
    assert clf.regression and clf.predict(rows, batch_size=7) == pytest.approx(logits.view(-1).tolist(), abs=1e-5)
    # prepare_glue.py's STS-B: labels.json's "score / 5" targets, so a score is 5 x the head's output
    data = tmp_path / "glue"
    shutil.copytree(tiny.glue_bin, data)
    meta = json.loads((data / "STS-B-bin" / "labels.json").read_text())
    (data / "STS-B-bin" / "labels.json").write_text(json.dumps({**meta, "target": "score / 5"}))
    five = predict.Classifier.load(str(runs.mt), data=str(data), task_name="STS-B", cpu=True)
    assert five.predict(rows[:5]) == pytest.approx([5 * x for x in logits.view(-1)[:5].tolist()], abs=5e-5)
    rows = raw_rows(tiny, "SST-2", pair=False)
    proc = run_predict(runs.mt, "--task-name", "SST-2", stdin="".join(r[0] + "\n" for r in rows))
    assert proc.returncode == 0, proc.stderr
    logits, names, _ = fairseq_dev_logits(runs.mt / "checkpoint_best.pt", os.path.join(tiny.glue_bin, "SST-2-bin"),
                                       "sst_2", False, 2)
    assert_labels(proc.stdout, logits, names)


def one_line_error(capsys, argv):
    assert predict.main(argv + ["--cpu"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("predict.py: error: "), err
    return err.strip()[len("predict.py: error: "):]


def test_bad_input_stops_with_one_line(tiny, runs, tmp_path, capsys):
    empty = tmp_path / "empty-run"
    empty.mkdir()
    assert one_line_error(capsys, [str(empty)]) == \
        f"{empty}: no checkpoint_best.pt or checkpoint_last.pt (an unfinished run, or not a run directory?)"
    ckpt = runs.mt / "checkpoint_best.pt"
    assert one_line_error(capsys, [str(runs.mt), "--task-name", "CoLA"]) == \
        f"--task-name CoLA: not a task of {ckpt} (its tasks: SST-2, RTE, STS-B)"
    assert one_line_error(capsys, [str(runs.mt)]) == f"--task-name: {ckpt} was trained on SST-2, RTE, STS-B: choose one"
    one = tmp_path / "one.tsv"
    one.write_text("w1 good2\tw3\nw4 bad1\n")
    assert one_line_error(capsys, [str(runs.lora), str(one)]) == \
        f"{one}, line 2: 1 column(s); the task takes a sentence pair: 2 tab-separated columns"
    assert one_line_error(capsys, [str(runs.lora), str(one), "--bpe-dir", str(tmp_path)]) == \
        f"--bpe-dir {tmp_path}: no encoder.json"
    assert one_line_error(capsys, [str(runs.wise), str(one), "--data", str(tmp_path / "nowhere")]) == \
        f"--data {tmp_path / 'nowhere'}: no such directory"
    refusal = code_carrying(tmp_path / "code.pt", tmp_path / "payload-ran")  # predict.py and export_hf.py read so
    assert one_line_error(capsys, [str(tmp_path / "code.pt")]) == f"{tmp_path / 'code.pt'}: {refusal}"
    assert not (tmp_path / "payload-ran").exists()


def readme_snippet():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = re.search(r"^<!-- predict-snippet:start -->\n```python\n(.*?)^```\n<!-- predict-snippet:end -->$",
                      text, re.M | re.S)
    assert block, "README.md: no ```python block between the predict-snippet markers"
    return block.group(1)


def test_readme_snippet_runs_as_printed_on_the_tiny_model(tiny, runs):
    """The snippet with only its paths line replaced: RUN_DIR, DATA_DIR, BPE_DIR of the tiny LoRA run."""
    code = readme_snippet()
    lines = code.splitlines()
    paths = [i for i, line in enumerate(lines) if line.startswith("RUN_DIR, DATA_DIR, BPE_DIR = ")]
    assert len(paths) == 1, code
    lines[paths[0]] = f"RUN_DIR, DATA_DIR, BPE_DIR = {str(runs.lora)!r}, {os.path.join(tiny.glue_bin, 'RTE-bin')!r}, None"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True, cwd=runs.root,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    # the sentences the snippet classifies, encoded as fairseq's sentence_prediction does: <s> A </s> </s> B </s>
    call = next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "predict")
    pairs = ast.literal_eval(call.args[0])
    from fairseq import checkpoint_utils
    from fairseq.data import data_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(runs.lora / "checkpoint_best.pt")])
    d = task.source_dictionary
    toks = data_utils.collate_tokens([torch.cat([torch.tensor([0]), d.encode_line(a, add_if_not_exist=False).long(),
                                                 torch.tensor([2]), d.encode_line(b, add_if_not_exist=False).long()])
                                      for a, b in pairs], d.pad())
    with torch.no_grad():
        probs = models[0].eval()(toks, classification_head_name=HEAD)[0].softmax(-1)
    ld = task.label_dictionary
    assert [g[0] for g in got] == [ld.string([int(k) + ld.nspecial]) for k in probs.argmax(-1)]
    assert [g[1] for g in got] == pytest.approx(probs.max(-1).values.tolist(), abs=1e-6)


def hf_config_of(out):
    from transformers import RobertaConfig

    return RobertaConfig.from_pretrained(str(out))


def hf_logits(out, toks, pad):
    from transformers import RobertaForSequenceClassification

    hf = RobertaForSequenceClassification.from_pretrained(str(out)).eval()
    with torch.no_grad():
        return hf(input_ids=toks, attention_mask=toks.ne(pad).long()).logits, hf.config


@pytest.mark.parametrize("which", ["lora", "mt"])
def test_export_gives_fairseqs_logits(tiny, runs, tmp_path, which, capsys):
    out = tmp_path / "hf"
    argv = [str(runs.lora), str(out)] if which == "lora" else [str(runs.mt), str(out), "--task-name", "RTE"]
    assert export_hf.main(argv) == 0
    assert "bare numbers" not in capsys.readouterr().out  # RTE's labels are words
    assert {"model.safetensors", "config.json"} <= set(os.listdir(out))
    head = HEAD if which == "lora" else "rte"
    ckpt = (runs.lora if which == "lora" else runs.mt) / "checkpoint_best.pt"
    logits, names, toks = fairseq_dev_logits(ckpt, os.path.join(tiny.glue_bin, "RTE-bin"), head, False, 2)
    assert toks.eq(1).any()  # padded rows: HF numbers positions from padding_idx + 1 as fairseq does
    theirs, config = hf_logits(out, toks, pad=1)
    assert (theirs - logits).abs().max() < 1e-5
    assert [config.id2label[i] for i in range(2)] == names
    if which == "mt":  # SST-2's labels are "0" and "1", in the label dictionary's order: said in one line
        assert export_hf.main([str(runs.mt), str(tmp_path / "sst2"), "--task-name", "SST-2"]) == 0
        out = capsys.readouterr().out
        id2label = hf_config_of(tmp_path / "sst2").id2label
        shown = ", ".join(f"{i}: {id2label[i]!r}" for i in range(2))
        assert f"export_hf.py: the label names are bare numbers as in the data, not words: id2label is {{{shown}}}" \
            in out, out


def test_exported_tokenizer_encodes_as_prepare_glue(tmp_path):
    """--bpe-dir: transformers' tokenizer gives the ids of prepare_glue.py's BPE + fairseq's dictionary."""
    from fairseq.data import Dictionary
    from transformers import AutoTokenizer

    from recadam_fairseq.prepare import prepare_glue

    bpe = tmp_path / "bpe"
    write_bpe(bpe)
    d = Dictionary.load(str(bpe / "dict.txt"))
    d.add_symbol("<mask>")
    export_hf.write_tokenizer(d, str(bpe), str(tmp_path / "hf"))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    a, b = " ".join(WORDS[:4]) + ", said the man", "The movie is bad!"

    def ids(text):
        return d.encode_line(prepare_glue.bpe_encode([text], str(bpe), 1)[0], add_if_not_exist=False).tolist()

    assert tok(a)["input_ids"] == [0] + ids(a)
    assert tok(a, b)["input_ids"] == [0] + ids(a) + [2] + ids(b)
    assert tok.mask_token_id == len(d) - 1 and tok.pad_token_id == 1
