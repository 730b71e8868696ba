"""The engine's executor: a plan of runs (each a function that trains, measures and returns its record), ``jobs``
at a time, in the order given; a failed run does not stop the others, and every failure is reported together
at the end. The forgetting comparison (compare/runner.py) and the translation comparison (compare/seq2seq.py)
run their plans through it; each run's own function makes it resumable (a finished run is read, not redone)."""

import threading
from concurrent.futures import ThreadPoolExecutor


class RunError(Exception):
    """A run that failed or left what it promised unmeasured; the command lines print it and exit 1."""


def execute(plan, jobs=1, order=None, on_done=None):
    """The results of ``plan`` (functions ``run(say)``), in its order. ``order``: the indices in the order to
    start them (default: as given); ``on_done(i, result)`` is called in this thread for each run, in start order,
    as soon as it and those before it have ended (the callers write their records there). ``say`` prints whole
    lines from any thread. Raises RunError with every failure's text once all have ended."""
    lock = threading.Lock()

    def say(text):
        with lock:
            print(text, flush=True)

    order = list(range(len(plan))) if order is None else list(order)
    results, errors = [None] * len(plan), []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {i: pool.submit(plan[i], say) for i in order}
        for i in order:
            try:
                results[i] = futures[i].result()
            except RunError as e:
                errors.append(str(e))
            else:
                if on_done:
                    on_done(i, results[i])
    if errors:
        raise RunError("\n\n".join(errors))
    return results
