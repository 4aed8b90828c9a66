"""Collection: the case grid a suite declares (``cases``: ``Case``, ``grid``, ``@cases``),
and the node ids a collection found (``nodeids``, for ``accelperf baselines prune``).
"""
