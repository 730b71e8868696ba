"""What a run measures beside its loss, logged through fairseq's metrics: the forgetting meter
(``--forgetting-probe``, forgetting_meter.py), BLEU at θ* (``--eval-bleu-start``, bleu_start.py), ‖θ − θ*‖² where
no optimizer or term logs it (theta_distance.py); measuring.py: how they measure without changing training.

:func:`install` builds every meter a component's config asks for; the components that declare the flags call it:
the plug-in's optimizers when fairseq builds them, the criteria when fairseq's Trainer first puts them in training
mode (before update 1, outside the training step's crash handler; fairseq-validate, which rebuilds criteria from
a checkpoint whose files may be long gone, never does).
"""

from . import bleu_start, forgetting_meter, theta_distance

_ABSENT = object()


def declares(cfg, name: str) -> bool:
    """Whether the component's config has the field ``name`` (a dataclass or fairseq's DictConfig node)."""
    return getattr(cfg, name, _ABSENT) is not _ABSENT


def install(cfg, task=None, criterion=None) -> None:
    """Every meter ``cfg`` asks for:

    - the forgetting meter, where ``cfg`` declares its flags (``config.ForgettingMeterConfig``: the plug-in's
      optimizers and the GLUE criteria). Its probe is checked now; θ* is measured at the criterion's first training
      call. An optimizer installs it before its listeners, so that θ* is measured before SAM's first pass 1 moves
      the weights; the criterion, which installs after the optimizer, adds the check of the probe's dictionary
      against ``task``'s.
    - BLEU at θ*, where ``cfg`` declares ``--eval-bleu-start`` (``config.BleuStartConfig``: the seq2seq criteria,
      with their ``task``).
    - ‖θ − θ*‖² for ``criterion``, a criterion whose ``reduce_metrics`` logs it (``theta_distance.reduce``: the
      GLUE criteria), unless the optimizer or the coupled objective logs it.
    """
    if declares(cfg, "forgetting_probe"):
        forgetting_meter.install(cfg, task)
    if declares(cfg, "eval_bleu_start"):
        bleu_start.install(cfg, task)
    if criterion is not None:
        theta_distance.install(criterion)


class InstallsWhenTraining:
    """Mixed into the seq2seq criteria, which keep their config in ``meters_cfg``: their meters are installed when
    fairseq's Trainer first puts the criterion in training mode (fairseq-validate never does)."""

    meters_cfg = None

    def train(self, mode: bool = True):
        cfg = self.meters_cfg
        if mode and cfg is not None:
            self.meters_cfg = None
            install(cfg, self.task)
        return super().train(mode)
