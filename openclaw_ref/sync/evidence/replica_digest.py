"""The replica digest: a 64-bit checksum per tensor, computed on the tensor's own device.

``checks.replica_check`` compares these digests across ranks with tensor collectives (16 bytes
per rank when the replicas agree) instead of copying every parameter to the host for SHA-256.

A ``ReplicaDigest`` owns what makes repeated digests cheap: the multiplier tables (one per
device), the scratch buffers of the row sums (one per device, grown on demand) and the plans
of the parameter lists it has seen. They live exactly as long as the instance, which its user
(a sync engine, once per run) holds, rather than in module globals that every engine, test and
thread in the process would share: a scratch buffer shared by two threads would be overwritten
mid-digest, and global caches outlive the parameters they were planned for. A fresh instance
gives the same digests; it only rebuilds its tables and plans first.

Two ways to compute the same bits: ``digests`` stays on the tensors' device from the words to
the digests (no host read: what a CUDA backward needs); ``digests_on_host`` makes the row sums
there and finishes them with Python integers (a CPU's path: its ~20 small torch ops cost more
than their arithmetic). The tests hold both to the definition below.

The digest of a tensor (``ReplicaDigest.digests``), exactly — the single-process tests
re-derive it with Python integers:
  x_i   the i-th 64-bit word of the tensor's bytes, elements in row-major order (native byte
        order; the last word zero-padded), as int64
  y_i   = x_i XOR (x_i >>> 33)                  (high bits folded into low ones: a bijection)
  u_r   = Σ_{j<W} A_j·y_{rW+j}                  (mod 2^64), per row r of W = ROW_WORDS words
  S     = Σ_r mix(u_r + (r+1)·φ)                (mod 2^64)
  d     = mix(S + (nbytes+1)·ψ)
with >>> a logical shift, mix the (bijective) splitmix64 finalizer and A_j = mix((j+1)·φ) | 1
fixed odd multipliers. All of it is integer arithmetic wrapping mod 2^64 — exact and
independent of the order of the sums (no float reduction; integer atomics on a GPU give the
same bits). Cost on one CPU core here, per 512 KB: ~0.2 ms (the fold, then one integer
matrix-vector product per row block), where the form with a second product over each word's
high half took ~0.4 ms. ``torch.hash_tensor`` (torch ≥ 2.9; ~0.15 ms) is not used: it XORs
the elements' bits, so it sees no permutation inside a tensor and misses any change that flips
the same bit an even number of times — a negated tensor of even length among them.

Collision argument. A change of one word (one or two fp32 elements, up to four fp16/bf16
elements, one fp64 element, any single flipped bit — a sign, -0.0 vs 0.0 — of any dtype) moves
y by δ ≠ 0 (the fold is a bijection) and u_r by A_j·δ with A_j odd, never 0 mod 2^64; mix is a
bijection, so d changes: detected with certainty. The fold is why sign flips do not pair off:
without it, the top bit of a word (the sign of every other fp32 element, of every fp64 one)
moves u_r by 2^63 whatever A_j is, so two such flips cancel (a negated tensor would not be
seen); folded by 33, a flip of bit 63 also flips bit 30 and one of bit 47 also bit 14 — bits no
sign of a 2-, 4- or 8-byte element sits at — and two flips cancel only if ±A_j ± A_k ≡ 0 mod
2^34. Any other change (a swap, many elements)
escapes the row sum only if Σ A_j·δ_j ≡ 0 mod 2^64 — probability about 2^-32 if the
multipliers were drawn at random (the linear universal-hash bound) — and a cancellation
between rows or parameters needs a collision of sums of mix values (~2^-64, heuristic). The
multipliers are fixed, though: this is a checksum against accidental divergence, not SHA-256 —
whoever chooses the change can forge it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from openclaw_ref.sync.errors import BadInput

ROW_WORDS = 4096  # 64-bit words per row: one multiplier table of 32 KiB per device
FOLD_SHIFT = 33
_LOW31 = (1 << (64 - FOLD_SHIFT)) - 1
_MASK64 = (1 << 64) - 1
_PHI = 0x9E3779B97F4A7C15  # splitmix64's increment (odd)
_PSI = 0xD6E8FEB86659FD93  # an odd constant for the length term
_MIX = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None))
CPU_BLOCK_WORDS = 1 << 18  # words per block on a CPU: 2 MiB of scratch, in cache
DEVICE_BLOCK_WORDS = 1 << 22  # accelerators: 32 MiB of scratch, few kernel launches
MAX_PLANS = 16  # plans kept per instance; more distinct layouts than this start afresh


def _s64(v: int) -> int:
    """A 64-bit pattern as the int64 scalar torch accepts."""
    v &= _MASK64
    return v - (1 << 64) if v >> 63 else v


def _mix_(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer, in place on an int64 tensor (logical shifts via masks)."""
    for shift, mult in _MIX:
        z.bitwise_xor_(torch.bitwise_right_shift(z, shift).bitwise_and_((1 << (64 - shift)) - 1))
        if mult is not None:
            z.mul_(_s64(mult))
    return z


