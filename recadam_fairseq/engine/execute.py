"""The engine's executor: a plan of runs (each a function that trains, measures and returns its record), ``jobs``
at a time, in the order given; a failed run does not stop the others, and every failure is reported together
at the end. The forgetting comparison (compare/runner.py) and the translation comparison (compare/seq2seq.py)
run their plans through it; each run's own function makes it resumable (a finished run is read, not redone)."""

import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait


class RunError(Exception):
    """A run that failed or left what it promised unmeasured; the command lines print it and exit 1."""


def execute(plan, jobs=1, order=None, on_done=None, stop=None, on_interrupt=None, on_stop=None):
    """The results of ``plan`` (functions ``run(say)``), in its order. ``order``: the indices in the order to
    start them (default: as given). ``on_done(i, result, say)`` is called in this thread for each run that
    succeeded, as it ends (the callers write their records there, so a run that ended is recorded even when the
    plan is stopped). ``say`` prints whole lines from any thread. A RunError is collected and raised with every
    failure's text once all have ended; any other exception (a bug, Ctrl-C) starts no more runs, sets ``stop`` (a
    threading.Event the runs may watch, or set: then too no more start) and is raised once the runs under way have
    ended (``on_stop`` is called first: the launcher's passes the Ctrl-C on to its trainers); each further Ctrl-C
    meanwhile calls ``on_interrupt`` (the launcher's: stop the trainers)."""
    lock, stop = threading.Lock(), stop or threading.Event()

    def say(text):
        with lock:
            print(text, flush=True)

    order = list(range(len(plan))) if order is None else list(order)
    place = {i: k for k, i in enumerate(order)}  # a run's place in the start order
    results, errors, waiting, running = [None] * len(plan), [], list(order), {}
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        while (waiting and not stop.is_set()) or running:
            while waiting and len(running) < max(1, jobs) and not stop.is_set():
                # started here, so a stopped plan starts no more
                i = waiting.pop(0)
                running[pool.submit(plan[i], say)] = i
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=lambda f: place[running[f]]):
                i = running.pop(f)
                try:
                    results[i] = f.result()
                except RunError as e:
                    errors.append((place[i], str(e)))
                else:
                    if on_done:
                        on_done(i, results[i], say)
    except BaseException:
        stop.set()
        if on_stop is not None:
            on_stop()
        # the runs under way end (their trainers got the Ctrl-C too), waited on as futures: a thread's join that a
        # Ctrl-C interrupted would not wait again
        while running:
            try:
                wait(list(running))
                break
            except KeyboardInterrupt:
                if on_interrupt is not None:
                    on_interrupt()
        pool.shutdown(wait=False)
        raise
    pool.shutdown(wait=True)
    if errors:
        raise RunError("\n\n".join(text for _, text in sorted(errors)))
    return results
