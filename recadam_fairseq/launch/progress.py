"""What the task scripts show of a run while fairseq-train writes its whole output to train.log.

fairseq prints its config (about 10 KB), Hydra's deprecation warnings and a line per event; the
terminal gets one line per log interval and per validation, and the errors. ``follow`` reads the
log as it grows (the run writes it itself, so a pipe the user closes, ``| head``, loses nothing).
"""

import math
import os
import sys
import time
from typing import Callable, Optional

from recadam_fairseq.core.forgetting import BLEU_DELTA, BUDGET, forgetting, moved, within_budget
from recadam_fairseq.engine.fairseq_log import parse_log_lines


# loggers whose INFO lines the terminal shows too: EWC's Fisher pass before update 1 (its progress, its time, F)
SHOWN_LOGGERS = ("recadam_fairseq.criterions.fisher_source",)
# torch.compile of RecAdam's fused update: minutes the first time on a loaded CPU, with nothing else to show
COMPILING = " | INFO | recadam_fairseq.core.fused | RecAdam: compiling "
COMPILE_NOTE = ("  --optimizer recadam: compiling its fused update with torch.compile: the first time can take minutes "
                "(on a CPU), later runs take it from torch's on-disk cache")


def _num(x) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"


def _float(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _signed(x) -> str:
    try:
        return f"{float(x):+.4g}"
    except (TypeError, ValueError):
        return str(x)


def progress_line(line: str, metric: Optional[str] = None) -> Optional[str]:
    """The terminal's line for one line of fairseq's log, or None: a train interval, a validation,
    the end of training, a logged warning or error (the script prints the run's error last), the INFO lines
    of SHOWN_LOGGERS."""
    stripped = line.rstrip("\n")
    for level in (" | WARNING | ", " | ERROR | "):  # fairseq's and the plug-in's (not Python's warnings)
        if level in stripped:
            return "  " + level.strip(" |").lower() + ": " + stripped.split(level, 1)[1].split(" | ", 1)[-1]
    if COMPILING in stripped:
        return COMPILE_NOTE
    for name in SHOWN_LOGGERS:  # the plug-in's own lines a user waits on (EWC's Fisher pass and its F)
        if f" | INFO | {name} | " in stripped:
            return "  " + stripped.split(f" | INFO | {name} | ", 1)[1]
    if "done training in" in stripped:
        return "  " + stripped.split("| ", 3)[-1].strip()
    records = parse_log_lines([stripped])
    if records.get("train_inner"):
        r = records["train_inner"][0]
        parts = [f"update {r.get('num_updates', '?')}", f"epoch {r.get('epoch', '?')}", f"loss {_num(r.get('loss'))}",
                 f"lr {_num(r.get('lr'))}"]
        if "ups" in r:
            parts.append(f"{_num(r['ups'])} updates/s")
        return "  " + ", ".join(parts)
    for kind, recs in records.items():
        if not recs or kind in ("train", "train_inner"):
            continue
        r = recs[0]
        subset = next((k[: -len("_num_updates")] for k in r if k.endswith("_num_updates")), None)
        if subset is None:
            continue
        keys = [metric] if metric and f"{subset}_{metric}" in r else [
            k[len(subset) + 1:] for k in r if k.startswith(subset + "_") and k[len(subset) + 1:] not in (
                "loss", "nll_loss", "ppl", "wps", "wpb", "bsz", "num_updates", "best_loss") and
            not k[len(subset) + 1:].startswith(("best_", "fgt_", "bleu_"))][:3]
        shown = ", ".join(f"{k} {_num(r[f'{subset}_{k}'])}" for k in keys)
        best = next((r[k] for k in r if k.startswith(f"{subset}_best_")), None)
        fgt = forgetting(r, subset + "_")  # the forgetting meter's, when the run has one
        bleu = r.get(f"{subset}_{BLEU_DELTA}")  # --eval-bleu-start's change since θ*, on each subset
        budget = _float(r.get(f"{subset}_{BUDGET}"))  # --forgetting-budget: may this one be checkpoint_best.pt
        over = budget is not None and not within_budget(fgt[1] if fgt else None, budget)
        return (f"  {subset} at update {r[f'{subset}_num_updates']}: loss {_num(r.get(f'{subset}_loss'))}"
                + (f", {shown}" if shown else "") + (f" (best {_num(best)})" if best is not None and
                                                     math.isfinite(_float(best) or 0) else "")
                + (" (none within the budget yet)" if best is not None and not math.isfinite(_float(best) or 0) else "")
                + (f", bleu {_signed(bleu)} since θ*" if bleu is not None else "")
                + (f", {moved(*fgt)} since θ*" if fgt else "")
                + (f", over the budget {budget:g}" if over else ""))
    return None


def echo(text: str) -> None:
    """A line on stdout; once the reader is gone (``| head``), the rest goes nowhere and the run goes on."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no error at exit's flush either)


def follow(path: str, offset: int, metric: Optional[str], stop: Callable[[], bool], poll: float = 0.5,
           out: Callable[[str], None] = echo) -> None:
    """``out`` the progress lines of ``path`` from byte ``offset`` until ``stop()`` (the launcher's thread: its trainer
    has ended), then the rest; a compile's note once."""
    pending, noted = "", False
    with open(path, encoding="utf-8", errors="replace") as f:
        f.seek(offset)
        while True:
            chunk = f.read()
            if chunk:
                pending += chunk
                *lines, pending = pending.split("\n")
                for line in lines:
                    shown = progress_line(line, metric)
                    if shown is not None and not (shown == COMPILE_NOTE and noted):
                        noted = noted or shown == COMPILE_NOTE
                        out(shown)
            elif stop():
                return
            else:
                time.sleep(poll)

