"""The compute canary's parts on one process: the probe touches nothing of training and holds
one block of gradients at a time, its input survives the trip as tensors, compiled modules are
probed without a recompile, and the verdict over the ranks' runs reaches each of its outcomes
(``sync/canary/``)."""

from __future__ import annotations

import math
from types import MethodType, SimpleNamespace

import pytest
import torch
from torch import nn

from openclaw_ref.sync.base import CANARY_EVERY, SyncConfig
from openclaw_ref.sync.canary.fingerprint import (
    FIELD_BYTES,
    FIELDS,
    decode_fields,
    encode_fields,
    local_fingerprint,
    unequal,
)
from openclaw_ref.sync.canary.input import _decode, _describe, capture
from openclaw_ref.sync.canary.probe import cotangent_like, run_probe
from openclaw_ref.sync.canary.row import STRIKES, CanaryEvent, Mode
from openclaw_ref.sync.canary.schedule import Canary
from openclaw_ref.sync.canary.tolerance import RTOL, RTOL_LOW, distance, off_ranks
from openclaw_ref.sync.canary.verdict import Finding, Outcome, Run, classify
from openclaw_ref.sync.errors import BadInput, ComputeMismatch
from openclaw_ref.sync.evidence.replica_digest import ReplicaDigest
from openclaw_ref.sync.hardening import canary_interval


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Linear(8, 2))


def _probe(net: nn.Module, x: torch.Tensor, seed: int = 3, **kw):
    return run_probe(net, list(net.named_parameters()), (x,), {}, seed, **kw)


def test_the_probe_leaves_grads_buffers_and_the_rng_stream_untouched():
    net, x = _net(), torch.randn(2, 6)
    before = {n: b.clone() for n, b in net.named_buffers()}
    rng = torch.get_rng_state()
    got = _probe(net, x)
    assert len(got.digest_list()) == 6 and all(d != 0 for d in got.digest_list())
    assert all(p.grad is None for p in net.parameters())
    assert all(torch.equal(before[n], b) for n, b in net.named_buffers())
    assert torch.equal(torch.get_rng_state(), rng)


def test_the_probe_is_bitwise_reproducible_with_dropout():
    net, x = _net(), torch.randn(2, 6)
    a, b = _probe(net, x, seed=5), _probe(net, x, seed=5)
    assert a.digest_list() == b.digest_list() and torch.equal(a.figures, b.figures)


def test_the_probes_digests_are_those_of_the_gradients_autograd_computes():
    """Streaming (each gradient digested as it is accumulated, then dropped) changes nothing:
    the digests are the replica digests of the full probe gradients."""
    net, x = _net(), torch.randn(2, 6)
    got = _probe(net, x, seed=5)
    with torch.random.fork_rng():
        torch.manual_seed(5)  # the probe's dropout stream
        out = net(x)
        grads = torch.autograd.grad(out, list(net.parameters()), cotangent_like(out, 5))
    assert got.digest_list() == ReplicaDigest().digests_on_host(list(grads))
    for i, g in enumerate(grads):
        assert math.isclose(float(got.figures[2 * i]), float(g.double().sum()), rel_tol=1e-9)


def test_the_probe_holds_one_block_of_gradients_at_a_time():
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])  # 8 x 16.6 KB of gradients
    total = sum(p.numel() * p.element_size() for p in net.parameters())
    largest = max(p.numel() * p.element_size() for p in net.parameters())
    x = torch.randn(2, 64)
    got = _probe(net, x, block_bytes=1)
    assert 0 < got.held_bytes <= largest < total
    whole = _probe(net, x, block_bytes=total)
    assert got.digest_list() == whole.digest_list()  # the block size never changes a digest


def test_the_probe_input_is_a_slice_of_the_batch_and_survives_the_header_round_trip():
    x, ids, mask = torch.randn(8, 3), torch.arange(8), torch.ones(4, 4)
    noted = capture((x, ids, 7), {"mask": mask, "scale": 0.5, "flag": True, "name": "x",
                                  "none": None})
    assert noted.leaves[0].shape == (2, 3) and torch.equal(noted.leaves[1], ids[:2])
    assert noted.leaves[2] == 7
    words, tensors = _describe(noted.leaves)
    payload = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])
    back = _decode(words, payload)
    for mine, theirs in zip(noted.leaves, back):
        if isinstance(mine, torch.Tensor):
            assert torch.equal(mine, theirs) and mine.dtype == theirs.dtype
        elif isinstance(mine, str):
            assert theirs is not mine  # a string is not sent: each rank keeps its own
        else:
            assert mine == theirs and type(mine) is type(theirs)


def test_the_probe_runs_the_forward_the_instance_carries_rather_than_the_class_one():
    """A client's persistent wrapper (Accelerate's autocast) is what training runs, so it is
    what the probe checks: here one that doubles the output doubles every gradient."""
    net, x = _net(), torch.randn(2, 6)
    net.forward = MethodType(lambda self, t: 2 * type(self).forward(self, t), net)
    plain = _probe(net, x, seed=7)
    wrapped = _probe(net, x, seed=7, forward=net.forward)
    assert torch.equal(2 * plain.figures, wrapped.figures)


