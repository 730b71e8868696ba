"""core/per_example.py's boundary: only the trace's or vmap's refusal of a model's loss falls back to one example at a
time (NotBatchable); a bug in the code around them raises as it is, not as a silent slow path."""

import pytest
import torch
import torch.nn.functional as F

from recadam_fairseq.core import ewc, per_example


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).double()
    sample = {"x": torch.randn(5, 4, dtype=torch.float64), "y": torch.tensor([0, 1, 2, 1, 0])}

    def loss_fn(m, s):
        return F.cross_entropy(m(s["x"]), s["y"], reduction="none")

    return model, sample, loss_fn


def _grads(model, loss_fn, sample, **kw):
    v = per_example.Vmapped(model, loss_fn, list(model.named_parameters()), 2, **kw)
    return list(v.grads(sample, 5, lambda: 1.0))


def test_a_bug_around_the_trace_raises_as_it_is():
    model, sample, loss_fn = _setup()
    assert len(_grads(model, loss_fn, sample)) == 3  # chunks of 2: the way works

    def pad(s):
        return {**s, "x": s["input"]}  # a bug: no such key

    def traced(m, s):
        return m.forward_loss(s)  # a bug: no such method (the traced variant of the loss only)

    with pytest.raises(KeyError, match="input"):
        _grads(model, loss_fn, sample, pad=pad)
    with pytest.raises(AttributeError, match="forward_loss"):
        _grads(model, loss_fn, sample, traced=traced)
    fisher = ewc.FisherPass(model, loss_fn, list(model.named_parameters()), 2, pad=pad, say=lambda msg: None)
    with pytest.raises(KeyError):  # EWC's pass does not go on one example at a time
        fisher.add(sample, 5)
    assert fisher.vmapped is not None and fisher.examples == 0


def test_a_loss_vmap_refuses_is_taken_one_at_a_time():
    model, sample, loss_fn = _setup()

    def shaped(m, s):  # a shape that depends on the data (here empty): vmap refuses it
        x = s["x"] + s["x"][s["x"] > 100].sum()
        return F.cross_entropy(m(x), s["y"], reduction="none")

    with pytest.raises(per_example.NotBatchable, match="RuntimeError: vmap"):
        _grads(model, shaped, sample)
    said = []
    fisher = ewc.FisherPass(model, shaped, list(model.named_parameters()), 2, say=said.append)
    fisher.add(sample, 5)
    assert fisher.examples == 5 and fisher.why.startswith("one at a time (RuntimeError: vmap") and said == [fisher.why]
