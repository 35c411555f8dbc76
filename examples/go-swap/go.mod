module github.com/vmmweights/vmmweights/examples/go-swap

go 1.20

require github.com/vmmweights/vmmweights/bindings/go v0.0.0

replace github.com/vmmweights/vmmweights/bindings/go => ../../bindings/go
