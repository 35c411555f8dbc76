package main

// The proxy mode's configuration: llama-swap's YAML (models by name, each
// with the command line that starts its server) plus the keys that say how
// a server sleeps and how much host memory the sleeping ones may keep.

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/shlex"
	"go.yaml.in/yaml/v3"
)

// ProxyConfig is the proxy mode's configuration, after macros are expanded
// and every value checked.
type ProxyConfig struct {
	// Vmmw is the `vmmw` command that runs each server under the interposer.
	Vmmw string
	// HealthCheckTimeout bounds a cold start (process start to a healthy checkEndpoint).
	HealthCheckTimeout time.Duration
	// SwapTimeout bounds how long a request is held for its model (swap, drain, cold start).
	SwapTimeout time.Duration
	// MaxAwake is how many servers may be awake at once (default 1).
	MaxAwake int
	// HostMemoryBudget bounds the host backup bytes of every asleep server
	// together; 0 is no bound.
	HostMemoryBudget uint64
	// LinkBytesPerSecond, when set, gives each swap a link time to compare with.
	LinkBytesPerSecond float64
	// LoadAtStart starts every server at start and puts each to sleep once healthy.
	LoadAtStart bool
	// IncludeAliasesInList lists aliases in /v1/models too.
	IncludeAliasesInList bool
	// APIKeys, when any, are required of every request but /health and
	// /healthz (llama-swap's apiKeys).
	APIKeys []string
	// Models in the file's order.
	Models []*ServerConfig
	// Ignored are the llama-swap keys this service accepts but does not act on.
	Ignored []string
}

// ServerConfig is one model: the server that serves it and how it sleeps.
type ServerConfig struct {
	ID            string
	Name          string
	Description   string
	Args          []string
	Proxy         *url.URL
	CheckEndpoint string // "" when health checking is off ("none")
	Aliases       []string
	Env           []string
	Policy        string
	UseModelName  string
	Unlisted      bool
	TTL           time.Duration
	UnloadTimeout time.Duration
}

// rawProxyConfig is the file as written (llama-swap's keys and ours).
type rawProxyConfig struct {
	Vmmw                 string         `yaml:"vmmw"`
	HealthCheckTimeout   int            `yaml:"healthCheckTimeout"`
	SwapTimeout          int            `yaml:"swapTimeout"`
	MaxAwake             int            `yaml:"maxAwake"`
	HostMemoryBudget     string         `yaml:"hostMemoryBudget"`
	LinkGBps             float64        `yaml:"linkGBps"`
	LoadAtStart          bool           `yaml:"loadAtStart"`
	Policy               string         `yaml:"policy"`
	StartPort            *int           `yaml:"startPort"`
	GlobalTTL            int            `yaml:"globalTTL"`
	UnloadTimeout        int            `yaml:"unloadTimeout"`
	IncludeAliasesInList bool           `yaml:"includeAliasesInList"`
	APIKeys              []string       `yaml:"apiKeys"`
	Macros               yaml.Node      `yaml:"macros"`
	Models               yaml.Node      `yaml:"models"`
	Rest                 map[string]any `yaml:",inline"`
}

type rawModel struct {
	Cmd           string    `yaml:"cmd"`
	Proxy         string    `yaml:"proxy"`
	CheckEndpoint string    `yaml:"checkEndpoint"`
	Aliases       []string  `yaml:"aliases"`
	Env           []string  `yaml:"env"`
	Name          string    `yaml:"name"`
	Description   string    `yaml:"description"`
	Policy        string    `yaml:"policy"`
	UseModelName  string    `yaml:"useModelName"`
	Unlisted      bool      `yaml:"unlisted"`
	TTL           *int      `yaml:"ttl"`
	UnloadTimeout int       `yaml:"unloadTimeout"`
	Macros        yaml.Node `yaml:"macros"`
	// Keys of llama-swap's that this service does not act on (filters,
	// metadata, cmdStop, ...) land here and are reported at start.
	Rest map[string]any `yaml:",inline"`
}

