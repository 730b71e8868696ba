"""The domain-adaptation comparison on a synthetic translation pair (issue #43, item 4).

    python scripts/seq2seq/compare.py                 # data, pretraining, every run, WiSE-FT, the report
    python scripts/seq2seq/compare.py --report-only   # docs/seq2seq-comparison.{md,png} again from its JSON

The pair is recadam_fairseq/tiny/make_text_translation.py's: real English text (movie-review snippets: domain
A, the pretraining domain; tweets: domain B, the new one) written by a rule (each word reversed, in capitals).
A small transformer is pretrained on A once; each method of the catalogue then fine-tunes it on B with
scripts/seq2seq/finetune.sh's run (launch/comparison.py: launch/translation.py's RunSpec, the real fairseq-train with
the catalogue's flags, trained in-process as finetune.sh trains it), and BLEU is read from the run's own log at its
last update: ``valid`` is B's dev set, ``test`` A's. WiSE-FT mixes a run's last weights
with θ* (scripts/interpolate.py) and scores both domains with fairseq-validate.

The runs go through the engine's executor (engine/execute.py, --jobs at a time); the page's table, verdicts and
figure are engine/verdicts.py's, the ones scripts/glue/summarize.py gives a user's own grid (BLEU on B against the
fall of BLEU on A since θ*, judged against Adam by the comparison's noise-aware rule).

Everything a result came from is recorded in WORK/results.json (the commands, the numbers) and copied to
docs/seq2seq-comparison.json; a run is reused while its command is the same (a finished run is not trained
again); the table and the figure are drawn from the JSON alone, so --report-only regenerates them
byte for byte.
"""

import argparse
import functools
import os
import re
import shlex
import subprocess
import sys
import time

from recadam_fairseq import catalogue
from recadam_fairseq.compare.files import ROOT, read_json, rel, write_json
from recadam_fairseq.engine import verdicts
from recadam_fairseq.engine.aggregate import OTHERS, to_float
from recadam_fairseq.engine.execute import RunError, execute
from recadam_fairseq.engine.fairseq_log import parse_log
from recadam_fairseq.launch import comparison, recipe
from recadam_fairseq.launch.command import launch
from recadam_fairseq.launch.spec import Stop
from recadam_fairseq.launch.train import train
from recadam_fairseq.launch.variables import Variables

DOCS = os.path.join(ROOT, "docs")
NAME = "seq2seq-comparison"
# the catalogue's methods this comparison runs -> what each runs as where scripts/seq2seq/finetune.sh lacks it (the
# METHOD, its knobs' values; None: itself): EWC is the coupled objective with F from a file (its runs in WORK/runs-ewc:
# finetune.sh names a run by the method and its knobs, the same as recadam-coupled's)
TRANSLATION = {"adam": None, "recadam": None, "recadam-coupled": None,
               "ewc": ("recadam-coupled", (("fisher", "{fisher}"),)), "r3f": None, "llrd": None, "rdrop": None,
               "recadam-rdrop": None}


def methods():
    """(label, the METHOD it runs as, ((knob, value), ...) added to it) of each, in the catalogue's order."""
    return tuple((n, *(TRANSLATION[n] or (n, ()))) for n in catalogue.METHODS if n in TRANSLATION)


def runs_dir(label: str) -> str:
    """WORK/runs, or WORK/runs-LABEL for a label that runs as another METHOD (its run names would be that one's)."""
    return "runs" if dict((x[0], x[1]) for x in methods()).get(label, label) == label else f"runs-{label}"
WISE = ("adam", "recadam")  # the runs WiSE-FT mixes with θ*


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=os.path.join(ROOT, "seq2seq-out"), help="data, pretraining and runs")
    p.add_argument("--sdist-dir", help="where vaderSentiment's sdist is (default WORK/sdists; fetched when missing)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--methods", nargs="+", default=[m[0] for m in methods()], help="labels of methods()")
    p.add_argument("--max-update", type=int, default=400)
    p.add_argument("--lr", default="3e-3")
    p.add_argument("--k", default="0.1")
    p.add_argument("--t0", default="100")
    p.add_argument("--gamma", default="500")
    p.add_argument("--alphas", type=float, nargs="+", default=[0.25, 0.5, 0.75], help="WiSE-FT's α")
    p.add_argument("--pretrain-updates", type=int, default=500)
    p.add_argument("--fisher-examples", type=int, default=1024)
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each on one core)")
    p.add_argument("--report-only", action="store_true", help="the md and png again from docs' JSON")
    p.add_argument("--docs", default=DOCS, help="where the md, json and png go")
    return p.parse_args(argv)


