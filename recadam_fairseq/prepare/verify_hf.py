"""convert_hf.py's ``--verify``: the converted model's hidden states (fairseq's forward, fp32) and, with a head, its
masked-LM logits against the original's forward (transformers, float64) on real sentences, tokenized by the
converted model's tokenizer.json; the errors kept in ``OUT/verify.json`` while it belongs to that model.pt, and the
line the command prints."""

import json
import os
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from recadam_fairseq.prepare.hf_source import (PAD, Source, load_tokenizer, max_positions, packaged_model_dir, quiet,
                                               read_model, special_ids, vocab_order)

# A few real sentences for --verify (movie-review and SNLI-like), of different lengths.
VERIFY_SENTENCES = [
    "The gorgeously elaborate continuation of the trilogy is so huge that a column of words cannot describe it.",
    "Effective but too tepid biopic.",
    "A man is playing a guitar on stage.",
    "Nobody is outside; the street is empty and the shops are closed for the holiday.",
    "Two dogs run through a field of snow while a child watches from the porch.",
    "It's a lovely film with lovely performances by Buy and Accorsi.",
]


def original(source: Source):
    """The original model through transformers (its masked-LM class when it has the head), float64, eval."""
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # what it says of a model it loads (and its progress bar): not the user's
    hf_logging.disable_progress_bar()
    try:
        config = AutoConfig.from_pretrained(source.model_dir)
        cls = AutoModelForMaskedLM if source.head is not None else AutoModel
        model = cls.from_pretrained(source.model_dir, config=config)
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
    return model.double().eval()


def with_eps(model, eps: float):
    """``model`` with every LayerNorm's eps ``eps`` (DistilBERT's is in its code, not its config)."""
    for m in model.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.eps = eps
    return model


