"""Regenerate one marked block of a Markdown file (the README's generated tables)."""


def replace_block(path: str, start: str, end: str, text: str, flag: str = "--readme") -> None:
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
