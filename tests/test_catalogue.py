"""The catalogue of methods (recadam_fairseq/catalogue.py): its records, the flags every consumer builds
from it, the command line and the docs' tables generated from it.

The task scripts' side (finetune.sh builds each METHOD's flags, run directory and run.json from it) is
tests/test_glue_scripts.py::test_every_method_through_finetune_is_the_catalogue_s."""

import ast
import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, USER_DIR, base_env

from recadam_fairseq import catalogue
from recadam_fairseq.__main__ import DOC_TABLES, RENDER
from recadam_fairseq.catalogue import KNOBS, METHODS
from recadam_fairseq.engine import methods as comparison


def at_defaults(m):
    """The knobs' defaults, restated from KNOBS (an implicit knob passes no flag)."""
    return {k: KNOBS[k].default for k in m.knobs if not KNOBS[k].implicit}


def pairs(flags, last=False):
    """A flag list as {flag: [values]}: every flag of the catalogue is given once; in a command
    (``last``), the last one counts, as argparse reads it."""
    out, key = {}, None
    for f in flags:
        if f.startswith("--"):
            assert last or f not in out, f"{f} given twice in {flags}"
            key = f
            out[key] = []
        else:
            out[key].append(f)
    return out


# Every method's flags at its defaults, its model, restore, task and own lr, written out here: a record changed
# by mistake fails this table, whatever the generated docs tables (regenerated from the same record) say.
R = "--recadam-anneal-fun sigmoid --recadam-anneal-k 0.1 --recadam-anneal-t0 1000 --recadam-pretrain-cof 5000"
PINNED = {
    "adam": ("--optimizer adam", dict()),
    "recadam": (f"--optimizer recadam {R}", dict()),
    "recadam-coupled": (f"--optimizer adam --criterion sentence_prediction_recadam --recadam-objective coupled {R}", dict()),
    "recadam-random-init": (f"--optimizer recadam {R}", dict(restore=False)),
    "ewc": (f"--optimizer adam --criterion sentence_prediction_recadam --recadam-objective coupled {R} --ewc-fisher task", dict()),
    "recadam-ewc": (f"--optimizer recadam {R} --ewc-fisher task", dict()),
    "r3f": ("--optimizer adam --criterion sentence_prediction_r3f --r3f-lambda 0.7 --noise-type uniform", dict()),
    "r4f": ("--optimizer adam --criterion sentence_prediction_r3f --r3f-lambda 0.7 --noise-type uniform --spectral-norm-classification-head", dict()),
    "recadam-r3f": (f"--optimizer recadam {R} --criterion sentence_prediction_r3f --r3f-lambda 0.7 --noise-type uniform", dict()),
    "sam": ("--optimizer samsgd --sam-type sam --rho 0.05", dict()),
    "fsam": ("--optimizer samsgd --sam-type fisher-sam --rho 0.05 --keep-ratio 0.1 --mask-iter-e 100", dict()),
    "recadam-fsam": (f"--optimizer recadam {R} --sam-type fisher-sam --rho 0.05 --keep-ratio 0.1 --mask-iter-e 100", dict()),
    "freeze": ("--optimizer adam --freeze-encoder-layers 0-2 --freeze-embeddings", dict(task="glue_multitask")),
    "ca-mtl": ("--optimizer adam", dict(model="ca_mtl_roberta", task="glue_multitask")),
    "recadam-ca-mtl": (f"--optimizer recadam {R}", dict(model="ca_mtl_roberta", task="glue_multitask")),
    "llrd": ("--optimizer recadam --recadam-anneal-w 0 --layer-lr-decay 0.9", dict()),
    "recadam-llrd": (f"--optimizer recadam {R} --layer-lr-decay 0.9", dict()),
    "reinit": ("--optimizer adam --reinit-layers 2", dict(model="roberta_ft")),
    "recadam-reinit": (f"--optimizer recadam {R} --reinit-layers 2", dict(model="roberta_ft")),
    "lora": ("--optimizer adam --lora-rank 8 --lora-alpha 8", dict(model="roberta_ft", lr="5e-4")),
    "mixout": ("--optimizer adam --mixout 0.9", dict(model="roberta_ft")),
    "recadam-mixout": (f"--optimizer recadam {R} --mixout 0.9", dict(model="roberta_ft")),
    "childtune-d": ("--optimizer recadam --recadam-anneal-w 0 --child-tuning D --child-tuning-ratio 0.3", dict()),
    "childtune-f": ("--optimizer recadam --recadam-anneal-w 0 --child-tuning F --child-tuning-ratio 0.3", dict()),
    "recadam-childtune-d": (f"--optimizer recadam {R} --child-tuning D --child-tuning-ratio 0.3", dict()),
    "rdrop": ("--optimizer adam --criterion sentence_prediction_rdrop --rdrop-alpha 1.0", dict()),
    "recadam-rdrop": (f"--optimizer recadam {R} --criterion sentence_prediction_rdrop --rdrop-alpha 1.0", dict()),
}


