"""The names vLLM's tests/basic_correctness/test_cumem.py imports from vllm,
for running its tests that need no engine against vmmweights' CuMemAllocator
(scripts/vllm-cumem.sh). The engine names are here so the module imports:
making an engine raises NeedsEngine, which skips that test (in the test's
own process, or through its forked child's exit code, harness_utils.py)."""

import pytest


class NeedsEngine(pytest.skip.Exception):  # type: ignore[misc]
    """A test made a vLLM engine: it is not one of the engine-free tests."""

    def __init__(self, *args, **kwargs):
        super().__init__("needs a vLLM engine (only the engine-free tests run here)")


class _NoEngine:
    def __init__(self, *args, **kwargs):
        raise NeedsEngine()

    @classmethod
    def from_engine_args(cls, *args, **kwargs):
        raise NeedsEngine()


LLM = SamplingParams = AsyncEngineArgs = AsyncLLMEngine = _NoEngine
