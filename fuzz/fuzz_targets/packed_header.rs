//! Fuzz target: see `vmmweights::fuzz::fuzz_packed_header`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmmweights::fuzz::fuzz_packed_header(data));
