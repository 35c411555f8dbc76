//go:build !cgo

package vmmw

// This package calls the vmmweights C library through cgo. Without cgo
// (CGO_ENABLED=0, or no C compiler found) the build stops here, with an
// error that names the fix, instead of at the first missing function.
const _ = vmmw_requires_cgo__build_with_CGO_ENABLED_1_and_a_C_compiler
