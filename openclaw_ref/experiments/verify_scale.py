"""What verifying a step's control blocks costs as the job grows to thousands of ranks.

No job of 8,192 ranks runs here, and none is needed: the check reads only the reduced blocks,
which are synthesized exactly as the allreduce would leave them (every rank's slot, written by
``encode_slot``, summed into one block). Two paths are timed in one process:

  ``check_blocks``  the per-step path: the whole step's buckets checked as tensors, one host
                    transfer (what ``ledger.Ledger.settle`` runs every step);
  ``decode+verify`` the per-bucket Python decode of every slot — what settle ran before, and
                    what it still runs for a bucket the fast path flags, to name the ranks.

Also stated: the control block's bytes per bucket, ``SLOT_FIELDS · W`` elements of the wire
dtype, and its share of a bucket of a given size.

``measure_counts`` times what the hardened hook runs now: ``control_counts_host.check_counts`` on
the counted step block (O(B) elements whatever W) of a clean step, synthesized exactly as the
SUM leaves it (n ranks' agreeing bits count n; ready times one per rank, or binned beyond 64
ranks; the replica row n × the digest's bits), for W = 8 … 8,192 and B = 16 … 1,024, with its
bytes per step beside the per-rank block's.
"""

from __future__ import annotations

import statistics
import time

import torch

from openclaw_ref.arms.blocks import block_size, check_blocks
from openclaw_ref.sync.evidence.control import verify
from openclaw_ref.sync.evidence.control_counts import (
    COUNT_FIELDS,
    DIGEST_BITS,
    HIST_BINS,
    STEP_FIELDS,
    CountLayout,
)
from openclaw_ref.sync.evidence.control_counts_host import check_counts
from openclaw_ref.sync.evidence.control_counts_write import (
    count_row,
    write_counts,
)
from openclaw_ref.sync.evidence.control_layout import SLOT_FIELDS, decode_block, encode_slot

WORLD_SIZES = (8, 64, 1024, 8192)
BUCKETS = 16
DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket cap


def hist_bin(units: torch.Tensor) -> torch.Tensor:
    """``control_counts.ready_bin`` of every element of an integer tensor (the histogram of
    a synthesized step, without writing each rank's block): the bit length of units² is the
    exponent ``frexp`` gives for it (exact in float64: units < 2^24)."""
    u = units.to(torch.int64).clamp(min=0)
    k = torch.frexp((u * u).to(torch.float64)).exponent.to(torch.int64)
    return torch.where(u < 1, torch.zeros_like(k), k.clamp(max=HIST_BINS - 1))


