"""What training a case yields, as data: the run (``run``), the program record (``program``),
and the sites in the user's code (``sites``).
"""
