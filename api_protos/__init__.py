"""Wire contracts as ``.proto`` sources (``proto/``) and their generated Python (``gen/``).

Regenerate with ``python -m api_protos.generate``; never edit ``gen/`` by hand.
"""