def test_each_method_is_pinned():
    assert list(PINNED) == list(METHODS)
    for name, m in METHODS.items():
        flags, facts = PINNED[name]
        assert " ".join(m.all_flags(at_defaults(m))) == flags, name
        assert (m.model, m.restore, m.task, m.lr) == (facts.get("model"), facts.get("restore", True),
                                                      facts.get("task"), facts.get("lr")), name


def test_compositions_are_recadam_plus_the_method():
    """recadam-X is X's flags with RecAdam's optimizer and knobs; recadam+X names it too."""
    rec = METHODS["recadam"]
    for name, m in METHODS.items():
        if not m.composed_of:
            # a record of its own: only recadam-ewc (EWC in RecAdam's pull) is named like RecAdam + a method
            assert not (name.startswith("recadam-") and name[8:] in METHODS) or name == "recadam-ewc", name
            continue
        x = METHODS[m.composed_of]
        assert name == f"recadam-{x.name}"
        v = {**at_defaults(x), **at_defaults(rec), "eps": "2e-05"}
        got, want = pairs(m.all_flags(v)), {**pairs(x.all_flags(v)), **pairs(rec.all_flags(v))}
        want.pop("--recadam-anneal-w", None)  # LLRD's and ChildTuning's plain Adam is RecAdam's w = 1 now
        assert got == want, name
        assert m.base == "recadam" and catalogue.get(f"recadam+{x.name}") is m
        assert m.run_name(v).startswith(f"{name}-k0.1-t1000")
    with pytest.raises(catalogue.UnknownMethod, match="lora does not combine with RecAdam"):
        catalogue.with_recadam(METHODS["lora"])
    with pytest.raises(catalogue.UnknownMethod, match="unknown method 'sgd'; known: adam, recadam, "):
        catalogue.get("sgd")
    with pytest.raises(catalogue.UnknownMethod, match=r"^unknown method 'recadm' \(did you mean 'recadam'\?\); known: "):
        catalogue.get("recadm")


def test_run_names_keep_their_old_form():
    """The run directories users already have: knobs named only off their default, RecAdam's first."""
    m = METHODS["recadam-fsam"]
    v = at_defaults(m)
    assert m.run_name(v) == "recadam-fsam-k0.1-t1000-rho0.05"
    assert m.run_name({**v, "gamma": "1000", "anneal_fun": "linear", "mask_iter_e": "5"}) == \
        "recadam-fsam-k0.1-t1000-g1000-linear-rho0.05"
    assert METHODS["lora"].run_name(at_defaults(METHODS["lora"])) == "lora-r8-a8"
    # R3F's λ named off its default (two λs shared one directory before), so a default run keeps its name
    assert (METHODS["r3f"].run_name({"lambda": "0.7"}), METHODS["r3f"].run_name({"lambda": "0.2"})) == ("r3f", "r3f-lambda0.2")
    # read back (scripts/glue/summarize.py): each method's knobs as named, at the defaults and off them
    for m in METHODS.values():
        for values in (at_defaults(m), {k: KNOBS[k].off_default for k in m.knobs}):
            named = {k: KNOBS[k].name_part(v) if KNOBS[k].name_part else v for k, v in values.items()
                     if KNOBS[k].tag is not None and not (KNOBS[k].tag_if_changed and v == KNOBS[k].default)}
            assert catalogue.parse_run_name(m.run_name(values)) == (m.name, named), m.name
    assert catalogue.parse_run_name("recadam-k1e-05-t100") == ("recadam", {"k": "1e-05", "t0": "100"})
    assert catalogue.parse_run_name("recadam-k0.1-x") == ("recadam", {})  # settings it cannot read: none
    assert catalogue.parse_run_name("sgd-k0.1") == ("sgd-k0.1", {})  # no method: the whole name
    with pytest.raises(ValueError, match=r"^RHO='x' is not a number$"):
        KNOBS["rho"].check("x")
    with pytest.raises(ValueError, match=r"^REINIT='1.5' is not an integer$"):
        KNOBS["reinit"].check("1.5")


