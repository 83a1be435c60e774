"""The model and everything that runs it on N ranks.

``model.py`` (the sparse-gated transformer; never imports ``torch.distributed``), ``data.py``
(the synthetic skill task and its rank sharding), ``config.py`` (run-config sections and named
presets), ``train.py`` (the one training loop and its run JSON), ``callbacks.py`` (the loop's one
callback protocol), ``faults.py`` (fault injectors, as callbacks), ``corpus_faults.py``
(the published DDP silent errors, as callbacks, with their sources), ``metrics.py`` (per-rank
measurements inside a step), ``launch.py``/``rank_process.py``/``pools.py``/``triage.py``
(spawned rank pools, torchrun support, which rank caused a failure), ``collectives.py`` (the one
object gather), ``environment.py`` (run metadata), ``jsonio.py`` (atomic writes), ``errors.py``
(the launcher's errors; the hook library's live in ``sync/errors.py``).
"""
