"""The reference model: names, shapes, rank-independent sparsity, experts without gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from openclaw_ref.core.model import (
    PRESETS,
    OpenClawConfig,
    build_model,
    preset,
    sparsity_at,
    validate_sparsity_range,
)


def _batch(cfg: OpenClawConfig, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, cfg.vocab_size, (n, cfg.seq_len), generator=g)
    return tokens, torch.arange(100, 100 + n)


def test_parameters_carry_the_seed_names():
    names = {n for n, _ in build_model(preset("tiny")).named_parameters()}
    assert "layer.3.attn.v_proj.weight" in names
    assert "layer.5.ffn.w1.weight" in names
    assert "layer.0.ffn.gate.router.weight" in names


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_maps_tokens_to_skill_logits(name):
    cfg = preset(name)
    model = build_model(cfg)
    tokens, ids = _batch(cfg, 2)
    assert model(tokens, ids, step=0).shape == (2, cfg.n_skills)


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match="tiny"):
        preset("huge")


@pytest.mark.parametrize("lo,hi", [(-0.1, 0.5), (0.2, 1.0), (0.7, 0.3), (0.5, 1.5)])
def test_sparsity_range_outside_unit_interval_or_empty_is_rejected(lo, hi):
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        validate_sparsity_range(lo, hi)


def test_sparsity_schedule_stays_in_the_seed_range():
    cfg = preset("tiny")
    values = [sparsity_at(cfg, s) for s in range(500)]
    assert min(values) >= 0.12 and max(values) <= 0.68
    assert max(values) - min(values) > 0.4  # the schedule really moves across the range


def test_realized_mask_density_is_within_binomial_tolerance():
    cfg = preset("tiny")
    model = build_model(cfg)
    tokens, ids = _batch(cfg, 16)
    for step in range(5):
        model(tokens, ids, step)
        s = sparsity_at(cfg, step)
        n = 16 * cfg.seq_len * cfg.d_ff  # every token is valid here
        sigma = math.sqrt(s * (1 - s) / n)
        for unit in model.gating_units():
            assert abs(unit.stats.masked_fraction - s) < 5 * sigma


def test_masks_depend_on_samples_not_on_how_the_batch_is_split():
    """N ranks × B samples must equal one process × N·B samples."""
    cfg = preset("tiny")
    model = build_model(cfg)
    tokens, ids = _batch(cfg, 8)
    whole = model(tokens, ids, step=3)
    halves = torch.cat([model(tokens[:4], ids[:4], 3), model(tokens[4:], ids[4:], 3)])
    torch.testing.assert_close(whole, halves, rtol=1e-5, atol=1e-6)


def test_same_seed_builds_identical_weights_and_outputs():
    cfg = preset("tiny", seed=7)
    a, b = build_model(cfg), build_model(cfg)
    tokens, ids = _batch(cfg, 4)
    assert torch.equal(a(tokens, ids, 1), b(tokens, ids, 1))


def test_an_expert_without_samples_gets_no_gradient():
    cfg = preset("tiny", n_experts=4, top_k=1)
    model = build_model(cfg)
    tokens, ids = _batch(cfg, 1)  # one sample reaches one expert per layer
    F.cross_entropy(model(tokens, ids, 0), torch.tensor([0])).backward()
    for blk in model.layer:
        grads = [e.w1.weight.grad is not None for e in blk.ffn.experts]
        assert sum(grads) == 1


def test_masked_units_receive_exactly_zero_gradient():
    cfg = preset("tiny", n_layer=1, sparsity_range=(0.5, 0.5))
    model = build_model(cfg)
    tokens, ids = _batch(cfg, 1)
    hidden = {}

    def keep_pre_activation(module, inputs, output) -> None:
        output.retain_grad()
        hidden["h"] = output

    model.layer[0].ffn.w1.register_forward_hook(keep_pre_activation)
    F.cross_entropy(model(tokens, ids, 0), torch.tensor([1])).backward()
    keep = model.layer[0].ffn.gate.unit_mask(tokens, ids, 0).bool()
    assert (~keep).any()
    assert torch.all(hidden["h"].grad[~keep] == 0)


def test_mask_entropy_is_reported_in_bits():
    cfg = preset("tiny")
    model = build_model(cfg)
    assert model.sparse_mask_entropy() == 0.0  # nothing realized yet
    tokens, ids = _batch(cfg, 8)
    model(tokens, ids, 0)
    assert 0.0 < model.sparse_mask_entropy() <= 1.0


def test_model_never_imports_torch_distributed():
    import openclaw_ref.core.model as m

    source = open(m.__file__).read()
    assert "torch.distributed" not in source.replace('``torch.distributed``', "")
