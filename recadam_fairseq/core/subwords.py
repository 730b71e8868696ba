"""Which subword marking a dictionary's symbols carry, and which ``--eval-bleu-remove-bpe`` undoes it.

Pure Python. fairseq's ``Dictionary.string(..., bpe_symbol)`` joins the symbols with spaces and then
undoes one marking (``data_utils.post_process``): subword-nmt's ``@@`` suffix (``subword_nmt``,
``@@ ``, ``@@``), SentencePiece's ``▁`` prefix (``sentencepiece``), and a few speech ones; any other
value raises NotImplementedError, at the first validation.
"""

from typing import Iterable, NamedTuple, Optional

# every value fairseq's post_process accepts (fairseq 0.12)
REMOVE_BPE = ("subword_nmt", "@@ ", "@@", "sentencepiece", "wordpiece", "letter", "silence", "_EOW", "none")
# the share of a dictionary's symbols that must carry a marking for it to count: a real BPE vocabulary has
# most of them marked, a word-level one at most a stray symbol
SHARE = 0.1


class Marking(NamedTuple):
    scheme: str  # "subword-nmt BPE" or "SentencePiece"
    marked: int  # symbols that carry the mark
    total: int
    undo: tuple  # the --eval-bleu-remove-bpe values that remove it (the first is the one to suggest)


def marking(symbols: Iterable[str]) -> Optional[Marking]:
    """The subword marking most of ``symbols`` carry, or None (words, or a marking fairseq cannot undo)."""
    symbols = list(symbols)
    if not symbols:
        return None
    bpe = sum(s.endswith("@@") for s in symbols)
    spm = sum(s.startswith("\u2581") for s in symbols)
    n, scheme, undo = max((bpe, "subword-nmt BPE", ("subword_nmt", "@@ ", "@@")),
                          (spm, "SentencePiece", ("sentencepiece",)))
    return Marking(scheme, n, len(symbols), undo) if n >= SHARE * len(symbols) else None


# what Moses's tokenizer writes for ' " & | < > [ ] and an intra-word hyphen (its escaping, and -a): text with
# them is only readable again after Moses's detokenizer
MOSES_ESCAPES = frozenset(("&apos;", "&quot;", "&amp;", "&#124;", "&lt;", "&gt;", "&#91;", "&#93;", "@-@"))


def moses_escaped(symbols: Iterable[str]) -> Optional[str]:
    """The first of ``symbols`` that holds a Moses escape (``&apos;s``, ``@-@``), or None."""
    return next((s for s in symbols if any(e in s for e in MOSES_ESCAPES)), None)
