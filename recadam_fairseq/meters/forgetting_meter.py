"""The forgetting meter (``--forgetting-probe DIR --forgetting-meter mlm|pairs``): at each validation, what the
model still knows from pretraining, logged beside the task metrics through fairseq's metrics (json log,
TensorBoard, W&B), with the change since θ*.

- mlm: ``fgt_mlm_loss`` (bits per masked token) and ``fgt_mlm_acc`` (%) of the model's own LM head on the
  probe's sentences, a fixed masking (core/probes.py); pairs: ``fgt_pairs_auc``, the zero-shot pair probe of
  the forgetting comparison (compare/measure.py uses the same core). Each with ``..._delta``: now − at θ*.
- θ* is measured once, at the criterion's first training call (before update 1), and kept in
  ``SAVE_DIR/forgetting_meter.json``: a resumed run reads it there.
- The measurement runs in eval mode without gradients; the modules' modes and the RNG states are put
  back, so training is the same with and without the meter.

Installed by ``meters.install`` from the components that declare the flags (config.ForgettingMeterConfig), once per
process: the plug-in's optimizers when they are built, the GLUE criteria when fairseq first puts them in training
mode (glue_core.ChecksPathsWhenTraining: not in fairseq-validate, which rebuilds criteria from a checkpoint).
"""

import logging
import math
import os
from typing import Dict, Optional

import numpy as np

from ..core import anchor
from ..core import probes
from ..core.errors import ConfigError
from ..core.forgetting import BUDGET_PREFIX, changes, forgetting, within_budget
from ..core.wrappers import unwrap_model
from ..plumbing import events
from ..plumbing.anchor_source import restore_path
from ..plumbing.metrics import log_forgetting_budget, log_forgetting_metrics
from .measuring import measuring, updates_done, values_at_theta_star

logger = logging.getLogger(__name__)

STATE_FILE = "forgetting_meter.json"
_pending = []  # an install waiting for the first training call (the criterion and the optimizer both install)


def install(cfg, task=None) -> None:
    """Check the probe against the model's checkpoint now (component build: before training, outside the
    training step's crash handler); measure θ* and follow the validations from the first training call.
    ``task``: the criterion's, whose dictionary the probe's must be."""
    probe = getattr(cfg, "forgetting_probe", None)
    check_budget(cfg, bool(probe))
    if not probe:
        return
    if _pending:  # the optimizer installed it (without the task): the criterion adds the dictionary check
        if task is not None:
            _pending[0].check_dictionary(task.source_dictionary.symbols)
        return
    data = load_probe(probe, str(cfg.forgetting_meter))
    meter = ForgettingMeter(cfg, data)
    meter.check_checkpoint(restore_path(cfg), task)
    _pending.append(meter)

    def first_call(criterion, args):
        _pending.clear()
        meter.start(criterion, unwrap_model(args[0]))
        return None

    events.on_first_training_call(first_call)


def best_metric(cfg):
    """(--best-checkpoint-metric, --maximize-best-checkpoint-metric), or (None, None) in a config built by hand."""
    try:
        name, maximize = cfg.best_checkpoint_metric, cfg.maximize_best_checkpoint_metric
    except Exception:  # noqa: BLE001 - an interpolation without a checkpoint node
        return None, None
    return (None, None) if not isinstance(name, str) or name.startswith("${") else (name, bool(maximize))


def check_budget(cfg, metered: bool) -> None:
    """--forgetting-budget and --best-checkpoint-metric fgt_budget_METRIC go together, with the meter."""
    budget = getattr(cfg, "forgetting_budget", None)
    best, _ = best_metric(cfg)
    budgeted = best is not None and best.startswith(BUDGET_PREFIX)
    if budget is not None and not math.isfinite(float(budget)):
        raise ConfigError(f"--forgetting-budget {budget}: must be a finite number")
    if not metered and (budget is not None or budgeted):
        what = f"--forgetting-budget {budget:g}" if budget is not None else f"--best-checkpoint-metric {best}"
        raise ConfigError(f"{what} needs the forgetting meter: --forgetting-probe DIR (scripts/binarize_probe.py)")
    if budget is not None and best is not None and not budgeted:
        raise ConfigError(f"--forgetting-budget {budget:g}: checkpoint_best.pt follows --best-checkpoint-metric {best}, "
                          f"which ignores the budget; give --best-checkpoint-metric {BUDGET_PREFIX}{best} (the best {best} "
                          f"among the validations that forgot at most {budget:g})")
    if budget is None and budgeted:
        raise ConfigError(f"--best-checkpoint-metric {best}: the forgetting meter logs it with --forgetting-budget X "
                          f"(the most a validation may forget); give one, or --best-checkpoint-metric "
                          f"{best[len(BUDGET_PREFIX):]}")