// Sleep policies a server's memory may sleep with (the control channel's names).
var proxyPolicies = []string{"offload", "offload_compressed", "discard"}

var (
	macroRef    = regexp.MustCompile(`\$\{([A-Za-z0-9_.-]+)\}`)
	macroNameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,63}$`)
)

// isProxyConfig says whether raw is a proxy-mode file: its `models` is a
// mapping (llama-swap's form), where the library mode's JSON has a list.
func isProxyConfig(raw []byte) bool {
	var top struct {
		Models yaml.Node `yaml:"models"`
	}
	if yaml.Unmarshal(raw, &top) != nil {
		return false
	}
	return top.Models.Kind == yaml.MappingNode
}

// readProxyConfig reads and checks path; every error names the key at fault.
func readProxyConfig(path string) (*ProxyConfig, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := parseProxyConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

func parseProxyConfig(raw []byte) (*ProxyConfig, error) {
	// ${env.NAME} first, as llama-swap does: a variable that is not set is an error.
	var envErr error
	raw = envMacro.ReplaceAllFunc(raw, func(m []byte) []byte {
		name := string(envMacro.FindSubmatch(m)[1])
		v, ok := os.LookupEnv(name)
		if !ok && envErr == nil {
			envErr = fmt.Errorf("${env.%s}: the environment variable is not set", name)
		}
		return []byte(v)
	})
	if envErr != nil {
		return nil, envErr
	}
	var rc rawProxyConfig
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&rc); err != nil {
		return nil, err
	}
	c := &ProxyConfig{Vmmw: rc.Vmmw, MaxAwake: rc.MaxAwake, LoadAtStart: rc.LoadAtStart,
		IncludeAliasesInList: rc.IncludeAliasesInList}
	for k := range rc.Rest {
		c.Ignored = append(c.Ignored, k)
	}
	for i, k := range rc.APIKeys {
		if k == "" || strings.ContainsAny(k, " \t\r\n") {
			return nil, fmt.Errorf("apiKeys[%d]: empty, or with a space", i)
		}
	}
	c.APIKeys = rc.APIKeys
	if c.Vmmw == "" {
		c.Vmmw = os.Getenv("VMMW_BIN")
	}
	if c.Vmmw == "" {
		c.Vmmw = "vmmw"
	}
	// llama-swap's healthCheckTimeout: default 120 s, at least 15 s.
	switch {
	case rc.HealthCheckTimeout < 0:
		return nil, fmt.Errorf("healthCheckTimeout %d: must be 0 (default 120) or more", rc.HealthCheckTimeout)
	case rc.HealthCheckTimeout == 0:
		c.HealthCheckTimeout = 120 * time.Second
	case rc.HealthCheckTimeout < 15:
		c.HealthCheckTimeout = 15 * time.Second
	default:
		c.HealthCheckTimeout = time.Duration(rc.HealthCheckTimeout) * time.Second
	}
	if rc.SwapTimeout < 0 {
		return nil, fmt.Errorf("swapTimeout %d: must be 0 (default: healthCheckTimeout + 60) or more seconds", rc.SwapTimeout)
	}
	c.SwapTimeout = time.Duration(rc.SwapTimeout) * time.Second
	if c.SwapTimeout == 0 {
		c.SwapTimeout = c.HealthCheckTimeout + 60*time.Second
	}
	if c.MaxAwake == 0 {
		c.MaxAwake = 1
	}
	if c.MaxAwake < 0 {
		return nil, fmt.Errorf("maxAwake %d: must be at least 1", c.MaxAwake)
	}
	if rc.HostMemoryBudget != "" {
		b, err := parseByteSize(rc.HostMemoryBudget)
		if err != nil {
			return nil, fmt.Errorf("hostMemoryBudget %q: %w", rc.HostMemoryBudget, err)
		}
		c.HostMemoryBudget = b
	}
	if rc.LinkGBps < 0 {
		return nil, fmt.Errorf("linkGBps %v: must be positive", rc.LinkGBps)
	}
	c.LinkBytesPerSecond = rc.LinkGBps * 1e9
	if rc.Policy != "" && !validPolicy(rc.Policy) {
		return nil, fmt.Errorf("policy %q: use one of %s", rc.Policy, strings.Join(proxyPolicies, ", "))
	}
	if rc.GlobalTTL < 0 {
		return nil, fmt.Errorf("globalTTL %d: must be 0 or more", rc.GlobalTTL)
	}
	if rc.UnloadTimeout < 0 {
		return nil, fmt.Errorf("unloadTimeout %d: must be 0 or more", rc.UnloadTimeout)
	}
	globals, err := readMacros(&rc.Macros, nil, "macros")
	if err != nil {
		return nil, err
	}
	if rc.Models.Kind != yaml.MappingNode || len(rc.Models.Content) == 0 {
		return nil, fmt.Errorf("models: none configured (a mapping of model IDs to their settings)")
	}

	type pending struct {
		id  string
		rm  rawModel
		mac map[string]string
	}
	var models []pending
	for i := 0; i+1 < len(rc.Models.Content); i += 2 {
		id := rc.Models.Content[i].Value
		if !modelName.MatchString(id) {
			return nil, fmt.Errorf("models: %q: use 1 to 64 of A-Z a-z 0-9 . _ - (the ID appears in URLs)", id)
		}
		var rm rawModel
		if err := rc.Models.Content[i+1].Decode(&rm); err != nil {
			return nil, fmt.Errorf("models.%s: %w", id, err)
		}
		mac, err := readMacros(&rm.Macros, globals, "models."+id+".macros")
		if err != nil {
			return nil, err
		}
		for k := range rm.Rest {
			c.Ignored = append(c.Ignored, "models."+id+"."+k)
		}
		models = append(models, pending{id, rm, mac})
	}

	// ${PORT}: one port per model that names it, in model-ID order from
	// startPort (llama-swap's default 5800). startPort 0 takes a free port
	// from the system for each.
	ids := make([]string, 0, len(models))
	for _, p := range models {
		ids = append(ids, p.id)
	}
	sort.Strings(ids)
	ports := map[string]int{}
	next := 5800
	if rc.StartPort != nil {
		next = *rc.StartPort
	}
	if next < 0 || next > 65535 {
		return nil, fmt.Errorf("startPort %d: use 0 (any free port) to 65535", next)
	}
	for _, id := range ids {
		var p pending
		for _, q := range models {
			if q.id == id {
				p = q
			}
		}
		if !usesPort(p.rm, p.mac) {
			continue
		}
		if rc.StartPort != nil && *rc.StartPort == 0 {
			port, err := freePort()
			if err != nil {
				return nil, fmt.Errorf("models.%s: ${PORT}: %w", id, err)
			}
			ports[id] = port
			continue
		}
		if next > 65535 {
			return nil, fmt.Errorf("models.%s: ${PORT}: past 65535 (lower startPort)", id)
		}
		ports[id] = next
		next++
	}

	seen := map[string]string{}
	for _, p := range models {
		s, err := p.rm.check(p.id, p.mac, ports[p.id], rc)
		if err != nil {
			return nil, fmt.Errorf("models.%s: %w", p.id, err)
		}
		for _, n := range append([]string{s.ID}, s.Aliases...) {
			if other, ok := seen[n]; ok {
				return nil, fmt.Errorf("models.%s: %q is already the ID or an alias of %s", s.ID, n, other)
			}
			seen[n] = s.ID
		}
		c.Models = append(c.Models, s)
	}
	sort.Strings(c.Ignored)
	return c, nil
}

// usesPort says whether the model's cmd or proxy names ${PORT}, directly or
// through a macro (the default proxy does).
func usesPort(rm rawModel, mac map[string]string) bool {
	if rm.Proxy == "" {
		return true
	}
	m := copyMacros(mac)
	m["PORT"] = "${PORT}"
	m["MODEL_ID"] = "${MODEL_ID}"
	for _, v := range []string{rm.Cmd, rm.Proxy} {
		if out, err := expandMacros(stripCommentLines(v), m); err == nil && strings.Contains(out, "${PORT}") {
			return true
		}
	}
	return false
}

var envMacro = regexp.MustCompile(`\$\{env\.([A-Za-z_][A-Za-z0-9_]*)\}`)

func (rm *rawModel) check(id string, mac map[string]string, port int, rc rawProxyConfig) (*ServerConfig, error) {
	mac = copyMacros(mac)
	mac["MODEL_ID"] = id
	if port != 0 {
		mac["PORT"] = strconv.Itoa(port)
	}
	expand := func(key, v string) (string, error) {
		out, err := expandMacros(v, mac)
		if err != nil {
			return "", fmt.Errorf("%s: %w", key, err)
		}
		return out, nil
	}
	s := &ServerConfig{ID: id, Unlisted: rm.Unlisted, Policy: rm.Policy}
	if strings.TrimSpace(rm.Cmd) == "" {
		return nil, fmt.Errorf("cmd: missing (the command line that starts the model's server)")
	}
	cmd, err := expand("cmd", stripCommentLines(rm.Cmd))
	if err != nil {
		return nil, err
	}
	if s.Args, err = shlex.Split(cmd); err != nil {
		return nil, fmt.Errorf("cmd: %w", err)
	}
	if len(s.Args) == 0 {
		return nil, fmt.Errorf("cmd: empty")
	}
	proxy := rm.Proxy
	if proxy == "" {
		proxy = "http://localhost:${PORT}"
	}
	if proxy, err = expand("proxy", proxy); err != nil {
		return nil, err
	}
	if s.Proxy, err = url.Parse(proxy); err != nil || s.Proxy.Host == "" || (s.Proxy.Scheme != "http" && s.Proxy.Scheme != "https") {
		return nil, fmt.Errorf("proxy %q: not an http:// URL", proxy)
	}
	s.CheckEndpoint = "/health"
	if rm.CheckEndpoint != "" {
		if s.CheckEndpoint, err = expand("checkEndpoint", rm.CheckEndpoint); err != nil {
			return nil, err
		}
	}
	if s.CheckEndpoint == "none" {
		s.CheckEndpoint = ""
	} else if !strings.HasPrefix(s.CheckEndpoint, "/") {
		return nil, fmt.Errorf("checkEndpoint %q: a path starting with / (or none)", s.CheckEndpoint)
	}
	for i, e := range rm.Env {
		v, err := expand(fmt.Sprintf("env[%d]", i), e)
		if err != nil {
			return nil, err
		}
		if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
			return nil, fmt.Errorf("env[%d] %q: use NAME=value", i, v)
		}
		s.Env = append(s.Env, v)
	}
	for i, a := range rm.Aliases {
		if !modelName.MatchString(a) {
			return nil, fmt.Errorf("aliases[%d] %q: use 1 to 64 of A-Z a-z 0-9 . _ -", i, a)
		}
	}
	s.Aliases = rm.Aliases
	if s.Name, err = expand("name", rm.Name); err != nil {
		return nil, err
	}
	if s.Description, err = expand("description", rm.Description); err != nil {
		return nil, err
	}
	if s.UseModelName, err = expand("useModelName", rm.UseModelName); err != nil {
		return nil, err
	}
	if s.Policy == "" {
		s.Policy = rc.Policy
	}
	if s.Policy == "" {
		s.Policy = "offload"
	}
	if !validPolicy(s.Policy) {
		return nil, fmt.Errorf("policy %q: use one of %s", s.Policy, strings.Join(proxyPolicies, ", "))
	}
	ttl := rc.GlobalTTL
	if rm.TTL != nil && *rm.TTL >= 0 {
		ttl = *rm.TTL
	} else if rm.TTL != nil && *rm.TTL != -1 {
		return nil, fmt.Errorf("ttl %d: use -1 (globalTTL), 0 (never) or seconds", *rm.TTL)
	}
	s.TTL = time.Duration(ttl) * time.Second
	unload := rm.UnloadTimeout
	if unload == 0 {
		unload = rc.UnloadTimeout
	}
	if unload <= 0 {
		unload = 10
	}
	s.UnloadTimeout = time.Duration(unload) * time.Second
	return s, nil
}

func validPolicy(p string) bool {
	for _, q := range proxyPolicies {
		if p == q {
			return true
		}
	}
	return false
}

// readMacros reads a macros mapping in its order; a macro may use the ones
// before it and those of base (the global ones, for a model's).
func readMacros(n *yaml.Node, base map[string]string, where string) (map[string]string, error) {
	out := copyMacros(base)
	if n.Kind == 0 {
		return out, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: a mapping of names to values", where)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		name, v := n.Content[i].Value, n.Content[i+1]
		if !macroNameRe.MatchString(name) {
			return nil, fmt.Errorf("%s: %q: use 1 to 63 of A-Z a-z 0-9 _ -", where, name)
		}
		if name == "PORT" || name == "MODEL_ID" || name == "PID" {
			return nil, fmt.Errorf("%s: %q is reserved", where, name)
		}
		if v.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("%s.%s: a string, number or bool", where, name)
		}
		if strings.Contains(v.Value, "${"+name+"}") {
			return nil, fmt.Errorf("%s.%s: refers to itself", where, name)
		}
		val, err := expandMacros(v.Value, out)
		if err != nil && !strings.Contains(err.Error(), "${PORT}") && !strings.Contains(err.Error(), "${MODEL_ID}") {
			return nil, fmt.Errorf("%s.%s: %w", where, name, err)
		}
		if err != nil {
			val = v.Value // resolved once the model's PORT and MODEL_ID are known
		}
		out[name] = val
	}
	return out, nil
}

func copyMacros(m map[string]string) map[string]string {
	out := make(map[string]string, len(m)+2)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// expandMacros replaces every ${name} in s, repeating for macros whose
// values name others; a name with no macro is an error.
func expandMacros(s string, mac map[string]string) (string, error) {
	for depth := 0; depth < 16; depth++ {
		var missing string
		out := macroRef.ReplaceAllStringFunc(s, func(m string) string {
			name := m[2 : len(m)-1]
			v, ok := mac[name]
			if !ok {
				if missing == "" {
					missing = m
				}
				return m
			}
			return v
		})
		if missing != "" {
			return "", fmt.Errorf("%s: no such macro", missing)
		}
		if out == s {
			return out, nil
		}
		s = out
	}
	return "", fmt.Errorf("macros nest more than 16 deep (a cycle?)")
}

// stripCommentLines drops the lines of a `|` command that start with #, and
// joins lines that end with a backslash, as llama-swap does.
func stripCommentLines(cmd string) string {
	var out []string
	for _, line := range strings.Split(cmd, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "#") {
			continue
		}
		out = append(out, strings.TrimSuffix(t, "\\"))
	}
	return strings.Join(out, "\n")
}

// parseByteSize reads "64G", "64GiB", "512M", "1.5T" or a plain byte count;
// K, M, G, T are powers of 1024 (as the library's sizes are).
func parseByteSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(t, "iB"), "B"), "b")
	mult := 1.0
	if t != "" {
		switch strings.ToUpper(t[len(t)-1:]) {
		case "K":
			mult = 1 << 10
		case "M":
			mult = 1 << 20
		case "G":
			mult = 1 << 30
		case "T":
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:len(t)-1]
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("a size such as 64G, 512MiB or 1000000 bytes")
	}
	return uint64(v * mult), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
