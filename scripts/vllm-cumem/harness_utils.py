"""The helpers test_cumem.py imports from vLLM's tests/utils.py: each test in
a forked process of its own (a fresh CUDA context and a fresh allocator), the
test failing when the child fails, and skipped when the child made a vLLM
engine (vllm.NeedsEngine: not an engine-free test)."""

import functools
import os
import traceback

import pytest

requires_fp8 = pytest.mark.skip(reason="vllm-cumem: needs a vLLM engine (only the engine-free tests run here)")

_NEEDS_ENGINE = 77


def create_new_process_for_each_test(method=None):
    def decorate(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            from vllm import NeedsEngine

            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    fn(*args, **kwargs)
                except NeedsEngine:
                    code = _NEEDS_ENGINE
                except BaseException:
                    traceback.print_exc()
                    code = 1
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _NEEDS_ENGINE:
                pytest.skip("needs a vLLM engine (only the engine-free tests run here)")
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"{fn.__name__} failed in its process"

        return run

    return decorate
