module github.com/vmmweights/vmmweights/bindings/go

go 1.20
