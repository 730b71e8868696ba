"""The documentation: README.md stays a short manual, every relative link (file and #anchor) of the pages
resolves, the generated blocks have their markers, and every ```python block runs (no training, no data).

Anchors follow GitHub's rule: the heading's text, lowercased, without punctuation other than - and _,
spaces turned into -, and -1, -2, ... appended to repeats.
"""

import glob
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT

README = os.path.join(ROOT, "README.md")
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
PAGES = [README, *DOCS, os.path.join(ROOT, "ARCHITECTURE.md"), os.path.join(ROOT, "scripts", "glue", "README.md"),
         os.path.join(ROOT, "data-prep", "README.md")]
MAX_README_LINES = 300

# Generated blocks: (page, start marker, end marker); the generators write between them.
MARKERS = [
    ("docs/performance.md", "<!-- benchmark:start -->", "<!-- benchmark:end -->"),    # scripts/benchmark.py --doc
    ("docs/performance.md", "<!-- gpu-e2e:start -->", "<!-- gpu-e2e:end -->"),        # scripts/gpu/e2e_overhead.py --doc
    ("docs/forgetting.md", "<!-- forgetting:start -->", "<!-- forgetting:end -->"),   # scripts/forgetting/run.py
    *[(f"docs/forgetting-{t}.md", "<!-- forgetting:start -->", "<!-- forgetting:end -->")  # run.py --task t
      for t in ("tweets", "nli", "multi")],
    ("docs/forgetting.md", "<!-- forgetting-summary:start -->", "<!-- forgetting-summary:end -->"),  # summary.py
    ("docs/forgetting.md", "<!-- forgetting-multitask:start -->", "<!-- forgetting-multitask:end -->"),
    ("README.md", "<!-- forgetting-summary:start -->", "<!-- forgetting-summary:end -->"),
    ("README.md", "<!-- quickstart:start -->", "<!-- quickstart:end -->"),            # tests/test_quickstart.py
    ("docs/glue.md", "<!-- after-quickstart:start -->", "<!-- after-quickstart:end -->"),  # the same test
    ("docs/forgetting-your-task.md", "<!-- your-task:start -->", "<!-- your-task:end -->"),  # test_grid_verdicts.py
]