def mix_int(v: int) -> int:
    """splitmix64's finalizer on a Python int, modulo 2^64 (``_mix_``'s bits, unsigned)."""
    v &= _MASK64
    for shift, mult in _MIX:
        v ^= v >> shift
        if mult is not None:
            v = (v * mult) & _MASK64
    return v


def _fold_(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` ← x XOR (x >>> 33), elementwise on int64 words (a logical shift: the arithmetic
    shift's sign fill is masked off, or the map would not be a bijection)."""
    torch.bitwise_right_shift(x, FOLD_SHIFT, out=out)
    return out.bitwise_and_(_LOW31).bitwise_xor_(x)


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as int64 words, on its device; the last word zero-padded. No copy
    for a contiguous, 8-byte-aligned tensor whose size is a multiple of 8 bytes."""
    t = t.detach()
    if t.is_contiguous() and t.dim() and (t.shape[-1] * t.element_size()) % 8 == 0:
        try:
            return t.view(torch.int64).view(-1)  # the common case: two views, no copy
        except RuntimeError:  # storage offset not a multiple of 8 bytes
            pass
    b = t.contiguous().view(-1).view(torch.uint8)  # a device-side copy if strided
    full, rest = divmod(b.numel(), 8)
    try:
        x = b[:full * 8].view(torch.int64)
    except RuntimeError:  # storage offset not a multiple of 8 bytes
        b = b.clone()
        x = b[:full * 8].view(torch.int64)
    if rest:
        last = torch.zeros(8, dtype=torch.uint8, device=b.device)
        last[:rest] = b[full * 8:]
        x = torch.cat([x, last.view(torch.int64)])
    return x


class _Plan:
    """How a list of tensors (by byte sizes) is digested; cached per layout, because the
    index tensors below cost more to build than a digest of small parameters. Tensors of less
    than one row are batched: their words are concatenated and reduced together."""

    def __init__(self, device: torch.device, nbytes: tuple[int, ...], batch: bool,
                 tables: Callable[[torch.device], torch.Tensor]) -> None:
        words = [(n + 7) // 8 for n in nbytes]
        self.small = [i for i, n in enumerate(words) if batch and 0 < n < ROW_WORDS]
        small = set(self.small)
        self.large = [i for i, n in enumerate(words) if n and i not in small]
        rows = {i: -(-words[i] // ROW_WORDS) for i in self.large}
        # Row sums come in this order: one per small tensor, then every large tensor's rows.
        seg = self.small + [i for i in self.large for _ in range(rows[i])]
        pos = [0] * len(self.small) + [r for i in self.large for r in range(rows[i])]
        self.seg_list, self.pos_list, self.nbytes = seg, pos, nbytes  # for a host finish
        self.seg = torch.tensor(seg, dtype=torch.int64, device=device)
        self.row_keys = (torch.tensor(pos, dtype=torch.int64).add_(1).mul_(_s64(_PHI))
                         .to(device))
        self.len_keys = (torch.tensor(nbytes, dtype=torch.int64).add_(1).mul_(_s64(_PSI))
                         .to(device))
        if self.small:  # per word of the concatenation: its multipliers and its tensor
            sizes = torch.tensor([words[i] for i in self.small], dtype=torch.int64)
            starts = torch.cumsum(sizes, 0) - sizes
            idx = torch.arange(int(sizes.sum())) - starts.repeat_interleave(sizes)
            self.small_a = tables(torch.device("cpu"))[idx].to(device)
            self.small_seg = torch.arange(len(self.small)).repeat_interleave(sizes).to(device)


class ReplicaDigest:
    """Digests tensors as the module docstring defines, reusing its tables, scratch and plans
    across calls (hold one per engine; see the module docstring for why not globals).

    ``block_words`` bounds the words reduced per block (and so the scratch: 8 bytes per
    word); by default ``CPU_BLOCK_WORDS`` on a CPU, ``DEVICE_BLOCK_WORDS`` elsewhere. It is
    rounded down to whole rows (at least one) and never changes a digest. ``max_plans`` bounds
    the plans kept (more distinct layouts than this start afresh)."""

    def __init__(self, *, block_words: int | None = None, max_plans: int = MAX_PLANS) -> None:
        self.block_words = block_words
        self.max_plans = max_plans
        self._tables: dict[torch.device, torch.Tensor] = {}
        self._scratch: dict[torch.device, torch.Tensor] = {}
        self._plans: dict[tuple, _Plan] = {}

    def digests(self, tensors: Sequence[torch.Tensor], *,
                fused: bool | None = None) -> torch.Tensor:
        """One int64 digest per tensor, computed with torch ops on the tensors' device: no
        copy of the data to the host, no host synchronisation. Tensors on other devices than
        the first are digested where they live; only their row sums (8 bytes per 32 KiB)
        move. ``fused`` (default: on a CPU) picks ``torch.mv`` over multiply-and-sum; both
        give the same bits. Returns an int64 tensor of ``len(tensors)`` on the first tensor's
        device (CPU when there are none)."""
        if not tensors:
            return torch.zeros(0, dtype=torch.int64)
        plan, device, sums = self._row_sums_of(tensors, fused)
        terms = _mix_(sums.add_(plan.row_keys)) if sums is not None else plan.row_keys
        s = torch.zeros(len(tensors), dtype=torch.int64, device=device)
        return _mix_(s.index_add_(0, plan.seg, terms).add_(plan.len_keys))

    def digests_on_host(self, tensors: Sequence[torch.Tensor]) -> list[int]:
        """``digests(tensors)`` as Python ints (the same bits, signed): the row sums are made
        on the tensors' device and read once; the ~20 small ops that finish them (row keys,
        mixes, per-tensor sums) run as integer arithmetic on the host. For tensors on a CPU,
        where each small torch op costs more than its arithmetic; on an accelerator this is
        a host synchronisation, which ``digests`` never makes."""
        if not tensors:
            return []
        plan, _, sums = self._row_sums_of(tensors, None)
        totals = [0] * len(tensors)
        if sums is not None:
            for u, i, r in zip(sums.tolist(), plan.seg_list, plan.pos_list):
                totals[i] += mix_int(u + (r + 1) * _PHI)
        return [_s64(mix_int(s + (n + 1) * _PSI)) for s, n in zip(totals, plan.nbytes)]

    def _row_sums_of(self, tensors: Sequence[torch.Tensor], fused: bool | None
                     ) -> tuple[_Plan, torch.device, torch.Tensor | None]:
        """(plan, first tensor's device, every row sum u_r in the plan's order — None when
        no tensor has a byte)."""
        device = tensors[0].device
        for t in tensors:
            if t.layout != torch.strided:
                raise BadInput(f"replica digests need dense tensors; got layout {t.layout}")
        plan = self._plan(device, tuple(t.numel() * t.element_size() for t in tensors),
                          all(t.device == device for t in tensors))
        parts: list[torch.Tensor] = []
        if plan.small:
            x = torch.cat([_words(tensors[i]) for i in plan.small])
            terms = _fold_(x, torch.empty_like(x)).mul_(plan.small_a)
            parts.append(torch.zeros(len(plan.small), dtype=torch.int64, device=device)
                         .index_add_(0, plan.small_seg, terms))
        for i in plan.large:
            t = tensors[i]
            a = self._multipliers(t.device)
            use_mv = t.device.type == "cpu" if fused is None else fused
            sums = self._row_sums(_words(t), a, use_mv)
            parts.extend(sums if t.device == device else [s.to(device) for s in sums])
        if not parts:
            return plan, device, None
        return plan, device, parts[0] if len(parts) == 1 else torch.cat(parts)

    def prepare(self, tensors: Sequence[torch.Tensor]) -> None:
        """Build now what ``digests(tensors)`` will reuse (the multiplier table of their
        device, the plan of their layout): the index tensors a plan copies to the device are a
        host-to-device copy, which must not happen later inside a CUDA backward."""
        if tensors:
            device = tensors[0].device
            self._multipliers(device)
            self._plan(device, tuple(t.numel() * t.element_size() for t in tensors),
                       all(t.device == device for t in tensors))

    def digest(self, t: torch.Tensor) -> torch.Tensor:
        """The digest of one tensor: a 0-dim int64 tensor on its device."""
        return self.digests([t])[0]

    @staticmethod
    def combine(digests: torch.Tensor) -> torch.Tensor:
        """One int64 over a digest vector, position-keyed: Σ_p mix(d_p + (p+1)·φ). Vectors
        that differ in one entry always combine differently (mix is a bijection). Needs no
        tables, hence static."""
        keys = torch.arange(1, digests.numel() + 1, dtype=torch.int64, device=digests.device)
        return _mix_(keys.mul_(_s64(_PHI)).add_(digests)).sum()

    @staticmethod
    def combine_on_host(digests: Sequence[int]) -> int:
        """``combine`` over digests held as Python ints (``digests_on_host``): same bits."""
        return _s64(sum(mix_int(d + (p + 1) * _PHI) for p, d in enumerate(digests)))

    # the reused state --------------------------------------------------------------------
    def _multipliers(self, device: torch.device) -> torch.Tensor:
        got = self._tables.get(device)
        if got is None:
            j = torch.arange(1, ROW_WORDS + 1, dtype=torch.int64).mul_(_s64(_PHI))
            got = self._tables[device] = _mix_(j).bitwise_or_(1).to(device)
        return got

    def _scratch_for(self, device: torch.device, words: int) -> torch.Tensor:
        got = self._scratch.get(device)
        if got is None or got.numel() < words:  # reused across calls: no allocation per block
            got = self._scratch[device] = torch.empty(words, dtype=torch.int64, device=device)
        return got

    def _plan(self, device: torch.device, nbytes: tuple[int, ...], batch: bool) -> _Plan:
        key = (device, nbytes, batch)
        got = self._plans.get(key)
        if got is None:
            if len(self._plans) >= self.max_plans:
                self._plans.clear()
            got = self._plans[key] = _Plan(device, nbytes, batch, self._multipliers)
        return got

    def _row_sums(self, x: torch.Tensor, a: torch.Tensor, fused: bool) -> list[torch.Tensor]:
        """u_r for every row of ``x`` (the last one may be short), in blocks of bounded
        scratch."""
        n = x.numel()
        words = self.block_words or (CPU_BLOCK_WORDS if x.device.type == "cpu"
                                     else DEVICE_BLOCK_WORDS)
        block = max(1, words // ROW_WORDS) * ROW_WORDS
        scratch = self._scratch_for(x.device, min(n, block))
        out = []
        for start in range(0, n, block):
            stop = min(n, start + block)
            rows, tail = divmod(stop - start, ROW_WORDS)
            pieces = []
            if rows:
                xs = x if rows * ROW_WORDS == n else x[start:start + rows * ROW_WORDS]
                pieces.append((xs.view(rows, ROW_WORDS), a))
            if tail:
                pieces.append((x[stop - tail:stop].view(1, tail), a[:tail]))
            for xs, aa in pieces:
                y = _fold_(xs, scratch[:xs.numel()].view(xs.shape))
                if fused:  # an integer matrix-vector product, no product temporary
                    out.append(torch.mv(y, aa))
                else:
                    out.append(y.mul_(aa).sum(1))
        return out
