module github.com/vmmweights/vmmweights/examples/go-swap

go 1.20

require (
	github.com/google/shlex v0.0.0-20191202100458-e7afc7fbc510
	github.com/vmmweights/vmmweights/bindings/go v0.0.0
	go.yaml.in/yaml/v3 v3.0.6
)

replace github.com/vmmweights/vmmweights/bindings/go => ../../bindings/go
