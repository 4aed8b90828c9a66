"""What training a case yields, as data: the run (``run``), the environment it ran in
(``environment``), the program record (``program``), the numerics fingerprint
(``fingerprint``), the sites in the user's code (``sites``), the base of a record kept as
the JSON it was read from (``section``), and the type of a JSON value (``jsonvalue``).
"""
