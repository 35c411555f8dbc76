package vmmw

// #include "vmmweights.h"
import "C"

import "errors"

// Status is a vmmweights status code (the C API's VMMW_* numbers, which never change).
type Status int32

// The status codes.
const (
	StatusOK                Status = 0
	StatusInvalidArgument   Status = 1
	StatusNullArgument      Status = 2
	StatusOutOfMemory       Status = 3
	StatusHostOutOfMemory   Status = 4
	StatusDriverUnavailable Status = 5
	StatusDriverError       Status = 6
	StatusUnknownPointer    Status = 7
	StatusUnknownTag        Status = 8
	StatusInvalidState      Status = 9
	StatusCheckpointInvalid Status = 10
	StatusIO                Status = 11
	StatusPlanMismatch      Status = 12
	StatusCancelled         Status = 13
	StatusPanic             Status = 14
	StatusUnsupported       Status = 15
	StatusBufferTooSmall    Status = 16
	StatusLoadInProgress    Status = 17
	StatusShareRefused      Status = 18
	StatusShareRevoked      Status = 19
	StatusVersionMismatch   Status = 20
	StatusUpdateSource      Status = 21
	StatusUpdateTorn        Status = 22
)

// String is the C name of the status ("VMMW_OUT_OF_MEMORY").
func (s Status) String() string {
	return C.GoString(C.vmmw_status_name(C.vmmw_status_t(s)))
}

// Error is a failed vmmweights call: its status and the library's message.
type Error struct {
	Status  Status
	Message string
	// DriverCode is the driver's own code of a StatusDriverError (a CUresult
	// on the cuda backend, an errno on the host backend); 0 otherwise.
	DriverCode int32
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
	ErrVersionMismatch   = &Error{Status: StatusVersionMismatch}
	ErrUpdateSource      = &Error{Status: StatusUpdateSource}
	ErrUpdateTorn        = &Error{Status: StatusUpdateTorn}
)

func isStatus(err error, s Status) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == s
}

func closedError(what string) error {
	return &Error{Status: StatusNullArgument, Message: "use of a closed " + what}
}
