"""The device-side replica check.

In one process: the digest (``replica_digest.ReplicaDigest``) re-derived with Python integers from
its written definition, and its bit-level properties (a flipped bit, swapped elements, a sign,
-0.0 vs 0.0, views, empties).
On a real 2-rank gloo group: equal replicas pass with one 16-byte-per-rank tensor gather; one
flipped bit on rank 1 is named (parameter and rank) for fp32/fp16/bf16/fp64 and a non-contiguous
parameter; DDP's ignored parameters are left out by ``synchronized_parameters``, frozen ones not.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.errors import ConsistencyError, ParameterMismatch
from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.evidence.replica_digest import ROW_WORDS, ReplicaDigest

# --- the digest, re-derived from its definition in replica_digest.py with Python integers ----
M64 = (1 << 64) - 1
PHI, PSI = 0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93


def mix(v: int) -> int:
    v &= M64
    v ^= v >> 30
    v = (v * 0xBF58476D1CE4E5B9) & M64
    v ^= v >> 27
    v = (v * 0x94D049BB133111EB) & M64
    return v ^ (v >> 31)


W = ROW_WORDS
A = [mix((j + 1) * PHI) | 1 for j in range(W)]


def reference_digest(t: torch.Tensor) -> int:
    raw = bytes(t.detach().contiguous().view(-1).view(torch.uint8).tolist())
    padded = raw + bytes(-len(raw) % 8)
    words = [int.from_bytes(padded[i:i + 8], "little", signed=True)
             for i in range(0, len(padded), 8)]
    s = 0
    for r in range(0, len(words), W):
        u = sum(A[j] * (x ^ ((x & M64) >> 33)) for j, x in enumerate(words[r:r + W])) & M64
        s += mix(u + (r // W + 1) * PHI)
    d = mix(s + (len(raw) + 1) * PSI)
    return d - (1 << 64) if d >> 63 else d


DIGEST = ReplicaDigest()  # one instance for the tests, as an engine holds one


def digest(t: torch.Tensor) -> int:
    return int(DIGEST.digest(t))


def _bits(t: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    """A contiguous copy of ``t`` with one bit of one element (row-major index) flipped."""
    out = t.detach().contiguous().clone()
    flat = out.view(-1).view(torch.uint8)
    size = t.element_size()
    flat[index * size + bit // 8] ^= 1 << (bit % 8)
    return out


# --- single process -------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: torch.randn(10001),  # two rows (one full, one short), odd word count
    lambda: torch.randn(7).half(),  # 14 bytes: a zero-padded last word
    lambda: torch.randn(3, 5).bfloat16(),
    lambda: torch.randn(9, dtype=torch.float64),
    lambda: torch.tensor([True, False, True, True, False]),  # 5 bytes
    lambda: torch.randint(-128, 127, (3,), dtype=torch.int8),
    lambda: torch.tensor(2.5),  # 0-dim
    lambda: torch.empty(0),
    lambda: torch.randn(12, 9).t(),  # non-contiguous
], ids=["fp32-2rows", "fp16-odd", "bf16", "fp64", "bool-5B", "int8", "scalar", "empty", "view"])
def test_the_digest_is_its_written_definition(make):
    torch.manual_seed(0)
    t = make()
    assert digest(t) == reference_digest(t)
    assert int(DIGEST.digests([t], fused=False)[0]) == digest(t)  # the accelerator path


def test_blocks_and_batching_do_not_change_a_digest():
    torch.manual_seed(1)
    ts = [torch.randn(3 * W * 2 + 5), torch.randn(4).half(), torch.randn(W * 2)]
    alone = [digest(t) for t in ts]
    assert DIGEST.digests(ts).tolist() == alone
    one_row = ReplicaDigest(block_words=W)  # one row per block
    assert one_row.digests(ts).tolist() == alone
    assert one_row.digests(ts, fused=False).tolist() == alone


def test_two_instances_digest_identically_without_shared_state():
    """A fresh instance (its own tables, scratch and plans) gives the bits of a used one."""
    torch.manual_seed(6)
    used = ReplicaDigest()
    used.digests([torch.randn(5 * W + 3), torch.randn(9).half()])  # warm: other layouts
    ts = [torch.randn(2 * W + 1), torch.randn(3, 7).bfloat16(), torch.randn(6, 4).t(),
          torch.tensor(1.5, dtype=torch.float64), torch.empty(0)]
    fresh = ReplicaDigest()
    assert fresh.digests(ts).tolist() == used.digests(ts).tolist()
    assert fresh.digests(ts).tolist() == [reference_digest(t) for t in ts]
    assert int(fresh.combine(fresh.digests(ts))) == int(ReplicaDigest.combine(used.digests(ts)))


def test_the_host_finish_gives_the_device_digests_bit_for_bit():
    """``digests_on_host`` (a CPU's path: row sums read once, finished with Python ints) and
    ``combine_on_host`` give the bits of the all-tensor path, batched small tensors included."""
    torch.manual_seed(7)
    ts = [torch.randn(3 * W + 5), torch.randn(9).half(), torch.empty(0), torch.randn(6, 4).t(),
          torch.tensor(-2.5, dtype=torch.float64), torch.randn(W).bfloat16()]
    on_host = DIGEST.digests_on_host(ts)
    assert on_host == DIGEST.digests(ts).tolist() == [reference_digest(t) for t in ts]
    assert ReplicaDigest.combine_on_host(on_host) == int(ReplicaDigest.combine(DIGEST.digests(ts)))
    assert DIGEST.digests_on_host([]) == [] and ReplicaDigest.combine_on_host([]) == 0


def test_every_single_bit_flip_changes_the_digest():
    torch.manual_seed(2)
    t = torch.randn(6)  # 3 words: every bit of every element, the sign bits included
    flipped = {digest(_bits(t, i, b)) for i in range(6) for b in range(32)}
    assert digest(t) not in flipped and len(flipped) == 6 * 32
    big = torch.randn(3 * W)  # a bit in the second row, in a low and a high half-word
    assert digest(_bits(big, 2 * W + 6, 0)) != digest(big)
    assert digest(_bits(big, 2 * W + 7, 31)) != digest(big)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        s = torch.randn(5).to(dtype)
        bits = 8 * s.element_size()
        assert all(digest(_bits(s, i, b)) != digest(s) for i in range(5) for b in range(bits))


def test_swapped_elements_and_sign_changes_change_the_digest():
    torch.manual_seed(3)
    t = torch.randn(3 * W)
    for i, j in [(0, 1), (0, 2), (5, 2 * W + 5), (W - 1, W)]:  # same word, rows apart, ...
        s = t.clone()
        s[i], s[j] = t[j], t[i]
        assert digest(s) != digest(t), (i, j)
    assert digest(-t) != digest(t)
    two = t.clone()
    two[1], two[3] = -t[1], -t[3]  # two high half-words: cancels in a plain 64-bit word sum
    assert digest(two) != digest(t)
    half = torch.tensor([1.0, 2.0, 3.0, 4.0]).half()
    assert digest(half.flip(0)) != digest(half)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_sign_flips_never_pair_off_in_the_top_bit_of_a_word(dtype):
    """Without the fold, a flip of a word's top bit (an fp64 sign; every other fp32 sign; every
    fourth bf16 sign) moves the row sum by 2^63 whatever its multiplier, so two cancel."""
    torch.manual_seed(5)
    t = torch.randn(2 * W, dtype=dtype)
    per_word = 8 // t.element_size()
    top = [per_word - 1, 3 * per_word - 1]  # the elements holding two words' top bits
    two = t.clone()
    two[top] = -t[top]
    assert digest(two) != digest(t)
    assert digest(-t) != digest(t)  # every sign: an even number of top bits per row


def test_negative_zero_differs_and_equal_bits_agree_however_they_are_stored():
    assert digest(torch.tensor([0.0, 1.0])) != digest(torch.tensor([-0.0, 1.0]))
    torch.manual_seed(4)
    t = torch.randn(17, 5)
    assert digest(t) == digest(t.clone())
    assert digest(t.t()) == digest(t.t().contiguous())
    offset = torch.arange(10, dtype=torch.float32)[1:]  # storage offset of 4 bytes
    assert digest(offset) == digest(offset.clone())
    assert digest(torch.empty(0)) == digest(torch.empty(0, 3))  # the same (zero) bytes
    assert digest(torch.empty(0)) != digest(torch.zeros(1))
    assert digest(torch.zeros(2)) != digest(torch.zeros(3))  # the length counts


def test_digests_never_read_the_data_on_the_host():
    """On the meta device a tensor has no data: any host copy or ``.item()`` would fail."""
    out = ReplicaDigest().digests([torch.empty(10, device="meta"),
                                   torch.empty(3, W, device="meta").half()])
    assert out.device.type == "meta" and out.shape == (2,)
    assert ReplicaDigest.combine(out).device.type == "meta"


def test_a_plain_module_reads_its_ignore_list():
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    m._ddp_params_and_buffers_to_ignore = ["1.bias"]
    assert [n for n, _ in checks.synchronized_parameters(m)] == ["0.weight", "0.bias", "1.weight"]


# --- 2 ranks, real gloo ----------------------------------------------------------------------
class Mixed(nn.Module):
    """Every dtype the check must handle, odd byte sizes, two rows, a non-contiguous view."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.f32 = nn.Parameter(torch.randn(33, 17, generator=g))  # 2244 B: a padded word
        self.f16 = nn.Parameter(torch.randn(5, 7, generator=g).half())
        self.bf16 = nn.Parameter(torch.randn(3, 3, generator=g).bfloat16())
        self.f64 = nn.Parameter(torch.randn(4, generator=g, dtype=torch.float64))
        self.wide = nn.Parameter(torch.randn(3, W, generator=g))  # 1.5 rows of words
        self.view = nn.Parameter(torch.randn(8, 6, generator=g).t())  # strides (1, 6)


