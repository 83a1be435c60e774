"""Everything a reader sees, made from records only.

``record.py`` (the versioned ``raw.json``, validated and upgraded on load), ``render.py`` (every
file of a results directory; ``summary.py``: ``results/README.md``, what harden() buys in one
table), ``comparison.py`` and ``section_tables.py`` (the comparison
document and each section's tables and captions; the ``corpus`` section's in
``corpus_tables.py``), ``plots.py`` (PNG plots; the bucket timeline's step and caption:
``timeline.py``), ``claims/`` (each claim of a source text and
the rule that turns a record into its verdict), ``speed.py`` (the speed targets and the README's
cost line), ``blocks.py`` (rendered blocks inside hand-written pages). Producers only make
records; all wording is here.
"""
