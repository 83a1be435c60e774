"""The openclaw reference model: a small transformer with a sparse gating unit in every block.

The seed texts describe "openclaw" only by its symptoms: a transformer whose sparse gating unit
masks 12–68% of its FFN units per step, with parameters named like ``layer.3.attn.v_proj.weight``
and ``layer.5.ffn.w1``. This file is the smallest model that has those properties *honestly*:

* Every source of randomness is a pure function of ``(seed, step, sample_id, position, unit)``,
  never of the rank, so N ranks with B samples each compute exactly what one process computes on
  the same N·B samples. That is what makes equivalence tests and every later consistency result
  meaningful.
* Each block routes whole samples to ``top_k`` of ``n_experts`` small experts. An expert that
  receives no sample on a rank gets *no gradient* on that rank (``grad is None``) — the realistic
  reason why the set of gradients differs between ranks under dynamic sparsity.

The model never imports ``torch.distributed``: parallelism is applied to a built model elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

SPARSITY_BOUNDS = (0.0, 1.0)  # allowed: lo <= s <= hi with 0 <= lo <= hi < 1
SEED_SPARSITY_RANGE = (0.12, 0.68)  # the seed's claim S2


def validate_sparsity_range(lo: float, hi: float) -> None:
    """Reject ranges outside [0, 1) or empty; raised before any process starts."""
    if not (0.0 <= lo < 1.0 and 0.0 <= hi < 1.0):
        raise ValueError(f"sparsity ratios must lie in [0, 1); got ({lo}, {hi})")
    if lo > hi:
        raise ValueError(f"sparsity range is empty: low {lo} > high {hi}; allowed range is [0, 1)")


@dataclass(frozen=True)
class OpenClawConfig:
    """Sizes of the model; presets below name the ones we publish numbers for."""

    vocab_size: int = 64
    seq_len: int = 16
    n_layer: int = 6
    n_head: int = 2
    d_model: int = 32
    d_ff: int = 64
    n_experts: int = 4
    top_k: int = 1
    d_expert: int = 32
    n_skills: int = 8
    sparsity_range: tuple[float, float] = field(default=SEED_SPARSITY_RANGE)
    seed: int = 0

    def __post_init__(self) -> None:
        validate_sparsity_range(*self.sparsity_range)
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_head {self.n_head}")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={self.n_experts}]; got {self.top_k}")


PRESETS: dict[str, OpenClawConfig] = {
    # CI: six layers so the seed's names (layer.3, layer.5) exist; a step takes ~20 ms here.
    "tiny": OpenClawConfig(),
    # The size the shared torch facts were measured with (4 layers, d256).
    "small": OpenClawConfig(
        vocab_size=256, seq_len=64, n_layer=4, n_head=4, d_model=256, d_ff=1024,
        n_experts=4, top_k=1, d_expert=256, n_skills=16,
    ),
    # Deep enough to have the seed's parameter names (layer.3, layer.5) many times over.
    "base": OpenClawConfig(
        vocab_size=1024, seq_len=128, n_layer=8, n_head=8, d_model=512, d_ff=2048,
        n_experts=8, top_k=2, d_expert=512, n_skills=32,
    ),
}


def preset(name: str, **overrides: object) -> OpenClawConfig:
    """A named preset, optionally with fields replaced; unknown names list the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Counter-based hashing: rank-independent randomness without generator state.


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A few rounds of 31-bit LCG + xorshift; every intermediate fits in int64 without overflow."""
    for _ in range(3):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        x = x ^ (x >> 13)
    return x


def hash_uniform(*keys: torch.Tensor | int) -> torch.Tensor:
    """Uniform [0, 1) values that depend only on the integer keys (broadcast together)."""
    device = next((k.device for k in keys if isinstance(k, torch.Tensor)), torch.device("cpu"))
    acc = torch.zeros((), dtype=torch.int64, device=device)
    for k in keys:
        k_t = torch.as_tensor(k, dtype=torch.int64, device=device)
        acc = _mix((acc ^ (k_t & 0x7FFFFFFF)) + 0x9E3779B)
    return acc.to(torch.float64).div(2.0**31).to(torch.float32)


EVAL_STEP = -1  # evaluation uses the middle of the range, so validation losses are comparable


def sparsity_at(cfg: OpenClawConfig, step: int) -> float:
    """The target masked fraction s for a step: a seeded schedule, identical on every rank."""
    lo, hi = cfg.sparsity_range
    if step == EVAL_STEP:
        return (lo + hi) / 2
    u = float(hash_uniform(cfg.seed, step, 0x5A5A))
    return lo + (hi - lo) * u


# ---------------------------------------------------------------------------------------------
# Modules


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention over valid (non-pad) keys; projections named q/k/v/o_proj."""

    def __init__(self, cfg: OpenClawConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model)
        # No key bias: it shifts every logit of a query equally, so softmax makes its gradient
        # exactly zero in theory and pure round-off in practice, which Adam amplifies to ±lr
        # steps that differ between 1 and N ranks.
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x_BTC: torch.Tensor, valid_BT: torch.Tensor) -> torch.Tensor:
        B, T, C = x_BTC.shape
        H = self.n_head

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, C/H)

        q, k, v = heads(self.q_proj(x_BTC)), heads(self.k_proj(x_BTC)), heads(self.v_proj(x_BTC))
        causal_TT = torch.ones(T, T, dtype=torch.bool, device=x_BTC.device).tril()
        allowed_B1TT = causal_TT & valid_BT[:, None, None, :]
        allowed_B1TT = allowed_B1TT | torch.eye(T, dtype=torch.bool, device=x_BTC.device)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed_B1TT)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class Expert(nn.Module):
    """One small MLP; receives whole samples chosen by the router."""

    def __init__(self, cfg: OpenClawConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_expert)
        self.w2 = nn.Linear(cfg.d_expert, cfg.d_model)

    def forward(self, x_NTC: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x_NTC)))


