"""λ(t) annealing schedules of RecAdam (pure functions, no torch needed)."""

import math

ANNEAL_FUNS = ("sigmoid", "linear", "constant")


def anneal_lambda(fun: str, step: float, k: float, t0: float, w: float = 1.0) -> float:
    """λ(t) of "Recall and Learn" (Chen et al., 2020).

    sigmoid: w / (1 + exp(-k (t - t0)));  linear: min(1, t / t0) · w;  constant: w.
    The sigmoid never overflows: for k (t - t0) << 0 it underflows to 0 instead.
    """
    if fun == "sigmoid":
        x = k * (step - t0)
        if x >= 0:
            return w / (1.0 + math.exp(-x))
        e = math.exp(x)  # in (0, 1]: no overflow, exact 0 far below t0
        return w * e / (1.0 + e)
    if fun == "linear":
        if t0 <= 0:
            raise ValueError(f"anneal_t0 must be > 0 for the linear schedule, got {t0}")
        return min(1.0, step / t0) * w
    if fun == "constant":
        return w
    raise ValueError(f"unknown anneal_fun {fun!r}: choose one of {', '.join(ANNEAL_FUNS)}")
