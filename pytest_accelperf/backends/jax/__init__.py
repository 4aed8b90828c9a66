"""The JAX backends: JAX (``backend``), GPipe (``pipeline``), Alpa (``alpa``)."""