@dataclass
class GatingStats:
    """What one gating unit realized in its last forward (plain tensors, never reduced here)."""

    masked_fraction: float = 0.0
    unit_keep_rate: torch.Tensor | None = None  # (d_ff,)
    expert_load: torch.Tensor | None = None  # (n_experts,) samples routed to each expert


class SparseGatingUnit(nn.Module):
    """Decides, per step, which FFN units each token keeps and which experts each sample uses.

    Forward steps:
      1. target ratio s = sparsity_at(seed, step) — the same on every rank;
      2. unit mask: unit u of token t in sample i is dropped when
         hash(seed, step, sample_id_i, t, token_id, u) < s — data-dependent (the token id enters
         the hash) but rank-independent, Bernoulli(1 - s) per element;
      3. routing: the router scores the mean of the sample's valid tokens and keeps the top_k
         experts with softmax weights over those k.

    Implements the seed's ``SparseGradientContract`` (P3) through ``sparse_mask_entropy()``.
    """

    def __init__(self, cfg: OpenClawConfig, layer_index: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_index = layer_index
        self.router = nn.Linear(cfg.d_model, cfg.n_experts)
        self.stats = GatingStats()

    def unit_mask(
        self, tokens_BT: torch.Tensor, sample_ids_B: torch.Tensor, step: int
    ) -> torch.Tensor:
        """Keep-mask (B, T, d_ff) as float 0/1."""
        B, T = tokens_BT.shape
        s = sparsity_at(self.cfg, step)
        pos_T = torch.arange(T, device=tokens_BT.device)
        unit_F = torch.arange(self.cfg.d_ff, device=tokens_BT.device)
        u_BTF = hash_uniform(
            self.cfg.seed * 1000 + self.layer_index,
            step,
            sample_ids_B.to(tokens_BT.device)[:, None, None],
            pos_T[None, :, None],
            tokens_BT[:, :, None],
            unit_F[None, None, :],
        )
        return (u_BTF >= s).to(torch.float32)

    def route(self, x_BTC: torch.Tensor,
              valid_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k expert ids (B, k) and their weights (B, k) per sample."""
        w_BT1 = valid_BT.unsqueeze(-1).to(x_BTC.dtype)
        pooled_BC = (x_BTC * w_BT1).sum(1) / w_BT1.sum(1).clamp_min(1.0)
        logits_BE = self.router(pooled_BC)
        top_logits_BK, top_ids_BK = logits_BE.topk(self.cfg.top_k, dim=-1)
        return top_ids_BK, top_logits_BK.softmax(dim=-1)

    def record(self, keep_BTF: torch.Tensor, valid_BT: torch.Tensor, ids_BK: torch.Tensor) -> None:
        with torch.no_grad():
            v = valid_BT.unsqueeze(-1).to(keep_BTF.dtype)
            n_valid = v.sum().clamp_min(1.0)
            keep_rate_F = (keep_BTF * v).sum((0, 1)) / n_valid
            self.stats = GatingStats(
                masked_fraction=float(1.0 - keep_rate_F.mean()),
                unit_keep_rate=keep_rate_F.detach().cpu(),
                expert_load=torch.bincount(ids_BK.flatten().cpu(), minlength=self.cfg.n_experts),
            )

    def sparse_mask_entropy(self) -> float:
        """Mean binary entropy (bits) of each unit's realized keep rate in the last forward."""
        p = self.stats.unit_keep_rate
        if p is None:
            return 0.0
        p = p.clamp(1e-12, 1 - 1e-12)
        h = -(p * p.log2() + (1 - p) * (1 - p).log2())
        return float(h.mean())


class SparseFFN(nn.Module):
    """Dense FFN (w1, w2) whose hidden units are masked by the gating unit, plus routed experts."""

    def __init__(self, cfg: OpenClawConfig, layer_index: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.gate = SparseGatingUnit(cfg, layer_index)
        self.experts = nn.ModuleList(Expert(cfg) for _ in range(cfg.n_experts))

    def forward(
        self, x_BTC: torch.Tensor, tokens_BT: torch.Tensor, valid_BT: torch.Tensor,
        sample_ids_B: torch.Tensor, step: int,
    ) -> torch.Tensor:
        keep_BTF = self.gate.unit_mask(tokens_BT, sample_ids_B, step).to(x_BTC.dtype)
        h_BTF = F.gelu(self.w1(x_BTC)) * keep_BTF
        out_BTC = self.w2(h_BTF)
        ids_BK, weights_BK = self.gate.route(x_BTC, valid_BT)
        self.gate.record(keep_BTF, valid_BT, ids_BK)
        for e, expert in enumerate(self.experts):
            hit_BK = ids_BK == e
            samples = hit_BK.any(-1).nonzero().flatten()
            if samples.numel() == 0:
                continue  # no sample routed here on this rank: this expert gets no gradient
            w_N = (weights_BK * hit_BK).sum(-1)[samples]
            out_BTC = out_BTC.index_add(0, samples, expert(x_BTC[samples]) * w_N[:, None, None])
        return out_BTC


class Block(nn.Module):
    def __init__(self, cfg: OpenClawConfig, layer_index: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ffn = SparseFFN(cfg, layer_index)

    def forward(self, x, tokens, valid, sample_ids, step: int) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), valid)
        return x + self.ffn(self.ln2(x), tokens, valid, sample_ids, step)


class OpenClawModel(nn.Module):
    """Tokens (B, T) → skill logits (B, n_skills): the hierarchical shape of seed 004's model.

    ``forward(tokens, sample_ids, step)``: token id 0 is padding. ``sample_ids`` are the global
    dataset indices of the batch rows; with ``step`` they fix every random choice.
    """

    def __init__(self, cfg: OpenClawConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.layer = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.n_skills)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Seeded init from the config alone, so every rank builds bitwise-identical weights."""
        g = torch.Generator().manual_seed(self.cfg.seed)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if p.dim() == 1:
                    p.copy_(torch.ones_like(p) if name.endswith("ln1.weight") or name.endswith(
                        "ln2.weight") or name == "ln_f.weight" else torch.zeros_like(p))
                else:
                    std = 0.02 if "embed" in name or "pos" in name else 1.0 / math.sqrt(p.shape[1])
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def conditional_parameter_names(self) -> list[str]:
        """Parameters that may legitimately get no gradient on a rank in a step (experts no
        sample was routed to). Every other parameter must receive one every step: the
        hardened sync checks that contract (seed P3's ``SparseGradientContract``)."""
        return [n for n, _ in self.named_parameters() if ".experts." in n]

    def gating_units(self) -> list[SparseGatingUnit]:
        return [blk.ffn.gate for blk in self.layer]

    def sparse_mask_entropy(self) -> float:
        units = self.gating_units()
        return sum(u.sparse_mask_entropy() for u in units) / max(1, len(units))

    def realized_sparsity(self) -> float:
        units = self.gating_units()
        return sum(u.stats.masked_fraction for u in units) / max(1, len(units))

    def forward(self, tokens_BT: torch.Tensor, sample_ids_B: torch.Tensor,
                step: int) -> torch.Tensor:
        B, T = tokens_BT.shape
        valid_BT = tokens_BT != 0
        x = self.embed(tokens_BT) + self.pos(torch.arange(T, device=tokens_BT.device))
        for blk in self.layer:
            x = blk(x, tokens_BT, valid_BT, sample_ids_B, step)
        x = self.ln_f(x)
        w_BT1 = valid_BT.unsqueeze(-1).to(x.dtype)
        pooled_BC = (x * w_BT1).sum(1) / w_BT1.sum(1).clamp_min(1.0)
        return self.head(pooled_BC)


def build_model(cfg: OpenClawConfig) -> OpenClawModel:
    return OpenClawModel(cfg)
