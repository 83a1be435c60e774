"""The FSDP2 × tensor-parallel corpus: healthy 2-D and 3-D set-ups and published TP/SP mistakes,
each a plain user script run under torchrun (``script``, its model and plans ``model``), its
public source (``cases``), the outcome judged from what every rank wrote, replica drift
included (``outcome``), and the launcher with its deadline (``launch``)."""
