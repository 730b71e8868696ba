"""The pretrained anchor θ*: which parameters it covers, its layout, its values.

Pure torch (no fairseq import): the fairseq adapter (``plumbing/anchor_source.py``) picks the checkpoint
(fairseq's restore rule, ``--recadam-pretrained-path``) and hands in its model state dict, the
model, the optimizer's tensors and the model's own upgrade of a checkpoint's keys.

- Values: a snapshot of the optimizer's own tensors (the weights the model loaded from that
  checkpoint, before any update), or the checkpoint's values.
- Coverage: exactly the parameters whose names exist in the pretrained checkpoint, after the
  model's own upgrade of its keys (which may rename old keys and inject the model's fresh tensors,
  e.g. new classification heads; injected entries share storage with the model and are not
  counted as pretrained).
- Layout: fairseq hands the optimizer the model's tensors (fp32, memory-efficient fp16), fp32
  copies of them (``--fp16-no-flatten-grads``, ``--bf16``) or one flat tensor holding all of
  them back to back (``--fp16``). An anchored region of a flat tensor is a list of element runs.
"""

import os
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import checkpoint_file
from .errors import ConfigError
from .wrappers import unwrap_model

Upgrade = Callable[[Dict[str, Tensor]], None]  # a model's renaming of a checkpoint's keys, in place


class AnchorError(ConfigError):
    """The anchor cannot be built: a bad checkpoint file, or a model that does not match it."""


def trainable_named_parameters(model: torch.nn.Module) -> List[Tuple[str, Tensor]]:
    """What fairseq hands the optimizer, in that order (model first; criterion tensors follow)."""
    return [(n, p) for n, p in unwrap_model(model).named_parameters() if p.requires_grad]


# --------------------------------------------------------------------------- checkpoint files
def load_checkpoint(path: str) -> dict:
    """A fairseq checkpoint, memory-mapped where possible (tensors are read when used).

    Raises AnchorError naming the file when it is missing, unreadable, cut short, refused (it carries code)
    or not a fairseq checkpoint (a dict whose ``model`` is a state dict of tensors): checkpoint_file's words.
    """
    if os.path.exists(path) and (not os.path.isfile(path) or not os.access(path, os.R_OK)):
        raise AnchorError(f"{path}: not a readable file")
    try:
        return checkpoint_file.fairseq_state(path)
    except checkpoint_file.CheckpointFileError as e:
        raise AnchorError(str(e)) from None


def pretrained_names(model: torch.nn.Module, state: Dict[str, Tensor],
                     upgrade: Optional[Upgrade] = None) -> Dict[str, Tensor]:
    """The checkpoint's parameters under the model's names, after ``upgrade`` (on a copy of ``state``).

    Returns {name: tensor} for the entries that really come from the checkpoint.
    """
    model = unwrap_model(model)
    state = dict(state)
    live = {t.data_ptr() for t in model.state_dict().values() if t.numel() > 0}
    if upgrade is not None:
        upgrade(state)
    return {k: v for k, v in state.items() if not (v.numel() > 0 and v.data_ptr() in live)}


# --------------------------------------------------------------------------- layout
def layout(tensors: Sequence[Tensor], named: Sequence[Tuple[str, Tensor]]) -> List[List[Tuple[Optional[str], int, int]]]:
    """For each optimizer tensor, its parts: [(name or None, start element, numel)].

    Parts named None belong to no model parameter (criterion parameters): never anchored.
    """
    by_id = {id(p): n for n, p in named}
    if all(id(t) in by_id for t in tensors):  # the model's own tensors (fp32, memory-efficient)
        return [[(by_id[id(t)], 0, t.numel())] for t in tensors]
    total = sum(p.numel() for _, p in named)
    if len(tensors) == 1 and tensors[0].dim() == 1 and tensors[0].numel() >= total and len(named) > 1:
        parts, off = [], 0  # --fp16: one flat tensor, the parameters back to back
        for n, p in named:
            parts.append((n, off, p.numel()))
            off += p.numel()
        if off < tensors[0].numel():
            parts.append((None, off, tensors[0].numel() - off))
        return [parts]
    if len(tensors) >= len(named) and all(t.shape == p.shape for t, (_, p) in zip(tensors, named)):
        # fp32 copies in the model's order (--fp16-no-flatten-grads, --bf16); criterion ones after
        return [[(named[i][0] if i < len(named) else None, 0, t.numel())] for i, t in enumerate(tensors)]
    raise AnchorError(
        f"cannot match the optimizer's {len(tensors)} tensors ({sum(t.numel() for t in tensors)} elements) "
        f"to the model's {len(named)} trainable parameters ({total} elements)"
    )


