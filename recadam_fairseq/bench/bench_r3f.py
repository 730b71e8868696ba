"""What R3F costs: updates/s of sentence_prediction vs R3F vs RecAdam + R3F, measured in one run
(``--rdrop``: also R-Drop, as run (one forward of the batch twice over) and as two forwards).

One update = the criterion's forward (R3F: clean and noised), backward, optimizer step, on a
RoBERTa encoder built by fairseq (dropout 0.1, a classification head), in training mode.
Methods are timed in rounds whose order rotates, so load from other processes hits all alike;
the table gives the median ms/update and the ratio of updates/s to sentence_prediction.

    python scripts/bench_r3f.py                    # tiny and MiniLM-sized shapes, CPU
    python scripts/bench_r3f.py --sizes minilm --device cuda
    python scripts/bench_r3f.py --sizes tiny --threads 1 --rounds 7 --rdrop     # docs/rdrop.md

Sizes: tiny (the tests' model: 2 layers, dim 64) and minilm (6 layers, dim 384, 12 heads,
ffn 1536, vocab 30522, as all-MiniLM-L6-v2).
"""

import argparse
import statistics
import sys
import time

import torch

# layers, dim, ffn, heads, vocab, batch, tokens
SIZES = {"tiny": (2, 64, 128, 2, 104, 16, 24), "minilm": (6, 384, 1536, 12, 30522, 16, 128)}
METHODS = ("sentence_prediction", "r3f", "recadam-r3f")
RDROP = ("rdrop", "rdrop-two-forwards")


def build(size, device):
    import fairseq  # noqa: F401
    from fairseq.models.roberta import RobertaModel, base_architecture

    import recadam_fairseq

    recadam_fairseq.register()
    layers, dim, ffn, heads, vocab, _, _ = SIZES[size]
    args = argparse.Namespace(encoder_layers=layers, encoder_embed_dim=dim, encoder_ffn_embed_dim=ffn,
                              encoder_attention_heads=heads, max_positions=514, dropout=0.1,
                              attention_dropout=0.1, activation_dropout=0.0, pooler_dropout=0.0)
    base_architecture(args)

    class Task:  # what RobertaModel.build_model and the criterion read
        source_dictionary = _Dict(vocab)
        label_dictionary = None

    model = RobertaModel.build_model(args, Task())
    model.register_classification_head("sentence_classification_head", num_classes=2)
    return model.to(device).train(), Task()


class _Dict:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def pad(self):
        return 1


def criterion(name, task, **over):
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY

    return CRITERION_REGISTRY[name](CRITERION_DATACLASS_REGISTRY[name](**over), task)


def make_updates(model, task, device):
    from recadam_fairseq.core.recadam import RecAdam

    params = [p for p in model.parameters() if p.requires_grad]
    hp = dict(lr=1e-5, betas=(0.9, 0.98), eps=1e-6)
    plain = criterion("sentence_prediction_recadam", task)  # R3F off: fairseq's sentence_prediction loss
    r3f = criterion("sentence_prediction_r3f", task, noise_type="uniform", r3f_lambda=0.7)
    adam = torch.optim.Adam(params, **hp)
    recadam = RecAdam(params, **hp, anneal_k=0.1, anneal_t0=1000, pretrain_params=[p.detach().clone() for p in params],
                      fused=False)
    rdrop = criterion("sentence_prediction_rdrop", task, rdrop_alpha=1.0)
    return {"sentence_prediction": (plain, adam), "r3f": (r3f, adam), "recadam-r3f": (r3f, recadam),
            "rdrop": (rdrop, adam), "rdrop-two-forwards": (rdrop_two_forwards, adam)}


def rdrop_two_forwards(model, sample, alpha=1.0):
    """R-Drop's loss with two forwards of B rows (what the criterion does in one forward of 2B)."""
    from recadam_fairseq.core import r3f, rdrop
    from recadam_fairseq.criterions import glue_core

    a, b = (glue_core.head_logits(model, sample["net_input"], "sentence_classification_head") for _ in range(2))
    y = sample["target"]
    both = glue_core.summed_loss(a, y, False) + glue_core.summed_loss(b, y, False)
    return rdrop.rdrop_loss(both, r3f.symm_kl(b, a) * len(y), alpha), len(y), {}


def batch(size, device, gen):
    _, _, _, _, vocab, b, t = SIZES[size]
    tokens = torch.randint(4, vocab, (b, t), generator=gen)
    tokens[:, 0] = 0
    return {"net_input": {"src_tokens": tokens.to(device)}, "target": torch.randint(0, 2, (b,), generator=gen).to(device),
            "ntokens": b * t}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench(size, device, rounds, steps, methods=METHODS):
    model, task = build(size, device)
    updates = make_updates(model, task, device)
    sample = batch(size, device, torch.Generator().manual_seed(0))

    def update(method):
        crit, opt = updates[method]
        opt.zero_grad(set_to_none=True)
        loss, n, _ = crit(model, sample)
        (loss / n).backward()
        opt.step()

    times = {m: [] for m in methods}
    for m in methods:  # warm-up
        update(m)
    for r in range(rounds):
        for m in methods[r % len(methods):] + methods[:r % len(methods)]:
            sync(device)
            t = time.perf_counter()
            for _ in range(steps):
                update(m)
            sync(device)
            times[m].append((time.perf_counter() - t) / steps)
    med = {m: statistics.median(v) for m, v in times.items()}
    return [{"size": size, "method": m, "ms": 1e3 * med[m], "ups": 1 / med[m],
             "ratio": med["sentence_prediction"] / med[m]} for m in methods]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["tiny", "minilm"], choices=list(SIZES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="updates per timed block")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--rdrop", action="store_true", help="also R-Drop: one forward of 2B rows, and two of B")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    methods = METHODS + RDROP if args.rdrop else METHODS
    rows = [row for size in args.sizes for row in bench(size, device, args.rounds, args.steps, methods)]
    print(f"device {device} ({torch.get_num_threads()} threads), torch {torch.__version__}; "
          f"median of {args.rounds} rounds x {args.steps} updates")
    print("| size | method | ms/update | updates/s | vs sentence_prediction |")
    print("|---|---|---|---|---|")
    for r in rows:
        layers, dim, _, _, _, b, t = SIZES[r["size"]]
        print(f"| {r['size']} ({layers}x{dim}, batch {b}x{t}) | {r['method']} | {r['ms']:.1f} | {r['ups']:.3g} | "
              f"{r['ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
