"""Seven small models of the kinds users bring, each as a ``Target`` factory. Most are *not*
shard-invariant — N ranks of any correct DDP differ from one process on the global batch — which
is why the suite judges a hook against stock DDP: BatchNorm normalizes over the local batch, an
in-batch softmax sees only the local negatives, a load-balancing loss counts the local tokens,
and a branch taken on the batch mean is taken per shard.

Every factory seeds its own weights, and every batch is a function of (step, rank) alone, with
rank-dependent statistics (so averaging matters). Sizes are tiny: a run of 4 steps on 2 ranks
costs well under a second here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from openclaw_ref.conformance.target import Batch, Target

PER_RANK = 8  # samples per rank


def _gen(step: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(10_007 * step + 101 * rank + 1)


class BatchNormCNN(nn.Module):
    """Two conv blocks with ``BatchNorm2d``: running statistics are buffers, and the batch
    statistics make each rank's gradient depend on its whole shard."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def batchnorm_cnn() -> Target:
    torch.manual_seed(0)

    def batch(step: int, rank: int, world_size: int) -> Batch:
        g = _gen(step, rank)
        x = torch.randn(PER_RANK, 3, 8, 8, generator=g) * (1 + rank) + 0.5 * rank
        return x, torch.randint(0, 4, (PER_RANK,), generator=g)

    return Target(BatchNormCNN(), batch, F.cross_entropy, lr=0.1)


class TiedLM(nn.Module):
    """A next-token model whose output projection is its embedding (one Parameter, two uses):
    DDP sees the tied weight once, and its gradient sums both uses."""

    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        steps = torch.arange(1, tokens.shape[1] + 1, dtype=h.dtype).view(1, -1, 1)
        h = torch.tanh(self.mix(h.cumsum(1) / steps))  # causal: position t sees tokens <= t
        return self.out(h)


def tied_lm() -> Target:
    torch.manual_seed(0)

    def batch(step: int, rank: int, world_size: int) -> Batch:
        g = _gen(step, rank)
        seq = torch.randint(0, 16 + 8 * rank, (PER_RANK, 7), generator=g) % 32
        return seq[:, :-1], seq[:, 1:]

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    return Target(TiedLM(), batch, loss, lr=0.2)


