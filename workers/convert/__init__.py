"""The drafter-conversion wing: EAGLE3 checkpoints into the layout SGLang loads, with every check.

``eagle3_format`` holds the format rules, ``checkpoint_source`` reads the inputs, ``converter`` with
``tensor_copy`` / ``tensor_values`` / ``safetensors_stream`` copies, hashes and scans tensors,
``report`` is the conversion report, ``cache`` the node-local cache of converted drafters, ``fixtures``
generates checkpoints in each published shape. It imports only ``workers.job``, ``workers.sglang`` and
``specsweep``, never ``workers.node``.
"""
