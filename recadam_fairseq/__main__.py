"""``python -m recadam_fairseq``: the plug-in's own command line.

    python -m recadam_fairseq --user-dir          the directory to pass to fairseq's --user-dir
    python -m recadam_fairseq methods             every method of the catalogue, one line each
    python -m recadam_fairseq methods NAME        one method: its knobs, flags, model, base, run directory
                                                  (wise-ft: the tool on a finished run that WiSE-FT is)
    python -m recadam_fairseq methods --write-docs   the method tables of README.md and docs/glue.md
"""

import argparse
import os
import sys

from . import catalogue
from .catalogue import KNOBS, METHODS, MODELS, TOOLS

HERE = os.path.dirname(os.path.abspath(__file__))
# the generated tables: (page, start marker, end marker, renderer)
DOC_TABLES = (("README.md", "<!-- methods:start -->", "<!-- methods:end -->", "readme"),
              ("docs/glue.md", "<!-- glue-methods:start -->", "<!-- glue-methods:end -->", "glue"),
              ("docs/search.md", "<!-- search-spaces:start -->", "<!-- search-spaces:end -->", "search"))


def placeholders(m: catalogue.Method) -> dict:
    """Each knob as its variable (``$K``), for the docs' flags."""
    return {k: f"${KNOBS[k].var}" for k in m.knobs}


def run_dir_pattern(m: catalogue.Method) -> str:
    """``recadam-llrd-k$K-t$T0[-g$GAMMA][-$ANNEAL_FUN]-d$LLRD``: the run name with its variables; the parts
    named only when not at their default in brackets."""
    name = m.run_name(placeholders(m))
    for k in m.knobs:
        knob = KNOBS[k]
        if knob.tag_if_changed:
            shown = f"<name of ${knob.var}>" if knob.name_part else f"${knob.var}"
            name = name.replace(f"-{knob.tag}${knob.var}", f"[-{knob.tag}{shown}]")
    return name


def flag_text(m: catalogue.Method, values: dict) -> str:
    """The method's flags, its task, model and lr included; a flag added only when its variable is set
    in brackets."""
    text = " ".join(m.all_flags(values))
    for k in m.knobs:
        knob = KNOBS[k]
        if knob.implicit and k in values:
            text = text.replace(f"{knob.flag} {values[k]}", f"[{knob.flag} {values[k]}]")
    text += f" --task {m.task}" if m.task else ""
    text += f" --arch {m.model}_*" if m.model else ""
    return text + (f" --lr {m.lr}" if m.lr else "")


def space_text(s: catalogue.Space, choices=()) -> str:
    """A knob's search range in words: ``0.01 to 1 (log)``, a word knob's ``choices`` (``sigmoid | linear``)."""
    if choices:
        return " | ".join(choices)
    return f"{s.low} to {s.high}" + (" of the run's updates" if s.relative else "") + (" (log)" if s.log else "")


def describe(m: catalogue.Method) -> str:
    """One method, for the command line."""
    lines = [f"{m.name}: {m.summary}"]
    where = "fairseq's RoBERTa" if not m.model else MODELS[m.model]
    criterion = m.criterion or "the command's own"
    lines.append(f"  base: {m.base or '-'}   model: {where}   criterion: {criterion}")
    lines.append(f"  task: {m.task or 'sentence_prediction'}   multi-task setting: {'yes' if m.multitask else 'no'}"
                 f"   task scripts: {'yes' if m.scripts else 'no (the comparison only)'}   page: docs/{m.page}")
    if m.knobs:
        lines.append("  knobs (variable [default], flag):")
        width = max(len(f"{KNOBS[k].var} [{KNOBS[k].default}]") for k in m.knobs)
        for k in m.knobs:
            knob = KNOBS[k]
            head = f"{knob.var} [{knob.default}]"
            lines.append(f"    {head:<{width}}  {knob.flag}: {knob.help}"
                         + (" (added only when set)" if knob.implicit else ""))
    defaults = m.defaults()
    lines.append(f"  flags at the defaults: {flag_text(m, defaults)}")
    if m.scripts:
        lines.append(f"  run directory (scripts/glue/finetune.sh): {m.run_name(defaults)}  ({run_dir_pattern(m)})")
        searched = [("LR", catalogue.LR_SPACE, ())] + [(KNOBS[k].var, KNOBS[k].space, KNOBS[k].choices)
                                                       for k in m.knobs
                                                       if KNOBS[k].space is not None and KNOBS[k].space.searched]
        lines.append("  searched by scripts/glue/tune.sh: " + ", ".join(f"{v} {space_text(s, c)} ({v}_RANGE)"
                                                                     for v, s, c in searched))
    if m.aliases:
        lines.append(f"  old spelling, still taken: {', '.join(m.aliases)}")
    for other, why in m.refuses:
        lines.append(f"  does not combine with {other}: {why}")
    return "\n".join(lines)


def describe_tool(t: catalogue.Tool) -> str:
    """A tool on a finished run (WiSE-FT), for the command line: no METHOD, no training."""
    return (f"{t.name}: {t.title}, {t.summary}\n  not a METHOD: a tool on a finished run's checkpoint\n"
            f"  run: {t.command}\n  page: docs/{t.page}")


