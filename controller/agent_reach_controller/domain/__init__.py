"""The domain's values: the rows the rules in `decide/` reason about and storage reads and writes.

Below storage in the layers: storage imports the domain, never the other way round.
"""
