"""The node worker's wing: one Ray actor per server slot, from preflight to the attempt's Parquet files.

``actor`` runs one job (convert the drafter, launch, check the live config, load, stop, write);
``launcher`` starts, watches and stops a server process group without leaking it; ``preflight`` checks
GPUs and ports; ``records`` builds the attempt's ``jobs`` row. It may import every other wing of
``workers``; only the harness's driver imports it.
"""
