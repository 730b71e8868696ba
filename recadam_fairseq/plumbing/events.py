"""The one way the plug-in follows fairseq's training loop. Nothing in fairseq is patched or replaced.

fairseq's Trainer, for every update (fairseq 0.12, ``trainer.py`` / ``tasks/fairseq_task.py``)::

    for each micro-batch (--update-freq, dummy batches included):
        task.train_step: model.set_num_updates(n); loss = criterion(model, sample); optimizer.backward(loss)
    optimizer.all_reduce_grads(model)        # through every fp16 wrapper, before the overflow check
    [overflow check: on fp16 overflow the update is skipped and n does not advance]
    optimizer.step(); trainer.set_num_updates(n + 1)

What a method can hook, and the documented call each event comes from:

=====================================  =================================================================
event                                  source
=====================================  =================================================================
first training call of the criterion   :func:`on_first_training_call`: torch's global forward pre-hook,
(gives the criterion and the model)    removed at that call, so no global hook remains once training runs
before / after each criterion forward  :func:`forward_hooks`: torch forward (pre-)hooks on that criterion
                                       instance; the pre-hook may replace the sample (ESAM)
fairseq's loss scale                   :func:`loss_scale`: the gradient fairseq's backward sends into the
                                       criterion's loss (its fp16 scale; 0 for an ignored dummy batch)
before / after the gradient reduction, :class:`LoopOptimizer`: the plug-in optimizer's own
before and after the step              ``all_reduce_grads(model)`` and ``step()``, which fairseq calls;
                                       listeners run in the order :data:`LISTENERS` declares
state kept in the checkpoint           :class:`LoopOptimizer`: each listener's ``state_dict()`` goes into
                                       the optimizer state (``last_optimizer_state[key]``)
the update number                      :func:`update_number`: fairseq's own count, as its Trainer logs it
the start of each validation pass      :func:`on_validation`: a torch forward pre-hook on that criterion
(per valid subset)                     instance; its first evaluation call in a fresh metrics root
=====================================  =================================================================

A new method adds a listener to its optimizer (``self.listen("name", obj)``, "name" placed in
:data:`LISTENERS`), or calls
:func:`on_first_training_call` when it needs the criterion and the model (ARCHITECTURE.md has a
worked example). It never assigns to a fairseq object's method.
"""

from typing import Any, Callable, Dict, List, Tuple

import torch
from fairseq.criterions import FairseqCriterion
from fairseq.logging import metrics


# --------------------------------------------------------------------------- criterion side
def is_training_call(args) -> bool:
    """A criterion call made by ``task.train_step``: gradients on, a model in training mode."""
    return (torch.is_grad_enabled() and len(args) >= 2 and isinstance(args[0], torch.nn.Module)
            and args[0].training)


def on_first_training_call(callback: Callable[[FairseqCriterion, tuple], Any]) -> None:
    """``callback(criterion, args)`` once, just before the first training forward of a FairseqCriterion
    (``args`` = (model, sample, ...)); what it returns replaces the args, as a pre-hook's would.

    fairseq builds the criterion and the model before the optimizer and never hands them to it; this
    is where an optimizer-side method meets them. The global hook exists only until that call. Hooks
    the callback adds to the criterion act from the next call on (forward hooks: from this one), so
    the callback does this call's "before" work itself.
    """
    state = {}

    def hook(module, args):
        if not isinstance(module, FairseqCriterion) or not is_training_call(args):
            return None
        state["handle"].remove()
        return callback(module, args)

    state["handle"] = torch.nn.modules.module.register_module_forward_pre_hook(hook)


def forward_hooks(criterion: torch.nn.Module, before: Callable, after: Callable) -> Tuple[Any, Any]:
    """Per-instance hooks for the training calls of ``criterion``.

    ``before(criterion, args)`` runs before each training forward and may return new ``args``
    (the replaced sample is what fairseq's forward then sees); ``after(criterion, args, output)``
    runs after it. Evaluation calls (no grad, model.eval()) are not passed on.
    """
    def pre(module, args):
        return before(module, args) if is_training_call(args) else None

    def post(module, args, output):
        if is_training_call(args):
            after(module, args, output)

    return criterion.register_forward_pre_hook(pre), criterion.register_forward_hook(post)


def on_validation(criterion: torch.nn.Module, marker: str, callback: Callable[[torch.nn.Module, tuple], Any]):
    """``callback(criterion, args)`` at the start of each validation pass, per valid subset (before its first
    batch's forward), from a per-instance forward pre-hook; returns the hook's handle.

    fairseq_cli.train's ``validate`` runs each subset inside ``metrics.aggregate(new_root=True)``, a fresh root
    aggregator, and calls the criterion from ``trainer.valid_step`` without gradients on a model in eval mode.
    The first such call in an aggregator that lacks the metric ``marker`` is a new pass; the callback logs
    ``marker`` there (``metrics.log_scalar``), which marks it. Training calls are not passed on."""
    def pre(module, args):
        if torch.is_grad_enabled() or len(args) < 2 or not isinstance(args[0], torch.nn.Module) or args[0].training:
            return None
        active = metrics.get_active_aggregators()
        if active and marker not in active[0]:
            callback(module, args)
        return None

    return criterion.register_forward_pre_hook(pre)


def loss_scale(loss: torch.Tensor, callback: Callable[[torch.Tensor], Any]) -> None:
    """``callback(g)`` with the gradient fairseq's backward sends into ``loss``: its fp16 loss scale
    (1 in fp32; 0 for a dummy batch fairseq multiplies by 0). Nothing is called if the loss has no
    graph."""
    if loss.requires_grad:
        loss.register_hook(lambda g: callback(g.detach()))


