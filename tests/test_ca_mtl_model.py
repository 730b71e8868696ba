"""CA-MTL's task-conditioned RoBERTa (--arch ca_mtl_roberta_*): modules, loading, conditioning, RecAdam.

Unit: each conditional module against a float64 formula written here. Adapter: the model built
by fairseq's own task from the tiny pretrained checkpoint (init equality with plain RoBERTa,
per-example conditioning). End to end: the real fairseq-train with --restore-file (pretrained
tensors loaded bit for bit; recadam anchors exactly the pretrained ones; a few updates train).
"""

import argparse
import copy
import os
import re

import numpy as np
import pytest
import torch

from helpers import TINY_CA_MTL, build_tiny, load_ckpt, random_tokens, run_plan
from recadam_fairseq.core.conditional_modules import (
    ConditionalAttentionBias,
    ConditionalBottleneck,
    ConditionalLayerNorm,
    TaskEmbedding,
)

TASKS = ["a", "b", "c"]


def _randomise(module, std=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)


# --------------------------------------------------------------------------- modules, float64
def test_conditional_layer_norm_matches_formula_float64():
    dim, bsz, seq = 6, 3, 4
    cln = ConditionalLayerNorm(dim, cond_dim=5, eps=1e-5).double()
    _randomise(cln)
    x = torch.randn(seq, bsz, dim, dtype=torch.float64)
    z = torch.randn(bsz, 5, dtype=torch.float64)
    got = cln(x, z, batch_dim=1).detach().numpy()

    W, c = cln.film.weight.detach().numpy(), cln.film.bias.detach().numpy()
    w, b = cln.weight.detach().numpy(), cln.bias.detach().numpy()
    want = np.empty((seq, bsz, dim))
    for j in range(bsz):
        gb = W @ z[j].numpy() + c
        gain = (1 + gb[:dim]) * w + gb[dim:]
        for t in range(seq):
            v = x[t, j].numpy()
            want[t, j] = (v - v.mean()) / np.sqrt(((v - v.mean()) ** 2).mean() + 1e-5) * gain + b
    assert np.abs(got - want).max() < 1e-12


