"""The FSDP2 silent-error corpus: published user mistakes under ``fully_shard``, each as a plain
user script run under torchrun (``silent_errors_script``), its public source (``patterns``),
the outcome a run ends in judged from what every rank wrote (``outcome``), and the torchrun
launcher that survives a rank dying by signal (``launch``)."""
