"""Running the suite in production: ``doctor.py`` (torch/CUDA/NCCL facts and NCCL-variable lint)
and ``prometheus.py`` (the per-rank exporter and the seed's P2 skew barrier, as loop callbacks).
"""