def test_every_method_parses_in_fairseq():
    """Every flag the catalogue writes is a flag of fairseq or of the plug-in, for every method at its
    defaults; a knob the scripts leave implicit has the flag's own default."""
    from fairseq import options

    import recadam_fairseq

    recadam_fairseq.register()
    for m in METHODS.values():
        if m.task:  # glue_multitask's flags need its data directory: tests/test_glue_multitask.py
            continue
        arch = "roberta_ft" if m.needs_ft else "ca_mtl_roberta" if m.model else "roberta"
        crit = [] if m.criterion else ["--criterion", "sentence_prediction"]
        argv = ["data", "--user-dir", USER_DIR, "--task", "sentence_prediction", "--arch", arch, *crit,
                *m.all_flags({k: KNOBS[k].default for k in m.knobs})]
        args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
        for k in m.knobs:
            if KNOBS[k].implicit:
                dest = KNOBS[k].flag[2:].replace("-", "_")
                assert str(getattr(args, dest)) == str(float(KNOBS[k].default)), (m.name, k)


def test_seq2seq_methods_parse_on_translation_and_the_script_lists_them():
    """scripts/seq2seq/finetune.sh's METHODs: each parses on --task translation with its GLUE criterion's twin; the
    script's usage and docs/seq2seq.md name exactly them."""
    import re

    from fairseq import options

    import recadam_fairseq

    recadam_fairseq.register()
    seq2seq = catalogue.names(scripts=True, seq2seq=True)
    for name in seq2seq:
        m = METHODS[name]
        f = m.flags({k: KNOBS[k].default for k in m.knobs})
        argv = ["data", "--user-dir", USER_DIR, "--task", "translation", "--arch", "transformer", "--criterion",
                m.seq2seq_criterion, *f["optimizer"], *f["extra"], *f["criterion"]]
        args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
        assert args.criterion.startswith("label_smoothed_cross_entropy_") and args.optimizer == f["optimizer"][1]
    assert not {"r4f", "reinit", "lora", "mixout", "ewc", "recadam-ewc", "ca-mtl"} & set(seq2seq)
    root = os.path.dirname(USER_DIR)
    usage = subprocess.run([os.path.join(root, "scripts", "seq2seq", "finetune.sh"), "--help"], capture_output=True,
                           text=True, env=dict(os.environ, PYTHON=sys.executable), check=True).stdout
    listed = re.search(r"^METHOD \(the catalogue.*?\n(.*?)^The methods' knobs", usage, re.S | re.M).group(1)
    assert listed.split() == seq2seq
    page = open(os.path.join(root, "docs", "seq2seq.md")).read()
    listed = re.search(r"Its\nmethods: (.*?) \(`scripts", page, re.S).group(1)
    assert listed.replace(",", " ").split() == seq2seq


