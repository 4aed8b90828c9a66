"""The machine a session runs on: its accelerator (``accel``), compile-only targets
(``targets``), the environment stored with a baseline (``fingerprint``: the machine and the
stack), and the errors a device raises (``device_errors``).
"""
