//! Fuzz target: see `vmmweights::fuzz::fuzz_gguf_metadata`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmmweights::fuzz::fuzz_gguf_metadata(data));
