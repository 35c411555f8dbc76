package main

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// A llama-swap configuration as its users write them: macros in macros,
// per-model macros, comments and continued lines in cmd, ${PORT} through
// a macro, env macros, keys this service does not act on. A global macro
// is expanded where it is declared: a model's override of a macro it names
// reaches the model's own values only.
func TestParseProxyConfigLlamaSwapForm(t *testing.T) {
	os.Setenv("GO_SWAP_MODELS", "/models")
	defer os.Unsetenv("GO_SWAP_MODELS")
	c, err := parseProxyConfig([]byte(`
healthCheckTimeout: 5
logLevel: info
startPort: 10001
globalTTL: 60
macros:
  latest-llama: >
    /opt/llama-server --port ${PORT}
  default_ctx: 4096
  default_args: "--ctx-size ${default_ctx}"
  models_dir: "${env.GO_SWAP_MODELS}"
models:
  zeta:
    macros:
      default_ctx: 16384
    cmd: |
      # the server
      ${latest-llama}
      --model ${models_dir}/zeta.gguf \
      ${default_args} -c ${default_ctx} --alias "${MODEL_ID} q8"
    aliases: [gpt-4o-mini]
    filters:
      stripParams: "temperature"
    ttl: 0
  alpha:
    cmd: /opt/other --listen 127.0.0.1:9000
    proxy: http://127.0.0.1:9000
    checkEndpoint: none
    env: ["CUDA_VISIBLE_DEVICES=1"]
    policy: discard
    unlisted: true
    useModelName: "org/alpha"
  beta:
    cmd: /opt/beta --port ${PORT}
hostMemoryBudget: 1.5G
maxAwake: 2
policy: offload_compressed
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Models) != 3 || c.Models[0].ID != "zeta" || c.Models[1].ID != "alpha" || c.Models[2].ID != "beta" {
		t.Fatalf("models in file order: %+v", c.Models)
	}
	z, a, b := c.Models[0], c.Models[1], c.Models[2]
	// Ports in model-ID order from startPort, only to models that use ${PORT}: beta, then zeta.
	wantZ := []string{"/opt/llama-server", "--port", "10002", "--model", "/models/zeta.gguf", "--ctx-size", "4096", "-c", "16384", "--alias", "zeta q8"}
	if !reflect.DeepEqual(z.Args, wantZ) {
		t.Fatalf("zeta's command: %q, want %q", z.Args, wantZ)
	}
	if b.Args[2] != "10001" || b.Proxy.String() != "http://localhost:10001" || z.Proxy.String() != "http://localhost:10002" {
		t.Fatalf("ports: beta %q %s, zeta %s", b.Args, b.Proxy, z.Proxy)
	}
	if a.Proxy.String() != "http://127.0.0.1:9000" || a.CheckEndpoint != "" || a.Policy != "discard" || !a.Unlisted ||
		a.UseModelName != "org/alpha" || !reflect.DeepEqual(a.Env, []string{"CUDA_VISIBLE_DEVICES=1"}) {
		t.Fatalf("alpha: %+v", a)
	}
	if z.Policy != "offload_compressed" || z.CheckEndpoint != "/health" || z.TTL != 0 || b.TTL != time.Minute {
		t.Fatalf("defaults: zeta %+v, beta %+v", z, b)
	}
	if c.HealthCheckTimeout != 15*time.Second || c.MaxAwake != 2 || c.HostMemoryBudget != 3<<29 {
		t.Fatalf("globals: %+v", c)
	}
	if got := strings.Join(c.Ignored, ","); got != "logLevel,models.zeta.filters" {
		t.Fatalf("ignored keys: %s", got)
	}
}

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]uint64{"1000": 1000, "64G": 64 << 30, "64GiB": 64 << 30, "512MB": 512 << 20, "1.5T": 3 << 39, "2k": 2048} {
		if got, err := parseByteSize(in); err != nil || got != want {
			t.Errorf("%s: %d %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-1G", "G"} {
		if _, err := parseByteSize(in); err == nil {
			t.Errorf("%q: accepted", in)
		}
	}
}
