"""Regenerate one marked block of a Markdown page (the generated tables in docs/)."""

import sys
from typing import Optional, Tuple


def replace_block(path: str, start: str, end: str, text: str, flag: str = "--doc") -> None:
    """Replace what lies between the ``start`` and ``end`` marker lines of ``path`` with ``text``;
    the rest of the file is left byte for byte. ``flag`` names the option in the error."""
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    if start not in doc or end not in doc:
        raise SystemExit(f"{flag} {path}: no {start} ... {end} markers")
    head, rest = doc.split(start, 1)
    tail = rest.split(end, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{start}\n{text}\n{end}{tail}")


def marker_problem(path: str, start: str, end: str, flag: str) -> Optional[str]:
    """Why the block cannot go into ``path`` (a missing file, missing markers), or None."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        return f"{flag} {path}: {e.strerror}"
    if start not in text or end not in text:
        return f"{flag} {path}: no {start} ... {end} markers"
    return None


def add_doc_options(ap, help: str) -> None:
    """``--doc PATH`` and its deprecated alias ``--readme``."""
    ap.add_argument("--doc", metavar="PATH", help=help)
    ap.add_argument("--readme", metavar="PATH", help="deprecated alias of --doc")


def doc_target(ap, args, prog: str, start: str, end: str) -> Tuple[Optional[str], str]:
    """(the page to write, the flag that named it) from ``--doc`` / ``--readme``; an error before any work
    when the page has no markers."""
    path, flag = args.doc, "--doc"
    if args.readme:
        if args.doc:
            ap.error("--readme is a deprecated alias of --doc: give one of them")
        print(f"{prog}: --readme is deprecated, use --doc", file=sys.stderr)
        path, flag = args.readme, "--readme"
    if path and (err := marker_problem(path, start, end, flag)):
        ap.error(err)
    return path, flag
