"""CA-MTL's task-conditioned modules (Pilault, El hattami and Pal, ICLR 2021), pure torch.

Every module is conditioned per example: ``TaskEmbedding(task_ids)`` turns the ids [B] into
task embeddings z [B, D], and the other modules take z (one row per example, so a batch may mix
tasks). All of them start as the identity of what they modulate: the FiLM generators are
zero-initialised (γ(z) = β(z) = 0, so ``(1 + γ)·x + β = x``), the attention-bias blocks and the
bottleneck's up-projection are zero, so a freshly initialised CA-MTL model computes exactly the
pretrained model's function. ``reset_parameters()`` restores that state (fairseq's RoBERTa
re-initialises every ``nn.Linear`` / ``nn.Embedding`` after construction; the model calls it
afterwards).

Tensors are [B, T, C] or [T, B, C]: ``batch_dim`` says where the batch is.
"""

import math
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def per_example(v: Tensor, x: Tensor, batch_dim: int) -> Tensor:
    """View v [B, C] so that it broadcasts over x [.., B, .., C] whose batch is at ``batch_dim``."""
    shape = [1] * x.dim()
    shape[batch_dim] = v.size(0)
    shape[-1] = v.size(-1)
    return v.view(shape)


class TaskEmbedding(nn.Module):
    """z_i: one learned vector per task; ``forward(task_ids [B]) -> z [B, D]``."""

    def __init__(self, num_tasks: int, dim: int, std: float = 0.02):
        super().__init__()
        if num_tasks < 1:
            raise ValueError(f"CA-MTL needs at least one task, got num_tasks={num_tasks}")
        self.std = std
        self.weight = nn.Parameter(torch.empty(num_tasks, dim))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.weight, std=self.std)  # BERT's init, as the authors' code

    @property
    def num_tasks(self) -> int:
        return self.weight.size(0)

    def forward(self, task_ids: Tensor) -> Tensor:
        return F.embedding(task_ids, self.weight)


class FiLM(nn.Module):
    """Feature-wise linear modulation from z: ``(γ, β) = W z + b``, applied as ``(1 + γ)·x + β``.

    W and b start at zero, so the modulation starts as the identity.
    """

    def __init__(self, cond_dim: int, feat_dim: int):
        super().__init__()
        self.feat_dim = feat_dim
        self.weight = nn.Parameter(torch.empty(2 * feat_dim, cond_dim))
        self.bias = nn.Parameter(torch.empty(2 * feat_dim))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.zeros_(self.weight)
        nn.init.zeros_(self.bias)

    def gamma_beta(self, z: Tensor) -> Tuple[Tensor, Tensor]:
        """γ(z), β(z): each [B, feat_dim]."""
        gamma, beta = F.linear(z, self.weight, self.bias).chunk(2, dim=-1)
        return gamma, beta

    def forward(self, z: Tensor, x: Tensor, batch_dim: int = 0) -> Tensor:
        gamma, beta = self.gamma_beta(z)
        return torch.addcmul(per_example(beta, x, batch_dim), x, 1 + per_example(gamma, x, batch_dim))


class ConditionalAlignment(FiLM):
    """Conditional alignment: the embedding output x [.., B, .., D] becomes ``(1 + γ(z))·x + β(z)``."""

    def __init__(self, dim: int):
        super().__init__(dim, dim)


class ConditionalLayerNorm(nn.Module):
    """Layer norm whose gain is modulated by the task: ``LN(x)·((1 + γ(z))·w + β(z)) + b``.

    ``weight`` and ``bias`` are the pretrained layer norm's (same names, so a RoBERTa checkpoint
    loads into them); ``film`` is new. As in the authors' code, the task modulates the gain only.
    """

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-5):
        super().__init__()
        self.normalized_shape = (dim,)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.film = FiLM(cond_dim, dim)

    def reset_parameters(self):
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        self.film.reset_parameters()

    def forward(self, x: Tensor, z: Tensor, batch_dim: int = 0) -> Tensor:
        gamma, beta = self.film.gamma_beta(z)
        gain = torch.addcmul(beta, 1 + gamma, self.weight)  # [B, D]
        y = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        return torch.addcmul(self.bias, y, per_example(gain, y, batch_dim))


