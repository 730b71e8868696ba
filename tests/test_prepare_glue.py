"""data-prep/prepare_glue.py on tiny GLUE-format files, loaded back with fairseq's sentence_prediction task.

Everything is generated here (no network): TSVs with the official column layouts of all nine
tasks, and a tiny GPT-2 byte-level BPE (all 256 byte symbols + a few dozen merges).
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from helpers.glue_files import GLUE, NUM_CLASSES, PAIR, SPLITS, write_bpe, write_glue, write_tsv
from recadam_fairseq.prepare import prepare_glue as pg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "data-prep", "prepare_glue.py")

def expected(task, fname):
    """(texts, label) per example that should survive, in file order."""
    text_cols, label_col, files = GLUE[task]
    header, rows = files[fname]
    ncols = len(header) if header else len(rows[0])
    return [([r[c].strip() for c in text_cols], r[label_col]) for r in rows if len(r) == ncols]


def splits_of(task):
    return SPLITS.get(task, {"train": "train.tsv", "valid": "dev.tsv"})


def run(args):
    """pg.main in-process; returns (rc, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = pg.main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    glue, bpe, out = root / "glue", root / "bpe", root / "out"
    write_glue(glue)
    n_merges = write_bpe(bpe)
    old, pg.POOL_MIN_LINES = pg.POOL_MIN_LINES, 0  # exercise the BPE process pool on tiny data
    try:
        rc, stdout, stderr = run(["--glue-dir", glue, "--bpe-dir", bpe, "--out", out, "--tasks", "ALL",
                                  "--workers", "2"])
    finally:
        pg.POOL_MIN_LINES = old
    assert rc == 0, stderr
    return SimpleNamespace(glue=glue, bpe=bpe, out=out, stdout=stdout, n_merges=n_merges)


def load(task_dir, split, task_name):
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask

    cfg = SentencePredictionConfig(data=str(task_dir), num_classes=NUM_CLASSES.get(task_name, 2),
                                   regression_target=task_name == "STS-B", classification_head_name="h",
                                   seed=1, no_shuffle=True)
    task = SentencePredictionTask.setup_task(cfg)
    return task, task.load_dataset(split)


# ----------------------------------------------------------------------------- results


def test_tiny_bpe_is_a_few_dozen_merges(prepared):
    assert 20 <= prepared.n_merges <= 80


@pytest.mark.parametrize("name", list(GLUE))
def test_task_loads_back_with_sentence_prediction(prepared, name):
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    bpe = get_encoder(str(prepared.bpe / "encoder.json"), str(prepared.bpe / "vocab.bpe"))
    task_dir = prepared.out / f"{name}-bin"
    assert (task_dir / "input1").is_dir() == (name in PAIR)
    meta = json.loads((task_dir / "labels.json").read_text())
    for split, fname in splits_of(name).items():
        task, ds = load(task_dir, split, name)
        want = expected(name, fname)
        assert len(ds) == len(want), (split, fname)
        d = task.source_dictionary
        for i, (texts, label) in enumerate(want):
            item = ds[i]
            tokens = item["net_input.src_tokens"].tolist()
            # one </s>-terminated segment per input (input0, then input1 for pairs)
            assert tokens[-1] == d.eos() and tokens.count(d.eos()) == len(texts)
            segments, cur = [], []
            for t in tokens:
                if t == d.eos():
                    segments.append(cur)
                    cur = []
                else:
                    cur.append(int(d[t]))  # dict symbols are the GPT-2 BPE ids
            assert [bpe.decode(s) for s in segments] == texts
            if name == "STS-B":
                assert item["target"] == pytest.approx([float(label) / 5.0])
            else:
                target = int(item["target"])
                assert task.label_dictionary[target + task.label_dictionary.nspecial] == label
                assert meta["id2label"][str(target)] == label


def test_output_layout(prepared):
    for name in GLUE:
        d = prepared.out / f"{name}-bin"
        inputs = ["input0", "input1"] if name in PAIR else ["input0"]
        for split in splits_of(name):
            for sub in inputs:
                assert (d / sub / f"{split}.bin").is_file() and (d / sub / f"{split}.idx").is_file()
            if name == "STS-B":
                assert (d / "label" / f"{split}.label").is_file()
            else:
                assert (d / "label" / f"{split}.bin").is_file()
        assert (d / "input0" / "dict.txt").read_text() == (prepared.bpe / "dict.txt").read_text()
        assert (d / "label" / "dict.txt").is_file() == (name != "STS-B")
        assert not (d / "input0" / "valid1.bin").exists() or name == "MNLI"
    # nothing left over from the build
    assert sorted(os.listdir(prepared.out)) == sorted(f"{n}-bin" for n in GLUE)


def test_mnli_has_matched_and_mismatched_dev(prepared):
    d = prepared.out / "MNLI-bin"
    _, matched = load(d, "valid", "MNLI")
    _, mismatched = load(d, "valid1", "MNLI")
    assert (len(matched), len(mismatched)) == (2, 3)
    assert json.loads((d / "labels.json").read_text())["splits"] == SPLITS["MNLI"]


def test_labels_json(prepared):
    meta = json.loads((prepared.out / "MNLI-bin" / "labels.json").read_text())
    assert meta["num_classes"] == 3 and not meta["regression"]
    assert sorted(meta["id2label"].values()) == ["contradiction", "entailment", "neutral"]
    assert {v: int(k) for k, v in meta["id2label"].items()} == meta["label2id"]
    cola = json.loads((prepared.out / "CoLA-bin" / "labels.json").read_text())
    assert cola["label_meaning"] == {"0": "unacceptable", "1": "acceptable"}
    stsb = json.loads((prepared.out / "STS-B-bin" / "labels.json").read_text())
    assert stsb["regression"] and stsb["num_classes"] == 1 and stsb["target"] == "score / 5"


def test_stsb_label_files_hold_scaled_scores(prepared):
    lines = (prepared.out / "STS-B-bin" / "label" / "train.label").read_text().split()
    assert [float(x) for x in lines] == pytest.approx([1.0, 0.1, 0.76])


def test_stsb_raw_scores(prepared, tmp_path):
    rc, _, err = run(["--glue-dir", prepared.glue, "--bpe-dir", prepared.bpe, "--out", tmp_path,
                      "--tasks", "sts-b", "--stsb-raw-scores"])
    assert rc == 0, err
    _, ds = load(tmp_path / "STS-B-bin", "valid", "STS-B")
    assert [ds[i]["target"] for i in range(len(ds))] == [pytest.approx([1.25]), pytest.approx([4.6])]


def test_summary_reports_counts_and_qqp_skips(prepared):
    s = prepared.stdout.split("== summary")[-1]
    for name in GLUE:
        assert f"{name}: " in s and str(prepared.out / f"{name}-bin") in s
    assert "train         4 examples from train.tsv (5 rows read, 1 skipped)" in s
    assert "skipped 1 x expected 6 tab-separated columns, got 5: lines 4" in s
    assert "skipped 1 x expected 6 tab-separated columns, got 7: lines 3" in s
    assert "valid1        3 examples from dev_mismatched.tsv" in s


# ----------------------------------------------------------------------------- bad input


@pytest.fixture
def glue_dir(tmp_path):
    write_glue(tmp_path / "glue")
    write_bpe(tmp_path / "bpe")
    return tmp_path


def prep(root, *tasks):
    return run(["--glue-dir", root / "glue", "--bpe-dir", root / "bpe", "--out", root / "out", "--tasks", *tasks])


def rewrite(root, task, fname, edit):
    header, rows = GLUE[task][2][fname]
    rows = [list(r) for r in rows]
    edit(rows)
    write_tsv(root / "glue" / task / fname, header, rows)
    return str(root / "glue" / task / fname)


def test_missing_task_file_exits_nonzero(glue_dir):
    os.remove(glue_dir / "glue" / "RTE" / "dev.tsv")
    proc = subprocess.run([sys.executable, SCRIPT, "--glue-dir", glue_dir / "glue", "--bpe-dir", glue_dir / "bpe",
                           "--out", glue_dir / "out", "--tasks", "CoLA", "RTE"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"{glue_dir / 'glue' / 'RTE' / 'dev.tsv'}: missing RTE file" in proc.stderr
    assert not (glue_dir / "out" / "CoLA-bin").exists()  # checked before any work


def test_wrong_column_count(glue_dir):
    path = rewrite(glue_dir, "RTE", "train.tsv", lambda rows: rows[1].pop())
    rc, _, err = prep(glue_dir, "RTE")
    assert rc == 1 and f"{path}, line 3: expected 4 tab-separated columns, got 3" in err
    assert os.listdir(glue_dir / "out") == []  # no half-made output


def test_wrong_column_count_in_headerless_cola(glue_dir):
    path = rewrite(glue_dir, "CoLA", "dev.tsv", lambda rows: rows[1].append("x"))
    rc, _, err = prep(glue_dir, "CoLA")
    assert rc == 1 and f"{path}, line 2: expected 4 tab-separated columns, got 5" in err


def test_unknown_label(glue_dir):
    path = rewrite(glue_dir, "MNLI", "dev_mismatched.tsv", lambda rows: rows[2].__setitem__(-1, "maybe"))
    rc, _, err = prep(glue_dir, "MNLI")
    assert rc == 1 and f"{path}, line 4: unknown MNLI label 'maybe'" in err


def test_dev_label_missing_from_train(glue_dir):
    path = rewrite(glue_dir, "QNLI", "train.tsv", lambda rows: rows[0].__setitem__(3, "not_entailment"))
    rc, _, err = prep(glue_dir, "QNLI")
    assert rc == 1
    assert f"{glue_dir / 'glue' / 'QNLI' / 'dev.tsv'}, line 2: label 'entailment' never occurs in {path}" in err


def test_bad_stsb_score(glue_dir):
    path = rewrite(glue_dir, "STS-B", "dev.tsv", lambda rows: rows[1].__setitem__(9, "7.5"))
    rc, _, err = prep(glue_dir, "STS-B")
    assert rc == 1 and f"{path}, line 3: STS-B score '7.5' is not a number in [0, 5]" in err


def test_empty_split(glue_dir):
    path = rewrite(glue_dir, "SST-2", "dev.tsv", lambda rows: rows.clear())  # header only
    rc, _, err = prep(glue_dir, "SST-2")
    assert rc == 1 and f"{path}: empty split, no examples" in err


def test_qqp_split_with_only_malformed_rows_is_empty(glue_dir):
    path = rewrite(glue_dir, "QQP", "dev.tsv", lambda rows: [r.append("x") for r in rows])
    rc, _, err = prep(glue_dir, "QQP")
    assert rc == 1 and f"{path}: empty split, no examples (3 rows read, all skipped)" in err


def test_download_without_network(glue_dir, monkeypatch):
    def offline(*a, **k):
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    rc, _, err = run(["--glue-dir", glue_dir / "fresh", "--bpe-dir", glue_dir / "fresh-bpe",
                      "--out", glue_dir / "out", "--tasks", "RTE", "--download"])
    assert rc == 1
    assert "--download could not fetch https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/encoder.json" in err
    assert "Temporary failure in name resolution" in err


def test_download_lays_out_files_like_download_glue_data(tmp_path, monkeypatch):
    """--download against a fake network: zip extraction, MRPC's dev-id split, BPE files."""
    import zipfile

    write_bpe(tmp_path / "src-bpe")
    rte = io.BytesIO()
    with zipfile.ZipFile(rte, "w") as z:
        for fname, (header, rows) in GLUE["RTE"][2].items():
            z.writestr(f"RTE/{fname}", "".join("\t".join(r) + "\n" for r in [header] + rows))
    mrpc_files = GLUE["MRPC"][2]
    header = mrpc_files["train.tsv"][0]
    msr = [header] + mrpc_files["dev.tsv"][1] + mrpc_files["train.tsv"][1]  # SentEval's unsplit train file
    served = {
        pg.GLUE_ZIPS["RTE"]: rte.getvalue(),
        pg.MRPC_TRAIN: "".join("\t".join(r) + "\n" for r in msr).encode("utf-8"),
        pg.MRPC_DEV_IDS: "".join(f"{r[1]}\t{r[2]}\n" for r in mrpc_files["dev.tsv"][1]).encode(),
        **{pg.BPE_URL.format(n): (tmp_path / "src-bpe" / n).read_bytes() for n in pg.BPE_FILES},
    }
    fetched = []

    def fake_urlopen(url, timeout=None):
        fetched.append(url)
        return io.BytesIO(served[url])

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    glue, bpe = tmp_path / "glue", tmp_path / "bpe"
    rc, out, err = run(["--glue-dir", glue, "--bpe-dir", bpe, "--out", tmp_path / "out",
                        "--tasks", "RTE", "MRPC", "--download"])
    assert rc == 0, err
    assert sorted(fetched) == sorted(served)
    assert "MRPC: sentence pair, 2 classes" in out and "valid         2 examples from dev.tsv" in out
    _, ds = load(tmp_path / "out" / "MRPC-bin", "valid", "MRPC")
    assert len(ds) == 2
    # a second run finds everything in place and fetches nothing
    fetched.clear()
    rc, _, err = run(["--glue-dir", glue, "--bpe-dir", bpe, "--out", tmp_path / "out",
                      "--tasks", "RTE", "--download"])
    assert rc == 0 and fetched == [], err