def load_probe(probe: str, kind: str) -> dict:
    """The probe directory's sentences (and pairs); a one-line error for what is missing or empty."""
    from fairseq.data import Dictionary, data_utils

    flag = f"--forgetting-probe {probe}"
    prefix = os.path.join(probe, "sentences")
    need = [prefix + ".idx", prefix + ".bin", os.path.join(probe, "dict.txt")]
    if kind == "pairs":
        need.append(os.path.join(probe, "pairs.npz"))
    missing = [os.path.basename(f) for f in need if not os.path.isfile(f)]
    if missing:
        raise ConfigError(f"{flag}: no {', '.join(missing)} there (--forgetting-meter {kind}); write the probe with "
                          f"scripts/binarize_probe.py")
    ds = data_utils.load_indexed_dataset(prefix, None)
    items = [ds[i].long() for i in range(len(ds))] if ds is not None else []
    items = [x for x in items if len(x) > 1]  # an empty line is </s> alone: nothing to measure
    if not items:
        raise ConfigError(f"{flag}: the probe is empty (no sentence in {prefix}.bin)")
    out = {"probe": probe, "kind": kind, "items": items, "dict": Dictionary.load(os.path.join(probe, "dict.txt"))}
    if kind == "pairs":
        if len(items) != len(ds):
            raise ConfigError(f"{flag}: {len(ds) - len(items)} empty sentences in {prefix}.bin, which pairs.npz "
                              f"indexes")
        pairs = np.load(os.path.join(probe, "pairs.npz"))
        prem, hyp, lab = pairs["premise"], pairs["hypothesis"], pairs["label"]
        if not len(lab) or not ((lab == 1).any() and (lab == 0).any()):
            raise ConfigError(f"{flag}: pairs.npz has {int((lab == 1).sum())} entailment and {int((lab == 0).sum())} "
                              f"contradiction pairs; the AUC needs both")
        if max(prem.max(), hyp.max()) >= len(items):
            raise ConfigError(f"{flag}: pairs.npz indexes sentence {int(max(prem.max(), hyp.max()))}, "
                              f"sentences.bin has {len(items)}")
        out.update(premise=prem, hypothesis=hyp, label=lab)
    return out