def runs_of(parts, anchored: Iterable[str]) -> List[Tuple[int, int]]:
    """Merge the anchored parts of one optimizer tensor into maximal element runs."""
    anchored = set(anchored)
    runs: List[List[int]] = []
    for name, start, n in parts:
        if name in anchored:
            if runs and runs[-1][0] + runs[-1][1] == start:
                runs[-1][1] += n
            else:
                runs.append([start, n])
    return [(s, n) for s, n in runs]


# --------------------------------------------------------------------------- building it
class AnchorPlan:
    """Which parameters are anchored, and how they map onto the optimizer's tensors."""

    def __init__(self, tensors: Sequence[Tensor], model: torch.nn.Module,
                 pretrained: Dict[str, Tensor]):
        named = trainable_named_parameters(model)
        self.tensors = list(tensors)
        self.parts = layout(self.tensors, named)
        shapes = dict((n, tuple(p.shape)) for n, p in named)
        common = [n for n, _ in named if n in pretrained]
        if not common:
            raise AnchorError(
                "the pretrained checkpoint has no parameter in common with the model "
                f"(model: {_preview([n for n, _ in named])}; checkpoint: {_preview(list(pretrained))}): wrong file?"
            )
        for n in common:
            if tuple(pretrained[n].shape) != shapes[n]:
                raise AnchorError(
                    f"parameter {n} has shape {tuple(pretrained[n].shape)} in the pretrained checkpoint "
                    f"but {shapes[n]} in the model"
                )
        self.anchored = common
        self.free = [n for n, _ in named if n not in pretrained]
        self.numel = {n: p.numel() for n, p in named}
        self.shapes = shapes
        self.shared: List[str] = []  # anchors that are a given tensor itself (build's ``shared``)
        self.views: Dict[str, Tensor] = {}  # name -> its piece of a built anchor, holding the same numbers

    def summary(self) -> str:
        a = sum(self.numel[n] for n in self.anchored)
        f = sum(self.numel[n] for n in self.free)
        msg = f"anchored {len(self.anchored)} tensors ({a:,} elements)"
        if self.free:
            msg += f"; not anchored, plain Adam: {len(self.free)} tensors ({f:,} elements): {', '.join(self.free)}"
        return msg

    def runs(self) -> List[List[Tuple[int, int]]]:
        return [runs_of(parts, self.anchored) for parts in self.parts]

    def build(self, values: Optional[Dict[str, Tensor]], dtype: Optional[torch.dtype] = None,
              shared: Optional[Dict[str, Tensor]] = None):
        """Yield (tensor, anchor, runs or None) per optimizer tensor; anchor None = not anchored.

        ``values`` None snapshots the optimizer's tensors; else the named pretrained values.
        ``shared``: {name: a tensor that already holds θ* (a model's mixout target)}. A tensor of the
        optimizer's own that is one such name gets that tensor as its anchor, not a copy, when it holds
        the very numbers the copy would (``same_numbers``; the anchor may be of another dtype: the update
        reads it in the tensor's). In a flat tensor (``--fp16``) the anchor is built in the shared
        tensors' dtype when that loses nothing, and ``self.views`` maps each shared name to its piece
        of the anchor, for the caller to make that piece the model's tensor (one copy of θ*).
        """
        shared = shared or {}
        for t, parts, runs in zip(self.tensors, self.parts, self.runs()):
            if not runs:
                yield t, None, None
                continue
            whole = len(runs) == 1 and runs[0] == (0, t.numel())
            want = dtype or t.dtype
            source = {name: (t.detach().reshape(-1)[s:s + n] if values is None else values[name].reshape(-1))
                      for name, s, n in parts if name in self.anchored}
            mine = [name for name in source if name in shared and shared[name].device == t.device]
            if whole and len(parts) == 1 and mine:
                (name,) = mine
                if fits(source[name], want) and same_numbers(shared[name].reshape(-1), source[name]):
                    self.shared.append(name)
                    yield t, shared[name].view_as(t), None
                    continue
            kinds = {shared[name].dtype for name in mine}
            if len(kinds) == 1 and want not in kinds:
                narrow = kinds.pop()  # the model's dtype (--fp16): one copy if every value is exact there
                if all(fits(x, want) and fits(x, narrow) for x in source.values()):
                    want = narrow
            buf = torch.empty(sum(n for _, n in runs), dtype=want, device=t.device)
            off = 0
            for name, x in source.items():
                piece = buf[off:off + x.numel()]
                piece.copy_(x)
                if name in mine and piece.dtype == shared[name].dtype and same_numbers(piece, shared[name].reshape(-1)):
                    self.views[name] = piece.view(self.shapes[name])
                off += x.numel()
            yield t, (buf.view_as(t) if whole else buf), (None if whole else runs)


