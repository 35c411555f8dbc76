"""The names vLLM's tests/basic_correctness/test_cumem.py imports from vllm,
for running its engine-free tests against vmmweights' CuMemAllocator
(scripts/vllm-cumem.sh). The engine names are here so the module imports;
the tests that need an engine are not run."""


class _NoEngine:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("vllm-cumem: no vLLM engine here; only the engine-free tests run")

    @classmethod
    def from_engine_args(cls, *args, **kwargs):
        return cls()


LLM = SamplingParams = AsyncEngineArgs = AsyncLLMEngine = _NoEngine
