"""The plug-in's own errors as one line: ``fairseq-train: error: --rho must be >= 0 ...``, no traceback.

Installed when fairseq loads the user-dir (``plugin.py``): a ``sys.excepthook`` that prints a
:class:`~recadam_fairseq.core.errors.ConfigError` as one line on stderr, and hands every other exception to the hook that was there before, with its
traceback. The exit status stays 1. ``RECADAM_TRACEBACK=1`` (any value but empty or ``0``) shows the
traceback of ours too.

Some of fairseq's own start-up failures are a user's input too, and get one line saying what to
change (:func:`fairseq_input_error`): a checkpoint file fairseq cannot load (refused: it carries code; cut
short; not a fairseq checkpoint: core/checkpoint_file.py's words, as restore_check.py says them before fairseq
starts for the files on the command line), a checkpoint that does not fit ``--arch`` (fairseq's "Cannot
load model parameters from checkpoint", with the first mismatch from torch's message) and
``--bf16`` off a TPU (fairseq 0.12's ``options.py`` turns ``--bf16`` into ``--tpu``, and the Trainer
asks torch_xla for its device). And ``--eval-bleu``'s settings, which fairseq's translation task reads
when it builds the model (:func:`_eval_bleu_error`): an ``--eval-bleu-detok`` it does not know or whose
package is missing, an ``--eval-bleu-args`` / ``--eval-bleu-detok-args`` that is not JSON. (Its
settings that fail later, or mislead, are checked by the seq2seq criteria: ``criterions/bleu_check.py``.)
"""

import os
import sys
from typing import Optional

from ..core.errors import ConfigError


def ours(exc: Optional[BaseException]) -> Optional[ConfigError]:
    """``exc`` if it is the plug-in's own ConfigError (another exception raised from one keeps its traceback)."""
    return exc if isinstance(exc, ConfigError) else None


def _innermost(exc: BaseException):
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code if tb is not None else None


def _translation_cfg(exc: BaseException):
    """fairseq's translation task config, when ``exc`` came out of its build_model with --eval-bleu; else None."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "build_model" and code.co_filename.endswith(os.path.join("tasks", "translation.py")):
            cfg = getattr(tb.tb_frame.f_locals.get("self"), "cfg", None)
            return cfg if getattr(cfg, "eval_bleu", False) else None
        tb = tb.tb_next
    return None


def _eval_bleu_error(exc: BaseException, cfg) -> Optional[str]:
    """fairseq builds --eval-bleu's detokenizer and generator with the model; what failed there, as the flag."""
    import json

    detok = cfg.eval_bleu_detok
    if isinstance(exc, json.JSONDecodeError):
        for flag, value in (("--eval-bleu-detok-args", cfg.eval_bleu_detok_args), ("--eval-bleu-args", cfg.eval_bleu_args)):
            try:
                json.loads(value)
            except json.JSONDecodeError as e:
                example = " such as '{\"beam\": 4}'" if flag == "--eval-bleu-args" else ""
                return f"{flag} {value!r}: not JSON ({e.msg} at character {e.pos}); give a JSON object{example}"
        return None
    if isinstance(exc, ImportError):  # the detokenizer's package: fairseq's message says which
        return (f"--eval-bleu-detok {detok}: {str(exc).strip()} (fairseq detokenizes the translations and references "
                f"before BLEU); --eval-bleu-detok space skips detokenizing, for text that was not tokenized")
    code = _innermost(exc) if isinstance(exc, KeyError) else None
    if code is not None and code.co_name == "build_x":
        from fairseq.data.encoders import TOKENIZER_REGISTRY

        return (f"--eval-bleu-detok {detok}: not a detokenizer fairseq knows; choose one of "
                f"{', '.join(sorted(TOKENIZER_REGISTRY))}")
    return None


def _checkpoint_load_error(exc: BaseException) -> Optional[str]:
    """fairseq's own load of a checkpoint file (checkpoint_utils.load_checkpoint_to_cpu) failed: the file, and
    why in core/checkpoint_file.py's words (refused, cut short, not a fairseq checkpoint), or what fairseq
    could not read in it."""
    from ..core import checkpoint_file

    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "load_checkpoint_to_cpu" and code.co_filename.endswith(os.path.join("fairseq", "checkpoint_utils.py")):
            path = str(tb.tb_frame.f_locals.get("path"))
            try:
                checkpoint_file.fairseq_state(path)
            except checkpoint_file.CheckpointFileError as e:
                return str(e)
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
            return f"{path}: fairseq cannot read it as a checkpoint ({type(exc).__name__}: {first[:160]})"
        tb = tb.tb_next
    return None


def fairseq_input_error(exc: Optional[BaseException]) -> Optional[str]:
    """What to change, for fairseq's start-up failures that come from the command line; else None."""
    cfg = _translation_cfg(exc) if isinstance(exc, BaseException) else None
    if cfg is not None:
        return _eval_bleu_error(exc, cfg)
    loading = _checkpoint_load_error(exc) if isinstance(exc, Exception) else None
    if loading:
        return loading
    text = str(exc)
    if text.startswith("Cannot load model parameters from checkpoint ") and type(exc) is Exception:
        path = text[len("Cannot load model parameters from checkpoint "):].split("; please")[0]
        cause = str(exc.__cause__ or exc.__context__ or "")
        details = [ln.strip().rstrip(".") for ln in cause.splitlines()[1:] if ln.strip()]
        first = details[0] if details else "its tensors differ from the model's"
        if len(first) > 240:
            first = first[:240] + " ..."
        return (f"{path}: the checkpoint does not fit the model --arch and its flags build ({first}); "
                f"give the checkpoint's architecture flags")
    code = _innermost(exc) if isinstance(exc, AttributeError) else None
    if code is not None and code.co_name == "get_tpu_device" and "xla_device" in text:
        return ("--bf16: fairseq 0.12 runs --bf16 and --memory-efficient-bf16 on TPUs only (options.py turns them "
                "into --tpu, which needs torch_xla); on a GPU use --fp16 or --amp")
    return None


def one_line(err: BaseException) -> str:
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{prog}: error: " + " ".join(str(err).split())


def install() -> None:
    """Chain a hook in front of the current ``sys.excepthook`` (once per process)."""
    previous = sys.excepthook
    if getattr(previous, "recadam_fairseq", False):
        return

    def hook(etype, value, tb):
        err = ours(value)
        if err is None:
            what = fairseq_input_error(value)
            err = ConfigError(what) if what else None
        if err is None or os.environ.get("RECADAM_TRACEBACK", "") not in ("", "0"):
            return previous(etype, value, tb)
        sys.stderr.write(one_line(err) + "\n")
        sys.stderr.flush()

    hook.recadam_fairseq = True
    sys.excepthook = hook
