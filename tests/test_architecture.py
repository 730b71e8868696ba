"""The shape ARCHITECTURE.md describes, checked: the core imports no fairseq, every flag is declared
once (the components' dataclass fields, the models' argparse flags), the folders import one way, a module's
name is its own, and nothing in the package patches fairseq or leaves a global hook in place (but the one
``sys.excepthook`` of plumbing/errors_hook.py)."""

import ast
import dataclasses
import glob
import os
import subprocess
import sys

from helpers import ROOT

PACKAGE = os.path.join(ROOT, "recadam_fairseq")
EVENTS = os.path.join("recadam_fairseq", "plumbing", "events.py")
ADAPTERS = {"optim", "criterions", "tasks", "models", "meters", "plumbing"}  # the fairseq adapters' folders
# folders without a flag: the core, the comparison, the tools and their rooms, the launcher
NO_FLAGS = ("core", "compare", "tools", "prepare", "use", "bench", "tiny", "launch")
CORE = sorted(os.path.relpath(p, ROOT)[:-3].replace(os.sep, ".")
              for p in glob.glob(os.path.join(PACKAGE, "core", "*.py")))


def sources():
    for path in sorted(glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            yield os.path.relpath(path, ROOT), ast.parse(f.read(), path)


def test_every_core_module_imports_without_fairseq():
    """Each module of recadam_fairseq/core in a fresh interpreter where ``import fairseq`` fails."""
    assert len(CORE) >= 15, CORE
    code = ("import importlib, sys\n"
            "sys.modules['fairseq'] = None  # import fairseq -> ImportError\n"
            f"for name in {CORE!r}:\n"
            "    importlib.import_module(name)\n"
            "assert not [m for m in sys.modules if m.startswith('fairseq.')]\n"
            "print('ok')\n")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def _field_declarations():
    """(file, class, flag name, how) for every dataclass field of the adapters (the core has no flags: it
    imports no fairseq): how = "field" for a declaration with its own metadata, "redefault" for one taken
    from another dataclass, "II" for a value read from another config node."""
    for path, tree in sources():
        if path.startswith(tuple(os.path.join("recadam_fairseq", d) for d in NO_FLAGS)) or \
                path == os.path.join("recadam_fairseq", "catalogue.py"):
            continue  # the core has no flags; the other folders of NO_FLAGS and the catalogue are no fairseq component
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    call = stmt.value
                    how = call.func.id if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) else "value"
                    yield path, cls.name, stmt.target.id, how


def _fairseq_flag_names():
    """The names of fairseq's own flags the plug-in's components sit beside: its config groups, the dataclasses
    the plug-in's components extend, and the argparse flags of RoBERTa, which the plug-in's models extend."""
    import argparse

    from fairseq.criterions.sentence_prediction import SentencePredictionConfig
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.models.roberta import RobertaModel
    from fairseq.optim.adam import FairseqAdamConfig
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig as SentencePredictionTaskConfig

    names = set()
    for dc in (SentencePredictionConfig, SentencePredictionTaskConfig, FairseqAdamConfig):
        names |= {f.name for f in dataclasses.fields(dc)}
    for group in dataclasses.fields(FairseqConfig):
        if dataclasses.is_dataclass(group.default_factory if group.default_factory is not dataclasses.MISSING
                                    else None):
            names |= {f.name for f in dataclasses.fields(group.default_factory)}
    roberta = argparse.ArgumentParser(add_help=False)
    RobertaModel.add_args(roberta)
    return names | {a.dest for a in roberta._actions}


def _model_flags():
    """(file, line, option strings, help text or None) of every ``add_argument`` in models/: fairseq 0.12's
    models take argparse flags (``add_args``), not dataclass fields."""
    for path, tree in sources():
        if not path.startswith(os.path.join("recadam_fairseq", "models") + os.sep):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                options = [a.value for a in node.args if isinstance(a, ast.Constant)]
                given = next((k.value for k in node.keywords if k.arg == "help"), None)
                help_text = given.value if isinstance(given, ast.Constant) else (
                    ast.unparse(given) if given is not None else None)
                yield path, node.lineno, options, help_text