def verify(model_dir: Optional[str], out_dir: str, sentences: Sequence[str] = VERIFY_SENTENCES) -> dict:
    """Max errors of the converted model's hidden states (and masked-LM logits) against the original's forward.

    ``abs``/``rel``: over all layers and non-pad tokens, max |Δ| and max ‖Δ‖/‖ref‖ per token, against the float64
    original with its own LayerNorm eps (``eps_source``); ``*_same_eps``: against it with the converted model's eps
    (``eps``; the same figures where the model kept its source's): what is left is fp32 rounding, and the difference
    of the two is an eps change (--fairseq-eps); ``cos``: 1 − cosine of mean-pooled last-layer embeddings (what the
    forgetting metric uses); with a head, ``mlm_abs``/``mlm_abs_same_eps``: max |Δ| of the masked-LM logits, and
    ``mlm_top1``/``mlm_top1_same_eps``: the share of tokens whose most likely word is the original's (two words
    whose logits an eps change moves past each other may swap).
    """
    import recadam_fairseq.safe_globals  # noqa: F401  (torch.load of fairseq's checkpoint types)
    from fairseq.data import data_utils
    from fairseq.models.roberta import RobertaModel

    import recadam_fairseq

    recadam_fairseq.register()  # a converted model that keeps its eps is the plug-in's roberta_ft
    model_dir = model_dir or packaged_model_dir()
    source = read_model(model_dir, os.path.join(out_dir, "tokenizer.json"))  # the ids the converted model reads
    f2b, b2f = vocab_order(source.vocab, model_dir, source.family)[1:]
    enc = load_tokenizer(out_dir, max_positions(source)).encode_batch(list(sentences))  # with the specials
    hf_pad = special_ids(source.vocab, model_dir, source.family)[1]
    ids = data_utils.collate_tokens([torch.tensor(e.ids) for e in enc], pad_idx=hf_pad)
    mask = data_utils.collate_tokens([torch.ones(len(e.ids), dtype=torch.long) for e in enc], pad_idx=0)
    with quiet():
        hub = RobertaModel.from_pretrained(os.path.abspath(out_dir), "model.pt", bpe=None)
    hub.eval()
    eps = hub.model.encoder.sentence_encoder.layernorm_embedding.eps  # what the converted model computes with
    tokens = b2f[ids].masked_fill(mask == 0, PAD)
    with torch.no_grad():
        ours = [s.double() for s in hub.extract_features(tokens, return_all_hiddens=True)]
        model = original(source)
        refs = [model(input_ids=ids, attention_mask=mask, output_hidden_states=True)]
        if eps != source.eps:  # (the same model, at the converted one's eps: what the conversion itself changed)
            refs.append(with_eps(model, eps)(input_ids=ids, attention_mask=mask, output_hidden_states=True))
        logits = hub.model(tokens)[0].double() if source.head is not None else None
    keep = mask.bool()

    def errs(a_list, b_list):
        d = torch.stack([(a - b)[keep] for a, b in zip(a_list, b_list)])  # (layers, tokens, dim)
        r = torch.stack([b[keep] for b in b_list])
        return d.abs().max().item(), (d.norm(dim=-1) / r.norm(dim=-1)).max().item()

    def pooled(h):
        return (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)

    ref, ref_eps = (list(r.hidden_states) for r in (refs[0], refs[-1]))
    a, r = errs(ours, ref)
    a2, r2 = errs(ours, ref_eps)
    cos = 1 - F.cosine_similarity(pooled(ours[-1]), pooled(ref[-1]), dim=-1)
    result = {"abs": a, "rel": r, "abs_same_eps": a2, "rel_same_eps": r2, "cos": cos.abs().max().item(),
              "layers": len(ours), "tokens": int(keep.sum()), "sentences": len(sentences),
              "max_abs_hidden": max(h[keep].abs().max().item() for h in ref), "family": source.family,
              "lm_head": source.head is not None, "eps": eps, "eps_source": source.eps}
    if logits is not None:  # the original's logits in fairseq's order
        theirs = [out.logits[..., f2b][keep] for out in (refs[0], refs[-1])]
        mine = logits[keep]
        result.update(mlm_abs=(mine - theirs[0]).abs().max().item(),
                      mlm_abs_same_eps=(mine - theirs[1]).abs().max().item(),
                      mlm_top1=(mine.argmax(-1) == theirs[0].argmax(-1)).double().mean().item(),
                      mlm_top1_same_eps=(mine.argmax(-1) == theirs[1].argmax(-1)).double().mean().item())
    result["model"] = model_stamp(out_dir)
    with open(os.path.join(out_dir, "verify.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    return result


def model_stamp(out_dir: str) -> list:
    """What identifies the converted model.pt a verify.json belongs to (size, mtime)."""
    st = os.stat(os.path.join(out_dir, "model.pt"))
    return [st.st_size, st.st_mtime_ns]


def verified(model_dir: Optional[str], out_dir: str) -> dict:
    """verify()'s result, from OUT/verify.json when it was written for this model.pt."""
    path = os.path.join(out_dir, "verify.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        if result.get("model") == model_stamp(out_dir):
            return result
    return verify(model_dir, out_dir)


def verify_line(v: dict) -> str:
    """verify()'s result as the line the command prints."""
    eps, own = v.get("eps", 1e-5), v.get("eps_source", 1e-12)  # (a verify.json written before they were kept)
    same = eps == own
    line = (f"verify on {v['sentences']} sentences, {v['tokens']} tokens, {v['layers']} hidden states "
            f"(max |h| {v['max_abs_hidden']:.3g}), against the original's forward (transformers, float64, its "
            f"LayerNorm eps {own:g}): max |Δ| {v['abs']:.3g}, max ‖Δ‖/‖h‖ {v['rel']:.3g}"
            + ("" if same else f"; {v['abs_same_eps']:.3g} / {v['rel_same_eps']:.3g} with its eps set to the "
                               f"converted model's {eps:g}")
            + f"; mean-pooled embeddings: 1 − cos ≤ {v['cos']:.3g}")
    if "mlm_abs" in v:
        line += (f"; masked-LM logits: max |Δ| {v['mlm_abs']:.3g}"
                 + ("" if same else f" ({v['mlm_abs_same_eps']:.3g} with the same eps)")
                 + f", the same top word for {100 * v['mlm_top1']:.1f}% of the tokens")
    return line
