module github.com/vmmweights/vmmweights/examples/go

go 1.19

require github.com/vmmweights/vmmweights/bindings/go v0.0.0

replace github.com/vmmweights/vmmweights/bindings/go => ../../bindings/go
