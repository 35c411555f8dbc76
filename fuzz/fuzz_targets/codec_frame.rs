//! Fuzz target: see `vmmweights::fuzz::fuzz_codec_frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmmweights::fuzz::fuzz_codec_frame(data));