def test_every_flag_is_declared_once():
    """A flag (a dataclass field with help) is declared with field(...) in one place; a component whose
    default differs, or that takes another's flag, uses config.redefault (same help, one declaration);
    fairseq's own flags (fairseq's dataclasses) are never declared again here."""
    fairseq_names = _fairseq_flag_names()
    # glue_multitask's data is a directory of <TASK>-bin directories, not sentence_prediction's one: its own help
    meaning_differs = {"data"}
    own = {}
    problems = []
    for path, cls, name, how in _field_declarations():
        if how == "field":
            if name in own:
                problems.append(f"{name}: declared in {own[name]} and {path}:{cls}")
            own[name] = f"{path}:{cls}"
            if name in fairseq_names and name not in meaning_differs:
                problems.append(f"{name} ({path}:{cls}) is fairseq's flag: take it with config.redefault")
        elif how not in ("redefault", "II"):
            problems.append(f"{name} ({path}:{cls}): declared with {how}, not field/redefault/II")
    assert not problems, "\n".join(problems)
    assert {"recadam_anneal_k", "sam_type", "r3f_lambda", "rdrop_alpha", "mt_tasks"} <= set(own)


def test_every_model_flag_has_help_and_is_declared_once():
    """The models' flags (argparse, ``add_args``): each with a help text, under a name that no other flag of the
    package (a model's or a dataclass field) and none of fairseq's has."""
    fairseq_names = _fairseq_flag_names()
    own = {name: f"{path}:{cls}" for path, cls, name, how in _field_declarations() if how == "field"}
    problems = []
    for path, line, options, help_text in _model_flags():
        where = f"{path}:{line}"
        if len(options) != 1 or not str(options[0]).startswith("--"):
            problems.append(f"{where}: {options}: one --long-option per flag")
            continue
        name = options[0][2:].replace("-", "_")
        if not (help_text or "").strip():
            problems.append(f"{where}: {options[0]} has no help")
        if name in own:
            problems.append(f"{options[0]}: declared in {own[name]} and {where}")
        if name in fairseq_names:
            problems.append(f"{options[0]} ({where}) is fairseq's flag")
        own[name] = where
    assert not problems, "\n".join(problems)
    assert {"reinit_layers", "lora_rank", "mixout", "ca_mtl_cln_layers", "ca_mtl_no_alignment"} <= set(own)


def test_every_registered_component_parses_and_flags_agree():
    """Every component the plug-in registers, built from fairseq's argparse: the help of a flag that several
    components share is one text (one declaration)."""
    from fairseq import options

    import recadam_fairseq

    recadam_fairseq.register()
    combos = [["--optimizer", "recadam", "--criterion", "sentence_prediction_recadam"],
              ["--optimizer", "samsgd", "--criterion", "sentence_prediction_r3f"],
              ["--optimizer", "recadam", "--criterion", "glue_multitask", "--task", "glue_multitask", "--mt-tasks",
               "RTE", "--arch", "ca_mtl_roberta_tiny"],
              ["--optimizer", "adam", "--criterion", "label_smoothed_cross_entropy_r3f", "--task", "translation",
               "--arch", "transformer"],
              ["--optimizer", "samsgd", "--criterion", "sentence_prediction_rdrop"],
              ["--optimizer", "adam", "--criterion", "label_smoothed_cross_entropy_rdrop", "--task", "translation",
               "--arch", "transformer"],
              ["--optimizer", "recadam", "--criterion", "label_smoothed_cross_entropy_recadam", "--task", "translation",
               "--arch", "transformer"]]
    helps = {}
    for extra in combos:
        parser = options.get_training_parser()
        argv = ["data", "--task", "sentence_prediction", "--arch", "roberta", *extra]
        args = options.parse_args_and_arch(parser, input_args=argv, parse_known=True)[0]
        assert args.optimizer == extra[1]
        for action in parser._actions:
            for opt in action.option_strings:
                if opt.startswith("--"):
                    helps.setdefault(opt, set()).add(action.help)
    shared = {k: v for k, v in helps.items() if len(v) > 1 and k.startswith(("--recadam", "--r3f", "--rdrop", "--rho",
                                                                               "--sam", "--eps", "--noise"))}
    assert not shared, shared


