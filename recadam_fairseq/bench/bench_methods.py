"""Cost of a set of methods: updates/s and peak memory against each one's base, in one run.

Trains the tiny RoBERTa of the tests (scripts/make_tiny_roberta.py) with the real fairseq-train on
the CPU, once per method, the same number of updates each, one thread, and prints ratios against
the method's base (the same command without the method). ``--set sam``: the samsgd variants against
``--optimizer adam``, RecAdam + fisher-sam against ``--optimizer recadam``; ``--set baselines``:
layer-wise lr decay, re-initialised layers and LoRA against Adam, and with RecAdam against RecAdam;
``--set regularisers``: Mixout, ChildTuning (D and F) and R-Drop likewise.
updates/s is fairseq's own ``ups`` over the run; peak memory is the process's peak RSS (which
includes Python and torch themselves, so on the tiny model it mostly shows that nothing large was
added), and ``+MB`` is the difference to the base run.

    python scripts/bench_methods.py --set sam [--updates 40] [--repeat 3] [--work DIR] [--out-md FILE]
    python scripts/bench_methods.py --list          # each set's methods and their flags, as JSON
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from recadam_fairseq import catalogue
from recadam_fairseq.bench import bench_rows
from recadam_fairseq.launch import tiny_train
from recadam_fairseq.tiny import make_tiny_roberta

SAM_EXTRA = ["--beta", "0.5", "--gamma", "0.5"]  # ESAM's β and γ, for the --sam-type variants
REC = {"gamma": "500"}  # RecAdam at the catalogue's defaults, γ small enough for --lr 1e-4


def command_flags(name, values, extra):
    """A method of the catalogue (recadam_fairseq/catalogue.py) at its defaults but ``values``: its flags,
    then ``extra``."""
    m = catalogue.get(name)
    v = {**m.defaults(), **values}
    return m.all_flags(v) + (["--arch", "roberta_ft"] if m.needs_ft else []) + extra  # the tiny sizes stay


W0 = list(catalogue.OPTIMIZERS["recadam-w0"])  # fairseq's adam bit for bit, with the optimizer-side listeners
FISHER = {"mask_iter_e": "10"}  # FSAM's mask every 10 updates: several within the run
SET_NAMES = ("sam", "baselines", "regularisers")


def base_row(m):
    """(label, method, values, extra) of the row ``m`` is timed against: its base at the benchmark's values, on
    RecAdam at w = 0 where ``m`` runs there (its optimizer-side listeners)."""
    base = catalogue.get(m.base)
    w0 = m.optimizer == "recadam-w0" and base.optimizer == "adam"
    return (base.name + " (recadam w=0)" if w0 else base.name, base.name, own_values(base, {}), W0 if w0 else [])


def own_values(m, values):
    """The benchmark's values for ``m``: FSAM's mask interval, then the row's, then RecAdam's γ."""
    return {**(FISHER if "mask_iter_e" in m.knobs else {}), **values, **(REC if m.uses_recadam else {})}


def rows_of(where):
    """A set's rows, each (name, base name, method, its knob values, extra flags): the catalogue's rows of it
    after their bases (Adam's first, RecAdam's before the methods on it)."""
    rows, bases = [], {}
    for m in catalogue.METHODS.values():
        for v in bench_rows.variants(m.name, where):
            label, *base = base_row(m)
            bases[label] = base
            extra = (SAM_EXTRA if "--sam-type" in m.optimizer_fixed else []) + list(v.extra)
            rows.append((v.label, label, m.name, own_values(m, dict(v.values)), extra))
    on_recadam = sorted(b for b in bases if catalogue.get(bases[b][0]).uses_recadam)
    order = sorted(set(bases) - set(on_recadam)) + on_recadam
    first = [r for r in rows if r[1] not in on_recadam]
    return ([(b, None, *bases[b]) for b in order if b not in on_recadam] + first
            + [(b, None, *bases[b]) for b in on_recadam] + [r for r in rows if r[1] in on_recadam])


# set -> [(name, base name, method, its knob values, extra flags)]
SETS = {s: rows_of(s) for s in SET_NAMES}
TITLE = {"sam": "SAM family", "baselines": "The cheap baselines (LLRD, re-init, LoRA)",
         "regularisers": "Mixout, ChildTuning and R-Drop"}

WRAP = ("import atexit, resource, sys\n"
        "atexit.register(lambda: print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True))\n"
        "sys.argv = ['fairseq-train'] + sys.argv[1:]\n"
        "from fairseq_cli.train import cli_main\n"
        "cli_main()\n")


def train(work, name, flags, updates, batch):
    args = tiny_train.finetune(os.path.join(work, "cls-bin"), os.path.join(work, "runs", name), *flags,
                               pretrained=os.path.join(work, "pretrained.pt"), updates=updates, batch_size=batch,
                               log_interval=1000)  # the method's flags last: its --criterion replaces the default
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", WRAP, *args], capture_output=True, text=True, env=env, cwd=work)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        sys.exit(f"bench_methods.py: {name} failed:\n{text[-3000:]}")
    rss = int(text.rsplit("PEAK_RSS_KB", 1)[1].split()[0]) / 1024
    ups = None
    for line in text.splitlines():
        if "| train |" in line and "{" in line:
            ups = float(json.loads(line[line.index("{"):])["train_ups"])
    if ups is None:
        sys.exit(f"bench_methods.py: {name}: no train summary in the log:\n{text[-3000:]}")
    return ups, rss


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=list(SETS), help="which methods")
    ap.add_argument("--list", action="store_true", help="print every set's commands' method flags as JSON; run nothing")
    ap.add_argument("--updates", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3, help="rounds over all methods; the best round is kept")
    ap.add_argument("--work", help="work directory (default: a temporary one)")
    ap.add_argument("--out-md", help="also write the table to this markdown file")
    a = ap.parse_args(argv)
    if a.list:
        print(json.dumps({s: [[name, method, values, command_flags(method, values, extra), extra]
                              for name, _, method, values, extra in rows] for s, rows in SETS.items()}))
        return
    if not a.set:
        ap.error("--set is required")
    work = a.work or tempfile.mkdtemp(prefix="bench-methods-")
    runs = SETS[a.set]
    if not os.path.exists(os.path.join(work, "pretrained.pt")):
        make_tiny_roberta.main([work])
    res = {}
    for r in range(a.repeat):  # rounds over all methods: a load change hits every method alike
        for name, base, method, values, extra in runs:
            ups, rss = train(work, name, command_flags(method, values, extra), a.updates, a.batch_size)
            print(f"round {r + 1}: {name}: {ups:.2f} updates/s, peak RSS {rss:.0f} MB", file=sys.stderr)
            best = res.get(name, (0.0, float("inf")))
            res[name] = (max(best[0], ups), min(best[1], rss))  # the best of the rounds
    lines = [f"{TITLE[a.set]}: cost on the tiny RoBERTa (CPU, 1 thread, batch {a.batch_size}, {a.updates} updates, "
             f"fairseq-train, best of {a.repeat} rounds), against the base optimizer:", "",
             "| method | base | updates/s | ÷ base | peak RSS MB | ÷ base | +MB |", "|---|---|---|---|---|---|---|"]
    for name, base, *_ in runs:
        ups, rss = res[name]
        if base is None:
            lines.append(f"| {name} | - | {ups:.2f} | 1 | {rss:.0f} | 1 | 0 |")
        else:
            bu, br = res[base]
            lines.append(f"| {name} | {base} | {ups:.2f} | {ups / bu:.2f} | {rss:.0f} | {rss / br:.3f} | {rss - br:+.0f} |")
    if a.set == "sam":
        esam, sam = res["esam"][0], res["sam"][0]
        lines += ["", f"ESAM (β = γ = 0.5) against SAM: {esam / sam:.2f}x the updates/s "
                      f"(fisher-esam against fisher-sam: {res['fisher-esam'][0] / res['fisher-sam'][0]:.2f}x)."]
    text = "\n".join(lines)
    print(text)
    if a.out_md:
        with open(a.out_md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
