"""The ``lightning`` backend: a LightningModule trained by ``Trainer.fit`` as written,
measured from a callback inside Lightning's loop (``backend``, ``callback``); what a suite
hands it is ``task`` (importing this package, or ``task``, imports no framework)."""
