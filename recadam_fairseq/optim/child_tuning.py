"""``--child-tuning F|D``: ChildTuning (Xu et al., EMNLP 2021) for ``--optimizer recadam`` and ``samsgd``.

The authors' ``ChildTuningAdamW`` multiplies each gradient by its mask inside the step: after the
trainer's gradient clipping, before Adam's moments. Here the mask is the listener's ``before_step``
(``plumbing/events.py``), on the optimizer's own tensors (the model's, fp32 copies, or ``--fp16``'s flat master)
after fairseq's reduction, overflow check and ``--clip-norm``; F's 1/p goes into the step's gradient
scale, so no fp16 gradient is multiplied toward overflow. The masks are bound to those tensors at the
first gradient reduction, which shows the parameters' names (as RecAdam's θ* and LLRD's scales).

D's Fisher information is computed at the criterion's first training call
(``events.on_first_training_call``): fairseq's batches of the training set, this rank's shard, in
train mode, with the global RNG and the gradients put back afterwards, so the first update is the
base run's apart from the mask; the sums are added over ranks and rank 0's mask is broadcast. The mask
(bits, by parameter name) is saved in the optimizer state under ``last_optimizer_state["child_tuning"]``
and a resumed run takes it from there. The math is ``core/child_tuning.py``.
"""

import logging
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from fairseq.distributed import utils as distributed_utils

from ..core.anchor import layout, trainable_named_parameters
from ..core.child_tuning import (FLAG, RATIO_FLAG, FisherSum, check, checksum, d_eligible, d_mask, draw_seed,
                                 mask_f_, pack_bits, unpack_bits)
from ..core.errors import ConfigError
from ..core.wrappers import unwrap_model
from ..plumbing import events
from ..plumbing.batches import prepare, train_batches

logger = logging.getLogger(__name__)

STATE_KEY = "child_tuning"  # the listener's state in the optimizer's state dict (checkpoint_last.pt)
FISHER_FP16_SCALE = 2.0 ** 16  # first loss scale of the fp16 Fisher passes; halved on overflow


