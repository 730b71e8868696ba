"""Per-rank bytes of RecAdam's optimizer state (θ*, Adam's moments) under --zero-sharding os, for
roberta_base's parameter shapes (with a 2-class sentence-prediction head), against the unsharded run.

The shards are fairscale's own (``OSS.partition_parameters``, the greedy rule fairseq's ZeRO stage 1
uses); each rank's RecAdam is then built on its shard's tensors, anchored, stepped once, and the bytes
of its state tensors summed. The step's time is that rank's update alone (OSS then broadcasts the
updated shards: not timed). No training, no process group.

    python scripts/bench_sharding.py [--ranks 1 2 4] [--anchor-dtype fp32|bf16] [--steps 3]
"""

import argparse
import time
from types import SimpleNamespace

import torch
from fairscale.optim import OSS

from recadam_fairseq.core.recadam import RecAdam

V, D, F, L, POS = 50265, 768, 3072, 12, 514


def roberta_base_shapes():
    """What fairseq hands the optimizer for roberta_base + a classification head, in its order."""
    shapes = [(V, D), (POS, D), (D,), (D,)]  # token and position embeddings, embedding layer norm
    for _ in range(L):
        shapes += [(D, D), (D,)] * 4 + [(D,), (D,), (F, D), (F,), (D, F), (D,), (D,), (D,)]
    shapes += [(D, D), (D,), (D,), (D,), (V,)]  # the LM head (its weight is tied to the embedding)
    shapes += [(D, D), (D,), (2, D), (2,)]  # the classification head
    return shapes


def shards(params, world):
    """fairscale's partition of ``params`` over ``world`` ranks, without a process group."""
    fake = SimpleNamespace(param_groups=[{"params": params}], world_size=world, _partition_parameters=[])
    return [groups[0]["params"] for groups in OSS.partition_parameters(fake)]


def state_bytes(opt):
    out = {"anchor": 0, "moments": 0}
    for st in opt.state.values():
        out["anchor"] += st["anchor"].numel() * st["anchor"].element_size() if "anchor" in st else 0
        out["moments"] += sum(st[k].numel() * st[k].element_size() for k in ("exp_avg", "exp_avg_sq") if k in st)
    return out


def one_rank(shapes, anchored, dtype, steps):
    """(state bytes, seconds per step) of the RecAdam of one rank's tensors; ``anchored``: which have θ*."""
    params = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]
    opt = RecAdam(params, lr=1e-5, anneal_k=0.5, anneal_t0=250, pretrain_cof=5000.0, defer_anchors=True, fused=False)
    for p, a in zip(params, anchored):
        if a:
            opt.set_anchor(p, p.detach().to(dtype).clone())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()  # the moments exist from the first step
    start = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return state_bytes(opt), (time.perf_counter() - start) / steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--anchor-dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.anchor_dtype]
    shapes = roberta_base_shapes()
    meta = [torch.empty(s, device="meta", requires_grad=True) for s in shapes]  # OSS balances trainable numel
    index = {id(t): i for i, t in enumerate(meta)}
    print(f"roberta_base + head: {sum(t.numel() for t in meta):,} elements; θ* {args.anchor_dtype}")
    print("| ranks | θ* per rank (MiB) | Adam moments per rank (MiB) | slowest rank's update (s) |")
    print("|---|---|---|---|")
    for world in args.ranks:
        rows = []
        for part in shards(meta, world):
            mine = [index[id(t)] for t in part]  # the classification head (the last 4) is new: no θ*
            rows.append(one_rank([shapes[i] for i in mine], [i < len(shapes) - 4 for i in mine], dtype, args.steps))
        mib = lambda key: " / ".join(f"{r[0][key] / 2**20:.1f}" for r in rows)  # noqa: E731
        print(f"| {world} | {mib('anchor')} | {mib('moments')} | {max(r[1] for r in rows):.3f} |")

if __name__ == "__main__":
    main()
