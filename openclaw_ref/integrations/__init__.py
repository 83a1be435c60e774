"""Other frameworks driving our loop and strategies: ``lightning/`` (a LightningModule, a
DataModule and the hardened DDP strategy; the ``lightning`` extra).
"""