def env_python():
    return sys.executable


def bindir():
    return os.path.dirname(sys.executable)


def portable(text: str) -> str:
    """A recorded command without this machine's paths: the venv's bin as .venv/bin, the checkout as ."""
    for path, short in ((bindir() + "/", ".venv/bin/"), (ROOT + "/", ""), (ROOT, ".")):
        text = text.replace(path, short)
    return text


def log(msg):
    print(f"seq2seq-compare: {msg}", flush=True)


def run(cmd, logfile=None, env=None):
    """``cmd`` at one core (niced with the comparison), from the checkout's root; its output to ``logfile`` (or the
    terminal)."""
    e = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=ROOT, **(env or {}))
    with open(logfile, "a") if logfile else open(os.devnull, "w") as f:
        out = f if logfile else None
        proc = subprocess.run(cmd, cwd=ROOT, env=e, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RunError(f"seq2seq-compare: failed ({proc.returncode}): {shlex.join(cmd)}"
                       + (f" (see {logfile})" if logfile else ""))


def arch_flags():
    from recadam_fairseq.tiny.make_text_translation import ARCH
    return list(ARCH)


def data_step(args, data):
    """The pair and the pretrained model, made once (reused while data.json says the same settings)."""
    info = read_json(os.path.join(data, "data.json"))
    if info and info.get("pretrain_updates") == args.pretrain_updates and os.path.isfile(
            os.path.join(data, "pretrained.pt")):
        return info
    log(f"making the pair and pretraining on domain A ({args.pretrain_updates} updates) in {rel(data)}")
    t = time.time()
    run([env_python(), "-m", "recadam_fairseq.tiny.make_text_translation", rel(data), "--sdist-dir",
         args.sdist_dir or os.path.join(args.work, "sdists"), "--pretrain-updates", str(args.pretrain_updates)],
        os.path.join(args.work, "make.log"))
    info = read_json(os.path.join(data, "data.json"))
    info["seconds"] = round(time.time() - t, 1)
    write_json(os.path.join(data, "data.json"), info)
    return info


def fisher_step(args, data):
    """EWC's F of domain A's translation objective at θ* (scripts/fisher.py), once."""
    out = os.path.join(data, "fisher-a.pt")
    cmd = comparison.translation_fisher(rel(os.path.join(data, "a-bin")), rel(os.path.join(data, "pretrained.pt")),
                                        arch_flags(), rel(out), args.fisher_examples, rel(recipe.FISHER))
    if not os.path.isfile(out):
        log("EWC's Fisher of domain A at θ*")
        run(cmd, os.path.join(args.work, "fisher.log"))
    return out, shlex.join(cmd)


BLEU_LINE = re.compile(r"valid on '(\w+)' subset \|.*\| bleu ([0-9.]+)")


def validate(args, data, checkpoint, logfile):
    """{"valid": BLEU on B, "test": BLEU on A} of ``checkpoint`` (fairseq-validate, greedy)."""
    cmd = [os.path.join(bindir(), "fairseq-validate"),
           *comparison.translation_validate(rel(os.path.join(data, "b-bin")), rel(checkpoint))]
    if os.path.exists(logfile):
        os.remove(logfile)
    run(cmd, logfile)
    with open(logfile) as f:
        found = dict(BLEU_LINE.findall(f.read()))
    return {s: float(found[s]) for s in ("valid", "test")}, shlex.join(cmd[1:])


def finetune_env(args, data, seed, label):
    return {"PRETRAINED": rel(os.path.join(data, "pretrained.pt")), "DATA": rel(os.path.join(data, "b-bin")),
            "SAVE_DIR": rel(os.path.join(args.work, runs_dir(label))), "MAX_UPDATE": str(args.max_update),
            "MAX_TOKENS": "2048", "LR": args.lr, "K": args.k, "T0": args.t0, "GAMMA": args.gamma, "BEAM": "1",
            "SEED": str(seed), "SAVE_INTERVAL_UPDATES": str(args.max_update), "LOG_INTERVAL": "100",
            "FAIRSEQ_TRAIN": os.path.join(bindir(), "fairseq-train"), "PYTHON": env_python()}


def command_of(run_dir):
    """command.sh without its comment lines (they hold the date)."""
    with open(os.path.join(ROOT, run_dir, "command.sh")) as f:
        return portable("".join(line for line in f if not line.startswith("#")))


def last_bleu(run_dir, updates):
    """{"valid": ..., "test": ...}: the BLEU the run's log has at its last update (B's validation, A's beside it)."""
    valid = parse_log(os.path.join(ROOT, run_dir, "train.log"))[0].get("valid", [])
    at = [e for e in valid if to_float(e.get("num_updates")) == updates]
    if not at or "test" not in at[-1][OTHERS]:
        raise RunError(f"seq2seq-compare: {run_dir}/train.log has no validation of valid and test at update {updates}")
    return {"valid": float(at[-1]["bleu"]), "test": float(at[-1][OTHERS]["test"]["bleu"])}


def run_of(args, data, label, method, knobs, seed, fisher, say=print):
    """The run of (label, seed): seq2seq/finetune.sh METHOD's RunSpec under the comparison's variables (and this
    process's, as finetune.sh read them), and those variables."""
    v = Variables(dict(os.environ, **finetune_env(args, data, seed, label)), "finetune.sh", say)
    values = {k: x.format(fisher=rel(fisher)) for k, x in knobs}
    try:
        return comparison.translation_run(v, method, values, ROOT), v
    except Stop as e:
        raise RunError(f"seq2seq-compare: finetune.sh {method}: {e}") from None


def finetune(args, data, label, method, knobs, seed, fisher, say=print):
    """One run, trained unless done, as scripts/seq2seq/finetune.sh trains it (its lines in WORK/LABEL-SEED.log);
    its record."""
    notes = []
    spec, v = run_of(args, data, label, method, knobs, seed, fisher, notes.append)
    run_dir = rel(spec.run_dir)
    t = time.time()
    done = spec.done()
    if not done:
        say(f"seq2seq-compare: {label} seed {seed} -> {run_dir}")
        logfile = os.path.join(args.work, f"{label}-{seed}.log")
        with open(logfile, "a") as f:
            def out(text):
                f.write(text + "\n")
                f.flush()

            v.say = lambda msg: out(f"finetune.sh: {msg}")
            for note in notes:
                v.say(note)
            env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=ROOT)
            try:
                rc = launch(spec, v, functools.partial(train, env=env, out=out, err=out), out)
            except Stop as e:  # its run directory holds a run of another command
                raise RunError(f"seq2seq-compare: {e}") from None
        if rc:
            raise RunError(f"seq2seq-compare: failed ({rc}): {label} seed {seed} (see {logfile})")
    bleu = last_bleu(run_dir, args.max_update)
    return {"label": label, "method": method, "seed": seed, "run_dir": run_dir, "command": command_of(run_dir),
            "bleu_b": bleu["valid"], "bleu_a": bleu["test"],
            "seconds": None if done else round(time.time() - t, 1)}


