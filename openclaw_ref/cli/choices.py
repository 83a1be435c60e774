"""The choice lists the CLI's parsers offer, as plain constants.

Why: their homes (the model presets, the strategies, the ``Wire``/``Planner``/``NonFinitePolicy``
/``WatchdogAction``
enums, the compare sections, the conformance checks, the hook-cost arms) import torch, and
``openclaw-bench --help`` must not (a torch import takes seconds). ``tests/test_cli.py`` proves
each list equal to its home, so they cannot drift."""

from __future__ import annotations

PRESETS = ("tiny", "small", "base")  # core.model.PRESETS
STRATEGIES = ("ddp", "ddp-allreduce", "ddp-fp16", "ddp-bf16", "ddp-powersgd", "ddp-detail",
              "local", "hardened", "bucketed", "seed-f5")  # arms.registry.STRATEGIES
WIRES = ("native", "fp32", "fp16", "bf16")  # sync.base.Wire
WRAPPERS = ("ddp", "fsdp2", "hsdp", "fsdp2-tp")  # conformance.target: --openclaw-wrapper
GUARDS = ("step", "bucket")  # sync.base.Guard
PLANNERS = ("static", "norm-ema", "norm-ema-agreed")  # arms.config.Planner
NONFINITE_POLICIES = ("skip", "raise")  # sync.base.NonFinitePolicy
WATCHDOG_ACTIONS = ("raise", "report", "exit")  # sync.base.WatchdogAction
BACKENDS = ("auto", "gloo", "nccl")
SECTIONS = ("strategies", "curves", "faults", "corpus", "false_alarms", "precision", "overflow",
            "raw_allreduce", "ablations", "lightning", "quantization",
            "hook_cost", "sdc", "fsdp_cost", "fsdp_corpus", "tp_corpus")  # experiments.registry
CHECKS = ("shape-agreement", "bucket-alignment", "overflow-rate", "replica-consistency",
          "equivalence", "fault-detection")  # conformance.cluster.CHECKS
CONFORM_FAULTS = ("permuted-params", "scale-mismatch", "missing-grad", "nan-grad", "bitflip",
                  "late-rank=250ms")  # conformance.settings.ConformSettings().faults
# experiments.hook_cost.ARMS
HOOK_COST_ARMS = ("ddp", "floor", "floor+nancheck", "allreduce_hook", "fp16_compress_hook",
                  "hardened", "hardened-fp16", "hardened-noreplica", "hardened-bucket-fp32",
                  "hardened+canary")
