"""The suite's own proof: small models unlike the openclaw model and comm hooks, correct and
broken, each named as ``MODULE:NAME`` the way a user names theirs (``--openclaw-model``,
``--openclaw-hook``).

  ``models``  seven ``Target`` factories: a BatchNorm CNN, a tied-embedding LM, a model whose
              forward branches on the batch, one with frozen layers, one with sparse embedding
              gradients, an MoE-style router with a load-balancing loss, a contrastive model
              with in-batch negatives
  ``fsdp``    the FSDP2 subjects (``--openclaw-wrapper fsdp2``/``hsdp``): a target, ``harden()``
              and a subject that doubles the gradients
  ``tp``      two FSDP2 × TP plans (``--openclaw-wrapper fsdp2-tp``) on one model: sequence
              parallel done right, and with the norms left out
  ``hooks``   the correct hooks (PyTorch's ``allreduce_hook`` and ``fp16_compress_hook``, a bf16
              hook that casts on gloo, ``harden()``) and the broken ones (no divide, one rank
              scaled, a bucket returned in another order, un-reduced on one rank)

``suite/test_zoo.py`` runs every model through the suite's checks with every hook: the correct
ones must pass, the broken ones fail naming the check (and the rank where the fault has one);
``suite/test_tp_zoo.py`` runs the two TP plans: the right one passes, the other fails by name.
"""