def wise_points(args, data, rec, done):
    """WiSE-FT of a run's last weights at each α: its records (those in ``done``, by α, reused)."""
    out = []
    ckpt = os.path.join(ROOT, rec["run_dir"], "checkpoint_last.pt")
    wdir = os.path.join(args.work, "wise", rec["label"], f"seed{rec['seed']}")
    os.makedirs(wdir, exist_ok=True)
    for a in args.alphas:
        if a in done:
            out.append(done[a])
            continue
        mixed = os.path.join(wdir, f"alpha{a}.pt")  # made again: a file left here may mix a run since changed
        run([env_python(), "scripts/interpolate.py", rel(ckpt), "--pretrained",
             rel(os.path.join(data, "pretrained.pt")), "--alpha", str(a), "--out", rel(mixed)],
            os.path.join(wdir, "interpolate.log"))
        bleu, cmd = validate(args, data, mixed, os.path.join(wdir, f"alpha{a}.log"))
        out.append({"label": rec["label"], "seed": rec["seed"], "alpha": a, "bleu_b": bleu["valid"],
                    "bleu_a": bleu["test"]})
    return out


def main(argv=None):
    try:
        return compare(parse_args(argv))
    except RunError as e:
        raise SystemExit(str(e))


def compare(args):
    """The comparison (or its page again, --report-only)."""
    if args.report_only:
        res = read_json(os.path.join(args.docs, NAME + ".json"))
        if res is None:
            raise SystemExit(f"seq2seq-compare: no {rel(os.path.join(args.docs, NAME + '.json'))}")
        write_report(res, args.docs)
        return 0
    args.work, args.docs = os.path.abspath(args.work), os.path.abspath(args.docs)
    args.sdist_dir = args.sdist_dir and os.path.abspath(args.sdist_dir)
    os.chdir(ROOT)  # the runs' commands name their files from the checkout, and so do their checks
    os.nice(10)  # every step at a low priority (its processes inherit it)
    os.makedirs(args.work, exist_ok=True)
    data = os.path.join(args.work, "data")
    info = data_step(args, data)
    results_path = os.path.join(args.work, "results.json")
    res = read_json(results_path) or {}
    settings = {"max_update": args.max_update, "lr": args.lr, "k": args.k, "t0": args.t0, "gamma": args.gamma,
                "seeds": args.seeds, "alphas": args.alphas, "beam": 1, "max_tokens": 2048,
                "pretrain_updates": args.pretrain_updates, "fisher_examples": args.fisher_examples,
                "extra": list(comparison.TRANSLATION_EXTRA)}
    res.update({"data": {k: v for k, v in info.items() if k != "seconds"}, "settings": settings})
    if "pretrained" not in res:
        bleu, cmd = validate(args, data, os.path.join(data, "pretrained.pt"), os.path.join(args.work, "pretrained.log"))
        res["pretrained"] = {"bleu_b": bleu["valid"], "bleu_a": bleu["test"], "command": portable("fairseq-validate " + cmd)}
    fisher, fisher_cmd = fisher_step(args, data) if "ewc" in args.methods else (None, None)
    res["fisher_command"] = fisher_cmd and portable(fisher_cmd)
    runs = {(r["label"], r["seed"]): r for r in res.get("runs", [])}
    wise = {(w["label"], w["seed"], w["alpha"]): w for w in res.get("wise", [])}
    plan = [(label, method, knobs, seed) for seed in args.seeds for label, method, knobs in methods()
            if label in args.methods]
    recorded, recorded_wise = dict(runs), dict(wise)  # what the runs read (record() changes the others)

    def one(label, method, knobs, seed, say):
        """The run's record and its WiSE-FT points (those of an unchanged run reused)."""
        rec = finetune(args, data, label, method, knobs, seed, fisher, say)
        old = recorded.get((label, seed))
        same = old and old["command"] == rec["command"] and rec["seconds"] is None
        if same:
            rec["seconds"] = old.get("seconds")
        done = {k[2]: v for k, v in recorded_wise.items() if k[:2] == (label, seed)} if same else {}
        return rec, wise_points(args, data, rec, done) if label in WISE else []

    def record(i, result, say):
        rec, points = result
        label, seed = rec["label"], rec["seed"]
        say(f"seq2seq-compare: {label} seed {seed}: BLEU B {rec['bleu_b']}, A {rec['bleu_a']}")
        runs[(label, seed)] = rec
        for k in [k for k in wise if k[:2] == (label, seed)]:  # the run's points at --alphas replace those recorded
            del wise[k]
        wise.update({(label, seed, w["alpha"]): w for w in points})
        res["runs"] = [runs[k] for k in sorted(runs, key=order_key)]
        res["wise"] = [wise[k] for k in sorted(wise, key=lambda k: (order_key(k[:2]), k[2]))]
        write_json(results_path, res)

    execute([functools.partial(one, *p) for p in plan], args.jobs, on_done=record)
    os.makedirs(args.docs, exist_ok=True)
    write_json(os.path.join(args.docs, NAME + ".json"), res)
    write_report(res, args.docs)
    return 0


