"""The conformance suite: its library, its tests (``suite/``, shipped in the wheel) and the pytest
plugin that runs them anywhere the package is installed (``pytest -m conformance --pyargs
openclaw_ref.conformance.suite``), plus the cluster mode (``openclaw-bench conform``).

In the repository this package is the top-level folder ``conformance/``, installed as
``openclaw_ref.conformance`` (pyproject's ``package-dir``; the editable install maps it too), and
``pytest -m conformance`` from the checkout collects ``conformance/suite/`` once (``testpaths``).

  ``settings``     what a conformance run trains, and a check's result
  ``recorders``    loop callbacks that watch the one training loop
  ``checks``       one collective function per check, verdicts identical on every rank
  ``report``       the measured figures as JSON
  ``cluster``      the cluster mode's driver: every selected check on a live group
  ``fault_matrix``  the fault × strategy matrix and its one outcome classifier
  ``corpus``       published DDP silent errors × (ddp, ddp-detail, harden() defaults, K=1)
  ``target``       a user's model and hook, named ``MODULE:NAME``: the ``Target`` protocol and
                   the input checks that run before any rank starts
  ``user_run``     the user's hook as one more strategy (``UserHook``) and the loop for a Target
  ``run_record``   what one rank saw in one run of a Target (``RunRecord``), DDP or FSDP2
  ``user_record``  one recorded run of a Target (states per step, buckets the hook saw and
                   returned), and the comparison of two runs
  ``oracle``       stock DDP as the reference a hook is judged against, its tolerance, the
                   model's shard invariance, and the session's cache of runs (``TargetRuns``)
  ``averaging``    the bucket average: a hook's result against the ranks' buckets, attributed
  ``user_checks``  the checks that apply to any model (equivalence with stock DDP per DDP
                   option set, bucket average, replica consistency, bucket layout)
  ``user_faults``  the fault matrix on a user's target: the faults and corpus patterns that
                   apply to the model, judged by ``fault_matrix.classify``
  ``fsdp_run``     ``--openclaw-wrapper fsdp2/hsdp``: the user's target under ``fully_shard``,
                   its recorded run, the healthy-jobs option sets
  ``fsdp_faults``  the FSDP2-form faults and the FSDP2 corpus on the user's target
  ``plugin``       the pytest plugin (entry point ``pytest11``): ``--openclaw-*`` options,
                   fixtures, the report
  ``zoo``          the suite's own proof: seven small models and correct and broken hooks
  ``suite``        the tests themselves
"""
