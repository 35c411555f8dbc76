package main

// The proxy mode's HTTP API: the OpenAI-compatible endpoints routed by the
// body's "model", /upstream/{model}/... passed through to one server, and
// the reports (README.md lists them).

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"
)

// maxBody bounds a request body the proxy reads to find its model.
const maxBody = 64 << 20

// ProxyHandler serves the proxy mode's API. testEndpoints adds /test/pause
// and /test/resume, which hold swaps after their drain.
func ProxyHandler(p *Proxy, testEndpoints bool) http.Handler {
	mux := http.NewServeMux()
	get := func(path string, f func(w http.ResponseWriter, r *http.Request)) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			if method(w, r, http.MethodGet) {
				f(w, r)
			}
		})
	}
	get("/health", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	get("/healthz", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	get("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, p.openAIModels())
	})
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) { p.serveByBody(w, r) })
	mux.HandleFunc("/upstream/", func(w http.ResponseWriter, r *http.Request) { p.serveUpstream(w, r) })
	get("/models", func(w http.ResponseWriter, r *http.Request) { reply(w, http.StatusOK, p.Models()) })
	mux.HandleFunc("/models/", func(w http.ResponseWriter, r *http.Request) { p.serveModel(w, r) })
	get("/running", func(w http.ResponseWriter, r *http.Request) { reply(w, http.StatusOK, p.running()) })
	get("/report", func(w http.ResponseWriter, r *http.Request) { reply(w, http.StatusOK, p.Report()) })
	get("/swaps", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, map[string]any{"swaps": p.Swaps()})
	})
	get("/timeline", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, map[string]any{"timeline": p.Timeline()})
	})
	if testEndpoints {
		mux.HandleFunc("/test/pause", func(w http.ResponseWriter, r *http.Request) {
			if method(w, r, http.MethodPost) {
				p.Pause()
				reply(w, http.StatusOK, map[string]bool{"paused": true})
			}
		})
		mux.HandleFunc("/test/resume", func(w http.ResponseWriter, r *http.Request) {
			if method(w, r, http.MethodPost) {
				p.Resume()
				reply(w, http.StatusOK, map[string]bool{"paused": false})
			}
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, &APIError{HTTP: http.StatusNotFound, Code: CodeNotFound, Message: fmt.Sprintf("no endpoint %s", r.URL.Path)})
	})
	if len(p.cfg.APIKeys) == 0 {
		return mux
	}
	return requireKey(p.cfg.APIKeys, mux)
}

// requireKey answers 401 to a request without one of keys, given as
// `Authorization: Bearer KEY`, as Basic authentication's password, or as
// `x-api-key: KEY` (the ways llama-swap takes them). /health and /healthz
// stay open for probes.
func requireKey(keys []string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" || r.URL.Path == "/healthz" {
			next.ServeHTTP(w, r)
			return
		}
		var given []string
		if _, pass, ok := r.BasicAuth(); ok {
			given = append(given, pass)
		}
		if scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "bearer") {
			given = append(given, strings.TrimSpace(cred))
		}
		if k := r.Header.Get("X-Api-Key"); k != "" {
			given = append(given, k)
		}
		for _, g := range given {
			for _, k := range keys {
				if subtle.ConstantTimeCompare([]byte(g), []byte(k)) == 1 {
					next.ServeHTTP(w, r)
					return
				}
			}
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="go-swap"`)
		openAIError(w, &APIError{HTTP: http.StatusUnauthorized, Code: "UNAUTHORIZED",
			Message: "a key of apiKeys is required: Authorization: Bearer KEY, or x-api-key: KEY"})
	})
}

// openAIError answers in the shape OpenAI clients read ({"error":{...}}),
// with the service's code and the model.
func openAIError(w http.ResponseWriter, e *APIError) {
	reply(w, e.HTTP, map[string]any{"error": map[string]any{"message": e.Message, "type": "go_swap_error", "code": e.Code, "model": e.Model}})
}

// serveByBody serves /v1/... (other than /v1/models): the model is the
// JSON body's "model".
func (p *Proxy) serveByBody(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		openAIError(w, &APIError{HTTP: http.StatusMethodNotAllowed, Code: CodeBadRequest, Message: fmt.Sprintf("%s %s: use POST", r.Method, r.URL.Path)})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		openAIError(w, &APIError{HTTP: http.StatusBadRequest, Code: CodeBadRequest, Message: "reading the body: " + err.Error()})
		return
	}
	var head struct {
		Model *string `json:"model"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		openAIError(w, &APIError{HTTP: http.StatusBadRequest, Code: CodeBadRequest, Message: "the body is not a JSON object: " + err.Error()})
		return
	}
	if head.Model == nil || *head.Model == "" {
		openAIError(w, &APIError{HTTP: http.StatusBadRequest, Code: CodeBadRequest, Message: `the body has no "model": name one of GET /v1/models`})
		return
	}
	s, aerr := p.lookup(*head.Model)
	if aerr != nil {
		openAIError(w, aerr)
		return
	}
	if s.cfg.UseModelName != "" {
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) == nil {
			m["model"], _ = json.Marshal(s.cfg.UseModelName)
			body, _ = json.Marshal(m)
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	p.forward(w, r, s, r.URL.Path)
}