def test_a_probe_under_autocast_says_it_computed_in_a_16_bit_float():
    net, x = _net(), torch.randn(2, 6)
    assert not _probe(net, x).low_precision
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _probe(net, x).low_precision


def test_a_compiled_module_is_probed_eagerly_without_a_recompile():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    try:
        net, x = _net(), torch.randn(2, 6)
        compiled = torch.compile(net, backend="aot_eager")  # dynamo's guards, no codegen
        compiled(torch.randn(16, 6)).sum().backward()
        graphs = counters["stats"]["unique_graphs"]
        got = _probe(compiled, x)  # 2 rows: a new shape to dynamo, were it asked
        compiled(torch.randn(16, 6)).sum().backward()
        assert counters["stats"]["unique_graphs"] == graphs and not counters["recompiles"]
        net.zero_grad(set_to_none=True)
        assert got.digest_list() == _probe(net, x).digest_list()  # the eager module's probe
    finally:
        torch._dynamo.reset()


# -- the verdict over the ranks' runs --------------------------------------------------------
def _run(tag: int, scale: float = 1.0) -> Run:
    """A run whose digests are ``tag`` and whose figures are scaled by ``scale``."""
    return Run((tag, tag), (1.0 * scale, 2.0 * scale, 3.0, 4.0))


def test_agreeing_runs_agree():
    assert classify([[_run(1)] * 3] * 3, False, RTOL).outcome is Outcome.AGREE


def test_a_rank_that_reproduces_its_own_other_result_is_persistent_and_named():
    runs = [[_run(1)] * 3, [_run(2)] * 3, [_run(1)] * 3]
    assert classify(runs, False, RTOL) == Finding(Outcome.PERSISTENT, (1,), False, 0, 0.0)


def test_two_ranks_that_each_reproduce_their_own_result_are_both_suspects():
    found = classify([[_run(1)] * 3, [_run(2, scale=2.0)] * 3], False, RTOL)
    assert found.outcome is Outcome.PERSISTENT and found.ranks == (0, 1) and found.tie


def test_one_rank_whose_runs_vary_while_the_others_agree_is_transient_on_that_rank():
    runs = [[_run(1)] * 3, [_run(9, scale=1.5), _run(1), _run(1)], [_run(1)] * 3]
    found = classify(runs, False, RTOL)
    assert found.outcome is Outcome.TRANSIENT and found.ranks == (1,)
    assert found.distance == pytest.approx(1.0 / 7)  # mass 2 → 3 of a whole mass of 7


def test_a_transient_is_attributed_by_its_own_variation_also_with_two_ranks():
    found = classify([[_run(1)] * 3, [_run(1), _run(9), _run(1)]], False, RTOL)
    assert found.outcome is Outcome.TRANSIENT and found.ranks == (1,)


def test_two_ranks_whose_runs_vary_are_the_jobs_non_determinism():
    runs = [[_run(1), _run(2), _run(1)], [_run(3), _run(1), _run(4)], [_run(1)] * 3]
    assert classify(runs, False, RTOL).outcome is Outcome.NONDETERMINISTIC


def test_under_the_tolerance_noise_agrees_and_only_a_distant_rank_is_persistent():
    noisy = [[_run(k, scale=1 + 1e-9 * k) for k in range(3)] for _ in range(3)]
    assert classify(noisy, True, RTOL).outcome is Outcome.AGREE
    far = [[_run(0)] * 3, [_run(0)] * 3, [_run(7, scale=3.0)] * 3]
    found = classify(far, True, RTOL)
    assert found.outcome is Outcome.PERSISTENT and found.ranks == (2,) and not found.tie


def test_the_tolerance_is_relative_to_the_whole_probe_gradient_not_one_parameter():
    """A BatchNorm-fed bias's gradient is ~0, pure noise: relative to itself any noise is
    huge, relative to the whole probe gradient it is nothing."""
    a = (1e-12, 1e-12, 5.0, 50.0)  # (sum, mass) of a ~0 gradient, then of a real one
    b = (-3e-12, 4e-12, 5.0, 50.0)
    assert distance(a, b) < 1e-12 < RTOL
    assert distance(a, (1e-12, 1e-12, 5.0, math.inf)) == math.inf
    assert distance((math.nan, 1.0), (math.nan, 1.0)) == 0.0  # NaN is NaN: no verdict here
    assert off_ranks([a, b, (1e-12, 1e-12, 9.0, 90.0)], RTOL) == [2]
    assert off_ranks([a, (1e-12, 1e-12, 9.0, 90.0)], RTOL) == [0, 1]  # two: both off the mid
    assert RTOL < RTOL_LOW


# -- what the canary does with a finding --------------------------------------------------
def _canary(world: int) -> Canary:
    tracked = [("a.weight", nn.Parameter(torch.zeros(1))), ("b.weight", nn.Parameter(
        torch.zeros(1)))]
    guard = SimpleNamespace(tracked=tracked, events=[], global_ranks=list(range(world)),
                            group=None, rank=0, world_size=world)
    return Canary(guard, every=2)


