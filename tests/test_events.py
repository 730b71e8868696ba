"""plumbing/events.py: fairseq's update number as fairseq hands it to task.train_step, from its logged metrics."""

from fairseq.logging import metrics

from recadam_fairseq.plumbing import events


def _saved_meters(n):
    metrics.reset()
    with metrics.aggregate("train"):
        metrics.log_scalar("num_updates", n, weight=0)  # what Trainer.set_num_updates logs
    return metrics.state_dict()


def test_update_number_follows_fairseqs_count():
    saved = _saved_meters(700)
    metrics.reset()  # fairseq-train's main() starts here
    assert events.update_number() == 0, "a fresh run"
    # --reset-optimizer without --reset-meters: fairseq passes update_num 0 although the restored
    # "train" meters say 700 (Trainer.load_checkpoint skips set_num_updates)
    metrics.load_state_dict(saved)
    with metrics.aggregate("train"), metrics.aggregate("train_inner"):
        assert events.update_number() == 0
    # a resume: set_num_updates(700) at load, then the restored meters
    metrics.reset()
    metrics.log_scalar("num_updates", 700, weight=0)
    metrics.load_state_dict(saved)
    with metrics.aggregate("train"), metrics.aggregate("train_inner"):
        assert events.update_number() == 700
        metrics.log_scalar("num_updates", 701, weight=0)  # after the next step
        metrics.reset_meters("train_inner")  # a log interval
        assert events.update_number() == 701
    with metrics.aggregate(new_root=True):  # validation: not a training call, no count there
        assert events.update_number() == 0
    metrics.reset()
