"""The load wing: concurrent load against one server, one exact record per request.

``generator`` runs a load level (closed or open loop, one or several client processes), ``workloads``
builds the request bodies, ``sse`` and ``stream`` parse the server's streams, ``socket_stamps`` dates
each chunk at the socket read, ``calibration`` measures the client's own added delay. It imports
``workers.job``, ``workers.sglang``, ``analysis.schema`` and ``specsweep``, never ``workers.node``.
"""
