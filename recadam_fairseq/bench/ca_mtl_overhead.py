"""What CA-MTL's conditional modules cost on top of RoBERTa: parameters and training-step time.

Builds ``roberta_<size>`` and ``ca_mtl_roberta_<size>`` (random weights, GPT-2-sized dictionary),
times forward + backward of a sentence-classification batch with mixed task ids in one run,
and prints the ratios.

  python scripts/ca_mtl_overhead.py --size base --batch 8 --seq 128 --tasks 8 [--device cuda]
"""

import argparse
import time

import torch


def build(arch, tasks, device):
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    d = Dictionary()
    for i in range(50265 - len(d)):
        d.add_symbol(f"w{i}")

    class Task:
        source_dictionary = d
        mt_task_names = [str(i) for i in range(tasks)]

        def max_positions(self):
            return 512

    cls = ARCH_MODEL_REGISTRY[arch]
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    cls.add_args(parser)
    args = parser.parse_args([])
    ARCH_CONFIG_REGISTRY[arch](args)
    model = cls.build_model(args, Task())
    model.register_classification_head("head", num_classes=3)
    return model.to(device).train()


def step_time(model, tokens, task_ids, reps, conditioned):
    kw = {"task_ids": task_ids} if conditioned else {}
    for i in range(reps + 1):  # the first is a warm-up
        if i == 1:
            if tokens.is_cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        model(tokens, classification_head_name="head", **kw)[0].sum().backward()
    if tokens.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["base", "large"], default="base")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)

    import recadam_fairseq

    recadam_fairseq.register()
    torch.manual_seed(0)
    rob = build(f"roberta_{args.size}", args.tasks, args.device)
    ca = build(f"ca_mtl_roberta_{args.size}", args.tasks, args.device)
    n_rob = sum(p.numel() for n, p in rob.named_parameters() if not n.startswith("classification_heads."))
    params = dict(ca.named_parameters())
    n_new = sum(params[n].numel() for n in ca.conditional_tensor_names())
    print(f"roberta_{args.size}: {n_rob:,} parameters (no head); CA-MTL adds {n_new:,} "
          f"({100 * n_new / n_rob:.2f}%) for {args.tasks} tasks")

    tokens = torch.randint(4, 50265, (args.batch, args.seq), device=args.device)
    tokens[:, 0], tokens[:, -1] = 0, 2
    task_ids = torch.arange(args.batch, device=args.device) % args.tasks
    t_rob = step_time(rob, tokens, task_ids, args.reps, False)
    t_ca = step_time(ca, tokens, task_ids, args.reps, True)
    print(f"forward+backward, batch {args.batch} x {args.seq} on {args.device}: roberta {1000 * t_rob:.0f} ms, "
          f"ca_mtl {1000 * t_ca:.0f} ms, ratio {t_ca / t_rob:.2f}")


if __name__ == "__main__":
    main()
