"""The compute canary's gradients, digested as autograd makes them: each probe gradient is taken
the moment it is accumulated (a stand-in's post-accumulate-grad hook, or FSDP2's gathered
parameters' backward: ``fsdp.canary_units``), queued, and digested with the others queued once
they reach the block size; then dropped. So a probe never holds more than one block of
gradients — at most ``block_bytes`` of small ones, or one parameter's — and ``held`` says how
much it held at its peak. The digest of a parameter does not depend on the block it was in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from openclaw_ref.sync.evidence.replica_digest import ReplicaDigest


class GradStream:
    """Digests and figures of the gradients as autograd accumulates them, a block at a time
    (module docstring): ``taker`` makes the stand-ins' post-accumulate-grad hooks."""

    def __init__(self, tracked: int, digest: ReplicaDigest, device: torch.device,
                 block_bytes: int) -> None:
        self.digest, self.device, self.block_bytes = digest, device, block_bytes
        self.on_host = device.type == "cpu"
        self.digests: list[int] | torch.Tensor = (
            [0] * tracked if self.on_host else torch.zeros(tracked, dtype=torch.int64,
                                                           device=device))
        self.seen = [False] * tracked
        self.figures = torch.zeros(2 * tracked, dtype=torch.float64, device=device)
        self.queue: list[tuple[Sequence[int], torch.Tensor]] = []
        self.queued = self.held = 0

    def taker(self, indices: Sequence[int]) -> Callable[[torch.Tensor], None]:
        """The post-accumulate-grad hook of the stand-in of the parameters at ``indices``."""
        return lambda leaf: self.take(indices, leaf)

    def take(self, indices: Sequence[int], leaf: torch.Tensor) -> None:
        g, leaf.grad = leaf.grad, None
        if g is not None:
            self.put(indices, g)

    def put(self, indices: Sequence[int], g: torch.Tensor) -> None:
        """Gradient ``g`` of the parameters at ``indices``, queued; the queue digested and
        dropped once it holds ``block_bytes``."""
        g = g.to_dense() if g.is_sparse else g
        self.queue.append((indices, g))
        self.queued += g.numel() * g.element_size()
        self.held = max(self.held, self.queued)
        if self.queued >= self.block_bytes:
            self.flush()

    def flush(self) -> None:
        if not self.queue:
            return
        grads = [g for _, g in self.queue]
        got = (self.digest.digests_on_host(grads) if self.on_host
               else self.digest.digests(grads).to(self.device))
        figs = torch.stack([torch.stack([g.sum(dtype=torch.float64),
                                         torch.linalg.vector_norm(g, 1, dtype=torch.float64)])
                            .to(self.device) for g in grads])
        for k, (indices, _) in enumerate(self.queue):
            for i in indices:
                self._add(i, got[k])
                self.figures[2 * i:2 * i + 2] += figs[k]
        self.queue.clear()
        self.queued = 0

    def _add(self, i: int, d: int | torch.Tensor) -> None:
        """Parameter ``i``'s digest; a second accumulation (a reentrant checkpoint's) is
        combined with the first in order — the same order on every rank."""
        if self.seen[i]:
            pair = [self.digests[i], d]
            d = (ReplicaDigest.combine_on_host(pair) if self.on_host
                 else ReplicaDigest.combine(torch.stack(pair)))
        self.digests[i] = d
        self.seen[i] = True
