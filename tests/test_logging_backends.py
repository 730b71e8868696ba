"""What fairseq's --tensorboard-logdir (and --wandb-project) receive from a recadam run.

One tiny real fairseq-train run (recadam, sentence_prediction_recadam, validation every 4 updates)
writes both the json log and TensorBoard event files; the event files are read back with
TensorBoard's own reader and must hold every json number at the same step.
"""

import glob
import math
import os

import pytest

from conftest import json_records

pytest.importorskip("tensorboard", reason="the [tensorboard] extra (make installs it)")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

RECADAM = ("recadam_lambda", "recadam_dist", "recadam_penalty", "target_loss")
GLUE_DEV = ("accuracy", "f1", "mcc", "acc_and_f1")


@pytest.fixture(scope="module")
def logged_run(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("tb")
    tb = root / "tb"
    _, log = tiny.train(root / "run", "--criterion", "sentence_prediction_recadam",
                        "--recadam-anneal-k", "0.5", "--recadam-anneal-t0", "4",
                        "--log-format", "json", "--log-interval", "2", "--tensorboard-logdir", str(tb),
                        "--validate-interval-updates", "4", "--best-checkpoint-metric", "mcc",
                        "--maximize-best-checkpoint-metric", "--no-save", updates=8, validate=True)
    return tb, log


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
    tb, log = logged_run
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