def _transient(rank: int, far: float) -> Finding:
    return Finding(Outcome.TRANSIENT, (rank,), param=1, distance=far)


def test_one_offs_beyond_the_tolerance_on_one_rank_raise_at_the_strikes_naming_it():
    canary = _canary(2)
    with pytest.warns(UserWarning, match="beyond the tolerance"):
        got = [canary._act(s, _transient(1, 0.5)) for s in range(STRIKES)]
    assert got[:-1] == [None] * (STRIKES - 1)
    assert isinstance(got[-1], ComputeMismatch) and got[-1].ranks == [1]
    assert "intermittently" in str(got[-1]) and got[-1].params == ["b.weight"]
    assert [e.kind for e in canary.guard.events] == [CanaryEvent.TRANSIENT] * STRIKES


def test_one_offs_never_raise_once_another_rank_has_varied_too():
    canary = _canary(2)
    canary._act(0, _transient(0, RTOL / 10))  # rank 0's runs varied once, within the noise
    with pytest.warns(UserWarning):
        assert all(canary._act(s, _transient(1, 0.5)) is None for s in range(1, 3 * STRIKES))
    assert canary.strikes == {1: 3 * STRIKES - 1}


def test_one_offs_within_the_noise_on_two_ranks_switch_to_the_tolerance_and_never_raise():
    canary = _canary(3)
    assert canary._act(0, _transient(2, RTOL / 10)) is None and canary.mode is Mode.BITWISE
    assert canary._act(1, _transient(0, RTOL / 10)) is None and canary.mode is Mode.TOLERANCE
    assert [e.kind for e in canary.guard.events][-1] == CanaryEvent.UNREPRODUCIBLE


def test_non_determinism_switches_to_the_tolerance_then_widens_it_and_never_raises():
    canary = _canary(2)
    nondet = Finding(Outcome.NONDETERMINISTIC, (0, 1), distance=1e-7)
    assert canary._act(0, nondet) is None and canary.mode is Mode.TOLERANCE
    rtol = canary.rtol
    assert canary._act(1, nondet) is None and canary.rtol == 10 * rtol
    assert "widened" in canary.summary()["why"]


def test_a_persistent_split_of_two_ranks_names_both_and_never_says_drain():
    err = _canary(2)._act(5, Finding(Outcome.PERSISTENT, (0, 1), True, 0, 0.3))
    assert err.ranks == [0, 1] and "either side may be the faulty one" in str(err)
    assert "drain" not in str(err)
    one = _canary(3)._act(5, Finding(Outcome.PERSISTENT, (2,), False, 0, 0.3))
    assert one.ranks == [2] and "drain the named node" in str(one)


# -- where the canary runs by default --------------------------------------------------------
def test_the_canary_is_on_by_default_under_the_step_guard():
    assert canary_interval(nn.Linear(2, 2), SyncConfig()) == (CANARY_EVERY, "")
    assert canary_interval(nn.Linear(2, 2), SyncConfig(canary_every=0))[0] == 0


def test_by_default_the_per_bucket_guard_runs_without_a_canary_and_says_why():
    every, why = canary_interval(nn.Linear(2, 2), SyncConfig(guard="bucket"))
    assert every == 0 and "per-bucket" in why


def test_a_canary_asked_for_under_the_per_bucket_guard_is_refused():
    with pytest.raises(BadInput, match="step guard only"):
        canary_interval(nn.Linear(2, 2), SyncConfig(guard="bucket", canary_every=4))


def test_a_negative_canary_interval_is_refused():
    with pytest.raises(BadInput, match="canary"):
        SyncConfig(canary_every=-1)


# -- the fingerprints exchanged before the first probe -----------------------------------------
def test_a_rank_whose_fingerprint_differs_is_named_with_the_field_and_both_values():
    base = local_fingerprint(torch.device("cpu"), nn.Linear(2, 2))
    other = list(base)
    other[list(FIELDS).index("threads")] = "7"
    ranks, words = unequal([base, base, other], on_cuda=False)
    assert ranks == [2] and "threads" in words and "rank 2: 7" in words
    assert unequal([base, other], on_cuda=False)[0] == [0, 1]  # two ranks: both
    assert unequal([base, base], on_cuda=False) is None


def test_cudnn_benchmark_forbids_bitwise_comparison_even_where_every_rank_has_it():
    row = local_fingerprint(torch.device("cpu"), nn.Linear(2, 2))
    row[list(FIELDS).index("cudnn.benchmark")] = "1"
    ranks, words = unequal([row, row], on_cuda=True)
    assert ranks == [] and "cudnn.benchmark" in words


def test_fingerprints_travel_as_bytes_and_come_back_as_the_same_text():
    fields = local_fingerprint(torch.device("cpu"), torch.compile(nn.Linear(2, 2)))
    assert fields[list(FIELDS).index("compile")] == "compiled"
    sent = [f.encode()[:FIELD_BYTES].decode() for f in fields]
    assert decode_fields(encode_fields(fields).tolist()) == sent