class ForgettingMeter:
    def __init__(self, cfg, data: dict):
        self.cfg, self.data = cfg, data
        self.kind = data["kind"]
        self.flag = f"--forgetting-probe {data['probe']}"
        self.start_values: Optional[Dict[str, float]] = None
        self.last = None  # (update, values) of the latest measurement

    # ------------------------------------------------------------------ checks against the model
    def check_dictionary(self, symbols, where: str = "") -> None:
        own = self.data["dict"].symbols
        if list(symbols[:len(own)]) != list(own) or any(s != "<mask>" for s in symbols[len(own):]):
            self.dictionary_error(len(symbols), where)

    def dictionary_error(self, size: int, where: str = ""):
        raise ConfigError(f"{self.flag}: its dict.txt ({len(self.data['dict'])} symbols) is not the model's dictionary "
                          f"({size} symbols{where}): binarize the probe with the model's dict.txt "
                          f"(scripts/binarize_probe.py --dict)")

    def head_error(self, where: str, missing: bool):
        what = ("no LM head (encoder.lm_head)" if missing
                else "an LM head at its initial values (it was made without one)")
        raise ConfigError(f"--forgetting-meter mlm: {where} has {what}; use --forgetting-meter pairs with a "
                          f"sentence-pair probe")

    def check_checkpoint(self, path: str, task=None) -> None:
        """Before training: the probe's dictionary against the task's (or the checkpoint's embedding rows: the
        dictionary with <mask>), and for mlm an LM head in the checkpoint that fairseq loads the weights from."""
        if task is not None:
            self.check_dictionary(task.source_dictionary.symbols)
        if not os.path.isfile(path):
            return  # no weights to load (fairseq starts from random ones): the first training call checks the model
        state = anchor.load_checkpoint(path)["model"]
        emb = state.get("encoder.sentence_encoder.embed_tokens.weight")
        n = len(self.data["dict"])
        if task is None and emb is not None and emb.shape[0] not in (n, n + 1):
            self.dictionary_error(emb.shape[0], f" in the embeddings of {path}")
        if self.kind == "mlm":
            keys = ("encoder.lm_head.bias", "encoder.lm_head.layer_norm.weight", "encoder.lm_head.layer_norm.bias")
            if any(k not in state for k in keys):
                self.head_error(f"the checkpoint {path}", True)
            if at_init(*(state[k] for k in keys)):
                self.head_error(f"the checkpoint {path}", False)

    def check(self, task, model) -> None:
        """At the first training call, on the model itself (what the checkpoint could not say)."""
        self.check_dictionary(task.source_dictionary.symbols)
        if self.kind == "mlm":
            if "<mask>" not in task.source_dictionary.indices:
                raise ConfigError("--forgetting-meter mlm: the task's dictionary has no <mask> symbol")
            head = getattr(getattr(model, "encoder", None), "lm_head", None)
            if head is None or untrained(head):
                self.head_error(f"the model ({type(model).__name__})", head is None)

    # ------------------------------------------------------------------ measuring
    def measure(self, model) -> Dict[str, float]:
        d = self.task.source_dictionary
        device = next(model.parameters()).device
        with measuring(model):
            if self.kind == "mlm":
                r = probes.masked_lm(lambda t, m: model(t, features_only=False, masked_tokens=m)[0], self.items,
                                     d.index("<mask>"), d.pad(), d.bos(), device=device)
                return {"mlm_loss": r["loss"], "mlm_acc": 100.0 * r["acc"]}
            emb = probes.mean_pooled(lambda t: model(t, features_only=True)[0], self.items, 32, d.pad(), d.bos(),
                                     device=device)
            r = probes.pair_auc(emb.float(), self.data["premise"], self.data["hypothesis"], self.data["label"])
            return {"pairs_auc": r["auc"]}

    def start(self, criterion, model) -> None:
        """At the first training call: check, then θ*'s values (measured now, or a resumed run's saved ones)."""
        self.task = criterion.task
        self.check(self.task, model)
        limit = model.max_positions() if hasattr(model, "max_positions") else None
        self.items, cut = probes.truncate(self.data["items"], int(limit) - 1) if limit else (self.data["items"], 0)
        if cut:
            logger.warning(f"forgetting meter: {cut} probe sentences cut to the model's {limit} positions")
        ident = {"meter": self.kind, "probe": os.path.abspath(self.data["probe"]),
                 "pretrained": self.cfg.finetune_from_model or self.cfg.restore_file}
        path = os.path.join(str(self.cfg.save_dir), STATE_FILE)
        self.start_values = values_at_theta_star(
            path, ident, lambda: self.measure(model),
            f"forgetting meter: {self.kind} on {len(self.items)} probe sentences at θ*", "no values at θ*, no _delta metrics")
        marker = "fgt_" + next(iter(self.start_values or self.measure_keys()))
        events.on_validation(criterion, marker, lambda crit, args: self.log(unwrap_model(args[0])))

    def measure_keys(self):
        return ("mlm_loss", "mlm_acc") if self.kind == "mlm" else ("pairs_auc",)

    def log(self, model) -> None:
        """At the start of a validation subset: measured once per update (MNLI's valid and valid1 share it); with
        --forgetting-budget, the metric checkpoint_best.pt follows (plumbing/metrics.log_forgetting_budget)."""
        upd = updates_done()
        if self.last is None or self.last[0] != upd:
            self.last = (upd, self.measure(model))
        log_forgetting_metrics(self.last[1], self.start_values)
        budget = getattr(self.cfg, "forgetting_budget", None)
        best, maximize = best_metric(self.cfg)
        if budget is not None and best is not None:
            forgot = forgetting(changes(self.last[1], self.start_values))
            log_forgetting_budget(float(budget), best[len(BUDGET_PREFIX):],
                                         within_budget(None if forgot is None else forgot[1], float(budget)), maximize)


def untrained(head) -> bool:
    ln = getattr(head, "layer_norm", None)
    return getattr(head, "bias", None) is not None and ln is not None and at_init(head.bias, ln.weight, ln.bias)


def at_init(bias, ln_weight, ln_bias) -> bool:
    """An LM head exactly at fairseq's init (bias 0, layer norm 1 and 0): a checkpoint without one
    (prepare/convert_hf.py fills them so); a trained head never has all of these."""
    return not bool(bias.any()) and bool((ln_weight == 1).all()) and not bool(ln_bias.any())