# fairseq objects' methods that a plug-in could be tempted to replace on an instance or class
def _fairseq_method_names():
    import torch
    from fairseq.criterions import FairseqCriterion
    from fairseq.models import BaseFairseqModel
    from fairseq.optim import FairseqOptimizer
    from fairseq.tasks import FairseqTask
    from fairseq.trainer import Trainer

    names = set()
    for cls in (FairseqCriterion, BaseFairseqModel, FairseqOptimizer, FairseqTask, Trainer, torch.nn.Module):
        names |= {n for n in dir(cls) if not n.startswith("__") and callable(getattr(cls, n, None))}
    return names


GLOBAL_HOOKS = ("register_module_forward_pre_hook", "register_module_forward_hook", "register_module_full_backward_hook",
                "register_module_full_backward_pre_hook", "register_module_backward_hook",
                "register_module_buffer_registration_hook", "register_module_module_registration_hook",
                "register_module_parameter_registration_hook", "register_optimizer_step_pre_hook",
                "register_optimizer_step_post_hook")


# the interpreter's own process-wide hooks: set by assignment, or by a call
PROCESS_HOOKS = ("sys.excepthook", "sys.unraisablehook", "sys.displayhook", "threading.excepthook")
PROCESS_HOOK_CALLS = ("sys.settrace", "sys.setprofile", "sys.addaudithook", "threading.settrace")
ERRORS_HOOK = os.path.join("recadam_fairseq", "plumbing", "errors_hook.py")


def test_nothing_patches_fairseq_and_no_global_hook_outside_events():
    """No assignment to a method of another object (``task.train_step = ...``) anywhere in the package; torch's
    process-global hooks only in plumbing/events.py, inside the function that removes its hook on first use; of the
    interpreter's process-wide hooks, only plumbing/errors_hook.py's ``sys.excepthook`` (ARCHITECTURE.md says
    why it stays)."""
    methods = _fairseq_method_names()
    problems = []
    for path, tree in sources():
        functions = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in GLOBAL_HOOKS:
                if path != EVENTS:
                    problems.append(f"{path}:{node.lineno}: {node.attr} outside {EVENTS}")
            if isinstance(node, ast.Call) and ast.unparse(node.func) in PROCESS_HOOK_CALLS:
                problems.append(f"{path}:{node.lineno}: {ast.unparse(node.func)}")
            if not isinstance(node, ast.Assign):
                continue
            for t in node.targets:
                hook = ast.unparse(t)
                if hook in PROCESS_HOOKS and (hook, path) != ("sys.excepthook", ERRORS_HOOK):
                    problems.append(f"{path}:{t.lineno}: sets {hook}")
            value = node.value  # a function put in place of a method: a lambda, a def of this file, a partial
            is_function = isinstance(value, ast.Lambda) or (isinstance(value, ast.Name) and value.id in functions) or (
                isinstance(value, ast.Call) and "partial" in ast.unparse(value.func))
            for t in node.targets:
                if isinstance(t, ast.Attribute) and t.attr in methods and is_function and not (
                        isinstance(t.value, ast.Name) and t.value.id == "self"):
                    problems.append(f"{path}:{t.lineno}: assigns {ast.unparse(t)} = {ast.unparse(value)}")
    assert not problems, "\n".join(problems)
    # events.py: the global hook is registered inside on_first_training_call and removed by its own first call
    events = dict(sources())[EVENTS]
    funcs = [n for n in events.body if isinstance(n, ast.FunctionDef) and any(
        isinstance(x, ast.Attribute) and x.attr in GLOBAL_HOOKS for x in ast.walk(n))]
    assert [f.name for f in funcs] == ["on_first_training_call"]
    assert "remove" in ast.unparse(funcs[0])


