//! Fuzz target: see `vmmweights::fuzz::fuzz_share_server`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmmweights::fuzz::fuzz_share_server(data));
