package vmmw

// The library and its header come from the installed C package, found through
// pkg-config (PKG_CONFIG_PATH=<prefix>/lib/pkgconfig); see the package doc.

// #cgo pkg-config: vmmweights
// #include <stdlib.h>
// #include "vmmweights.h"
// #if !defined(VMMW_VERSION_MAJOR) || VMMW_VERSION_MAJOR != 0 || VMMW_VERSION_MINOR != 1
// #error "this Go package wraps the vmmweights 0.1 C API: install a matching libvmmweights (pkg-config --modversion vmmweights)"
// #endif
import "C"

import (
	"unsafe"
)

// call runs one C function that reports failure through a vmmw_error_t**,
// and turns its status and error object into a Go error (freeing the object).
// The error object is created per call, so the message is this call's even if
// the goroutine moved between OS threads.
func call(f func(errOut **C.vmmw_error_t) C.vmmw_status_t) error {
	var cerr *C.vmmw_error_t
	rc := f(&cerr)
	if rc == C.VMMW_OK {
		C.vmmw_error_free(cerr) // never set on success; NULL is accepted
		return nil
	}
	msg := Status(rc).String()
	var driverCode int32
	if cerr != nil {
		msg = C.GoString(C.vmmw_error_message(cerr))
		driverCode = int32(C.vmmw_error_driver_code(cerr))
		C.vmmw_error_free(cerr)
	}
	return &Error{Status: Status(rc), Message: msg, DriverCode: driverCode}
}

// readString reads a string through the C buffer protocol (buf, cap, *needed).
func readString(f func(buf *C.char, capacity C.size_t, needed *C.size_t, errOut **C.vmmw_error_t) C.vmmw_status_t) (string, error) {
	buf := make([]byte, 128)
	for attempt := 0; attempt < 4; attempt++ {
		var needed C.size_t
		err := call(func(e **C.vmmw_error_t) C.vmmw_status_t {
			return f((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &needed, e)
		})
		if err == nil {
			return string(buf[:int(needed)-1]), nil
		}
		if !isStatus(err, StatusBufferTooSmall) {
			return "", err
		}
		buf = make([]byte, int(needed))
	}
	return "", &Error{Status: StatusBufferTooSmall, Message: "string kept growing while read"}
}

// bytesPtr is the address of b's first byte, or nil for an empty slice. The
// C side only reads or writes it during the call.
func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// Version is the library's version at run time ("0.1.0").
func Version() string {
	return C.GoString(C.vmmw_version_string())
}

// VersionParts is the library's version at run time as numbers.
func VersionParts() (major, minor, patch int) {
	return int(C.vmmw_version_major()), int(C.vmmw_version_minor()), int(C.vmmw_version_patch())
}

// HeaderVersion is the version of the C API this package wraps (the header
// it is compiled against must say the same; a test checks it).
const HeaderVersion = "0.1.0"