# ```python blocks that are not run here, each with why: (page, a line the block holds) -> reason.
NOT_RUN = {
    ("README.md", "clf = Classifier.load(RUN_DIR"):
        "needs a fine-tuned run: tests/test_predict.py runs it on the tiny model",
}

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def rel(path):
    return os.path.relpath(path, ROOT)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def prose_lines(text):
    """The lines outside fenced code blocks, with their 1-based numbers."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def code_blocks(text, lang):
    """The bodies of the ```lang blocks of ``text``."""
    return re.findall(rf"^```{lang}[ \t]*\n(.*?)^```", text, re.S | re.M)


def slug(heading):
    text = re.sub(r"`([^`]*)`", r"\1", heading)              # inline code: its text
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)   # links: their text
    text = re.sub(r"<[^>]+>", "", text).replace("*", "")    # html tags, emphasis
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for _, line in prose_lines(read(path)):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(path):
    """(line number, target) of every link and image outside code (inline code spans left out)."""
    for n, line in prose_lines(read(path)):
        for target in LINK.findall(re.sub(r"`[^`]*`", "code", line)):
            yield n, target


def test_readme_is_a_short_manual():
    text = read(README)
    n = len(text.splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move detail to docs/"
    bash = "\n".join(code_blocks(text, "bash"))
    for cmd in ("make demo", "make test"):
        assert re.search(rf"^{cmd}\b", bash, re.M), f"README.md shows no `{cmd}` command"


def test_what_the_walk_throughs_write_is_ignored():
    """What the documented commands write at the repository's root is in .gitignore: make demo (demo-out), the
    quickstart and glue.md (runs, hf-sst2), seq2seq.md's walk-through (mt-tiny, mt-runs), forgetting-your-task.md's
    (probe-runs; minilm-task, example-task), make forgetting."""
    with open(os.path.join(ROOT, ".gitignore"), encoding="utf-8") as f:
        ignored = {ln.strip().strip("/") for ln in f if ln.strip() and not ln.startswith("#")}
    written = {"demo-out", "probe-runs", "runs", "hf-sst2", "mt-tiny", "mt-runs", "forgetting-out", "minilm-task",
               "example-task"}
    assert written <= ignored, sorted(written - ignored)
    pages = read(os.path.join(ROOT, "docs", "seq2seq.md")) + read(os.path.join(ROOT, "docs", "glue.md"))
    assert all(f" {d}/" in pages or f" {d} " in pages for d in ("mt-tiny", "mt-runs", "hf-sst2")), "the pages' names"


def test_pages_exist():
    names = {os.path.basename(p) for p in DOCS}
    want = {"recadam.md", "r3f.md", "sam.md", "ca-mtl.md", "forgetting.md", "performance.md", "glue.md",
            "benchmark.md", "bench_sam.md", "bench_baselines.md", "forgetting-adam-400.md", "reinit.md", "lora.md",
            "llrd.md", "wise-ft.md", "child-tuning.md", "rdrop.md", "mixout.md", "forgetting-your-task.md"}
    assert want <= names, sorted(want - names)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    bad = []
    for n, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(dest):
            bad.append(f"{rel(page)}:{n}: {target}: no file {rel(dest)}")
        elif anchor:
            if not dest.endswith(".md"):
                bad.append(f"{rel(page)}:{n}: {target}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(dest):
                bad.append(f"{rel(page)}:{n}: {target}: no heading #{anchor} in {rel(dest)}")
    assert not bad, "\n".join(bad)


def test_slug_follows_github():
    assert slug("What differs from fairseq's examples/rxf") == "what-differs-from-fairseqs-examplesrxf"
    assert slug("`convert_hf_to_fairseq.py`: a Hugging Face BERT or RoBERTa to fairseq RoBERTa") == \
        "convert_hf_to_fairseqpy-a-hugging-face-bert-or-roberta-to-fairseq-roberta"
    assert slug("CA-MTL: multi-task GLUE") == "ca-mtl-multi-task-glue"
    assert slug("R3F / R4F") == "r3f--r4f"


@pytest.mark.parametrize("page, start, end", MARKERS, ids=[f"{p}:{s[5:-4]}" for p, s, _ in MARKERS])
def test_generated_block_markers(page, start, end):
    text = read(os.path.join(ROOT, page))
    assert text.count(start) == 1 and text.count(end) == 1, f"{page}: needs one {start} and one {end} line"
    assert text.index(start) < text.index(end)
    assert re.search(rf"^{re.escape(start)}$", text, re.M) and re.search(rf"^{re.escape(end)}$", text, re.M)


def python_blocks():
    out = []
    for page in (README, *DOCS):
        for i, code in enumerate(code_blocks(read(page), "python")):
            out.append(pytest.param(rel(page), code, id=f"{rel(page)}#{i + 1}"))
    return out


def reason_not_run(page, code):
    for (where, line), reason in NOT_RUN.items():
        if where == page and line in code:
            return reason
    return None


@pytest.mark.parametrize("page, code", python_blocks())
def test_python_block_runs(page, code, tmp_path):
    reason = reason_not_run(page, code)
    if reason:
        pytest.skip(f"not run: {reason}")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{page}:\n{code}\n---\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"


def test_every_exception_names_a_block():
    blocks = {(p.values[0], p.values[1]) for p in python_blocks()}
    for (where, line), _ in NOT_RUN.items():
        assert any(page == where and line in code for page, code in blocks), \
            f"NOT_RUN entry for {where} matches no ```python block: remove it"


# ------------------------------------------------------------------ flag tables against the code
# Each `| flag | default | meaning |` table of the method pages, in page order, and the fairseq-train
# components whose flags it documents: every default it shows must be the one fairseq-train gets.
FLAG_TABLES = {
    "docs/recadam.md": [["--optimizer", "recadam"], ["--criterion", "sentence_prediction_recadam"]],
    "docs/r3f.md": [["--criterion", "sentence_prediction_r3f"],
                    ["--criterion", "label_smoothed_cross_entropy_r3f", "--task", "translation", "--arch",
                     "transformer"]],
    "docs/sam.md": [["--optimizer", "samsgd"]],
    "docs/llrd.md": [["--optimizer", "recadam"]],
    "docs/child-tuning.md": [["--optimizer", "recadam"]],
    "docs/ewc.md": [["--optimizer", "recadam"]],
    "docs/rdrop.md": [["--criterion", "sentence_prediction_rdrop"],
                      ["--criterion", "label_smoothed_cross_entropy_rdrop", "--task", "translation", "--arch",
                       "transformer"]],
    "docs/ca-mtl.md": [["--task", "glue_multitask", "--criterion", "glue_multitask", "--arch", "ca_mtl_roberta_base"],
                       ["--task", "glue_multitask", "--criterion", "glue_multitask", "--arch", "ca_mtl_roberta_base"]],
    "docs/reinit.md": [["--arch", "roberta_ft_base"]],
    "docs/lora.md": [["--arch", "roberta_ft_base"]],
    "docs/mixout.md": [["--arch", "roberta_ft_base"]],
    "docs/forgetting-meter.md": [["--optimizer", "recadam"]],
}


def flag_tables(text):
    """[[(flag, default as shown)]] for every table headed | flag | default | meaning |."""
    tables, rows = [], None
    for line in text.splitlines():
        if re.match(r"^\|\s*flag\s*\|\s*default\s*\|", line):
            rows = []
            tables.append(rows)
        elif rows is not None and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            m = re.fullmatch(r"`(--[a-z0-9-]+)`", cells[0])
            if m:
                rows.append((m.group(1), cells[1]))
        else:
            rows = None
    return tables


def shown_equals(shown, value):
    shown = shown.strip("`")
    if str(value) == shown:
        return True
    if shown in ("none", "(required)", ""):
        return value in (None, "", -1) or shown == "(required)"
    if shown == "off":
        return value is False
    try:
        return float(shown) == float(value)
    except (TypeError, ValueError):
        pass
    if shown.startswith("("):
        return eval(shown) == (eval(value) if isinstance(value, str) else tuple(value))
    return str(value) == shown


def component_default(args, dest):
    """A flag argparse leaves out of the namespace (fairseq's model args suppress the task's --max-positions):
    the default of the chosen task / criterion / optimizer dataclass that declares it."""
    import dataclasses

    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
    from fairseq.optim import OPTIMIZER_DATACLASS_REGISTRY
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    for registry, name in ((TASK_DATACLASS_REGISTRY, args.task), (CRITERION_DATACLASS_REGISTRY, args.criterion),
                           (OPTIMIZER_DATACLASS_REGISTRY, args.optimizer)):
        dc = registry.get(name)
        fields = {f.name: f for f in dataclasses.fields(dc)} if dc else {}
        if dest in fields:
            return fields[dest].default
    raise AssertionError(f"--{dest.replace('_', '-')} is no flag of {args.task} / {args.criterion} / {args.optimizer}")


@pytest.mark.parametrize("page", sorted(FLAG_TABLES))
def test_flag_tables_show_the_codes_defaults(page):
    from fairseq import options

    import recadam_fairseq

    recadam_fairseq.register()
    tables = flag_tables(read(os.path.join(ROOT, page)))
    assert len(tables) == len(FLAG_TABLES[page]), f"{page}: {len(tables)} flag tables"
    wrong = []
    for rows, extra in zip(tables, FLAG_TABLES[page]):
        argv = ["data", "--task", "sentence_prediction", "--arch", "roberta", *extra]
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, input_args=argv, parse_known=True)[0]
        for flag, shown in rows:
            dest = flag[2:].replace("-", "_")
            value = getattr(args, dest) if hasattr(args, dest) else component_default(args, dest)
            if not shown_equals(shown, value):
                wrong.append(f"{page}: {flag} shows {shown}, the code's default is {value!r}")
    assert not wrong, "\n".join(wrong)