def update_number() -> int:
    """fairseq's count of finished updates, the ``update_num`` it hands ``task.train_step``: the
    ``num_updates`` its Trainer logs (``metrics.log_scalar``) on each update, and when it restores an
    optimizer state, into the root aggregator of the training loop. That one is fairseq's "default"
    aggregator object, which no restored meter state replaces (``metrics.load_state_dict`` swaps the
    registered copies, not the active ones). 0 before the first update of a fresh run or with
    ``--reset-optimizer``, and outside fairseq-train."""
    active = metrics.get_active_aggregators()
    meter = active[0].get("num_updates") if active else None
    return int(meter.val) if meter is not None and meter.val is not None else 0


# --------------------------------------------------------------------------- optimizer side
# The listeners' keys in the order their events run. ``LoopOptimizer.listen`` takes them in this order
# only, so the first-call hooks listeners register as they are added (ChildTuning-D's, SAM's) run in it too.
LISTENERS = (
    "child_tuning",  # ChildTuning: D's Fisher passes must see θ, before SAM's first pass 1 moves it to θ+ε
    "sam",  # SAM: before_reduce puts θ back from θ+ε before the listeners after it read the weights
    "anchoring",  # RecAdam's θ*: the weights, read at the first reduction (θ, after SAM's restore)
    "layer_lr",  # LLRD's lr scales: read names and shapes only; last
)


class LoopOptimizer:
    """Mixed in before a FairseqOptimizer subclass: the optimizer-side events go to its listeners.

    A listener may define ``before_reduce(model)``, ``after_reduce(model)``, ``before_step(scale)``,
    ``after_step()`` and ``state_dict()`` / ``load_state_dict(state)``; the events reach them in the
    order of :data:`LISTENERS`. ``before_reduce`` runs before fairseq's reduction (and its overflow check),
    ``after_reduce`` after it, ``before_step`` and ``after_step`` around a step that happens (a skipped
    fp16 update calls neither). ``before_step`` sees the gradients the step will use, on the optimizer's
    own tensors (after the overflow check and ``--clip-norm``; ``--fp16``: the flat fp32 master copy), and
    returns the scale to step with: the step uses the gradients divided by it (fairseq's loss-scale
    argument: inside the optimizer when it ``supports_step_with_scale``, else multiplied in place).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._listeners: Dict[str, Any] = {}

    def listen(self, key: str, listener: Any) -> None:
        """Add ``listener`` under ``key``, one of :data:`LISTENERS`, after the keys LISTENERS puts before it."""
        if key not in LISTENERS:
            raise ValueError(f"listener {key!r}: not in events.LISTENERS {LISTENERS}, which orders the listeners")
        later = [k for k in self._listeners if LISTENERS.index(k) >= LISTENERS.index(key)]
        if later:
            raise ValueError(f"listener {key!r} added after {later}: events.LISTENERS runs it before them")
        self._listeners[key] = listener

    def listeners(self) -> List[Tuple[str, Any]]:
        return list(self._listeners.items())

    def _emit(self, event: str, *args) -> None:
        for _, listener in self.listeners():
            fn = getattr(listener, event, None)
            if fn is not None:
                fn(*args)

    def all_reduce_grads(self, module):
        self._emit("before_reduce", module)
        super().all_reduce_grads(module)
        self._emit("after_reduce", module)

    # fairseq's --amp: AMPOptimizer unscales the torch optimizer's gradients in clip_grad_norm (the
    # Trainer always calls it), then hands this FairseqOptimizer, another object to the GradScaler, to
    # GradScaler.step, which would unscale them again: a plain optimizer steps on gradients / loss
    # scale (seen on an H100: 35% off the fp32 run). Declared scaling-aware, the scaler passes its
    # overflow flag instead (``found_inf``) and the step takes the gradients as clip_grad_norm left them.
    _step_supports_amp_scaling = True
    _unscaled = False

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        self._unscaled = True  # AMPOptimizer unscaled the gradients just before this call
        return super().clip_grad_norm(max_norm, aggregate_norm_fn)

    def step(self, closure=None, scale=1.0, groups=None):
        found_inf = getattr(self, "found_inf", None)  # set by GradScaler.step for this call only
        unscaled, self._unscaled = self._unscaled, False
        if found_inf is not None:
            if not unscaled:
                raise RuntimeError(f"{type(self).__name__}: GradScaler.step() on gradients that were not "
                                   f"unscaled: call clip_grad_norm() first, as fairseq's AMPOptimizer does")
            if found_inf.item():  # the scaler skips the step, as it would for any optimizer
                return
        for _, listener in self.listeners():
            fn = getattr(listener, "before_step", None)
            if fn is not None:
                scale = fn(scale)
        super().step(closure, scale, groups)
        self._emit("after_step")

    def state_dict(self):
        st = super().state_dict()
        extra = {k: lst.state_dict() for k, lst in self.listeners() if hasattr(lst, "state_dict")}
        return {**st, **extra} if extra else st

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        state_dict = dict(state_dict)
        extra = {k: state_dict.pop(k) for k, _ in self.listeners() if k in state_dict}
        super().load_state_dict(state_dict, optimizer_overrides)
        for k, lst in self.listeners():
            if k in extra and hasattr(lst, "load_state_dict"):
                lst.load_state_dict(extra[k])
