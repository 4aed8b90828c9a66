"""What training a case yields, as data: the run (``run``), the program record (``program``),
the numerics fingerprint (``fingerprint``), the sites in the user's code (``sites``), and
the type of a JSON value (``jsonvalue``).
"""
