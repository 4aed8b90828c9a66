"""The ``hf`` backend: a model trained by transformers' ``Trainer``, measured from a
callback (:mod:`.backend`); what a suite imports is :mod:`pytest_accelperf.hf`."""
