"""Seed 004's precision × devices table (claim L3): 1 rank fp32, 1 rank AMP, N ranks DDP + AMP.

AMP is bf16 autocast on CPU and fp16 autocast on GPU; one rank runs unwrapped (the
single-device flow), N ranks run stock DDP. The seed claims 0.42 → 0.31 → 0.08 s/iter and
9.8 → 5.2 → 3.7 GB per GPU.
"""

from __future__ import annotations

from . import common
from .common import need


class Seed004Matrix(common.JobBenchmark):
    params = [common.SEED004_PRECISIONS, common.WORLD_SIZES, common.BACKENDS]
    param_names = ["precision", "world_size", "backend"]

    def setup(self, cache_dir, precision, world_size, backend):
        self.f = common.case_figures(cache_dir, "seed004", precision, world_size, backend)

    def track_s_per_iter(self, *_):
        return need(self.f, "s_per_iter")

    track_s_per_iter.unit = "s"

    def track_peak_memory_per_rank_mb(self, *_):
        return need(self.f, "peak_memory_mb")

    track_peak_memory_per_rank_mb.unit = "MiB"