class Branching(nn.Module):
    """Takes one of two paths on the sign of the *batch* mean: each shard decides for itself,
    so a rank may leave a path's parameters unused on a step (``find_unused_parameters``)."""

    def __init__(self) -> None:
        super().__init__()
        self.pos, self.neg = nn.Linear(12, 16), nn.Linear(12, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        path = self.pos if bool(x.mean() > 0) else self.neg
        return self.head(torch.relu(path(x)))


def branching() -> Target:
    torch.manual_seed(0)

    def batch(step: int, rank: int, world_size: int) -> Batch:
        g = _gen(step, rank)
        shift = 0.6 if (step + rank) % 2 == 0 else -0.6  # the ranks disagree on every step
        x = torch.randn(PER_RANK, 12, generator=g) + shift
        return x, torch.randint(0, 3, (PER_RANK,), generator=g)

    return Target(Branching(), batch, F.cross_entropy, lr=0.1, find_unused_parameters=True)


class Frozen(nn.Module):
    """A "pretrained" stem with ``requires_grad=False`` (no gradient, no bucket slot) and a
    LayerNorm, then trainable layers."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32))
        for p in self.stem.parameters():
            p.requires_grad_(False)
        self.body = nn.Sequential(nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.stem(x))


def frozen_layers() -> Target:
    torch.manual_seed(0)

    def batch(step: int, rank: int, world_size: int) -> Batch:
        g = _gen(step, rank)
        x = torch.randn(PER_RANK, 16, generator=g) * (1 + rank)
        return x, torch.randint(0, 4, (PER_RANK,), generator=g)

    return Target(Frozen(), batch, F.cross_entropy, lr=0.1)


class SparseEmbedding(nn.Module):
    """A bag of ids through ``nn.Embedding(sparse=True)``: its gradient is a sparse COO tensor,
    which DDP reduces in a bucket of its own."""

    def __init__(self, ids: int = 64, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(ids, dim, sparse=True)
        self.head = nn.Linear(dim, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).mean(1))


def sparse_embedding() -> Target:
    torch.manual_seed(0)

    def batch(step: int, rank: int, world_size: int) -> Batch:
        g = _gen(step, rank)
        ids = torch.randint(0, 40, (PER_RANK, 5), generator=g) + 8 * rank  # overlapping rows
        return ids, torch.randint(0, 4, (PER_RANK,), generator=g)

    return Target(SparseEmbedding(), batch, F.cross_entropy, lr=0.2)


class Router(nn.Module):
    """Top-1 routing over four experts, Switch-Transformer style: the output carries the
    load-balancing loss E · Σ_e f_e · P_e, with f_e the fraction of the *local* tokens sent to
    expert e and P_e their mean router probability. An expert no local token chose gets no
    gradient on that rank (``find_unused_parameters``)."""

    def __init__(self, dim: int = 12, experts: int = 4) -> None:
        super().__init__()
        self.router = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))
        self.head = nn.Linear(dim, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(self.router(x), dim=-1)
        gate, choice = probs.max(dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            chosen = choice == e
            if bool(chosen.any()):
                out[chosen] = expert(x[chosen]) * gate[chosen, None]
        share = F.one_hot(choice, len(self.experts)).float().mean(0)
        aux = len(self.experts) * (share * probs.mean(0)).sum()
        return self.head(torch.relu(out + x)), aux


def moe_router() -> Target:
    torch.manual_seed(0)

    def batch(step: int, rank: int, world_size: int) -> Batch:
        g = _gen(step, rank)
        x = torch.randn(PER_RANK, 12, generator=g) + torch.linspace(-1, 1, 12) * rank
        return x, torch.randint(0, 3, (PER_RANK,), generator=g)

    def loss(output: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        logits, aux = output
        return F.cross_entropy(logits, labels) + 0.1 * aux

    return Target(Router(), batch, loss, lr=0.1, find_unused_parameters=True)


class TwoTower(nn.Module):
    """Query and document encoders; the loss is a softmax over every pair in the batch, so a
    sample's negatives are the other samples of its shard (in-batch negatives)."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 8))
        self.doc = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 8))

    def forward(self, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.query(q), dim=-1) @ F.normalize(self.doc(d), dim=-1).T * 10.0


def contrastive() -> Target:
    torch.manual_seed(0)

    def batch(step: int, rank: int, world_size: int) -> Batch:
        g = _gen(step, rank)
        q = torch.randn(PER_RANK, 10, generator=g) * (1 + rank)
        d = q + 0.3 * torch.randn(PER_RANK, 10, generator=g)
        return (q, d), torch.arange(PER_RANK)  # each query's own document is its positive

    return Target(TwoTower(), batch, F.cross_entropy, lr=0.2)


def syncbn_mlp() -> Target:
    """An MLP with ``nn.SyncBatchNorm`` (batch statistics reduced across the ranks). Not in
    ``MODELS``: torch 2.13 supports it only on GPU modules (CUDA, and XPU/HPU builds); on the
    CPU, DDP refuses it at construction ("SyncBatchNorm layers only work with GPU modules")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.SyncBatchNorm(32), nn.ReLU(), nn.Linear(32, 4))

    def batch(step: int, rank: int, world_size: int) -> Batch:
        g = _gen(step, rank)
        x = torch.randn(PER_RANK, 16, generator=g) * (1 + rank)
        return x, torch.randint(0, 4, (PER_RANK,), generator=g)

    return Target(model, batch, F.cross_entropy, lr=0.1)


# Every model of the zoo, by the name ``--openclaw-model`` takes after ``zoo.models:``.
MODELS: tuple[str, ...] = ("batchnorm_cnn", "tied_lm", "branching", "frozen_layers",
                           "sparse_embedding", "moe_router", "contrastive")
