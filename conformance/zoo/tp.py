"""The suite's own FSDP2 × tensor-parallel subjects, for ``--openclaw-wrapper fsdp2-tp``: the TP
corpus's 2-block model (``openclaw_ref.tp_corpus.model``: an input projection, LayerNorm →
Linear → ReLU → Linear blocks with a residual, a final norm and a head; the loss computed
inside) as a ``Target`` with a ``tp_plan``, one correct and one with the published mistake.

  ``sequence_parallel``  right: torchtitan's Llama split — the input projection scatters the
                         sequence (``RowwiseParallel(input_layouts=Replicate(),
                         output_layouts=Shard(1))``), the norms under ``SequenceParallel()``,
                         ``w1``/``w2`` column/row-wise, the head gathers; every check passes;
  ``norms_left_out``     broken: the same plan without the norms. Each tp rank's norm gradient
                         covers its own part of the sequence and nothing reduces it over tp
                         (Megatron-LM#1446, TransformerEngine#441): stock trains silently while
                         the norms' tp replicas drift apart. The suite's tp-replica check must
                         fail naming the norms and every rank; ``harden()`` raises
                         ``GradientsNotAveraged`` at step 0.

Each plan returns the blocks, which the suite ``fully_shard``s over dp before the root.
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from openclaw_ref.conformance.target import Batch, Target
from openclaw_ref.tp_corpus.cases import Plan
from openclaw_ref.tp_corpus.model import Net, batch, parallelize

# the norms the broken plan leaves out: what its failures must name
NORMS = ("blocks.0.norm.weight", "blocks.0.norm.bias", "blocks.1.norm.weight",
         "blocks.1.norm.bias", "norm.weight", "norm.bias")


def sequence_parallel() -> Target:
    return _target(Plan.SEQUENCE_PARALLEL)


def norms_left_out() -> Target:
    return _target(Plan.SP_WITHOUT_NORMS)


def _target(plan: Plan) -> Target:
    return Target(Net(), _batch, _loss, lr=0.05, tp_plan=partial(_split, plan=plan))


def _split(model: Net, tp_mesh: DeviceMesh, plan: Plan) -> list[nn.Module]:
    parallelize(model, tp_mesh, plan)
    return list(model.blocks)


def _batch(step: int, rank: int, world_size: int) -> Batch:
    """Part ``rank`` of ``world_size`` of global batch ``step``; the model takes the targets
    and returns its loss."""
    x, y = batch(step, rank, world_size)
    return (x, y), y


def _loss(loss, labels):
    return loss