@pytest.mark.parametrize("seq_len", [5, 7, 10])
def test_attention_bias_is_block_diagonal_float64(seq_len):
    max_len, blocks = 7, 3  # blocks of ceil(7/3) = 3: the last one is cut at position 7
    mod = ConditionalAttentionBias(4, max_len, blocks).double()
    _randomise(mod)
    z = torch.randn(2, 4, dtype=torch.float64)
    got = mod(z, seq_len).detach().numpy()

    A = mod.blocks.detach().numpy()
    W, c = mod.film.weight.detach().numpy(), mod.film.bias.detach().numpy()
    want = np.zeros((2, seq_len, seq_len))
    for k in range(2):
        gb = W @ z[k].numpy() + c
        gamma, beta = gb[:3], gb[3:]
        for i in range(min(seq_len, max_len)):
            for j in range(min(seq_len, max_len)):
                if i // 3 == j // 3:
                    want[k, i, j] = A[i // 3, i % 3, j % 3] * (1 + gamma[j % 3]) + beta[j % 3]
    assert np.abs(got - want).max() < 1e-12


def test_bottleneck_and_identity_init_float64():
    dim = 6
    mod = ConditionalBottleneck(dim, 2, cond_dim=5).double()
    h = torch.randn(3, 4, dim, dtype=torch.float64)  # batch first
    z = torch.randn(3, 5, dtype=torch.float64)
    assert mod(h, z, batch_dim=0).abs().max() == 0  # up-projection zero: adds nothing at start
    _randomise(mod)
    W, c = mod.film.weight.detach().numpy(), mod.film.bias.detach().numpy()
    want = np.empty((3, 4, dim))
    for j in range(3):
        gb = W @ z[j].numpy() + c
        filmed = (1 + gb[:dim]) * h[j].numpy() + gb[dim:]
        down = filmed @ mod.down.weight.detach().numpy().T + mod.down.bias.detach().numpy()
        want[j] = down @ mod.up.weight.detach().numpy().T + mod.up.bias.detach().numpy()
    assert np.abs(mod(h, z, batch_dim=0).detach().numpy() - want).max() < 1e-12
    emb = TaskEmbedding(3, 5)
    assert torch.equal(emb(torch.tensor([2, 0])), emb.weight[[2, 0]])


# --------------------------------------------------------------------------- the model, in process
@pytest.fixture(scope="module")
def pair(tiny):
    """Plain RoBERTa and CA-MTL (3 tasks), both loaded from the tiny pretrained checkpoint, float64."""
    state = load_ckpt(tiny.pretrained)["model"]
    rob, task, _ = build_tiny(tiny)
    rob.load_state_dict(dict(state), strict=True)
    ca, _, _ = build_tiny(tiny, *TINY_CA_MTL, tasks=TASKS)
    ca.load_state_dict(dict(state), strict=True)  # fairseq's load path: upgrade_state_dict fills the new tensors
    ca.classification_heads.load_state_dict(rob.classification_heads.state_dict())
    return rob.double().eval(), ca.double().eval(), task, state


def test_names_and_build(pair):
    rob, ca, _, state = pair
    from recadam_fairseq.models.ca_mtl_roberta import CaMtlRobertaModel

    assert isinstance(ca, CaMtlRobertaModel) and ca.is_task_conditioned and ca.num_tasks == len(TASKS)
    new = set(ca.state_dict()) - set(rob.state_dict())
    assert set(rob.state_dict()) <= set(ca.state_dict())  # every RoBERTa name kept
    assert new == set(ca.conditional_tensor_names()) and not new & set(state)
    layer1 = ca.encoder.sentence_encoder.layers[1]  # tiny: 2 layers; upper half and top = layer 1
    assert layer1.adapter is not None and hasattr(layer1.final_layer_norm, "film")
    assert ca.encoder.sentence_encoder.layers[0].adapter is None
    assert not hasattr(ca.encoder.sentence_encoder.layers[0].final_layer_norm, "film")


def test_fresh_conditional_modules_compute_pretrained_roberta(pair):
    rob, ca, task, _ = pair
    toks, _ = random_tokens(task)
    ids = torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        want, want_extra = rob(toks, features_only=True, return_all_hiddens=True)
        got, got_extra = ca(toks, features_only=True, return_all_hiddens=True, task_ids=ids)
        assert (got - want).abs().max() < 1e-12
        for a, b in zip(got_extra["inner_states"], want_extra["inner_states"]):
            assert (a - b).abs().max() < 1e-12
        head = "sentence_classification_head"
        assert (ca(toks, classification_head_name=head, task_ids=ids)[0]
                - rob(toks, classification_head_name=head)[0]).abs().max() < 1e-12
        # the comparison sees a conditional change: a shift β in the alignment moves every feature
        ca.encoder.sentence_encoder.alignment.bias[64:].add_(0.1)
        try:
            moved = ca(toks, features_only=True, task_ids=ids)[0]
        finally:
            ca.encoder.sentence_encoder.alignment.bias.zero_()
    assert (moved - want).abs().max() > 1e-3


@pytest.fixture(scope="module")
def conditioned(pair, tiny):
    """A CA-MTL model whose conditional tensors are all perturbed (as after multi-task training)."""
    _, fresh, task, _ = pair
    ca = copy.deepcopy(fresh)
    names = set(ca.conditional_tensor_names())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in ca.named_parameters():
            if n in names:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.1)
    return ca, task


def test_task_ids_condition_each_example(conditioned):
    ca, task = conditioned
    toks, lengths = random_tokens(task)
    ids = torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        full = ca(toks, features_only=True, task_ids=ids)[0]
        for k in range(len(TASKS)):  # a mixed batch equals the per-task batches, row for row
            rows = ids == k
            assert (ca(toks[rows], features_only=True, task_ids=ids[rows])[0] - full[rows]).abs().max() < 1e-12
        for i, n in enumerate(lengths):  # and each row alone, unpadded
            alone = ca(toks[i:i + 1, :n], features_only=True, task_ids=ids[i:i + 1])[0]
            assert (alone[0] - full[i, :n]).abs().max() < 1e-10
        per_task = [ca(toks, features_only=True, task_ids=torch.full((6,), k))[0] for k in range(len(TASKS))]
        none = ca(toks, features_only=True)[0]
    assert torch.equal(none, per_task[0])  # task_ids None = task 0 (a criterion that passes none)
    for a in range(len(TASKS)):
        for b in range(a + 1, len(TASKS)):
            assert (per_task[a] - per_task[b]).abs().min(dim=-1).values.max() > 1e-4  # every position moves
    with pytest.raises(ValueError, match="task_ids must have shape"):
        ca(toks, task_ids=torch.zeros(5, dtype=torch.long))