def _outcome(fn) -> tuple | None:
    try:
        fn()
    except ConsistencyError as exc:
        return type(exc).__name__, exc.step, exc.ranks, exc.params
    return None


def _count_gathers() -> tuple[list[int], object]:
    """Patch the collectives: count the bytes of every tensor gather, forbid pickled ones."""
    sizes: list[int] = []
    real = getattr(dist, checks.GATHER)

    def gather(out, inp, group=None, async_op=False):
        sizes.append(inp.numel() * inp.element_size())
        return real(out, inp, group=group, async_op=async_op)

    def pickled(*args, **kwargs):
        raise AssertionError("the replica check must not pickle")

    saved = (real, dist.all_gather_object)
    setattr(dist, checks.GATHER, gather)
    dist.all_gather_object = pickled
    return sizes, saved


def flip_cases(ctx, cases: list[tuple[str, int, int]]) -> list[tuple]:
    """Per case (parameter, flat element index, bit): rank 1 flips that bit, every rank runs
    the check; returns the outcome and the bytes each gather sent from this rank."""
    results = []
    for name, index, bit in cases:
        model = Mixed()
        if name and ctx.rank == 1:
            with torch.no_grad():
                p = getattr(model, name)
                flipped = _bits(p, index, bit)
                p.copy_(flipped)
        named = list(model.named_parameters())
        sizes, (real, obj) = _count_gathers()
        try:
            got = _outcome(lambda named=named: checks.replica_check(named, step=7))
        finally:
            setattr(dist, checks.GATHER, real)
            dist.all_gather_object = obj
        results.append((got, sizes))
    return results


