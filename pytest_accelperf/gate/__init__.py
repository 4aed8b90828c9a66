"""The session and the gate's wiring: options, the session's state, the case
pipeline (``runner``), judging, where a case trains (``routing``), the bounds on a case
(``hangs``), explanations, the max-batch search, and the xdist role.
"""
