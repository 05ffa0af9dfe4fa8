"""Every fault mode of the simulated server: SGLang's exit status, log lines and HTTP behaviour."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request

import pytest

from tests.launch_args import chain_launch_args
from workers.node.launcher import start_sim, wait_healthy
from workers.sglang import api

FAST = {"SPECSWEEP_SIM_TIME_SCALE": "0.05"}


def status_of(url: str, timeout: float = 10) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def generate(url: str, max_new_tokens: int = 16, timeout: float = 10) -> int:
    body = {"text": "a b c", "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True}}
    request = urllib.request.Request(
        url + api.GENERATE, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            reply.read()
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def wait_exit(handle, timeout: float = 20) -> int:
    return handle.popen.wait(timeout=timeout)


@pytest.mark.parametrize(
    ("fault", "expected_line"),
    [
        ("oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"),
        ("nccl", "torch.distributed.DistBackendError: NCCL error in:"),
        ("assert", "AssertionError"),
    ],
)
def test_startup_fault_dies_like_sglang_when_scheduler_raises(
    kimi_target, eagle3_draft, fault, expected_line
):
    """A scheduler that raises at startup: its traceback, the SIGQUIT line, then SIGKILL (status -9)."""
    env = {**FAST, "SPECSWEEP_SIM_FAULT": fault}
    with start_sim(chain_launch_args(kimi_target, eagle3_draft, 3), env=env, healthy_within_s=None) as handle:
        assert wait_exit(handle) == -signal.SIGKILL
        log = handle.log_text()
    assert "TP0] Scheduler hit an exception: Traceback (most recent call last):" in log
    assert any(line.startswith(expected_line) for line in log.splitlines())
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "fired up and ready to roll" not in log


def test_load_crash_when_launch_names_a_plain_llama_draft(kimi_target, fixtures_dir):
    """A launch SGLang accepts but cannot load (EAGLE3 with a LlamaForCausalLM draft) dies while loading."""
    args = chain_launch_args(kimi_target, fixtures_dir / "eagle3-draft-llama-arch", 3)
    with start_sim(args, env=FAST, healthy_within_s=None) as handle:
        assert wait_exit(handle) == -signal.SIGKILL
        assert "Scheduler hit an exception" in handle.log_text()


def test_crash_after_kills_server_when_request_count_exceeded(kimi_target, eagle3_draft):
    """crash_after 2: two requests succeed, the third finds the server dead (runtime SIGQUIT path)."""
    env = {**FAST, "SPECSWEEP_SIM_FAULT": "crash_after", "SPECSWEEP_SIM_FAULT_AFTER": "2"}
    with start_sim(chain_launch_args(kimi_target, eagle3_draft, 3), env=env) as handle:
        assert [generate(handle.url), generate(handle.url)] == [200, 200]
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            generate(handle.url)
        assert wait_exit(handle) == -signal.SIGKILL
        log = handle.log_text()
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in log
    assert "SIGQUIT received. signum=3, frame=None. It usually means one child failed." in log


def test_hang_before_ready_keeps_health_503_when_loading_never_ends(kimi_target, eagle3_draft):
    """hang_before_ready: the port answers, /health and /ready stay 503, the process stays alive."""
    env = {**FAST, "SPECSWEEP_SIM_FAULT": "hang_before_ready"}
    with start_sim(chain_launch_args(kimi_target, eagle3_draft, 3), env=env, healthy_within_s=None) as handle:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                codes = (status_of(handle.url + api.HEALTH), status_of(handle.url + api.READY))
                break
            except urllib.error.URLError:
                time.sleep(0.1)
        # Its loader logs this line and returns: loading never ends, where a healthy start turns ready.
        while "Capture cuda graph begin" not in handle.log_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert codes == (503, 503)
        assert (status_of(handle.url + api.HEALTH), status_of(handle.url + api.READY)) == (503, 503)
        assert handle.popen.poll() is None
        assert "Capture cuda graph begin" in handle.log_text()


def test_slow_start_answers_503_until_load_delay_passes(kimi_target, eagle3_draft):
    """SPECSWEEP_SIM_LOAD_DELAY_S: 503 while loading, then the ready line and 200."""
    env = {**FAST, "SPECSWEEP_SIM_LOAD_DELAY_S": "1.5"}
    with start_sim(chain_launch_args(kimi_target, eagle3_draft, 3), env=env, healthy_within_s=None) as handle:
        deadline = time.monotonic() + 15
        while True:
            try:
                first = status_of(handle.url + api.READY)
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline, "the port did not answer within 15 s"
                time.sleep(0.05)
        started = time.monotonic()
        assert first == 503
        wait_healthy(handle, 20)
        assert time.monotonic() - started > 0.3
        assert status_of(handle.url + api.READY) == 200
        assert "The server is fired up and ready to roll!" in handle.log_text()


def test_hang_mid_stream_stalls_stream_and_fails_health_when_scheduler_hangs(kimi_target, eagle3_draft):
    """hang_mid_stream 1: request 2 stops mid-stream, no more output; /health times out to 503."""
    env = {
        **FAST,
        "SPECSWEEP_SIM_FAULT": "hang_mid_stream",
        "SPECSWEEP_SIM_FAULT_AFTER": "1",
        "SGLANG_HEALTH_CHECK_TIMEOUT": "1",
    }
    with start_sim(chain_launch_args(kimi_target, eagle3_draft, 3), env=env) as handle:
        assert generate(handle.url, 40) == 200
        body = {"text": "x", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}, "stream": True}
        request = urllib.request.Request(
            handle.url + api.GENERATE,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        received = []
        with urllib.request.urlopen(request, timeout=1.5) as reply, pytest.raises(TimeoutError):
            for line in reply:
                if line.startswith(b"data: {"):
                    received.append(json.loads(line[6:])["meta_info"][api.META_COMPLETION_TOKENS])
        assert received and 20 <= received[-1] < 40
        assert status_of(handle.url + api.HEALTH) == 503
        assert handle.popen.poll() is None


def test_http_500_answers_every_nth_generation_request(kimi_target, eagle3_draft):
    """http_500 every 3: requests 3 and 6 get HTTP 500 with an error body, the others 200."""
    env = {**FAST, "SPECSWEEP_SIM_FAULT": "http_500", "SPECSWEEP_SIM_FAULT_EVERY": "3"}
    with start_sim(chain_launch_args(kimi_target, eagle3_draft, 3), env=env) as handle:
        assert [generate(handle.url) for _ in range(6)] == [200, 200, 500, 200, 200, 500]
        assert status_of(handle.url + api.HEALTH) == 200
