"""The helpers test_cumem.py imports from vLLM's tests/utils.py: each test in
a forked process of its own (a fresh CUDA context and a fresh allocator), the
test failing when the child fails."""

import functools
import os
import traceback

import pytest

requires_fp8 = pytest.mark.skip(reason="vllm-cumem: engine tests are not run")


def create_new_process_for_each_test(method=None):
    def decorate(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    fn(*args, **kwargs)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"{fn.__name__} failed in its process"

        return run

    return decorate
