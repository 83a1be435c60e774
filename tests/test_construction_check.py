"""The start-up check, digest first.

In one process: the 16-byte manifest digest is equal for equal manifests and changes with any
name, shape, dtype, order or bucket layout; the start-up exchange shrinks from O(W × manifest)
to W × 16 bytes per rank.
On a real 2-rank gloo group: a clean start-up sends one 16-byte tensor gather and pickles
nothing; every mismatch still raises the error and the message the manifest comparison always
raised (the expected texts below were recorded from the all-manifests check it replaces).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.experiments.startup_scale import exchange_bytes, synthesized_manifest
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.hardening import harden

BASE = [("a.weight", (4, 4), "torch.float32"), ("a.bias", (4,), "torch.float32"),
        ("b.weight", (4, 4), "torch.float32")]


# --- single process -------------------------------------------------------------------------
def test_equal_manifests_have_equal_16_byte_digests():
    d = checks.manifest_digest(BASE, [64, 16])
    assert len(d) == checks.DIGEST_BYTES == 16
    assert d == checks.manifest_digest([tuple(e) for e in BASE], [64, 16])


@pytest.mark.parametrize("changed, layout", [
    ([("a.weightx", (4, 4), "torch.float32")] + BASE[1:], [64, 16]),  # a name
    ([("a.weight", (4, 5), "torch.float32")] + BASE[1:], [64, 16]),  # a shape
    ([("a.weight", (16,), "torch.float32")] + BASE[1:], [64, 16]),  # same numel, other shape
    ([("a.weight", (4, 4), "torch.float16")] + BASE[1:], [64, 16]),  # a dtype
    ([BASE[2], BASE[1], BASE[0]], [64, 16]),  # the order (same-shaped entries swapped)
    (BASE[:2], [64, 16]),  # an entry fewer
    (BASE, [64, 8]),  # the bucket layout
    (BASE, None),  # no layout
])
def test_any_change_of_name_shape_dtype_order_or_layout_changes_the_digest(changed, layout):
    assert checks.manifest_digest(changed, layout) != checks.manifest_digest(BASE, [64, 16])


def test_the_encoding_is_unambiguous_about_separators_in_names():
    one = [("a|(4,)|x;b", (4,), "torch.float32")]
    two = [("a", (4,), "x"), ("b", (4,), "torch.float32")]
    assert checks.manifest_digest(one) != checks.manifest_digest(two)


def test_the_start_up_exchange_is_16_bytes_per_rank_on_the_clean_path():
    manifest = synthesized_manifest(200_000)
    for world in (8, 64, 1024, 8192):
        row = exchange_bytes(world, manifest)
        assert row["after_clean"] == 16 * world
        assert row["before"] >= 200_000 * world  # every rank's whole manifest, pickled
        assert row["after_mismatch"] == world * (16 + 8 + row["compressed_bytes"])


# --- two ranks ------------------------------------------------------------------------------
def _manifest_for(case: str, rank: int) -> tuple[list, list[int] | None]:
    named = [(n, torch.zeros(s, dtype=getattr(torch, d.split(".")[1]))) for n, s, d in BASE]
    layout = [64, 16]
    if rank == 1:
        if case == "swap":
            named = [named[2], named[1], named[0]]
        elif case == "extra":
            named = named + [("c.weight", torch.zeros(2))]
        elif case == "dtype":
            named[1] = ("a.bias", torch.zeros(4, dtype=torch.float64))
        elif case == "layout":
            layout = [64, 8, 8]
        elif case == "both":
            named, layout = named[:2], [64]
    return named, layout


class _Gathers:
    """Within the block: the bytes of every tensor gather (``checks.GATHER``) this rank sends;
    a pickled gather (``all_gather_object``) fails."""

    def __enter__(self) -> list[int]:
        self.sizes: list[int] = []
        self.real, self.obj = getattr(dist, checks.GATHER), dist.all_gather_object

        def gather(out, inp, group=None, async_op=False):
            self.sizes.append(inp.numel() * inp.element_size())
            return self.real(out, inp, group=group, async_op=async_op)

        def pickled(*args, **kwargs):
            raise AssertionError("the construction check must not pickle")

        setattr(dist, checks.GATHER, gather)
        dist.all_gather_object = pickled
        return self.sizes

    def __exit__(self, *exc) -> None:
        setattr(dist, checks.GATHER, self.real)
        dist.all_gather_object = self.obj


def construction_cases(ctx, cases: list[str]) -> list[tuple]:
    """Per case: the outcome (error type, ranks, params, message) and the bytes of each tensor
    gather this rank sent."""
    results = []
    for case in cases:
        named, layout = _manifest_for(case, ctx.rank)
        got = None
        with _Gathers() as sizes:
            try:
                checks.construction_check(named, layout=layout)
            except ConsistencyError as exc:
                got = (type(exc).__name__, exc.ranks, exc.params, str(exc))
        results.append((got, sizes))
    return results


def harden_a_clean_model(ctx) -> list[int]:
    """The gathers ``harden()`` sends at start-up on a clean 2-rank DDP model."""
    ddp = DDP(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)))
    with _Gathers() as sizes:
        state = harden(ddp, SyncConfig(), ctx)
    state.close()
    return sizes


TIE = "; the ranks disagree, no majority: either side may be the faulty one"
EXPECTED = {  # the manifest comparison's words; two ranks that disagree: both are suspects
    "swap": ("ParameterMismatch", [0, 1], ["a.weight", "b.weight"],
             "ParameterMismatch at ranks [0, 1]: entry #0: rank 0 has a.weight [4, 4] "
             f"torch.float32, rank 1 has b.weight [4, 4] torch.float32 (2 ranks compared){TIE} "
             "[params: a.weight, b.weight]"),
    "extra": ("ParameterMismatch", [0, 1], ["c.weight"],
              "ParameterMismatch at ranks [0, 1]: entry #3: rank 0 has (absent), rank 1 has "
              f"c.weight [2] torch.float32 (2 ranks compared){TIE} [params: c.weight]"),
    "dtype": ("ParameterMismatch", [0, 1], ["a.bias"],
              "ParameterMismatch at ranks [0, 1]: entry #1: rank 0 has a.bias [4] "
              "torch.float32, rank 1 has a.bias [4] torch.float64 (2 ranks compared)"
              f"{TIE} [params: a.bias]"),
    "layout": ("BucketMisalignment", [0, 1], [],
               "BucketMisalignment at ranks [0, 1]: bucket layouts differ at construction "
               "(bucket sizes in bytes): the ranks disagree, no majority: either side may be "
               "the faulty one: {rank 0: 2 buckets [64, 16], rank 1: 3 buckets [64, 8, 8]}"),
    "both": ("ParameterMismatch", [0, 1], ["b.weight"],  # the manifest is judged first
             "ParameterMismatch at ranks [0, 1]: entry #2: rank 0 has b.weight [4, 4] "
             f"torch.float32, rank 1 has (absent) (2 ranks compared){TIE} [params: b.weight]"),
}


def test_a_clean_start_up_gathers_one_16_byte_digest_per_rank_and_pickles_nothing(pools):
    results = pools.get(2).run(construction_cases, ["clean"])
    assert results[0] == results[1] == [(None, [16])]


def test_every_mismatch_raises_the_same_error_and_message_as_the_manifest_comparison(pools):
    cases = list(EXPECTED)
    results = pools.get(2).run(construction_cases, cases)
    assert results[0] == results[1]  # the same verdict on every rank
    for case, (got, sizes) in zip(cases, results[0]):
        assert got == EXPECTED[case], case
        assert sizes[:2] == [16, 8] and len(sizes) == 3, case  # digests, lengths, manifests


def test_harden_starts_up_with_the_digests_only(pools):
    assert pools.get(2).run(harden_a_clean_model) == [[16], [16]]
