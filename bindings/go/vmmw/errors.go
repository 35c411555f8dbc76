package vmmw

// #include "vmmweights.h"
import "C"

import "errors"

// Status is a vmmweights status code (the C API's VMMW_* numbers, which never change).
type Status int32

// The status codes.
const (
	StatusOK                Status = C.VMMW_OK
	StatusInvalidArgument   Status = C.VMMW_INVALID_ARGUMENT
	StatusNullArgument      Status = C.VMMW_NULL_ARGUMENT
	StatusOutOfMemory       Status = C.VMMW_OUT_OF_MEMORY
	StatusHostOutOfMemory   Status = C.VMMW_HOST_OUT_OF_MEMORY
	StatusDriverUnavailable Status = C.VMMW_DRIVER_UNAVAILABLE
	StatusDriverError       Status = C.VMMW_DRIVER_ERROR
	StatusUnknownPointer    Status = C.VMMW_UNKNOWN_POINTER
	StatusUnknownTag        Status = C.VMMW_UNKNOWN_TAG
	StatusInvalidState      Status = C.VMMW_INVALID_STATE
	StatusCheckpointInvalid Status = C.VMMW_CHECKPOINT_INVALID
	StatusIO                Status = C.VMMW_IO
	StatusPlanMismatch      Status = C.VMMW_PLAN_MISMATCH
	StatusCancelled         Status = C.VMMW_CANCELLED
	StatusPanic             Status = C.VMMW_PANIC
	StatusUnsupported       Status = C.VMMW_UNSUPPORTED
	StatusBufferTooSmall    Status = C.VMMW_BUFFER_TOO_SMALL
	StatusLoadInProgress    Status = C.VMMW_LOAD_IN_PROGRESS
	StatusShareRefused      Status = C.VMMW_SHARE_REFUSED
	StatusShareRevoked      Status = C.VMMW_SHARE_REVOKED
)

// String is the C name of the status ("VMMW_OUT_OF_MEMORY").
func (s Status) String() string {
	return C.GoString(C.vmmw_status_name(C.vmmw_status_t(s)))
}

// Error is a failed vmmweights call: its status and the library's message.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string {
	return e.Status.String() + ": " + e.Message
}

// Is reports whether target is an *Error with the same Status and no message
// (the Err* sentinels), so errors.Is(err, vmmw.ErrOutOfMemory) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Status == e.Status
}

// Sentinels for errors.Is.
var (
	ErrInvalidArgument   = &Error{Status: StatusInvalidArgument}
	ErrNullArgument      = &Error{Status: StatusNullArgument}
	ErrOutOfMemory       = &Error{Status: StatusOutOfMemory}
	ErrHostOutOfMemory   = &Error{Status: StatusHostOutOfMemory}
	ErrDriverUnavailable = &Error{Status: StatusDriverUnavailable}
	ErrDriverError       = &Error{Status: StatusDriverError}
	ErrUnknownPointer    = &Error{Status: StatusUnknownPointer}
	ErrUnknownTag        = &Error{Status: StatusUnknownTag}
	ErrInvalidState      = &Error{Status: StatusInvalidState}
	ErrCheckpointInvalid = &Error{Status: StatusCheckpointInvalid}
	ErrIO                = &Error{Status: StatusIO}
	ErrPlanMismatch      = &Error{Status: StatusPlanMismatch}
	ErrCancelled         = &Error{Status: StatusCancelled}
	ErrPanic             = &Error{Status: StatusPanic}
	ErrUnsupported       = &Error{Status: StatusUnsupported}
	ErrBufferTooSmall    = &Error{Status: StatusBufferTooSmall}
	ErrLoadInProgress    = &Error{Status: StatusLoadInProgress}
	ErrShareRefused      = &Error{Status: StatusShareRefused}
	ErrShareRevoked      = &Error{Status: StatusShareRevoked}
)

func isStatus(err error, s Status) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == s
}

func closedError(what string) error {
	return &Error{Status: StatusNullArgument, Message: "use of a closed " + what}
}