class ConditionalAttentionBias(nn.Module):
    """Conditional attention: a block-diagonal, task-conditioned bias M(z) added to QKᵀ/√d.

    Over the first ``max_len`` positions, M(z) = A'_1(z) ⊕ ... ⊕ A'_N(z) (block-diagonal), each
    block A'_n(z) = A_n·(1 + γ(z)) + β(z) with A_n ∈ R^{b×b} learned (zero at start) and γ, β ∈ R^b
    FiLM'd from z per block column, b = ceil(max_len / N). Positions beyond ``max_len`` get no bias.
    """

    def __init__(self, cond_dim: int, max_len: int, num_blocks: int):
        super().__init__()
        if max_len < 1 or num_blocks < 1 or num_blocks > max_len:
            raise ValueError(f"conditional attention needs 1 <= blocks ({num_blocks}) <= max_len ({max_len})")
        self.max_len = max_len
        self.num_blocks = num_blocks
        self.block = math.ceil(max_len / num_blocks)
        self.blocks = nn.Parameter(torch.zeros(num_blocks, self.block, self.block))
        self.film = FiLM(cond_dim, self.block)

    def reset_parameters(self):
        nn.init.zeros_(self.blocks)
        self.film.reset_parameters()

    def forward(self, z: Tensor, seq_len: int) -> Tensor:
        """The bias [B, seq_len, seq_len] for a batch of ``seq_len`` positions."""
        gamma, beta = self.film.gamma_beta(z)  # [B, b]
        a = torch.addcmul(beta[:, None, None, :], self.blocks[None], 1 + gamma[:, None, None, :])  # [B, N, b, b]
        eye = torch.eye(self.num_blocks, dtype=a.dtype, device=a.device)
        n = self.num_blocks * self.block
        m = torch.einsum("knij,nm->knimj", a, eye).reshape(a.size(0), n, n)  # block-diagonal
        keep = min(seq_len, self.max_len)
        m = m[:, :keep, :keep]
        if seq_len > keep:
            m = F.pad(m, (0, seq_len - keep, 0, seq_len - keep))
        return m


class ConditionalBottleneck(nn.Module):
    """Conditional bottleneck adapter: ``up(down(FiLM_z(h)))``, D -> ``dim`` -> D.

    Linear, as in the authors' code; ``up`` starts at zero so the adapter adds nothing at first.
    """

    def __init__(self, embed_dim: int, dim: int, cond_dim: int):
        super().__init__()
        self.film = FiLM(cond_dim, embed_dim)
        self.down = nn.Linear(embed_dim, dim)
        self.up = nn.Linear(dim, embed_dim)
        self.reset_parameters()

    def reset_parameters(self):
        self.film.reset_parameters()
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: Tensor, z: Tensor, batch_dim: int = 0) -> Tensor:
        return self.up(self.down(self.film(z, h, batch_dim)))


NEW_MODULES = (TaskEmbedding, FiLM, ConditionalAttentionBias, ConditionalBottleneck)
"""Modules whose tensors a pretrained (unconditioned) checkpoint does not have."""


def new_tensor_names(model: nn.Module) -> list:
    """Names (in ``model.state_dict()``) of the tensors that CA-MTL adds, in model order."""
    names = []
    for prefix, m in model.named_modules():
        if isinstance(m, NEW_MODULES):
            for n, _ in m.named_parameters():
                key = f"{prefix}.{n}" if prefix else n
                if key not in names:
                    names.append(key)
    return names


def reset_conditional_parameters(model: nn.Module) -> None:
    """Put every conditional module back to its identity initialisation (pretrained LN tensors untouched)."""
    for m in model.modules():
        if isinstance(m, NEW_MODULES):
            m.reset_parameters()