// serveUpstream passes /upstream/{model}/rest through to the model's server as /rest.
func (p *Proxy) serveUpstream(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/upstream/")
	name, path, _ := strings.Cut(rest, "/")
	s, aerr := p.lookup(name)
	if aerr != nil {
		openAIError(w, aerr)
		return
	}
	p.forward(w, r, s, "/"+path)
}

// forward holds r until s is awake, then proxies it to path on s's server,
// streaming the answer as it comes (SSE included). A client that goes away
// cancels the upstream request.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, s *Server, path string) {
	held := time.Now()
	release, aerr := p.acquire(r.Context(), s)
	if aerr != nil {
		if aerr.HTTP == 499 {
			return // nobody to answer
		}
		openAIError(w, aerr)
		return
	}
	defer release()
	defer func() {
		// ReverseProxy aborts with ErrAbortHandler when the client goes away
		// mid-answer (its upstream request is cancelled with it): say so.
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				p.log.Printf("go-swap: %s: the client went away mid-answer; the upstream request was cancelled", s.cfg.ID)
			}
			panic(v)
		}
	}()
	if d := time.Since(held); d > time.Millisecond {
		w.Header().Set("X-Go-Swap-Held-Seconds", strconv.FormatFloat(d.Seconds(), 'f', 3, 64))
	}
	w.Header().Set("X-Go-Swap-Model", s.cfg.ID)
	target := s.cfg.Proxy
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = strings.TrimSuffix(target.Path, "/") + path
			pr.Out.URL.RawPath = ""
			pr.Out.Host = target.Host
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if req.Context().Err() != nil {
				p.log.Printf("go-swap: %s: the client went away (%v); the upstream request was cancelled", s.cfg.ID, err)
				return
			}
			p.countError(s)
			openAIError(w, &APIError{HTTP: http.StatusBadGateway, Code: "UPSTREAM_ERROR", Model: s.cfg.ID,
				Message: fmt.Sprintf("model %q's server did not answer: %v", s.cfg.ID, err)})
		},
	}
	rp.ServeHTTP(w, r)
}

// serveModel serves GET /models/{name}, POST /models/{name}/activate and
// POST /models/{name}/policy.
func (p *Proxy) serveModel(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/models/"), "/")
	switch {
	case len(parts) == 1:
		if method(w, r, http.MethodGet) {
			answer(w)(p.Model(parts[0]))
		}
	case len(parts) == 2 && parts[1] == "activate":
		if !method(w, r, http.MethodPost) {
			return
		}
		s, aerr := p.lookup(parts[0])
		if aerr != nil {
			fail(w, aerr)
			return
		}
		t := time.Now()
		release, aerr := p.acquire(r.Context(), s)
		if aerr != nil {
			if aerr.HTTP != 499 {
				fail(w, aerr)
			}
			return
		}
		release()
		v, _ := p.Model(s.cfg.ID)
		reply(w, http.StatusOK, map[string]any{"model": s.cfg.ID, "seconds": time.Since(t).Seconds(), "server": v})
	case len(parts) == 2 && parts[1] == "policy":
		if !method(w, r, http.MethodPost) {
			return
		}
		var req struct {
			Policy string `json:"policy"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil {
			fail(w, &APIError{HTTP: http.StatusBadRequest, Code: CodeBadRequest, Message: `the body: {"policy": "offload"|"offload_compressed"|"discard"}: ` + err.Error()})
			return
		}
		answer(w)(p.SetPolicy(parts[0], req.Policy))
	default:
		fail(w, &APIError{HTTP: http.StatusNotFound, Code: CodeNotFound, Message: fmt.Sprintf("no endpoint %s", r.URL.Path)})
	}
}

// openAIModels is GET /v1/models: the listed models (and their aliases
// when includeAliasesInList), in OpenAI's shape.
func (p *Proxy) openAIModels() map[string]any {
	data := []map[string]any{}
	created := p.started.Unix()
	add := func(id string, s *Server) {
		m := map[string]any{"id": id, "object": "model", "created": created, "owned_by": "go-swap"}
		if s.cfg.Name != "" {
			m["name"] = s.cfg.Name
		}
		if s.cfg.Description != "" {
			m["description"] = s.cfg.Description
		}
		data = append(data, m)
	}
	for _, s := range p.servers {
		if s.cfg.Unlisted {
			continue
		}
		add(s.cfg.ID, s)
		if p.cfg.IncludeAliasesInList {
			for _, a := range s.cfg.Aliases {
				add(a, s)
			}
		}
	}
	return map[string]any{"object": "list", "data": data}
}

// running is llama-swap's GET /running: the servers with a process.
func (p *Proxy) running() map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := []map[string]any{}
	for _, s := range p.servers {
		if s.proc != nil {
			out = append(out, map[string]any{"model": s.cfg.ID, "state": s.state, "proxy": s.cfg.Proxy.String(), "cmd": strings.Join(s.cfg.Args, " ")})
		}
	}
	return map[string]any{"running": out}
}