class ChildTuning:
    """The F or D gradient mask of a LoopOptimizer's tensors, applied just before each step."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg):
        self.opt, self.cfg = optimizer, cfg
        self.mode, self.ratio = str(cfg.child_tuning), float(cfg.child_tuning_ratio)
        self.plan: Optional[List[Tuple[torch.Tensor, list]]] = None  # (optimizer tensor, its layout parts)
        self.keep: Optional[Dict[str, torch.Tensor]] = None    # D: the Fisher passes' keep masks, until bound
        self.packed: Optional[Dict[str, torch.Tensor]] = None  # D: a checkpoint's packed masks, until bound
        self.drop: List[Tuple[torch.Tensor, torch.Tensor]] = []  # D, bound: (tensor, bool drop mask of its elements)
        self.by_name: Dict[str, torch.Tensor] = {}  # D, bound: each parameter's view of ``drop``
        self._gens: Dict[torch.device, torch.Generator] = {}

    # ------------------------------------------------------------------ binding to the optimizer's tensors
    def before_reduce(self, model: torch.nn.Module) -> None:
        if self.plan is None:
            self.bind(model)

    def bind(self, model: torch.nn.Module) -> None:
        named = trainable_named_parameters(model)
        tensors = [p for g in self.opt.param_groups for p in g["params"]]
        self.plan = list(zip(tensors, layout(tensors, named)))
        if self.mode == "F":
            n = sum(t.numel() for t in tensors)
            logger.info(f"child-tuning F: each update keeps each of the {n:,} gradient elements with probability "
                        f"{self.ratio:g} (kept ones ×1/{self.ratio:g}), drawn from (--seed {self.cfg.seed}, update)")
            return
        shapes = {n: p.shape for n, p in named}
        if self.packed is not None:
            want = {n for n in shapes if d_eligible(n)}
            if set(self.packed) != want:
                raise ConfigError(
                    f"{FLAG} D: the checkpoint's mask covers {len(self.packed)} tensors, this model's encoder layers "
                    f"have {len(want)} (another model?): start a new optimizer state with --reset-optimizer")
            keep, source = {n: unpack_bits(b, shapes[n]) for n, b in self.packed.items()}, "from the checkpoint"
        elif self.keep is not None:
            keep, source = self.keep, "from the Fisher information"
        else:
            raise RuntimeError(f"{FLAG} D: no mask at the first gradient reduction (the criterion's first "
                               f"training call computes it)")
        for t, parts in self.plan:
            mine = [(n, s, k) for n, s, k in parts if n in keep]
            if not mine:
                continue
            if len(parts) == 1:  # the parameter itself or its copy
                n = mine[0][0]
                drop = torch.logical_not(keep[n]).reshape(-1).to(t.device)
            else:  # --fp16's flat tensor: the parameters' runs
                drop = torch.zeros(t.numel(), dtype=torch.bool, device=t.device)
                for n, s, k in mine:
                    drop[s:s + k] = torch.logical_not(keep[n]).reshape(-1)
            self.drop.append((t, drop))
            for n, s, k in mine:
                self.by_name[n] = drop[s:s + k] if len(parts) > 1 else drop
        self.keep = self.packed = None
        total = sum(d.numel() for d in self.by_name.values())
        dropped = sum(int(d.sum()) for d in self.by_name.values())
        logger.info(f"child-tuning D: mask {source}: {total - dropped:,} of the {total:,} elements of "
                    f"{len(self.by_name)} encoder-layer tensors take the gradient (p = {self.ratio:g}); "
                    f"crc32 {self.crc():08x}")

    def crc(self) -> int:
        return checksum(b for _, b in sorted(self.state_dict().get("keep", {}).items()))

    # ------------------------------------------------------------------ the mask, before each step
    def before_step(self, scale: float) -> float:
        if self.plan is None:
            raise RuntimeError(f"{FLAG}: step() before all_reduce_grads(model) bound the mask")
        if self.mode == "D":
            for t, drop in self.drop:
                if t.grad is not None:
                    t.grad.view(-1).masked_fill_(drop, 0)
            return scale
        update = events.update_number()
        seeded = set()
        for t, parts in self.plan:
            gen = self._gens.get(t.device)
            if gen is None:
                gen = self._gens[t.device] = torch.Generator(device=t.device)
            if t.device not in seeded:
                gen.manual_seed(draw_seed(self.cfg.seed, update))
                seeded.add(t.device)
            g = None if t.grad is None else t.grad.view(-1)
            mask_f_([(None if g is None else g[s:s + k], k) for _, s, k in parts], self.ratio, gen)
        return scale * self.ratio  # the step divides by it: the kept elements ×1/p

    # ------------------------------------------------------------------ D: the Fisher passes
    def first_call(self, criterion, args):
        if self.plan is None and self.keep is None and self.packed is None:
            self.keep = self.fisher_mask(criterion, args[0])
        return None

    def fisher_mask(self, criterion, model: torch.nn.Module) -> Dict[str, torch.Tensor]:
        cfg, inner = self.cfg, unwrap_model(model)
        named = [(n, p) for n, p in trainable_named_parameters(inner) if d_eligible(n)]
        if not named:
            raise ConfigError(f"{FLAG} D: the model has no trainable parameters in layers named "
                              f"*.sentence_encoder.layers.N.* (RoBERTa's) or encoder.layers.N / decoder.layers.N "
                              f"(fairseq's encoder-decoders), the ones D masks")
        world, rank, group = 1, 0, None
        if dist.is_available() and dist.is_initialized():
            group = distributed_utils.get_data_parallel_group()
            world, rank = distributed_utils.get_world_size(group), distributed_utils.get_rank(group)
        device, dtype = named[0][1].device, named[0][1].dtype
        half = any(p.dtype == torch.float16 for _, p in named)
        scale = FISHER_FP16_SCALE if half else 1.0
        fisher = FisherSum([p for _, p in named], clip=float(cfg.clip_norm or 0.0))
        limit, examples = int(cfg.child_tuning_fisher_batches), 0
        params = [p for p in list(inner.parameters()) + list(criterion.parameters()) if p.requires_grad]
        saved = [(p, p.grad) for p in params]
        for p in params:
            p.grad = None
        try:  # the inner model: no DDP hook or collective per batch, so ranks may see different batch counts
            with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
                for sample in self.batches(criterion.task, inner, world, rank):
                    if limit and fisher.batches >= limit:
                        break
                    if not sample:  # the empty batches that even out the shards
                        continue
                    sample = prepare(sample, device, dtype)
                    while True:
                        loss, sample_size, _ = criterion.forward(inner, sample)
                        (loss * (scale / max(float(sample_size), 1.0))).backward()  # the batch's mean loss
                        ok = fisher.add([p.grad for _, p in named], scale, check_finite=half)
                        for p in params:
                            p.grad = None
                        if ok:
                            break
                        if scale <= 1.0:
                            raise FloatingPointError(f"{FLAG} D: the fp16 gradients overflow on a training batch "
                                                     f"even without a loss scale")
                        scale /= 2
                    examples += int(sample.get("nsentences", 0))
        finally:
            for p, g in saved:
                p.grad = g
        counts = torch.tensor([fisher.batches, examples], dtype=torch.float64, device=device)
        if world > 1:
            for s in fisher.sums:
                distributed_utils.all_reduce(s, group=group)
            distributed_utils.all_reduce(counts, group=group)
        keep = d_mask(fisher.sums, self.ratio)
        del fisher
        if world > 1:  # one mask everywhere, whatever the reduction's rounding on each rank
            packed = [pack_bits(k) for k in keep]
            for b in packed:
                distributed_utils.broadcast(b, src=0, group=group)
            keep = [unpack_bits(b, p.shape) for b, (_, p) in zip(packed, named)]
        n_batches, n_examples = (int(x) for x in counts.tolist())
        logger.info(f"child-tuning D: Fisher information of {n_batches} batches ({n_examples} examples, {world} "
                    f"rank{'s' if world > 1 else ''}) over {len(named)} encoder-layer tensors"
                    f"{'; fp16 loss scale ' + format(scale, 'g') if half else ''}")
        return {n: k for (n, _), k in zip(named, keep)}

    def batches(self, task, model, world: int, rank: int):
        return train_batches(self.cfg, task, model, world, rank)

    # ------------------------------------------------------------------ the checkpoint
    def state_dict(self) -> dict:
        st = {"mode": self.mode, "ratio": self.ratio}
        if self.by_name:
            st["keep"] = {n: pack_bits(torch.logical_not(d)).cpu() for n, d in self.by_name.items()}
        elif self.keep is not None:
            st["keep"] = {n: pack_bits(k).cpu() for n, k in self.keep.items()}
        elif self.packed is not None:
            st["keep"] = self.packed
        return st

    def load_state_dict(self, st: dict) -> None:
        if st.get("mode") != self.mode:
            raise ConfigError(f"{FLAG} {self.mode}: the checkpoint's optimizer state was trained with {FLAG} "
                              f"{st.get('mode')}: start a new optimizer state with --reset-optimizer")
        if self.mode == "D" and "keep" in st:
            if st.get("ratio") != self.ratio:
                raise ConfigError(f"{RATIO_FLAG} {self.ratio:g}: the checkpoint's ChildTuning-D mask keeps "
                                  f"{st.get('ratio'):g}: resume with {RATIO_FLAG} {st.get('ratio'):g}, or start a "
                                  f"new optimizer state with --reset-optimizer")
            self.packed, self.keep = dict(st["keep"]), None
            self.plan, self.drop, self.by_name = None, [], {}  # bound again at the next reduction


def add_child_tuning(optimizer: events.LoopOptimizer, cfg) -> Optional[ChildTuning]:
    """The listener for ``cfg.child_tuning`` on a LoopOptimizer, or None when off."""
    check(str(cfg.child_tuning), float(cfg.child_tuning_ratio), cfg.child_tuning_fisher_batches)
    if str(cfg.child_tuning) == "off":
        return None
    if str(getattr(cfg, "zero_sharding", "none")) == "os":  # not yet checked against the unsharded run
        raise ConfigError(f"--child-tuning {cfg.child_tuning} does not support --zero-sharding os yet: drop one of them")
    listener = ChildTuning(optimizer.optimizer, cfg)
    optimizer.listen(STATE_KEY, listener)
    if listener.mode == "D":  # the Fisher passes, at the criterion's first training call
        events.on_first_training_call(listener.first_call)
    return listener
