"""SAM family, float64 unit level: one update of each variant through the controller (the same code
fairseq-train runs), against references written independently on flat vectors."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion
from torch.func import functional_call

from recadam_fairseq.core.sam_controller import SAMController
from recadam_fairseq.optim.sam_support import connect
from recadam_fairseq.core.sam import SAM_TYPES, Perturbed, gsam_rho, validate_sam_hparams



@pytest.fixture(autouse=True)
def _float64():
    """This module's tensors are float64; restored after each test (the others expect float32)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


H = dict(sam_type="sam", rho=0.3, beta=0.5, gamma=0.5, keep_ratio=0.2, num_samples=32, mask_iter_e=1,
         gsam_alpha=0.4, rho_min=0.05)
N_EX = 10
ESAM_SEED = 3  # its draw perturbs embed_tokens, fc1.weight, out.weight: weights and an embedding


class TinyNet(torch.nn.Module):
    """Parameter names with 'embed' and 'bias', a sentence_prediction-like call signature."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(13, 6)
        self.fc1 = torch.nn.Linear(6, 9)
        self.out = torch.nn.Linear(9, 3)

    def forward(self, src_tokens, src_lengths=None, features_only=True, classification_head_name=None):
        x = torch.tanh(self.fc1(self.embed_tokens(src_tokens).mean(1)))
        return self.out(x), None

    def get_targets(self, sample, net_output):
        return sample["target"]


class SumCE(FairseqCriterion):
    def __init__(self):
        super().__init__(task=None)

    def forward(self, model, sample, reduce=True):
        return self.per_example_loss(model, sample).sum(), sample["target"].numel(), {}

    def per_example_loss(self, model, sample):  # what ESAM's selection reads (criterions/glue_core.py)
        logits, _ = model(**sample["net_input"])
        return F.cross_entropy(logits, sample["target"], reduction="none")


def make(seed=0):
    torch.manual_seed(seed)
    model = TinyNet()
    sample = {"net_input": {"src_tokens": torch.randint(0, 13, (N_EX, 5)), "src_lengths": torch.full((N_EX,), 5)},
              "target": torch.randint(0, 3, (N_EX,)), "id": torch.arange(N_EX), "nsentences": N_EX, "ntokens": 5 * N_EX}
    return model, sample


def one_update(sam_type, lr=1e-3, seed=0, **kw):
    """fairseq's order: criterion forward (the pre-hook runs pass 1), backward, all_reduce_grads, step."""
    model, sample = make(seed)
    crit = SumCE()
    ctl = SAMController({**H, "sam_type": sam_type, **kw}, lr_of=lambda: lr, lr_max=2e-3, seed=ESAM_SEED)
    connect(ctl)  # as --sam-type does: the controller meets the criterion at its first training call
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen = {}
    crit.register_forward_hook(lambda m, a, out: seen.setdefault("sample", a[1]) and None)
    loss, _, _ = crit(model, sample)
    perturbed = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss.backward()
    assert ctl.before_reduce(model)
    ctl.after_reduce()
    for n, p in model.named_parameters():  # θ is back, bit for bit
        assert torch.equal(p, theta[n]), n
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    ctl.after_step()
    return model, sample, theta, perturbed, grads, seen["sample"], ctl


# ---------------------------------------------------------------- independent references
def flat(d, names):
    return torch.cat([d[n].reshape(-1) for n in names])


def ref_grad(model, theta, sample, idx=None):
    """∇ of the summed CE at parameters ``theta`` (a fresh copy of the model), on examples ``idx``."""
    m = copy.deepcopy(model)
    params = {n: t.clone().requires_grad_(True) for n, t in theta.items()}
    src, tgt = sample["net_input"]["src_tokens"], sample["target"]
    if idx is not None:
        src, tgt = src[idx], tgt[idx]
    logits, _ = functional_call(m, params, (src,))
    loss = -torch.log_softmax(logits, -1).gather(1, tgt[:, None]).sum()
    g = torch.autograd.grad(loss, list(params.values()))
    return dict(zip(params, g))


def per_example(model, theta, sample):
    logits, _ = functional_call(copy.deepcopy(model), theta, (sample["net_input"]["src_tokens"],))
    return -torch.log_softmax(logits, -1).gather(1, sample["target"][:, None])[:, 0]


def ref_mask(g, names, keep_ratio):
    """Top ⌊keep·N⌋ of g² over the non-bias, non-embedding elements, by a full sort; others: None."""
    elig = [n for n in names if "bias" not in n and "embed" not in n]
    vals = flat({n: g[n] ** 2 for n in elig}, elig).tolist()
    order = sorted(range(len(vals)), key=lambda i: -vals[i])
    keep = set(order[:int(len(vals) * keep_ratio)])
    out, off = {}, 0
    for n in elig:
        k = g[n].numel()
        out[n] = torch.tensor([float(i + off in keep) for i in range(k)]).view(g[n].shape)
        off += k
    return out


def ref_eps(g, names, rho, divisor=1.0, mask=None, selected=None):
    sel = [n for n in names if selected is None or n in selected]
    norm = flat(g, sel).norm().item() + 1e-12  # the 1e-12 of Foret et al.'s code (ρ = 0 gives ε = 0)
    return {n: (rho / divisor * g[n] / norm * (mask[n] if mask and n in mask else 1.0)) if n in sel
            else torch.zeros_like(g[n]) for n in names}


def esam_draw(n_tensors, beta, seed=None):
    return (torch.rand(n_tensors, generator=torch.Generator().manual_seed(ESAM_SEED if seed is None else seed), dtype=torch.float64) < beta).tolist()


