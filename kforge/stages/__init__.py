"""Pipeline stages, one module per Snakemake rule file (``rules/<stage>.smk``).

Each stage function reads its inputs, computes an action key from what it really depends on,
returns the cached record when the key is known, and otherwise does the work, records it in
the store and the work ledger, and writes its record to the Snakemake output path. Run one
with ``python -m kforge.stages <stage> ...`` (that is what the rules do).
"""
