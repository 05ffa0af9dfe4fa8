"""The lossless check's requests: a fixed, bundled set of prompts sent at temperature 0, twice.

The prompts are bundled (not the workload's): the same few texts for every sweep, sent as text on
``/generate`` (the server tokenizes them, so no vocabulary size is assumed) with ``max_new_tokens`` of
``CHECK_OUTPUT_TOKENS``. Each server gets them one at a time (``serial``, batch size 1) and then all at once
(``batched``): on the baseline the two are the same greedy decode at two batch sizes, so where they differ
is the noise floor of the hardware's arithmetic, measured, not assumed (docs/results.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from analysis.schema import LosslessRecord
from workers.sglang import api
from workers.sglang.lossless import greedy_request, output_ids

CHECK_OUTPUT_TOKENS = 64
CHECK_PROMPTS: tuple[str, ...] = (
    "Explain why the sky is blue in two sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List the planets of the solar system in order from the sun.",
    "Translate 'Where is the train station?' into French, German and Spanish.",
    "What is the derivative of x^3 * sin(x)?",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "Give three tips for writing clear commit messages.",
    "Convert 72 degrees Fahrenheit to Celsius and show the steps.",
    "Write a haiku about a mountain lake at dawn.",
    "What are the differences between TCP and UDP?",
    "Sort the numbers 42, 7, 19, 3, 88, 61 in ascending order.",
    "Describe how a hash table handles collisions.",
    "Write a SQL query that counts orders per customer.",
    "Name five prime numbers greater than 100.",
    "Explain the difference between a process and a thread.",
    "Continue the sequence: 2, 4, 8, 16, ...",
)


def run_check(url: str, *, sweep_id: str, job_id: str, request_timeout_s: float) -> list[LosslessRecord]:
    """Send the check prompts to the server at ``url`` serially, then all at once; one record per mode x
    prompt. A failed request is a record with its error (the analysis leaves that prompt uncompared)."""
    return asyncio.run(_run(url, sweep_id, job_id, request_timeout_s))


async def _run(url: str, sweep_id: str, job_id: str, request_timeout_s: float) -> list[LosslessRecord]:
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        serial = [await _one(session, url, i) for i in range(len(CHECK_PROMPTS))]
        batched = await asyncio.gather(*(_one(session, url, i) for i in range(len(CHECK_PROMPTS))))
    return [
        LosslessRecord(sweep_id, job_id, mode, index, ids, error)
        for mode, outcomes in (("serial", serial), ("batched", batched))
        for index, (ids, error) in enumerate(outcomes)
    ]


async def _one(
    session: aiohttp.ClientSession, url: str, index: int
) -> tuple[tuple[int, ...] | None, str | None]:
    """The output ids of check prompt ``index``, or the reason there are none."""
    body = greedy_request(CHECK_PROMPTS[index], CHECK_OUTPUT_TOKENS)
    try:
        async with session.post(url + api.GENERATE, json=body) as response:
            if response.status != 200:
                return None, f"HTTP {response.status}: {(await response.text())[:200]}"
            answer: Any = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        return tuple(output_ids(answer)), None
    except ValueError as exc:
        return None, str(exc)
