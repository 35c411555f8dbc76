package main

import (
	"errors"
	"net/http"

	"github.com/vmmweights/vmmweights/bindings/go/vmmw"
)

// APIError is every error the service answers with, as JSON. Code is the
// library's status name (VMMW_OUT_OF_MEMORY, ...) when the library refused,
// else one of the service's own codes below.
type APIError struct {
	HTTP    int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"error"`
	Model   string `json:"model,omitempty"`
	// Phase is the swap step that failed: "sleep" or "wake".
	Phase string `json:"phase,omitempty"`
	// RolledBack says the models put to sleep for the failed swap were woken
	// again, so every model is as it was before the request.
	RolledBack *bool `json:"rolled_back,omitempty"`
}

func (e *APIError) Error() string { return e.Code + ": " + e.Message }

// The service's own codes.
const (
	CodeUnknownModel = "UNKNOWN_MODEL"
	CodeSwapInFlight = "SWAP_IN_FLIGHT"
	CodeModelAsleep  = "MODEL_ASLEEP"
	CodeClosed       = "SHUTTING_DOWN"
	CodeBadRequest   = "BAD_REQUEST"
	CodeNotFound     = "NOT_FOUND"
)

// libraryError turns a library error into an APIError carrying its status name.
func libraryError(err error, model, phase string) *APIError {
	e := &APIError{HTTP: http.StatusInternalServerError, Code: "ERROR", Message: err.Error(), Model: model, Phase: phase}
	var le *vmmw.Error
	if errors.As(err, &le) {
		e.Code = le.Status.String()
		e.Message = le.Message
		switch le.Status {
		case vmmw.StatusOutOfMemory, vmmw.StatusHostOutOfMemory:
			e.HTTP = http.StatusInsufficientStorage
		case vmmw.StatusCheckpointInvalid:
			e.HTTP = http.StatusConflict
		}
	}
	return e
}