def ddp_ignored_and_frozen(ctx) -> dict:
    torch.manual_seed(0)  # the ignored parameter is never broadcast: start it equal
    model = nn.ModuleDict({"kept": nn.Linear(4, 4), "ignored": nn.Linear(4, 4),
                           "frozen": nn.Linear(4, 4)})
    model["frozen"].requires_grad_(False)
    DDP._set_params_and_buffers_to_ignore_for_model(model, ["ignored.weight"])
    ddp = DDP(model)
    synced = checks.synchronized_parameters(ddp)
    out = {"names": [n for n, _ in synced]}
    rd = ReplicaDigest()  # one digester across checks of two layouts, as an engine holds one
    with torch.no_grad():
        if ctx.rank == 1:
            model["ignored"].weight.add_(1.0)
    out["ignored_diverged"] = _outcome(lambda: checks.replica_check(synced, step=1, digest=rd))
    out["all_params"] = _outcome(
        lambda: checks.replica_check(list(model.named_parameters()), step=1, digest=rd))
    with torch.no_grad():
        if ctx.rank == 1:
            model["frozen"].weight[0, 0] = -model["frozen"].weight[0, 0]
    out["frozen_diverged"] = _outcome(lambda: checks.replica_check(synced, step=2, digest=rd))
    return out


def short_list_on_rank_one(ctx) -> tuple | None:
    named = list(Mixed().named_parameters())
    return _outcome(lambda: checks.replica_check(named[:-1] if ctx.rank else named, step=3))


def test_equal_replicas_pass_with_one_16_byte_gather(pools):
    results = pools.get(2).run(flip_cases, [("", 0, 0)])
    assert results[0] == results[1] == [(None, [16])]  # nothing pickled, nothing more sent


CASES = [("f32", 100, 3), ("f16", 34, 15), ("bf16", 4, 0), ("f64", 2, 63),
         ("wide", 2 * W + 1, 30), ("view", 13, 31)]


def test_one_flipped_bit_on_rank_one_is_named_for_every_dtype_and_a_view(pools):
    results = pools.get(2).run(flip_cases, CASES)
    assert results[0] == results[1]  # the same verdict on every rank
    n_params = len(list(Mixed().parameters()))
    for (name, _, _), (got, sizes) in zip(CASES, results[0]):
        assert got == ("ReplicaDivergence", 7, [0, 1], [name]), name  # two: both suspects
        assert sizes == [16, 8 * n_params]  # the digest vectors only after a disagreement


def test_ddp_ignored_parameters_are_not_checked_and_frozen_ones_are(pools):
    results = pools.get(2).run(ddp_ignored_and_frozen)
    assert results[0] == results[1]
    r = results[0]
    assert r["names"] == ["kept.weight", "kept.bias", "ignored.bias", "frozen.weight",
                          "frozen.bias"]
    assert r["ignored_diverged"] is None
    assert r["all_params"] == ("ReplicaDivergence", 1, [0, 1], ["ignored.weight"])
    assert r["frozen_diverged"] == ("ReplicaDivergence", 2, [0, 1], ["frozen.weight"])


def test_a_rank_with_another_parameter_count_is_named_not_aborted(pools):
    results = pools.get(2).run(short_list_on_rank_one)
    assert results[0] == results[1]
    assert results[0][0] == ParameterMismatch.__name__ and results[0][2] == [0, 1]