def listing() -> str:
    width = max(map(len, METHODS))
    rows = [f"{'method':<{width}}  {'base':<8} knobs (variable [default])"]
    for m in METHODS.values():
        knobs = " ".join(f"{KNOBS[k].var}[{KNOBS[k].default}]" for k in m.knobs)
        rows.append(f"{m.name:<{width}}  {m.base or '-':<8} {knobs}" + ("" if m.scripts else "  (comparison only)"))
    rows += [f"{t.name:<{width}}  {'-':<8} (a tool on a finished run: {t.command.split()[0]})" for t in TOOLS.values()]
    return "\n".join(rows + ["", "python -m recadam_fairseq methods NAME: its flags, model and run directory"])


def readme_table() -> str:
    """The README's table: one row per method that is not RecAdam + another, then the combinations."""
    rows = ["| method | what it does | METHOD | turn it on (scripts' defaults) | page |", "|---|---|---|---|---|"]
    combined = []
    for m in METHODS.values():
        if m.composed_of:
            combined.append(m.composed_of)
            continue
        if m.name == "adam":
            continue
        values = m.defaults()
        page = m.page.split("#")[0]
        rows.append(f"| {m.name} | {m.summary} | {'`' + m.name + '`' if m.scripts else '-'} | "
                    f"`{flag_text(m, values)}` | [{page}](docs/{m.page}) |")
    rows += [f"| {t.title} | {t.summary} | - | `{t.command}` | [{t.page}](docs/{t.page}) |" for t in TOOLS.values()]
    rows += ["", "RecAdam combines with " + ", ".join(f"`{n}`" for n in combined) + " as METHOD `recadam-X`: X's "
             "flags on RecAdam's optimizer. `python -m recadam_fairseq methods NAME` prints a method's flags, "
             "variables and run directory."]
    return "\n".join(rows)


def glue_table() -> str:
    """docs/glue.md's table: every METHOD of the task scripts with its flags, variables and run directory."""
    rows = ["| METHOD | flags | variables [defaults] | run directory | base |", "|---|---|---|---|---|"]
    for m in METHODS.values():
        if not m.scripts:
            continue
        variables = ", ".join(f"`{KNOBS[k].var}` [{KNOBS[k].default}]" for k in m.knobs) or "-"
        rows.append(f"| `{m.name}` | `{flag_text(m, placeholders(m))}` | {variables} | "
                    f"`{run_dir_pattern(m)}` | {m.base or '-'} |")
    return "\n".join(rows)


def search_table() -> str:
    """docs/search.md's table: each knob tune.sh can search, its range and the METHODs that have it."""
    rows = ["| variable | range variable | range [default] | scale | searched | METHODs |", "|---|---|---|---|---|---|"]
    space = catalogue.LR_SPACE
    rows.append(f"| `LR` | `LR_RANGE` | {space.low} to {space.high} | log | always | every METHOD |")
    for k in KNOBS.values():
        s = k.space
        if s is None:
            continue
        users = [m.name for m in METHODS.values() if m.scripts and k.key in m.knobs]
        if not users:
            continue
        scale = "words" if k.choices else "log" if s.log else "linear"
        rng = " \\| ".join(k.choices) if k.choices else f"{s.low} to {s.high}" + (
            " of MAX_UPDATE" if s.relative else " (the encoder's)" if s.high == "layers" else "")
        who = ", ".join(f"`{u}`" for u in users) if len(users) <= 4 else f"{len(users)}: `{users[0]}`, `{users[1]}`, ..."
        rows.append(f"| `{k.var}` | `{k.var}_RANGE` | {rng} | {scale} | "
                    f"{'by default' if s.searched else 'when its range is given'} | {who} |")
    return "\n".join(rows)


RENDER = {"readme": readme_table, "glue": glue_table, "search": search_table}


def write_docs(root: str) -> None:
    from .tools.readme_block import replace_block

    for page, start, end, kind in DOC_TABLES:
        replace_block(os.path.join(root, page), start, end, RENDER[kind]())


def methods_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m recadam_fairseq methods",
                                 description="The catalogue of methods (recadam_fairseq/catalogue.py).")
    ap.add_argument("name", nargs="?", help="one method: its knobs, flags, model, base and run directory")
    ap.add_argument("--write-docs", action="store_true",
                    help="rewrite the method tables of README.md and docs/glue.md (in the repository)")
    args = ap.parse_args(argv)
    if args.write_docs:
        write_docs(os.path.dirname(HERE))
        return 0
    if args.name is None:
        print(listing())
        return 0
    if args.name.lower() in TOOLS:
        print(describe_tool(TOOLS[args.name.lower()]))
        return 0
    try:
        print(describe(catalogue.get(args.name)))
    except catalogue.UnknownMethod as e:
        print(f"python -m recadam_fairseq methods: error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["methods"]:
        return methods_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m recadam_fairseq", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--user-dir", action="store_true", help="print the --user-dir path of this installation")
    args = parser.parse_args(argv)
    if not args.user_dir:
        parser.print_help()
        return 2
    print(HERE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