def order_key(key):
    labels = [m[0] for m in methods()]
    return (labels.index(key[0]) if key[0] in labels else len(labels), key[1])


# ---- the report: from the JSON alone ----

TASK = "translation, domain B"  # the answer's task: BLEU on B (the new domain) against BLEU on A's fall since θ*
FORGETTING = "BLEU on A"


def fmt(x):
    return f"{x:.2f}"


def answer(res):
    """The runs of the JSON judged by the grid's rule (engine/verdicts.py, as summarize.py judges a user's grid):
    per method, BLEU on B against the fall of BLEU on A since θ*, mean ± std over seeds; the WiSE-FT points on
    their runs' rows."""
    pre_a = res["pretrained"]["bleu_a"]
    rows = []
    for label in dict.fromkeys(r["label"] for r in res["runs"]):
        rs = [r for r in res["runs"] if r["label"] == label]
        row = verdicts.setting_row(label, label, [(r["seed"], r["bleu_b"], pre_a - r["bleu_a"]) for r in rs],
                                   config="", **knobs(label, res["settings"]))
        wise = verdicts.wise_rows(label, label, [(w["seed"], w["alpha"], w["bleu_b"], pre_a - w["bleu_a"])
                                                 for w in res.get("wise", []) if w["label"] == label])
        if wise:  # α strictly between θ* and the run
            row["interpolated"] = wise
        rows.append(row)
    return verdicts.judge(TASK, "bleu", FORGETTING, rows, updates=res["settings"]["max_update"],
                          at="its last update")