def test_criterion_style_calls(conditioned):
    """What R3F-style criteria call: features_only + head + task_ids, and token_embeddings (noised) reaching
    the encoder; a criterion that passes no task_ids gets task 0."""
    ca, task = conditioned
    toks, _ = random_tokens(task)
    ids = torch.tensor([2, 1, 0, 2, 1, 0])
    head = "sentence_classification_head"  # registered by sentence_prediction's build_model
    with torch.no_grad():
        emb = ca.encoder.sentence_encoder.embed_tokens(toks)
        plain = ca(toks, features_only=True, classification_head_name=head, task_ids=ids)[0]
        same = ca(toks, features_only=True, classification_head_name=head, task_ids=ids, token_embeddings=emb)[0]
        noised = ca(toks, features_only=True, classification_head_name=head, task_ids=ids,
                    token_embeddings=emb + 1e-2 * torch.randn_like(emb))[0]
        default = ca(toks, classification_head_name=head)[0]
        zeros = ca(toks, classification_head_name=head, task_ids=torch.zeros(6, dtype=torch.long))[0]
    assert plain.shape == (6, 2) and torch.equal(plain, same) and (noised - plain).abs().max() > 1e-6
    assert torch.equal(default, zeros)


def test_bad_flags_name_themselves(pair):
    from recadam_fairseq.models.ca_mtl_roberta import CaMtlPlan

    args = pair[1].args  # the tiny CA-MTL model's parsed flags (2 layers, dim 64)

    def plan(**flags):
        return CaMtlPlan(argparse.Namespace(**{**vars(args), **flags}))

    with pytest.raises(ValueError, match=r"--ca-mtl-cln-layers '0-5': layer 2 does not exist, the model has 2 encoder layers \(0-1\)"):
        plan(ca_mtl_cln_layers="0-5")
    with pytest.raises(ValueError, match="--ca-mtl-attn-layers 'upper half'"):
        plan(ca_mtl_attn_layers="upper half")
    with pytest.raises(ValueError, match="--ca-mtl-attn-blocks 40"):
        plan(ca_mtl_attn_blocks=40)
    with pytest.raises(ValueError, match="--ca-mtl-adapter-dim -2"):
        plan(ca_mtl_adapter_dim=-2)
    p = plan(ca_mtl_cln_layers="none", ca_mtl_attn_layers="0,1", ca_mtl_adapter_layers="all")
    assert (p.cln, p.attn, p.adapter, p.adapter_dim, p.max_len, p.blocks) == (set(), {0, 1}, {0, 1}, 21, 32, 4)


def test_flags_reach_the_model(tiny):
    model, _, _ = build_tiny(tiny, *TINY_CA_MTL, "--ca-mtl-cln-layers", "none", "--ca-mtl-attn-layers", "1",
                             "--ca-mtl-adapter-layers", "none", "--ca-mtl-no-alignment")
    assert model.conditional_tensor_names() == [
        "encoder.sentence_encoder.layers.1.attn_bias.blocks", "encoder.sentence_encoder.layers.1.attn_bias.film.weight",
        "encoder.sentence_encoder.layers.1.attn_bias.film.bias", "encoder.sentence_encoder.task_embedding.weight"]


# --------------------------------------------------------------------------- fairseq-train
@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """Two fairseq-train runs side by side (each is mostly start-up):

    lr0: fairseq's Adam at lr 0 leaves every tensor as fairseq-train loaded it;
    recadam: 8 updates, λ(t) rising within them so the pretrained tensors move too.
    """
    lr0, rec = tmp_path_factory.mktemp("ca_mtl_lr0"), tmp_path_factory.mktemp("ca_mtl_recadam")
    out = run_plan({"lr0": lambda: tiny.train(lr0, *TINY_CA_MTL, "--lr", "0", optimizer="adam", updates=1),
                    "recadam": lambda: tiny.train(rec, *TINY_CA_MTL, "--recadam-anneal-t0", "2", "--recadam-anneal-k",
                                                  "1", updates=8)})
    return {"lr0": (lr0, out["lr0"][1]), "recadam": (rec, out["recadam"][1])}