def _folder_imports():
    """{folder: {folder it imports: [files]}} over the package's folders (core/, optim/, ..., tools/): every import,
    at module level or inside a function, absolute or relative."""
    folders = {d for d in os.listdir(PACKAGE) if os.path.isfile(os.path.join(PACKAGE, d, "__init__.py"))}
    edges = {}
    for path, tree in sources():
        parts = path[:-3].split(os.sep)  # recadam_fairseq, folder, module
        if len(parts) < 3:
            continue  # the package root: its face
        here = parts[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level + 1] if node.level else []
                mod = base + (node.module.split(".") if node.module else [])
                names = [mod + [a.name] for a in node.names] if len(mod) == 1 else [mod]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".") for a in node.names]
            else:
                continue
            for name in names:
                if name[0] == "recadam_fairseq" and len(name) > 1 and name[1] in folders and name[1] != parts[1]:
                    edges.setdefault(parts[1], {}).setdefault(name[1], []).append(path)
    return folders, edges


def test_folders_import_one_way():
    """The package's folders form layers (ARCHITECTURE.md): no folder imports another that imports it back, directly
    or through others."""
    folders, edges = _folder_imports()
    assert {"core", "plumbing", "meters", "criterions", "optim", "compare", "tools", "prepare", "use", "bench", "tiny",
            "engine"} <= folders
    assert edges.get("core", {}) == {}, edges.get("core")
    problems = []

    def walk(folder, trail):
        for nxt, files in sorted(edges.get(folder, {}).items()):
            if nxt in trail:
                loop = trail[trail.index(nxt):] + [nxt]
                problems.append(" -> ".join(loop) + f" ({folder} -> {nxt}: {sorted(set(files))[0]})")
            else:
                walk(nxt, trail + [nxt])

    for f in sorted(folders):
        walk(f, [f])
    assert not problems, "\n".join(sorted(set(problems)))


# names that two modules may share (ARCHITECTURE.md): fairseq's name of a task and a criterion registered together
REGISTERED_TWICE = {"glue_multitask.py": {"criterions", "tasks"}}


def test_module_names_are_unique_but_the_core_adapter_mirror():
    """No two modules of the package share a name, except the math in core/ and its fairseq adapter of the same
    name in one adapter folder (core/layer_lr.py, optim/layer_lr.py), and a task and a criterion fairseq registers
    under one name."""
    where = {}
    for path, _ in sources():
        parts = path.split(os.sep)
        if parts[-1] != "__init__.py":
            where.setdefault(parts[-1], []).append(parts[1] if len(parts) > 2 else "(root)")
        elif len(parts) > 2:  # a folder's name is taken too (prepare/ and a prepare.py would read as one)
            where.setdefault(parts[-2] + ".py", []).append("(a folder)")
    problems = []
    for name, folders in sorted(where.items()):
        if len(folders) == 1:
            continue
        mirror = len(folders) == 2 and "core" in folders and set(folders) - {"core"} <= ADAPTERS
        if not mirror and set(folders) != REGISTERED_TWICE.get(name):
            problems.append(f"{name}: in {', '.join(sorted(folders))}")
    assert not problems, "\n".join(problems)


def test_no_module_is_over_500_lines():
    """A module does one thing: none of the package's is over 500 lines (split one that grows past it)."""
    lengths = {path: sum(1 for _ in open(os.path.join(ROOT, path), encoding="utf-8")) for path, _ in sources()}
    assert max(lengths.values()) > 400 and not {p: n for p, n in lengths.items() if n > 500}


def test_no_module_is_loaded_by_file_path():
    """Code shared between scripts lives in the package and is imported: no importlib.util.spec_from_file_location
    (nor a sys.path entry for a scripts/ folder) anywhere in the repository."""
    problems = []
    for path in sorted(glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)):
        name = os.path.relpath(path, ROOT).replace(os.sep, "/")
        if name.startswith((".venv/", "build/")):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location":
                problems.append(f"{name}:{node.lineno}: spec_from_file_location")
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.path.insert" and "scripts" in ast.unparse(node):
                problems.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not problems, "\n".join(problems)
