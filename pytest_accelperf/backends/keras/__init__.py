"""The ``keras`` backend: a compiled Keras 3 model trained by ``model.fit`` on JAX, as
written, measured from a callback inside Keras's own loop (``backend``, ``callback``); what
a suite hands it is ``task`` (importing this package, or ``task``, imports no framework)."""
