"""Multi-task batch sampling for CA-MTL (pure numpy / torch, no fairseq).

Examples of all tasks live in one index space: task t owns the global indices
``offsets[t] .. offsets[t] + sizes[t] - 1`` (``offsets`` = cumulative sizes). A sampler turns
(sizes, batch size, seed, epoch) into the list of batches of one epoch, deterministically, so
fairseq can rebuild it on resume and shard it across ranks (rank r takes batches r, r+N, ...).

Modes (``--mt-sampling``):

- ``sequential``: task after task in ``--mt-tasks`` order, each task's examples shuffled and cut
  into batches of B until the task runs out (the authors' default).
- ``uniform``: every batch comes from one task drawn with probability 1/T.
- ``proportional``: task t drawn with probability n_t^(1/τ) / Σ n_s^(1/τ) (τ = temperature;
  τ = 1: by dataset size, τ → ∞: uniform).
- ``uncertainty`` (MT-Uncertainty, Pilault et al. 2021): every step draws a *candidate* batch of
  B examples from every task (T·B in all); the model scores them and only the top B are trained
  on (``uncertainty_scores`` / ``select_uncertain``).

In uniform, proportional and uncertainty modes a task's examples are drawn without replacement
from a per-task permutation, reshuffled when the task runs out. Every mode has the same epoch
length, ceil(n_t / B) summed over tasks, so ``--max-epoch`` means roughly one pass over the data.
"""

import math
from typing import List, Sequence

import numpy as np
import torch

MODES = ("sequential", "uniform", "proportional", "uncertainty")


def task_probabilities(mode: str, sizes: Sequence[int], temperature: float = 1.0) -> np.ndarray:
    """Probability of drawing each task for one batch (uniform, proportional)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    if mode == "uniform":
        return np.full(len(sizes), 1.0 / len(sizes))
    if mode == "proportional":
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        w = sizes ** (1.0 / temperature)
        return w / w.sum()
    raise ValueError(f"no task probabilities for sampling mode {mode!r}")


def steps_per_epoch(sizes: Sequence[int], batch_size: int) -> int:
    return int(sum(math.ceil(n / batch_size) for n in sizes))


class _Stream:
    """A task's examples without replacement, reshuffled each time they run out."""

    def __init__(self, n: int, offset: int, rng: np.random.Generator):
        self.n, self.offset, self.rng = n, offset, rng
        self.perm, self.pos = rng.permutation(n), 0

    def take(self, k: int) -> np.ndarray:
        out = []
        while k > 0:
            if self.pos == self.n:
                self.perm, self.pos = self.rng.permutation(self.n), 0
            got = self.perm[self.pos:self.pos + k]
            self.pos += len(got)
            k -= len(got)
            out.append(got)
        return np.concatenate(out) + self.offset


def epoch_batches(mode: str, sizes: Sequence[int], batch_size: int, seed: int, epoch: int,
                  temperature: float = 1.0) -> List[np.ndarray]:
    """The batches (arrays of global indices) of one epoch; same arguments, same batches.

    Uncertainty mode returns candidate batches: B examples of every task back to back (fewer
    for a task smaller than B).
    """
    if mode not in MODES:
        raise ValueError(f"unknown sampling mode {mode!r}; choose one of {', '.join(MODES)}")
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    sizes = [int(n) for n in sizes]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    rng = np.random.default_rng([seed, epoch])
    if mode == "sequential":
        out = []
        for n, off in zip(sizes, offsets):
            perm = rng.permutation(n) + off
            out += [perm[i:i + batch_size] for i in range(0, n, batch_size)]
        return out
    streams = [_Stream(n, off, rng) for n, off in zip(sizes, offsets)]
    steps = steps_per_epoch(sizes, batch_size)
    if mode == "uncertainty":
        return [np.concatenate([s.take(min(batch_size, s.n)) for s in streams]) for _ in range(steps)]
    tasks = rng.choice(len(sizes), size=steps, p=task_probabilities(mode, sizes, temperature))
    return [streams[t].take(batch_size) for t in tasks]


# ----------------------------------------------------------------------------- MT-Uncertainty


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per row divided by the maximum entropy log C (in [0, 1]).

    One class (regression) has no entropy: NaN, for ``uncertainty_scores`` to substitute.
    """
    c = logits.size(-1)
    if c < 2:
        return torch.full(logits.shape[:-1], float("nan"), dtype=torch.float32, device=logits.device)
    lp = torch.log_softmax(logits.float(), dim=-1)
    return -(lp.exp() * lp).sum(-1) / math.log(c)


def uncertainty_scores(norm_entropy: torch.Tensor, task_ids: torch.Tensor, num_tasks: int,
                       donor: int = -1) -> torch.Tensor:
    """MT-Uncertainty score per candidate example.

    score_i = Ĥ_i · m_t / max_s m_s, with Ĥ_i the normalised entropy of example i, t its task and
    m_t the mean Ĥ over task t's candidates (tasks absent from the candidates take no part in the
    max). Regression examples (Ĥ NaN) borrow, position by position (cycled), the scores of the
    ``donor`` task's candidates (the first classification task present when donor < 0); with no
    classification task at all every score is 0.
    """
    h = norm_entropy.float()
    tid = task_ids.long()
    present = torch.bincount(tid, minlength=num_tasks) > 0
    counts = torch.bincount(tid, minlength=num_tasks).clamp(min=1).float()
    known = ~torch.isnan(h)
    sums = torch.zeros(num_tasks, dtype=h.dtype, device=h.device).index_add_(0, tid, torch.where(known, h, 0.0))
    cls_task = torch.zeros(num_tasks, dtype=torch.bool, device=h.device).index_fill_(0, tid[known], True)
    means = sums / counts
    valid = present & cls_task
    top = means[valid].max() if bool(valid.any()) else h.new_tensor(0.0)
    weight = means / top if float(top) > 0 else torch.zeros_like(means)
    scores = torch.where(known, h * weight[tid], 0.0)
    if bool((~known).any()):
        if donor < 0:
            donors = torch.nonzero(valid).flatten()
            donor = int(donors[0]) if len(donors) else -1
        if donor >= 0 and bool(valid[donor]):
            src = scores[tid == donor]
            for t in torch.unique(tid[~known]).tolist():
                pos = torch.nonzero(tid == t).flatten()
                scores[pos] = src[torch.arange(len(pos), device=h.device) % len(src)]
    return scores


def select_uncertain(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the k highest scores (ties: the earlier position first), in ascending order."""
    k = min(k, scores.numel())
    # stable sort on -score: equal scores keep their order, so the selection is reproducible
    order = torch.sort(-scores, stable=True).indices[:k]
    return torch.sort(order).values
