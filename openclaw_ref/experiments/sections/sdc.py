"""Section ``sdc``: one rank's hardware computes matrix products wrong (``core.sdc_faults``)
under stock DDP, ``harden()`` with the compute canary off (``canary_every=0``) and on — per
fault and column the outcome, the error, the step and the ranks named, at 2 and 4 ranks
(``experiments.sdc_corpus.corpus_task``); the canary's detection rate of the intermittent and
data-dependent faults over many probes (``rate_task``); the healthy-jobs corpus with the
canary off and at every step: alarms and whether training stayed bitwise the same
(``experiments.canary_healthy.healthy_pair_task``); and the tolerance's justification, healthy
noise beside the smallest fault caught per model and precision
(``experiments.canary_noise.noise_table``, on the parent: one process). Figures only; the
tables and their wording are ``reporting.sdc_tables``. Every rank returns the same outcomes
(the tests assert it): rank 0's are kept."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from openclaw_ref.core.pools import PoolCache
from openclaw_ref.core.sdc_faults import SDC_FAULTS
from openclaw_ref.experiments.canary_healthy import HealthyJob, healthy_pair_task
from openclaw_ref.experiments.canary_noise import noise_table
from openclaw_ref.experiments.sdc_corpus import Column, SdcCase, corpus_task, rate_task

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

K, STEPS, FAULT_STEP = 2, 8, 2
WORLDS = (2, 4)
# the faults that fire on some calls only, with the VALUE the rate is measured at
RATE_FAULTS: tuple[tuple[str, str], ...] = (("sdc-flip-low", "0.2"), ("sdc-flip-high", "0.2"),
                                            ("sdc-threshold", "2.5"))
RATE_PROBES, QUICK_RATE_PROBES = 40, 8
NOISE_TRIALS, QUICK_NOISE_TRIALS = 20, 3


def worlds_of(cfg: CompareConfig) -> tuple[int, ...]:
    return WORLDS[:1] if cfg.quick else WORLDS


def jobs(cfg: CompareConfig) -> int:
    """One tick per world size's corpus, per rate fault, per healthy job, and the noise."""
    return len(worlds_of(cfg)) + len(RATE_FAULTS) + len(HealthyJob) + 1


def cases() -> list[SdcCase]:
    return [SdcCase(f, steps=STEPS, fault_step=FAULT_STEP, canary_every=K) for f in SDC_FAULTS]


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    corpus = []
    for world in worlds_of(cfg):
        for row in pools.get(world).run(corpus_task, cases(), tuple(Column))[0]:
            corpus.append({"world_size": world, "fault": row["fault"],
                           "value": SdcCase(**row["case"]).resolved_value or None,
                           "column": row["column"],
                           "outcome": row["outcome"], "error": row["kind"] or None,
                           "step": row["step"], "ranks": row["ranks"],
                           "params": row["params"][:1], "fired": row["fired"],
                           "reported": sum(k == "CanaryTransient" and world - 1 in r
                                           for k, r in zip(row["events"],
                                                           row["event_ranks"]))})
        progress.tick(f"sdc corpus at {world} ranks")
    probes = QUICK_RATE_PROBES if cfg.quick else RATE_PROBES
    rates = []
    for fault, value in RATE_FAULTS:
        rates.append(pools.get(2).run(rate_task, fault, value, probes)[1])  # the faulty rank's
        progress.tick(f"sdc rate {fault}")
    healthy = []
    for job in HealthyJob:
        replies = pools.get(2).run(healthy_pair_task, job)
        healthy.append({**replies[0], "bitwise_equal": all(r["bitwise_equal"] for r in replies),
                        "alarms_off": sum(r["alarms_off"] for r in replies),
                        "alarms_on": sum(r["alarms_on"] for r in replies)})
        progress.tick(f"sdc healthy {job.value}")
    noise = noise_table(QUICK_NOISE_TRIALS if cfg.quick else NOISE_TRIALS)
    progress.tick("sdc canary noise")
    return {"settings": {"canary_every": K, "steps": STEPS, "fault_step": FAULT_STEP,
                         "fault_rank": "last", "cases": [asdict(c) for c in cases()]},
            "corpus": corpus, "rates": rates, "healthy": healthy, "noise": noise}
