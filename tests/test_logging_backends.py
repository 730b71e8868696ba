"""What fairseq's --tensorboard-logdir and --wandb-project receive from a recadam run.

One tiny real fairseq-train run (recadam, sentence_prediction_recadam, validation every 4 updates)
writes the json log, TensorBoard event files and an offline W&B run; the event files are read back
with TensorBoard's own reader, the W&B run with W&B's own record type, and both must hold every
json number at the same step.
"""

import glob
import importlib.util
import json
import math
import os
import struct
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # [test] extra

from helpers import ROOT, json_records

RECADAM = ("recadam_lambda", "recadam_dist", "recadam_penalty", "target_loss")
GLUE_DEV = ("accuracy", "f1", "mcc", "acc_and_f1")


# wandb (with its 100 MB of dependencies) stays out of the venv, where fairseq would import it in
# every process: `make` installs it beside the venv for this test (pip install --target).
WANDB_DIR = os.path.join(sys.prefix, "wandb-offline")
HAVE_WANDB = importlib.util.find_spec("wandb") is not None or os.path.isdir(os.path.join(WANDB_DIR, "wandb"))


@pytest.fixture(scope="module")
def logged_run(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("logging")
    tb, wb = root / "tb", root / "wandb"
    flags = ["--criterion", "sentence_prediction_recadam", "--recadam-anneal-k", "0.5", "--recadam-anneal-t0", "4",
             "--log-format", "json", "--log-interval", "2", "--tensorboard-logdir", str(tb),
             "--validate-interval-updates", "4", "--best-checkpoint-metric", "mcc",
             "--maximize-best-checkpoint-metric", "--no-save"]
    env = None
    if HAVE_WANDB:
        wb.mkdir()
        flags += ["--wandb-project", "recadam-test"]
        path = [ROOT, os.environ.get("PYTHONPATH", ""), WANDB_DIR]
        env = {"WANDB_MODE": "offline", "WANDB_DIR": str(wb), "WANDB_SILENT": "true",
               "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    _, log = tiny.train(root / "run", *flags, updates=8, validate=True, env=env)
    return tb, wb, log


def _scalars(logdir):
    """{tag: {step: value}} of the event files in one of fairseq's per-split TensorBoard directories."""
    assert glob.glob(os.path.join(logdir, "events.out.tfevents.*")), f"no event file in {logdir}"
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        out[tag] = {e.step: e.value for e in events}
        assert len(out[tag]) == len(events), f"{tag}: two values at one step"
    return out


def _same(tb_value, json_value):
    # the json log prints 6 significant digits ("{:g}"); event files hold float32
    return math.isclose(tb_value, float(json_value), rel_tol=1e-5, abs_tol=1e-9)


def test_tensorboard_holds_the_json_log(logged_run):
    tb, _, log = logged_run
    inner = json_records(log, "train_inner")
    assert [int(r["num_updates"]) for r in inner] == [2, 4, 6, 8]
    scalars = _scalars(tb / "train_inner")
    assert set(RECADAM) <= scalars.keys(), sorted(scalars)
    _assert_all_equal(inner, scalars, "num_updates", "")
    lam = scalars["recadam_lambda"]  # λ(t) itself, not an average over the log interval
    assert all(_same(lam[t], 1 / (1 + math.exp(-0.5 * (t - 4)))) for t in (2, 4, 6, 8))
    assert all(scalars["recadam_dist"][t] > 0 for t in (2, 4, 6, 8))

    valid = json_records(log, "valid")
    assert [int(r["valid_num_updates"]) for r in valid] == [4, 8]
    vscalars = _scalars(tb / "valid")
    assert set(GLUE_DEV + ("loss", "target_loss")) <= vscalars.keys(), sorted(vscalars)
    _assert_all_equal(valid, vscalars, "valid_num_updates", "valid_")


def _assert_all_equal(records, scalars, step_key, prefix):
    """Every number of every json record is in TensorBoard, at the record's step, with its value."""
    checked = 0
    for rec in records:
        step = int(rec[step_key])
        for key, value in rec.items():
            name = key[len(prefix):] if key.startswith(prefix) else key
            if name in ("epoch", "update", "num_updates"):
                continue
            try:
                float(value)
            except (TypeError, ValueError):
                continue
            assert name in scalars and step in scalars[name], f"{prefix}{name}: no value at step {step}"
            assert _same(scalars[name][step], value), (key, step, scalars[name][step], value)
            checked += 1
    assert checked >= 10 * len(records)


@pytest.mark.skipif(not HAVE_WANDB, reason=f"wandb is not installed (make puts it in {WANDB_DIR})")
def test_wandb_offline_run_holds_the_json_log(logged_run):
    _, wb, log = logged_run
    files = glob.glob(str(wb / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert files, f"no offline W&B run in {wb}"
    if importlib.util.find_spec("wandb") is None:
        sys.path.append(WANDB_DIR)
    from wandb.proto import wandb_internal_pb2

    rows = {}
    for path in files:
        for rec in _wandb_records(path, wandb_internal_pb2):
            if rec.WhichOneof("record_type") == "history":
                row = rows.setdefault(rec.history.step.num, {})
                row.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
    # {split: {key: {step: value}}}, the layout TensorBoard's reader gives
    scalars = {}
    for step, row in rows.items():
        for key, value in row.items():
            if "/" in key and isinstance(value, (int, float)):
                split, name = key.split("/", 1)
                scalars.setdefault(split, {}).setdefault(name, {})[step] = value
    inner, valid = json_records(log, "train_inner"), json_records(log, "valid")
    assert set(RECADAM) <= scalars["train_inner"].keys()
    assert set(GLUE_DEV) <= scalars["valid"].keys()
    _assert_all_equal(inner, scalars["train_inner"], "num_updates", "")
    _assert_all_equal(valid, scalars["valid"], "valid_num_updates", "valid_")


def _wandb_records(path, pb):
    """The records of a .wandb file: W&B's 7-byte header, then LevelDB's log format (32 KiB blocks of
    chunks: crc32c, length, type) around serialized ``wandb_internal_pb2.Record`` messages."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:8]
    pos, block, chunks = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if length == 0 and kind == 0:  # block trailer or padding
            pos += left
            continue
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = pb.Record()
            rec.ParseFromString(chunks)
            chunks = b""
            yield rec