def knob_values(m, s):
    """A method's knobs as the runs had them, as text: the catalogue's defaults, RecAdam's from the settings ``s``."""
    return {k: s.get(k, v) if k in ("k", "t0", "gamma") else v for k, v in m.defaults().items()}


def knobs(label, s):
    """The same, typed (a row's knobs, as engine/verdicts.py's rows hold them)."""
    return {k: catalogue.KNOBS[k].type(v) for k, v in knob_values(catalogue.get(label), s).items()}


def describe(label, res):
    m = catalogue.get(dict((x[0], x[1]) for x in methods()).get(label, label))
    shown = ", ".join(f"{k}={v}" for k, v in knob_values(m, res["settings"]).items())
    if label == "ewc":
        return f"EWC: `recadam-coupled` + `--ewc-fisher` F of domain A ({shown})"
    return f"`{m.name}`" + (f" ({shown})" if shown else "")


def write_report(res, docs):
    a = answer(res)
    pre = res["pretrained"]
    s = res["settings"]
    d = res["data"]
    lines = [
        "# Domain adaptation on a synthetic translation pair",
        "",
        "Generated by `scripts/seq2seq/compare.py` from [seq2seq-comparison.json](seq2seq-comparison.json) "
        "(`--report-only` redraws this page and the figure from it). What the setting can and cannot show: "
        "[docs/seq2seq.md](seq2seq.md#the-domain-adaptation-comparison).",
        "",
        f"A rule-based pair over real English text: each word written reversed, in capitals. Domain A (pretraining): "
        f"rotten-tomatoes snippets; domain B (fine-tuning): tweets, both from `{d['sdist']}`; "
        f"{d['domains']['a']['train']} training and {d['domains']['a']['valid']} dev fragments per domain, "
        f"{d['vocab']['per_domain']} words per domain ({d['vocab']['shared']} shared); "
        f"{100 * d['a_valid_words_not_in_b_vocab']:.1f}% of A's dev words never occur in B. A transformer "
        f"(2+2 layers, dim 64) pretrained {d['pretrain_updates']} updates on A (BLEU {fmt(pre['bleu_b'])} on B, "
        f"{fmt(pre['bleu_a'])} on A), then fine-tuned {s['max_update']} updates on B (lr {s['lr']}, polynomial "
        f"decay, 6% warmup, {s['max_tokens']} tokens a batch, fp32 on one CPU core) through "
        "`scripts/seq2seq/finetune.sh`. BLEU (sacrebleu, greedy) at the last update; seeds "
        f"{', '.join(str(x) for x in s['seeds'])}.",
        "",
        "The table and the figure are what `scripts/glue/summarize.py` writes for a user's own grid "
        "([docs/forgetting-your-task.md](forgetting-your-task.md)), by the same rule: each method's BLEU on B "
        "against its forgetting, the fall of BLEU on A since θ* (positive = forgot), mean ± std over seeds; "
        "against Adam, **keeps** its BLEU when the gap is within twice its standard error over the seeds, "
        "**forgets less** when the fall is smaller by more than that (each at least 0.5 BLEU); **frontier**: "
        "no other method has a higher BLEU on B and less forgetting.",
        "",
    ]
    lines += verdicts.task_markdown(a, "each seed's last weights mixed with θ* (`scripts/interpolate.py`), "
                                       "scored with `fairseq-validate`")
    lines += ["The methods' settings: " + "; ".join(describe(r["name"], res) for r in a["rows"]) + ".", ""]
    lines += ["![BLEU on B against the fall of BLEU on A](seq2seq-comparison.png)", "",
              "Each run (seed, method, BLEU B, BLEU A):", ""]
    for r in res["runs"]:
        lines.append(f"- {r['label']} seed {r['seed']}: {fmt(r['bleu_b'])}, {fmt(r['bleu_a'])} (`{r['run_dir']}`)")
    with open(os.path.join(docs, NAME + ".md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    verdicts.plot_one(a, os.path.join(docs, NAME + ".png"))
