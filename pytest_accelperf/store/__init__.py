"""The baseline store and the files it reads and writes: the store itself (``baselines``), the
baseline block (``block``, ``summary``), the files' schema (``schema``), what is stored
(``policy``, ``recordable``), and JSON on disk (``jsonfile``).
"""
