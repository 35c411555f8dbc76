// Package vmmw is the Go binding of vmmweights: model weights in GPU memory
// through CUDA virtual memory management, with sleep/wake at stable addresses.
//
// It wraps the C API (include/vmmweights.h) with cgo. Build the library first
// (cargo build --release, or the CMake package) and point cgo at it:
//
//	export CGO_LDFLAGS="-L/path/to/lib -Wl,-rpath,/path/to/lib"
//	go test ./...
//
// Every handle type (Device, Segment, ...) is freed by Close, which is
// idempotent; a finalizer calls Close for handles that are dropped without it,
// but explicit Close releases device memory at a predictable time and should
// be preferred. Methods of a closed handle return an *Error with
// StatusNullArgument. A handle may be used from several goroutines at once,
// except that Close must not run concurrently with other calls on it.
//
// Errors are *Error values carrying the library's Status and message; use
// errors.Is(err, vmmw.ErrOutOfMemory) (or any Err* sentinel) to test the status.
// No Go pointer is kept by the C side after a call returns.
package vmmw
