// Package vmmw is the Go binding of vmmweights: model weights in GPU memory
// through CUDA virtual memory management, loaded in place from safetensors
// checkpoints, with sleep and wake at stable addresses.
//
// # Installing
//
// The package wraps the C library with cgo and finds it through pkg-config.
// The module is not published yet: use it from a checkout of the repository.
// Install the C package once (CMake, see docs/BUILDING.md), from the
// checkout's folder, and point pkg-config at it:
//
//	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//	cmake --build build && cmake --install build --prefix /opt/vmmweights
//	export PKG_CONFIG_PATH=/opt/vmmweights/lib/pkgconfig
//
// then, in your module's go.mod, require the module and replace it with the
// checkout's copy:
//
//	require github.com/vmmweights/vmmweights/bindings/go v0.0.0
//	replace github.com/vmmweights/vmmweights/bindings/go => /path/to/vmmweights/bindings/go
//
// Once it is published, `go get github.com/vmmweights/vmmweights/bindings/go/vmmw`
// takes the place of the replace directive.
//
// At run time the shared library is found through the rpath the installed
// pkg-config file adds (or the system's library path for a /usr install). The
// package refuses to compile against a header of another minor version than
// the one it wraps.
//
// # Versions
//
// The module github.com/vmmweights/vmmweights/bindings/go will be tagged
// bindings/go/vX.Y.Z once published, with X.Y.Z the release of the C library
// it wraps; the import path of this package is its vmmw folder.
//
// # Handles
//
// Every handle type (Device, Pool, Segment, Loader) is freed by Close, which
// is idempotent; a finalizer calls Close for handles dropped without it, but
// an explicit Close releases device memory at a predictable time. Methods of
// a closed handle return an *Error with StatusNullArgument. A handle may be
// used from several goroutines at once, except that Close must not run
// concurrently with other calls on it.
//
// # Errors
//
// Errors are *Error values carrying the library's Status and message; test
// the status with errors.Is(err, vmmw.ErrOutOfMemory) (or any Err* sentinel).
// Context cancellation is reported as the context's error (errors.Is(err,
// context.Canceled)) wrapped around ErrCancelled when the library stopped.
//
// # Coverage
//
// Every function of the C API has a Go counterpart except the PyTorch
// allocator entry points (vmmw_torch_malloc/free, called by PyTorch itself)
// and vmmw_error_status (the status is the Error's Status field). No Go
// pointer is kept by the C side after a call returns.
package vmmw
