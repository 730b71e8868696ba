"""One builder of fairseq-train's arguments (recadam_fairseq/launch): the tiny model's runs (launch/tiny_train.py) as
the demos, the benchmarks, the GPU pass and tests/helpers' Tiny build them, and scripts/fisher.py's command
(recipe.fisher_command), frozen as each built its own before they moved there: the demos' documented results
(docs/ewc.md's table) and the GPU pass's recorded commands stay the same runs. The comparisons' commands are checked
against their records (tests/test_forgetting.py, tests/test_seq2seq_comparison.py)."""

import ast
import hashlib
import json
import os
import sys
import types

import pytest

from helpers import ROOT, Tiny, tiny_classifier_args

from recadam_fairseq.bench import bench_methods, e2e as bench_e2e, e2e_overhead
from recadam_fairseq.launch import demo, tiny_train

# sha256 of each argv (JSON, the checkout as <REPO>, the interpreter as <PYTHON>), its first 16 hex digits, as the
# builders wrote them before the move (launch/demo.py, tiny/tiny_train.py, bench/e2e_overhead.py, bench/e2e.py,
# bench/bench_methods.py)
FROZEN = {
    "demo/adam": "a6d4474eec8d5545",
    "demo/recadam": "00be0d5b350a0ab3",
    "ewc-demo/adam": "bcd8753b7111bd49",
    "ewc-demo/recadam": "62c2fac807d17858",
    "ewc-demo/ewc": "753413ee77781ad0",
    "ewc-demo/recadam-ewc": "e8e27487d6f752c7",
    "ewc-demo/fisher": "fb135f96cfdc22e1",
    "gpu-pass/base/adam": "0856420fc22bf5f0",
    "gpu-pass/base/recadam": "0084f848b4b91234",
    "gpu-pass/base/recadam-bf16-anchor": "9727af6a572c6192",
    "gpu-pass/base/recadam-cudagraph": "6fbf2be20a2f1fa5",
    "gpu-pass/base/recadam-coupled": "3df6dc38f3278a91",
    "gpu-pass/base/ewc": "6fb0c1c3654937be",
    "gpu-pass/base/recadam-ewc": "8d46d1a086510b8b",
    "gpu-pass/base/r3f": "f1ea4db6b3adebdc",
    "gpu-pass/base/r4f": "16d73c008d374e9d",
    "gpu-pass/base/recadam-r3f": "5140e2a85267c9c9",
    "gpu-pass/base/sam": "001d4e35e6781049",
    "gpu-pass/base/fsam": "774e1920af5e3dd2",
    "gpu-pass/base/recadam-fsam": "323eaee883a8b327",
    "gpu-pass/base/mt-roberta": "507857ebe7a13f06",
    "gpu-pass/base/ca-mtl": "172b1fe5bfd3e294",
    "gpu-pass/base/llrd": "cba281c724728e00",
    "gpu-pass/base/recadam-llrd": "ec421e117a49529f",
    "gpu-pass/base/reinit": "697109cebc4f7b0d",
    "gpu-pass/base/lora": "e0cc901b47a9b43c",
    "gpu-pass/base/mixout": "a743dc30b9a2d5fd",
    "gpu-pass/base/recadam-mixout": "4ff48e3b3dc52f22",
    "gpu-pass/base/childtune-d": "49cd37477e361553",
    "gpu-pass/base/recadam-childtune-d": "6b4d808d904658d4",
    "gpu-pass/base/rdrop": "d9b1015dbae91afb",
    "gpu-pass/base/recadam-rdrop": "47132c6987f7cf3f",
    "gpu-pass/base/start": "10208d512756627b",
    "gpu-pass/tiny/adam": "73cd8e2833575da2",
    "gpu-pass/tiny/recadam": "c680ff9287e3fcbe",
    "gpu-pass/tiny/recadam-bf16-anchor": "3315df45cf3eb4a1",
    "gpu-pass/tiny/recadam-cudagraph": "b2bd5ca575a17703",
    "gpu-pass/tiny/recadam-coupled": "617d936f6323a3cc",
    "gpu-pass/tiny/ewc": "ac19c50f6090d53a",
    "gpu-pass/tiny/recadam-ewc": "295012f064ee53bb",
    "gpu-pass/tiny/r3f": "b078315e7a17735c",
    "gpu-pass/tiny/r4f": "8d532e4267bd53df",
    "gpu-pass/tiny/recadam-r3f": "93db304f832a3845",
    "gpu-pass/tiny/sam": "c747b83c11750183",
    "gpu-pass/tiny/fsam": "05ef3e7dc9804350",
    "gpu-pass/tiny/recadam-fsam": "a20f5e09914c7266",
    "gpu-pass/tiny/mt-roberta": "42af2566bb1999ba",
    "gpu-pass/tiny/ca-mtl": "c7ec7f73814989e7",
    "gpu-pass/tiny/llrd": "668884685a3c44c8",
    "gpu-pass/tiny/recadam-llrd": "695977066c67ea15",
    "gpu-pass/tiny/reinit": "45b2aee54b9b0037",
    "gpu-pass/tiny/lora": "d8744f69e042df5e",
    "gpu-pass/tiny/mixout": "b7db7df578fb1999",
    "gpu-pass/tiny/recadam-mixout": "c3eda441ab5df6e0",
    "gpu-pass/tiny/childtune-d": "4154e361e38daf82",
    "gpu-pass/tiny/recadam-childtune-d": "8a3e1964b4c0b42c",
    "gpu-pass/tiny/rdrop": "e141f2be4570dd32",
    "gpu-pass/tiny/recadam-rdrop": "7e8b13bc3c97cc98",
    "gpu-pass/tiny/start": "5c83bfb3c24c3387",
    "bench-e2e/adam": "dd69ff0b147aee56",
    "bench-e2e/recadam": "bbe97156551c82a8",
    "bench-methods/sam/adam": "49113ce2bf941f50",
    "bench-methods/sam/sam": "b98ef876efc1650e",
    "bench-methods/sam/esam": "5406ba663efc908e",
    "bench-methods/sam/gsam": "dc11d447c0409d80",
    "bench-methods/sam/fisher-sam": "9b41b8f5093116c9",
    "bench-methods/sam/fisher-esam": "2f415094b19c7c49",
    "bench-methods/sam/fisher-gsam": "022bb419f0baeaae",
    "bench-methods/sam/recadam": "5594b8442733ed20",
    "bench-methods/sam/recadam+fisher-sam": "bc254eae553d6a0a",
    "bench-methods/baselines/adam": "49113ce2bf941f50",
    "bench-methods/baselines/adam (recadam w=0)": "a977d9ada9568151",
    "bench-methods/baselines/llrd 0.9": "dec9b552faeb62af",
    "bench-methods/baselines/reinit 1": "0cc56351d57fd18b",
    "bench-methods/baselines/lora r=8 (q, v)": "8f9e4c5e56ca4582",
    "bench-methods/baselines/lora r=8 (all six)": "a1348f51878606cd",
    "bench-methods/baselines/recadam": "5594b8442733ed20",
    "bench-methods/baselines/recadam+llrd 0.9": "4c6aef13433d2e71",
    "bench-methods/baselines/recadam+reinit 1": "013124ca2dea84ee",
    "bench-methods/regularisers/adam": "49113ce2bf941f50",
    "bench-methods/regularisers/adam (recadam w=0)": "a977d9ada9568151",
    "bench-methods/regularisers/mixout 0.9": "1549be2ec28de5ce",
    "bench-methods/regularisers/childtune-d 0.3": "a11d581c07e78541",
    "bench-methods/regularisers/childtune-f 0.3": "dd9f8269f3210d7d",
    "bench-methods/regularisers/rdrop 1": "8732e9e69782e241",
    "bench-methods/regularisers/recadam": "5594b8442733ed20",
    "bench-methods/regularisers/recadam+mixout 0.9": "bebcc489cebf9c71",
    "bench-methods/regularisers/recadam+childtune-d 0.3": "9ef38fb1103eca28",
    "bench-methods/regularisers/recadam+rdrop 1": "80404faf494764ef",
    "tiny/default": "7591ec98bd6e75e2",
    "tiny/adam": "ad9bbf3094d85478",
    "tiny/samsgd": "60b9a28a886c449b",
    "tiny/classifier": "536d6756d08a316f",
}