def synthesized_blocks(world_size: int, buckets: int = BUCKETS,
                       dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """``(buckets, block_size(W))``: the reduced blocks of a clean step with random ready
    times (every slot written by its own rank, as after the SUM)."""
    g = torch.Generator().manual_seed(seed)
    out = torch.zeros(buckets, block_size(world_size), dtype=dtype)
    for b in range(buckets):
        ready = torch.randint(0, 5000, (world_size,), generator=g).tolist()
        slots = [encode_slot(clock=11, bucket=b, digest=0x0123456789ABCDEF ^ b, scale_exp=0,
                             ready_s=ready[r] * 1e-5) for r in range(world_size)]
        out[b] = torch.tensor([v for s in slots for v in s], dtype=dtype)
    return out


def block_bytes(world_size: int, dtype: torch.dtype = torch.float32) -> int:
    return block_size(world_size) * dtype.itemsize


def block_share(world_size: int, bucket_bytes: int = DDP_BUCKET_BYTES,
                dtype: torch.dtype = torch.float32) -> float:
    """The control block's bytes as a fraction of the bucket's gradient bytes."""
    return block_bytes(world_size, dtype) / bucket_bytes


def _median_s(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(world_sizes=WORLD_SIZES, buckets: int = BUCKETS, repeats: int = 9) -> list[dict]:
    """Per world size: µs per bucket of each path (median of ``repeats``), and the block size.
    The decode path is timed on one bucket (it is per bucket by construction)."""
    torch.set_num_threads(1)
    rows = []
    for w in world_sizes:
        blocks = synthesized_blocks(w, buckets)
        indices = list(range(buckets))
        fast = _median_s(lambda b=blocks, i=indices: check_blocks(b, i, 0), repeats) / buckets
        one = blocks[0].tolist()
        slow = _median_s(lambda o=one, w=w: verify(decode_block(o, w), bucket=0, params=[]),
                         max(3, repeats // 3))
        rows.append({"world_size": w, "buckets": buckets,
                     "check_blocks_us_per_bucket": fast * 1e6,
                     "decode_verify_us_per_bucket": slow * 1e6,
                     "block_bytes_fp32": block_bytes(w),
                     "block_bytes_fp16": block_bytes(w, torch.float16),
                     "share_of_25mb_fp32": block_share(w)})
    return rows


def check_over_pass(world_size: int, buckets: int = BUCKETS, repeats: int = 21) -> float:
    """``check_blocks`` time ÷ the time of one plain pass over the same blocks (a sum), timed in
    interleaved pairs in this process, median of the pair ratios: the verification's cost in
    units of reading its input once. The host's speed cancels, so the figure is fit for a
    regression gate where absolute microseconds on a shared machine are not."""
    torch.set_num_threads(1)
    blocks = synthesized_blocks(world_size, buckets)
    indices = list(range(buckets))
    check_blocks(blocks, indices, 0)
    ratios = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        check_blocks(blocks, indices, 0)
        t1 = time.perf_counter()
        float(blocks.sum())
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
    return statistics.median(ratios)


COUNT_WORLD_SIZES = (8, 64, 1024, 8192)
COUNT_BUCKETS = (16, 128, 1024)


def synthesized_counts(world_size: int, buckets: int, dtype: torch.dtype = torch.float32,
                       seed: int = 0) -> torch.Tensor:
    """The reduced counted block of a clean step of ``buckets`` buckets at W ranks: exactly
    the SUM of every rank's ``write_counts`` (built per rank up to 64 ranks; beyond, per group
    from one template slot, since the agreeing bits of n ranks sum to n × the template's)."""
    layout = CountLayout(world_size, dtype)
    g = torch.Generator().manual_seed(seed)
    ready = torch.randint(0, 5000, (world_size, buckets), generator=g)
    digest = torch.tensor(0x0123456789ABCDEF, dtype=torch.int64)

    def slots(r: int) -> torch.Tensor:
        return torch.tensor([encode_slot(clock=11, bucket=b, digest=0x5EED ^ b, scale_exp=0,
                                         ready_s=int(ready[r, b]) * 1e-5)
                             for b in range(buckets)], dtype=torch.int64)

    total = torch.zeros(layout.size(buckets), dtype=torch.float64)
    if layout.detail:
        one = torch.empty(layout.size(buckets), dtype=dtype)
        for r in range(world_size):
            write_counts(one, layout, r, slots(r), replica=digest)
            total += one.double()
        return total.to(dtype)
    template = torch.tensor([list(count_row(s)) for s in slots(0).tolist()],
                            dtype=torch.float64)[:, :COUNT_FIELDS]
    G = layout.groups
    rows = total[:buckets * layout.row].view(buckets, layout.row)
    hist = rows[:, G * COUNT_FIELDS:].view(buckets, G, HIST_BINS)
    step = total[buckets * layout.row:].view(G, STEP_FIELDS)
    bits = (torch.bitwise_right_shift(digest, torch.arange(DIGEST_BITS - 1, -1, -1)) & 1)
    for k in range(G):
        members = list(range(k * layout.group_size,
                             min(world_size, (k + 1) * layout.group_size)))
        n = len(members)
        rows[:, k * COUNT_FIELDS:(k + 1) * COUNT_FIELDS] = n * template
        bins = hist_bin(ready[members])  # ready units of 10 µs, as encode_slot quantizes them
        for b in range(buckets):
            hist[b, k] = torch.bincount(bins[:, b], minlength=HIST_BINS).double()
        step[k, 0], step[k, 1:] = n, n * bits.double()
    return total.to(dtype)


def measure_counts(world_sizes=COUNT_WORLD_SIZES, bucket_counts=COUNT_BUCKETS,
                   repeats: int = 9) -> list[dict]:
    """Per (W, B): the clean check's µs per bucket (median of ``repeats``, the one host read
    included) and the step block's bytes, counted and per-rank."""
    torch.set_num_threads(1)
    rows = []
    for w in world_sizes:
        for b in bucket_counts:
            layout = CountLayout(w, torch.float32)
            block = synthesized_counts(w, b)
            check, _ = check_counts(block, layout, b)
            assert all(check.ok) and check.replica_ok, (w, b)
            t = _median_s(lambda x=block, lay=layout, n=b: check_counts(x, lay, n), repeats)
            rows.append({"world_size": w, "buckets": b, "check_us_per_bucket": t / b * 1e6,
                         "step_bytes_fp32": layout.nbytes(b),
                         "step_bytes_fp16": CountLayout(w, torch.float16).nbytes(b),
                         "step_bytes_bf16": CountLayout(w, torch.bfloat16).nbytes(b),
                         "per_rank_step_bytes_fp32": SLOT_FIELDS * w * b * 4})
    return rows
