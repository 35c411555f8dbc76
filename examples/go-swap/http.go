package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Handler serves the HTTP API (README.md lists it). testEndpoints adds
// /test/pause and /test/resume, which hold swaps in flight.
func Handler(s *Service, testEndpoints bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if method(w, r, http.MethodGet) {
			reply(w, http.StatusOK, map[string]string{"status": "ok"})
		}
	})
	mux.HandleFunc("/models", func(w http.ResponseWriter, r *http.Request) {
		if method(w, r, http.MethodGet) {
			answer(w)(s.Models())
		}
	})
	mux.HandleFunc("/models/", func(w http.ResponseWriter, r *http.Request) { modelRoute(s, w, r) })
	mux.HandleFunc("/swaps", func(w http.ResponseWriter, r *http.Request) {
		if method(w, r, http.MethodGet) {
			reply(w, http.StatusOK, map[string]interface{}{"swaps": s.Swaps()})
		}
	})
	mux.HandleFunc("/timeline", func(w http.ResponseWriter, r *http.Request) {
		if method(w, r, http.MethodGet) {
			answer(w)(s.Timeline())
		}
	})
	mux.HandleFunc("/report", func(w http.ResponseWriter, r *http.Request) {
		if method(w, r, http.MethodGet) {
			answer(w)(s.Report())
		}
	})
	if testEndpoints {
		mux.HandleFunc("/test/pause", func(w http.ResponseWriter, r *http.Request) {
			if method(w, r, http.MethodPost) {
				s.Pause()
				reply(w, http.StatusOK, map[string]bool{"paused": true})
			}
		})
		mux.HandleFunc("/test/resume", func(w http.ResponseWriter, r *http.Request) {
			if method(w, r, http.MethodPost) {
				s.Resume()
				reply(w, http.StatusOK, map[string]bool{"paused": false})
			}
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, &APIError{HTTP: http.StatusNotFound, Code: CodeNotFound, Message: fmt.Sprintf("no endpoint %s", r.URL.Path)})
	})
	return mux
}

// modelRoute serves /models/{name}, /models/{name}/activate and /models/{name}/digest.
func modelRoute(s *Service, w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/models/"), "/")
	name := parts[0]
	switch {
	case len(parts) == 1:
		if method(w, r, http.MethodGet) {
			answer(w)(s.Model(name))
		}
	case len(parts) == 2 && parts[1] == "activate":
		if !method(w, r, http.MethodPost) {
			return
		}
		wait := true
		if v := r.URL.Query().Get("wait"); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				fail(w, &APIError{HTTP: http.StatusBadRequest, Code: CodeBadRequest, Message: fmt.Sprintf("wait=%q: use true or false", v)})
				return
			}
			wait = b
		}
		sw, err := s.Activate(name, wait)
		if err != nil {
			if sw != nil {
				// A failed swap: the error and what it did before failing.
				reply(w, err.HTTP, map[string]interface{}{"code": err.Code, "error": err.Message, "model": err.Model,
					"phase": err.Phase, "rolled_back": err.RolledBack, "swap": sw})
				return
			}
			fail(w, err)
			return
		}
		reply(w, http.StatusOK, sw)
	case len(parts) == 2 && parts[1] == "digest":
		if method(w, r, http.MethodGet) {
			d, err := s.Digest(name)
			if err != nil {
				fail(w, err)
				return
			}
			reply(w, http.StatusOK, map[string]interface{}{"model": name, "tensors": d})
		}
	default:
		fail(w, &APIError{HTTP: http.StatusNotFound, Code: CodeNotFound, Message: fmt.Sprintf("no endpoint %s", r.URL.Path)})
	}
}

func method(w http.ResponseWriter, r *http.Request, want string) bool {
	if r.Method == want {
		return true
	}
	w.Header().Set("Allow", want)
	fail(w, &APIError{HTTP: http.StatusMethodNotAllowed, Code: CodeBadRequest, Message: fmt.Sprintf("%s %s: use %s", r.Method, r.URL.Path, want)})
	return false
}

// answer replies with v, or with err when it is set.
func answer(w http.ResponseWriter) func(v interface{}, err *APIError) {
	return func(v interface{}, err *APIError) {
		if err != nil {
			fail(w, err)
			return
		}
		reply(w, http.StatusOK, v)
	}
}

func fail(w http.ResponseWriter, e *APIError) {
	reply(w, e.HTTP, e)
}

func reply(w http.ResponseWriter, code int, v interface{}) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
