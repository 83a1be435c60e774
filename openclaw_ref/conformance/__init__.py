"""The conformance suite's library, used by ``pytest -m conformance`` (``conformance/``) and by the
cluster mode (``openclaw-bench conform``).

  ``settings``   what a conformance run trains, and a check's result
  ``recorders``  loop callbacks that watch the one training loop
  ``checks``     one collective function per check, verdicts identical on every rank
  ``report``     the measured figures as JSON
  ``cluster``    the cluster mode's driver: every selected check on a live group
  ``fault_matrix``  the fault × strategy matrix and its one outcome classifier
  ``corpus``     published DDP silent errors × (ddp, ddp-detail, harden() defaults, K=1)
"""
