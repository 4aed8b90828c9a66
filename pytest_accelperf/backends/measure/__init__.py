"""How a step is measured, whatever the framework: the measured-step loop (``loop``), the
drift probe (``probe``), the fingerprint and the shared helpers (``common``) and the
user's batches (``data``). Nothing here imports a framework."""