def check_finite(values: Dict[str, Tensor], names: Sequence[str]) -> None:
    """θ* must be finite: one NaN or Inf there turns every pulled weight into NaN at the first update."""
    for n in names:
        v = values[n]
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            bad = int((~torch.isfinite(v)).sum())
            raise AnchorError(f"parameter {n} holds {bad} NaN or Inf value(s): the pretrained weights θ* must be "
                              f"finite (a corrupt or diverged checkpoint?)")


def _preview(names: List[str], k: int = 3) -> str:
    return ", ".join(names[:k]) + (f", ... ({len(names)} in all)" if len(names) > k else "")


def build_anchors(tensors: Sequence[Tensor], model: torch.nn.Module, source: str, state: Dict[str, Tensor],
                  from_file: bool, dtype: Optional[torch.dtype] = None, shared: Optional[Dict[str, Tensor]] = None,
                  upgrade: Optional[Upgrade] = None):
    """θ* for ``tensors`` (the optimizer's, or the model's own) from a checkpoint's model ``state`` dict.

    ``source`` names the checkpoint in messages; ``from_file``: θ* takes the checkpoint's values, else
    a snapshot of ``tensors`` (the checkpoint then only says which parameters are pretrained);
    ``upgrade``: see :func:`pretrained_names`. Returns (one log line, [(tensor, anchor or None, runs or
    None)], the plan: its ``shared`` and ``views`` say which anchors are ``shared``'s tensors or pieces
    to share, see ``AnchorPlan.build``).
    """
    try:
        named = pretrained_names(model, state, upgrade)
        plan = AnchorPlan(tensors, model, named)
        check_finite(named, plan.anchored)
    except AnchorError as e:
        raise AnchorError(f"{source}: {e}") from None
    anchors = list(plan.build(named if from_file else None, dtype=dtype, shared=shared))
    return f"pretrained weights θ* from {source}: {plan.summary()}", anchors, plan


# --------------------------------------------------------------------------- one copy of θ*
CHUNK = 1 << 20  # elements compared at a time: no model-sized temporary


def same_numbers(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors of equal numel hold the same numbers, whatever their float dtypes."""
    if a.numel() != b.numel():
        return False
    if a.dtype == b.dtype:
        return bool(torch.equal(a.reshape(-1), b.reshape(-1)))
    a, b = a.reshape(-1), b.reshape(-1)
    return all(torch.equal(a[i:i + CHUNK].double(), b[i:i + CHUNK].double()) for i in range(0, a.numel(), CHUNK))


def fits(x: Tensor, dtype: torch.dtype) -> bool:
    """Whether every value of ``x`` is exact in ``dtype``."""
    if x.dtype == dtype or dtype == torch.float64 or (dtype == torch.float32 and x.dtype in (torch.float16,
                                                                                            torch.bfloat16)):
        return True
    x = x.reshape(-1)
    return all(torch.equal(x[i:i + CHUNK].to(dtype).to(x.dtype), x[i:i + CHUNK]) for i in range(0, x.numel(), CHUNK))


def share_existing(tensors: Sequence[Tensor], anchors, model: torch.nn.Module, shared: Dict[str, Tensor]):
    """Anchors restored from a checkpoint's optimizer state, with the ``shared`` tensors put in their place.

    ``anchors``: [(anchor or None, runs or None)] per optimizer tensor. Returns ([(anchor, runs)] in the
    same order, the names whose anchor is now ``shared``'s tensor, {name: piece of an anchor} to share as
    ``AnchorPlan.build`` gives them). Only tensors holding the anchor's very numbers take its place.
    """
    named = trainable_named_parameters(model)
    shapes = {n: tuple(p.shape) for n, p in named}
    out, used, views = [], [], {}
    for t, parts, (a, runs) in zip(tensors, layout(tensors, named), anchors):
        if a is None:
            out.append((None, None))
            continue
        spans, off = [], 0  # (name, offset in the anchor, numel) of the parts the anchor covers
        for s, n in (runs or [(0, t.numel())]):
            spans += [(name, off + ps - s, pn) for name, ps, pn in parts if name and s <= ps and ps + pn <= s + n]
            off += n
        mine = [(name, o, n) for name, o, n in spans if name in shared and shared[name].device == a.device]
        if runs is None and len(parts) == 1 and mine and same_numbers(shared[mine[0][0]], a):
            out.append((shared[mine[0][0]].view_as(t), None))
            used.append(mine[0][0])
            continue
        kinds = {shared[name].dtype for name, _, _ in mine}
        if len(kinds) == 1 and a.dtype not in kinds:
            narrow = kinds.pop()
            if fits(a, narrow):
                a = a.to(narrow)  # the model's dtype (--fp16), the same numbers: one copy of θ*
        flat = a.reshape(-1)
        for name, o, n in mine:
            piece = flat[o:o + n]
            if piece.dtype == shared[name].dtype and same_numbers(piece, shared[name]):
                views[name] = piece.view(shapes[name])
        out.append((a, runs))
    return out, used, views