def test_benchmarks_and_gpu_pass_read_the_catalogue():
    """scripts/bench_methods.py and the GPU pass (scripts/gpu/e2e_overhead.py, through the comparison's
    specs): each benchmarked method's command holds the catalogue's flags for it."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_methods.py"), "--list"],
                       capture_output=True, text=True, check=True)
    seen = set()
    for rows in json.loads(p.stdout).values():
        for label, name, values, flags, extra in rows:
            m = catalogue.get(name)
            want = m.all_flags({**at_defaults(m), **values}) + (["--arch", "roberta_ft"] if m.needs_ft else [])
            assert flags == want + extra, label
            seen.add(m.name)
    assert {"sam", "fsam", "recadam-fsam", "llrd", "reinit", "lora", "mixout", "childtune-d", "rdrop"} <= seen
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu", "e2e_overhead.py"), "--list",
                        "--size", "tiny", "--methods", *e2e_methods()], capture_output=True, text=True, check=True)
    for label, (spec, cmd) in json.loads(p.stdout).items():
        s = comparison.parse(spec)
        m = catalogue.get(s["method"])
        want = pairs(m.all_flags(comparison_values(s)))
        got = pairs(cmd[1:], last=True)  # after the data directory
        assert {k: got.get(k) for k in want} == want, label


def e2e_methods():
    """The GPU pass's rows: each catalogue method's (its table's rows)."""
    from recadam_fairseq.bench import bench_rows

    return [v.label for m in METHODS for v in bench_rows.variants(m, "gpu")]


def comparison_values(s):
    """A parsed --methods spec as the catalogue's knob values (the comparison's pinned ones included)."""
    m = catalogue.get(s["method"])
    values = {k: v for k, v in comparison.PINNED.items() if k in m.knobs}
    values.update({k: comparison.fmt(s[k]) for k in comparison.METHODS[s["method"]]})
    return values


def test_comparison_reads_the_catalogue():
    """The comparison's --methods: every catalogue method's flags, at the comparison's values, are the
    catalogue's; the old spelling (recadam+r3f) names the same method, recorded under the catalogue's name."""
    for name, m in METHODS.items():
        s = comparison.parse(name)
        f = comparison.flags(s, 12)
        crit = (["--criterion", "glue_multitask"] if m.task else
                ["--criterion", m.criterion or "sentence_prediction", *m.flags(comparison_values(s))["criterion"]])
        got = pairs(f["optimizer"] + f["criterion"] + f["extra"])
        want = pairs(m.flags(comparison_values(s))["optimizer"] + crit + m.flags(comparison_values(s))["extra"]
                     + (["--lr", comparison.fmt(float(m.lr))] if m.lr else []))
        facts = PINNED[name][1]
        assert got == want and f["arch"] == facts.get("model") and f["restore"] == facts.get("restore", True), name
        assert all(comparison.parse(a) == s for a in m.aliases), name
    assert comparison.setting_name(comparison.parse("recadam+r3f")) == "recadam-r3f-k0.1-t40-g5000-lambda1"


def test_the_command_line(tmp_path):
    run = [sys.executable, "-m", "recadam_fairseq", "methods"]
    p = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, check=True)
    assert [line.split()[0] for line in p.stdout.splitlines()[1:len(METHODS) + 1]] == list(METHODS)
    p = subprocess.run(run + ["recadam+llrd"], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert "flags at the defaults: " + " ".join(METHODS["recadam-llrd"].all_flags(at_defaults(
        METHODS["recadam-llrd"]))) in p.stdout
    assert "run directory (scripts/glue/finetune.sh): recadam-llrd-k0.1-t1000-d0.9" in p.stdout
    p = subprocess.run(run + ["sgd"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "unknown method 'sgd'" in p.stderr


@pytest.mark.parametrize("page,start,end,kind", DOC_TABLES)
def test_docs_tables_are_current(page, start, end, kind):
    """README.md's and docs/glue.md's method tables are the catalogue's: regenerate them with
    ``python -m recadam_fairseq methods --write-docs``."""
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    block = text.split(start + "\n", 1)[1].split("\n" + end, 1)[0]
    assert block == RENDER[kind](), f"{page} is stale: python -m recadam_fairseq methods --write-docs"


# A method only this test has: one record (and its knob), registered in every interpreter the test starts
# (a sitecustomize on PYTHONPATH): each consumer's own code finds it in the catalogue.
THROWAWAY = """\
from recadam_fairseq import catalogue as c
c.KNOBS["throw"] = c.Knob("throw", "THROW", "0.5", float, "--throw", "a test's knob", tag="x", group="optimizer",
                          off_default="0.25", label="θ", bounds=("(0, 1)", "the throw"))
c.register(c.Method("throwaway", "a method only a test has", "adam", knobs=("throw",), multitask=True,
                    page="throwaway.md"), c.WithRecAdam("throwaway"))
# the consumers' own tables: the benchmarks' and the GPU pass's rows, the comparisons' routing
from recadam_fairseq.bench import bench_rows as b
b.ROWS.update({"throwaway": (b.GPU, b.Variant("regularisers", "throwaway 0.5")), "recadam-throwaway": (b.GPU,)})
"""
# what the comparisons and the docs' tables make of it, in one interpreter
PROBE = """\
import json
from recadam_fairseq.__main__ import RENDER
from recadam_fairseq.compare import plan, seq2seq
from recadam_fairseq.engine import methods
plan.COST["throwaway"] = 3
seq2seq.TRANSLATION["throwaway"] = None
grid = plan.make_grid(["throwaway:0.25", "recadam-throwaway:k=0.2,t0=30,throw=0.25"], 5000.0)
try:
    methods.flags(methods.parse("throwaway:1"), 12)
    refused = None
except methods.MethodError as e:
    refused = str(e)
print(json.dumps({"settings": [[methods.setting_name(s), methods.label(s), plan.cost(s["method"]),
                                methods.flags(s, 12, multitask=True)] for s in grid],
                  "refused": refused, "multitask": methods.MULTITASK_METHODS, "seq2seq": seq2seq.methods(),
                  "tables": {k: r() for k, r in RENDER.items()}}))
"""


def test_a_new_record_reaches_every_consumer(tmp_path):
    """ARCHITECTURE.md's worked example: a method is one record. The task scripts (finetune.sh's --help, its
    command and run directory, grid.sh, multitask.sh, seq2seq's finetune.sh), summarize.py, the comparison, the
    translation comparison, the benchmarks, the GPU pass and the docs' tables all take it from there."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(THROWAWAY)
    (tmp_path / "glue-bin" / "RTE-bin" / "input0").mkdir(parents=True)
    env = base_env(PYTHONPATH=f"{site}{os.pathsep}{ROOT}", PYTHON=sys.executable, DRY_RUN=1,
                   FAIRSEQ_TRAIN=f"{sys.executable} -m fairseq_cli.train", ROBERTA_PATH=tmp_path / "no-model.pt",
                   DATA_DIR=tmp_path / "glue-bin", ARCH="roberta_large", MAX_POSITIONS=512, FP16=0)

    def run(*cmd, **kw):
        return subprocess.run(cmd, capture_output=True, text=True, check=True, env=dict(env, **kw)).stdout

    glue, seq2seq = os.path.join(ROOT, "scripts", "glue"), os.path.join(ROOT, "scripts", "seq2seq")
    for script, multitask in (("finetune.sh", False), ("multitask.sh", True)):
        usage = run(os.path.join(glue, script), "--help").split("The methods' knobs")
        assert usage[0].split()[-2:] == ["throwaway", "recadam-throwaway"], script
        assert "THROW [0.5]  --throw: a test's knob (throwaway, recadam-throwaway)" in usage[1], script
    assert "throwaway recadam-throwaway" in run(os.path.join(seq2seq, "finetune.sh"), "--help")
    # finetune.sh's command and run directory; grid.sh: the (k, t0) grid for RecAdam + it
    run(os.path.join(glue, "finetune.sh"), "RTE", "throwaway", THROW="0.25", SAVE_DIR=str(tmp_path / "one"))
    command = open(tmp_path / "one" / "RTE" / "throwaway-x0.25" / "seed1" / "command.sh").read()
    assert "--optimizer adam \\\n  --throw 0.25 \\\n" in command
    runs = tmp_path / "grid"
    run(os.path.join(glue, "grid.sh"), "RTE", METHODS="throwaway recadam-throwaway", KS="0.1", T0S="100 200",
        SAVE_DIR=str(runs))
    names = sorted(os.listdir(runs / "RTE"))
    assert names == ["recadam-throwaway-k0.1-t100-x0.5", "recadam-throwaway-k0.1-t200-x0.5", "throwaway-x0.5"]
    # summarize.py reads the runs' names back
    for name in names:
        (runs / "RTE" / name / "seed1" / "train.log").write_text(
            '2026-01-01 | INFO | valid | {"epoch": 1, "valid_accuracy": "50", "valid_num_updates": "1"}\n')
        (runs / "RTE" / name / "seed1" / "done").write_text("")
    run(sys.executable, os.path.join(glue, "summarize.py"), str(runs))
    rows = {r.split(",")[2]: r.split(",")[1:5] for r in open(runs / "runs.csv").read().splitlines()[1:]}
    assert rows == {"x0.5": ["throwaway", "x0.5", "", ""], "k0.1-t100-x0.5": ["recadam-throwaway", "k0.1-t100-x0.5",
                                                                                "0.1", "100"],
                    "k0.1-t200-x0.5": ["recadam-throwaway", "k0.1-t200-x0.5", "0.1", "200"]}
    # the comparison (its plan, flags, labels, bounds, run order), the translation comparison, the docs' tables
    got = json.loads(run(sys.executable, "-c", PROBE))
    (one, label, cost, flags), (rec, _, _, rec_flags) = got["settings"]
    assert (one, label, cost) == ("throwaway-x0.25", "throwaway θ=0.25", 3)
    assert flags["optimizer"] == ["--optimizer", "adam", "--throw", "0.25"] and flags["task"][1] == "glue_multitask"
    assert rec == "recadam-throwaway-k0.2-t30-g5000-x0.25" and rec_flags["optimizer"][-2:] == ["--throw", "0.25"]
    assert got["refused"] == "--methods throwaway-x1: the throw must be in (0, 1)"
    assert {"throwaway", "recadam-throwaway"} <= set(got["multitask"])
    assert ["throwaway", "throwaway", []] in got["seq2seq"]
    assert "| throwaway | a method only a test has | `throwaway` | `--optimizer adam --throw 0.5` | " \
           "[throwaway.md](docs/throwaway.md) |" in got["tables"]["readme"]
    assert "`throwaway`" in got["tables"]["readme"].splitlines()[-1]  # RecAdam combines with it
    assert "| `throwaway` | `--optimizer adam --throw $THROW` | `THROW` [0.5] | `throwaway-x$THROW` | adam |" \
        in got["tables"]["glue"]
    # the benchmarks' set and the GPU pass: its rows, against its base's
    bench = json.loads(run(sys.executable, os.path.join(ROOT, "scripts", "bench_methods.py"), "--list"))
    assert ["throwaway 0.5", "throwaway", {}, ["--optimizer", "adam", "--throw", "0.5"], []] in bench["regularisers"]
    gpu = json.loads(run(sys.executable, os.path.join(ROOT, "scripts", "gpu", "e2e_overhead.py"), "--list", "--size",
                         "tiny", "--methods", "recadam-throwaway", "throwaway"))
    assert list(gpu) == ["adam", "recadam", "recadam-throwaway", "throwaway"]
    assert gpu["recadam-throwaway"][0] == "recadam-throwaway:t0=250" and "--throw" in gpu["recadam-throwaway"][1]


def test_no_module_but_the_catalogue_lists_methods():
    """The catalogue is the only list of methods: no module of the package or scripts/ holds more than three of
    their names as string literals (prose that mentions them aside; the comparison's plan of settings holds two),
    but a consumer's own routing table, keyed by the catalogue's names (each key one of its methods: a renamed
    method cannot drop out of a benchmark or a comparison unseen)."""
    from recadam_fairseq.compare import plan, seq2seq
    from recadam_fairseq.bench import bench_rows

    names = set(METHODS)
    tables = {os.path.join("recadam_fairseq", "bench", "bench_rows.py"): bench_rows.ROWS,
              os.path.join("recadam_fairseq", "compare", "seq2seq.py"): seq2seq.TRANSLATION,
              os.path.join("recadam_fairseq", "compare", "plan.py"): plan.COST}
    for path, table in tables.items():
        assert set(table) <= names, (path, set(table) - names)
    allowed = {os.path.join("recadam_fairseq", "catalogue.py"), *tables}
    found = {}
    for top in ("recadam_fairseq", "scripts", "data-prep"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)
                if f.endswith(".py") and rel not in allowed:
                    with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
                        tree = ast.parse(fh.read())
                    named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names}
                    if len(named) > 3:
                        found[rel] = sorted(named)
    assert not found, found