def _normal(argv):
    return [w.replace(sys.executable, "<PYTHON>").replace(ROOT, "<REPO>") for w in argv]


def _digest(argv):
    return hashlib.sha256(json.dumps(_normal(argv)).encode()).hexdigest()[:16]


def _captured(module, call):
    """The argv ``call()`` hands ``module``'s subprocess.run (nothing runs)."""
    seen = []

    def run(cmd, **kw):
        seen.append(cmd)
        raise StopIteration

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module.subprocess, "run", run)
        with pytest.raises(StopIteration):
            call()
    return seen[0]


def _masked_lm_start(work, size, precision, cpu):
    """The GPU pass's masked-LM start (make_setup's fairseq-train) in ``work``, as if in WORK (nothing binarized or
    trained)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(e2e_overhead, "preprocess", lambda args: None)
        argv = _captured(e2e_overhead, lambda: e2e_overhead.make_setup(work, size, 4, 1, cpu, precision))
    return [w.replace(work, "WORK") for w in argv]


def built(work):
    """{name: argv} of every frozen command, built now (``work``: where the GPU pass's setup writes its text)."""
    out = {}
    for m in ("adam", "recadam"):  # scripts/demo.sh's
        out[f"demo/{m}"] = demo.argv("OUT", m, f"OUT/{m}")
    for m in ("adam", "recadam", "ewc", "recadam-ewc"):  # scripts/ewc_demo.sh's
        out[f"ewc-demo/{m}"] = demo.argv("OUT", m, f"OUT/ewc/{m}", "OUT/ewc/mlm-fisher.pt", save=False)
    out["ewc-demo/fisher"] = tiny_train.masked_lm_fisher("OUT/tiny", "OUT/ewc/mlm-fisher.pt")
    setup = {"glue": "GLUE", "sentiment": "DATA", "pretrained": "PT"}
    for size, precision, cpu in (("base", "fp16", False), ("tiny", "fp32", True)):  # the GPU pass, its smoke run
        args = types.SimpleNamespace(size=size, precision=precision, updates=120, batch_size=32, log_interval=20,
                                     cpu=cpu)
        for name in e2e_overhead.CATALOGUE:
            out[f"gpu-pass/{size}/{name}"] = e2e_overhead.train_command(args, setup, name, "SAVE")
        out[f"gpu-pass/{size}/start"] = _masked_lm_start(work, size, precision, cpu)
    for name in bench_e2e.E2E:
        out[f"bench-e2e/{name}"] = _captured(bench_e2e, lambda: bench_e2e.e2e_train("TINY", name, 40, 4, 1))
    for s, rows in bench_methods.SETS.items():
        for name, _, method, values, extra in rows:
            flags = bench_methods.command_flags(method, values, extra)
            out[f"bench-methods/{s}/{name}"] = _captured(
                bench_methods, lambda: bench_methods.train("WORK", name, flags, 40, 16))
    t = Tiny("TINY")
    out["tiny/default"] = t.finetune_args("SAVE")
    out["tiny/adam"] = t.finetune_args("SAVE", "--fp16", "--x", optimizer="adam", updates=3)
    out["tiny/samsgd"] = t.finetune_args("SAVE", optimizer="samsgd", restore=False, validate=True, device="cuda",
                                         data="DATA")
    out["tiny/classifier"] = tiny_classifier_args() + ["|"] + tiny_classifier_args(False)
    return out


def test_the_moved_builders_build_what_they_built(tmp_path):
    now = built(str(tmp_path))
    missing = sorted(set(FROZEN) - set(now))
    assert not missing, f"no longer built: {missing}"
    changed = {k: _normal(now[k]) for k in FROZEN if _digest(now[k]) != FROZEN[k]}
    assert not changed, f"changed: {json.dumps(changed, indent=1)}"


# the modules whose runs launch/ builds: no fairseq-train flag of their own (the catalogue's and the recipe's); (a
# heuristic: fairseq-train's general flags and the plug-in's, outside the module's own add_argument)
CALLERS = ("launch/demo.py", "bench/e2e_overhead.py", "bench/e2e.py", "compare/runner.py", "compare/ewc_fisher.py",
           "compare/seq2seq.py")
# fairseq-train's flags those modules may still read or write: the GPU pass's reading of a row's anchor dtype,
# seq2seq.py's fairseq-validate
# the flags they read in a command: a GPU row's anchor dtype (its θ* bytes), a recorded run's --cpu (the same run
# on either device)
READ = {"bench/e2e_overhead.py": {"--recadam-anchor-dtype"}, "compare/runner.py": {"--cpu"}}


def test_the_callers_name_no_fairseq_train_flag():
    from fairseq import options

    parser = options.get_training_parser()
    known = {s for a in parser._actions for s in a.option_strings if s.startswith("--")}
    found = {}
    for rel in CALLERS:
        with open(os.path.join(ROOT, "recadam_fairseq", rel), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        own = {id(a) for n in ast.walk(tree)  # the module's own command line
               if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument" for a in n.args}
        words = {n.value for n in ast.walk(tree)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in own}
        flags = {w for w in words if w in known or w.startswith(("--recadam", "--ewc", "--forgetting"))}
        if flags - READ.get(rel, set()):
            found[rel] = sorted(flags - READ.get(rel, set()))
    assert not found, found
