// Command install-check loads a checkpoint through the installed library from
// Go: the module by its import path, the library through pkg-config.
//
//	install-check CHECKPOINT
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/vmmweights/vmmweights/bindings/go/vmmw"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: install-check CHECKPOINT")
	}
	if vmmw.Version() != vmmw.HeaderVersion {
		log.Fatalf("library %s, header %s", vmmw.Version(), vmmw.HeaderVersion)
	}
	pool, err := vmmw.NewPool(vmmw.PoolOptions{Backend: vmmw.BackendHost})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	tag, err := vmmw.TagID("weights")
	if err != nil {
		log.Fatal(err)
	}
	loader, err := vmmw.OpenLoader(os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	defer loader.Close()
	if err := loader.Allocate(pool, tag); err != nil {
		log.Fatal(err)
	}
	res, err := loader.Load(context.Background(), pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := pool.Sleep(vmmw.TagPolicy{Tag: tag, Policy: vmmw.Reload}); err != nil {
		log.Fatal(err)
	}
	if err := pool.Wake(context.Background(), tag); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("go: vmmweights %s loaded %d bytes, slept (reload) and woke\n", vmmw.Version(), res.Bytes)
}