def gsam_direction(gh, g, names, alpha):
    vh, v = flat(gh, names), flat(g, names)
    perp = v - (v @ vh) / (vh @ vh) * vh
    out, off = {}, 0
    for n in names:
        k = gh[n].numel()
        out[n] = gh[n] - alpha * perp[off:off + k].view(gh[n].shape)
        off += k
    return out


TOL = dict(rtol=1e-12, atol=1e-13)  # float64 round-off on O(1) values


@pytest.mark.parametrize("sam_type", [t for t in SAM_TYPES if t != "none"])
def test_one_update_matches_an_independent_float64_reference(sam_type):
    model, sample, theta, perturbed, grads, used_sample, ctl = one_update(sam_type)
    names = list(theta)
    g = ref_grad(model, theta, sample)
    base = sam_type.replace("fisher-", "")
    rho = gsam_rho(H["rho"], H["rho_min"], 1e-3, 2e-3) if base == "gsam" else H["rho"]
    if base == "gsam":
        assert rho == pytest.approx(0.05 + (0.3 - 0.05) * 0.5)
    selected = None
    if base == "esam":
        selected = {n for n, k in zip(names, esam_draw(len(names), H["beta"])) if k}
        assert 0 < len(selected) < len(names)  # the draw is a real selection
    g_seen = {n: g[n] if selected is None or n in selected else torch.zeros_like(g[n]) for n in names}
    mask = ref_mask(g_seen, names, H["keep_ratio"]) if sam_type.startswith("fisher") else None
    divisor = H["beta"] if base == "esam" else H["keep_ratio"] if sam_type == "fisher-gsam" else 1.0
    eps = ref_eps(g, names, rho, divisor, mask, selected)
    for n in names:  # θ + ε is what the second pass saw
        torch.testing.assert_close(perturbed[n], theta[n] + eps[n], **TOL, msg=n)
        if mask is not None and n in mask and (selected is None or n in selected):
            assert torch.equal(eps[n] != 0, mask[n].bool())
    plus = {n: theta[n] + eps[n] for n in names}
    idx = None
    if base == "esam":  # the γ-fraction with the largest loss rise, by a full sort
        rise = (per_example(model, plus, sample) - per_example(model, theta, sample)).tolist()
        idx = sorted(sorted(range(N_EX), key=lambda i: -rise[i])[:int(N_EX * H["gamma"])])
        assert used_sample["target"].tolist() == sample["target"][idx].tolist()
        assert used_sample["nsentences"] == len(idx) and used_sample["id"].tolist() == idx
    gh = ref_grad(model, plus, sample, idx)
    want = gsam_direction(gh, g, names, H["gsam_alpha"]) if base == "gsam" else gh
    for n in names:
        torch.testing.assert_close(grads[n], want[n], **TOL, msg=n)
        assert not torch.allclose(want[n], g[n], rtol=1e-6, atol=0) or n.endswith("bias")  # ε changed it
    if mask is not None:  # the committed mask is the exact top-k; biases/embeddings perturbed unmasked
        assert ctl.mask is not None
        for i, n in enumerate(names):
            if n in mask:
                assert torch.equal(ctl.mask[i].double(), mask[n]), n
            else:
                assert ctl.mask[i] is None
        assert 0 < sum(m.sum().item() for m in mask.values()) == int(
            sum(mask[n].numel() for n in mask) * H["keep_ratio"])


def test_rho_zero_leaves_the_gradient_exact():
    model, sample, theta, perturbed, grads, _, _ = one_update("sam", rho=0.0, rho_min=0.0)
    g = ref_grad(model, theta, sample)
    for n in theta:
        assert torch.equal(perturbed[n], theta[n])
        torch.testing.assert_close(grads[n], g[n], **TOL)


def test_restore_is_bit_exact_in_half_precision():
    torch.manual_seed(3)
    p = torch.randn(1000).half()
    orig = p.clone()
    e = torch.randn(1000) * 1e-2
    pert = Perturbed()
    pert.apply([p], [e])
    assert not torch.equal(p, orig)
    assert not torch.equal((p.float() - e).half(), orig)  # subtracting ε back would not be exact
    assert pert.restore() and torch.equal(p, orig) and not pert.active


@pytest.mark.parametrize("key,value,flag", [
    ("sam_type", "ssam", "--sam-type"), ("rho", -0.1, "--rho"), ("beta", 0.0, "--beta"), ("beta", 1.5, "--beta"),
    ("gamma", 0.0, "--gamma"), ("gamma", 2.0, "--gamma"), ("keep_ratio", 0.0, "--keep-ratio"),
    ("keep_ratio", 1.01, "--keep-ratio"), ("mask_iter_e", 0, "--mask-iter-e"), ("mask_iter_e", 2.5, "--mask-iter-e"),
    ("num_samples", 0, "--num-samples"), ("gsam_alpha", -1.0, "--gsam-alpha"), ("rho_min", 0.5, "--rho-min"),
])
def test_bad_input_names_the_flag(key, value, flag):
    with pytest.raises(ValueError, match=flag):
        validate_sam_hparams({**H, key: value})


def test_gsam_rho_follows_the_lr():
    assert gsam_rho(0.1, 0.01, 2e-3, 2e-3) == 0.1
    assert gsam_rho(0.1, 0.01, 0.0, 2e-3) == 0.01
    assert math.isclose(gsam_rho(0.1, 0.01, 5e-4, 2e-3), 0.01 + 0.09 * 0.25)
