"""The statistics behind verdicts: the bootstrap interval (``bootstrap``), the suite's one
verdict (``family``), the machine's load while a step was timed (``contention``), and how
numbers are printed (``units``).
"""