@pytest.fixture(scope="module")
def loaded_run(runs):
    save, log = runs["lr0"]
    return load_ckpt(os.path.join(save, "checkpoint_last.pt"))["model"], log


@pytest.fixture(scope="module")
def recadam_run(runs):
    return runs["recadam"]


def test_restore_file_loads_every_pretrained_tensor(loaded_run, tiny, pair):
    model, log = loaded_run
    _, ca, _, _ = pair
    pretrained = load_ckpt(tiny.pretrained)["model"]
    for k, v in pretrained.items():
        assert torch.equal(model[k], v), k  # bit for bit
    new = ca.conditional_tensor_names()
    assert set(model) - set(pretrained) == set(new) | {k for k in model if k.startswith("classification_heads.")}
    line = [s for s in log.splitlines() if "ca_mtl_roberta:" in s]
    assert len(line) == 1 and f"{len(new)} conditional tensors" in line[0] and all(n in line[0] for n in new)
    for k in new:  # the identity initialisation, as loaded
        if ".film." in k or k.endswith(("alignment.weight", "alignment.bias", "attn_bias.blocks", "adapter.up.weight",
                                        "adapter.up.bias", "adapter.down.bias")):
            assert not model[k].any(), k
        else:
            assert model[k].std() > 0.01, k  # task embedding, adapter.down: BERT's normal(0, 0.02)


def test_recadam_anchors_exactly_the_pretrained_tensors(recadam_run, tiny, pair):
    _, log = recadam_run
    _, ca, _, _ = pair
    m = re.search(r"recadam: pretrained weights θ\* from --restore-file \S+: anchored (\d+) tensors \(([\d,]+) "
                  r"elements\); not anchored, plain Adam: (\d+) tensors \([\d,]+ elements\): (.*)$", log, re.M)
    assert m, log[-3000:]
    pretrained = load_ckpt(tiny.pretrained)["model"]
    params = dict(ca.named_parameters())
    anchored = [n for n in params if n in pretrained]
    # every checkpoint tensor is anchored, or is a buffer, or an alias of a tied (anchored) parameter
    aliases = {"encoder.lm_head.weight"}
    assert {k for k in pretrained if k not in params} == aliases | {k for k, _ in ca.named_buffers()}
    assert int(m.group(1)) == len(anchored)
    assert int(m.group(2).replace(",", "")) == sum(params[n].numel() for n in anchored)
    free = m.group(4).strip().split(", ")
    heads = [n for n in params if n.startswith("classification_heads.")]
    assert int(m.group(3)) == len(free) and sorted(free) == sorted(ca.conditional_tensor_names() + heads)


def test_ca_mtl_trains_and_loads_back(recadam_run, tiny, pair):
    from fairseq import checkpoint_utils

    save, log = recadam_run
    losses = [float(x) for x in re.findall(r"train_inner \| .* loss=([\d.]+),", log)]
    assert len(losses) >= 8 and all(np.isfinite(losses))
    ckpt = os.path.join(save, "checkpoint_last.pt")
    state = load_ckpt(ckpt)["model"]
    pretrained = load_ckpt(tiny.pretrained)["model"]
    _, fresh, _, _ = pair
    new = fresh.conditional_tensor_names()
    assert all(state[k].any() for k in new if ".film." in k)  # zero at start: they learned
    assert not torch.equal(state["encoder.sentence_encoder.layers.0.fc1.weight"],
                           pretrained["encoder.sentence_encoder.layers.0.fc1.weight"])
    # fairseq's own loading path (fairseq-validate, hub): the same model class and tensors
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([ckpt], arg_overrides={"data": tiny.cls_bin})
    model = models[0].eval()
    assert type(model).__name__ == "CaMtlRobertaModel" and model.is_task_conditioned
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    toks, _ = random_tokens(task)
    logits = model(toks, classification_head_name="sentence_classification_head")[0]
    assert logits.shape == (6, 2) and torch.isfinite(logits).all()
