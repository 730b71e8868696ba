"""Regenerate one marked block of a Markdown page (the generated tables in docs/)."""

from typing import Optional


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


def add_doc_option(ap, help: str) -> None:
    """``--doc PATH``: the page whose marked block a command also writes."""
    ap.add_argument("--doc", metavar="PATH", help=help)


def doc_target(ap, args, start: str, end: str) -> Optional[str]:
    """The page ``--doc`` names, or None; an error before any work when it has no markers."""
    if args.doc and (err := marker_problem(args.doc, start, end, "--doc")):
        ap.error(err)
    return args.doc
