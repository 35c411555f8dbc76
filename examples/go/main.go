// Command example shows vmmweights from Go: a pool (CUDA when present, else
// the host simulation), a checkpoint loaded in place into it, sleep (weights
// offloaded to host memory, device memory released, pointers kept), wake, and
// the memory report.
//
//	PKG_CONFIG_PATH=<prefix>/lib/pkgconfig go run . [checkpoint]
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"math"
	"os"
	"path/filepath"

	"github.com/vmmweights/vmmweights/bindings/go/vmmw"
)

// writeCheckpoint writes one F32 tensor "embed.weight" [512, 256].
func writeCheckpoint(path string) error {
	const rows, cols = 512, 256
	hdr := fmt.Sprintf(`{"embed.weight":{"dtype":"F32","shape":[%d,%d],"data_offsets":[0,%d]}}`, rows, cols, rows*cols*4)
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(hdr)))
	b.WriteString(hdr)
	for i := 0; i < rows*cols; i++ {
		binary.Write(&b, binary.LittleEndian, math.Float32bits(float32(i)*0.25))
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func main() {
	path := ""
	if len(os.Args) > 1 {
		path = os.Args[1]
	} else {
		dir, err := os.MkdirTemp("", "vmmw-example-go-")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "model.safetensors")
		if err := writeCheckpoint(path); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Printf("vmmweights %s\n", vmmw.Version())

	pool, err := vmmw.NewPool(vmmw.PoolOptions{Backend: vmmw.BackendAuto})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	weights, err := vmmw.TagID("weights")
	if err != nil {
		log.Fatal(err)
	}
	loader, err := vmmw.OpenLoader(path)
	if err != nil {
		log.Fatal(err)
	}
	defer loader.Close()
	if err := loader.Allocate(pool, weights); err != nil {
		log.Fatal(err)
	}
	res, err := loader.Load(context.Background(), pool, func(done, total uint64) (cancel bool) { return false })
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("loaded %d bytes in %.3f s (%.2f GB/s)\n", res.Bytes, res.Seconds, res.GBps)

	names, err := loader.DestinationNames()
	if err != nil {
		log.Fatal(err)
	}
	d, err := loader.Destination(names[0])
	if err != nil {
		log.Fatal(err)
	}
	before := make([]byte, d.Bytes)
	if err := pool.Read(d.Ptr, before); err != nil {
		log.Fatal(err)
	}
	show := func(when string) {
		r, err := pool.Report()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%-7s live %d B, tracked %d B, host backup %d B, asleep %v\n",
			when, r.LiveBytes, r.TrackedBytes, r.HostBackupBytes, r.Asleep)
	}
	show("loaded")
	if err := pool.Sleep(vmmw.TagPolicy{Tag: weights, Policy: vmmw.Offload}); err != nil {
		log.Fatal(err)
	}
	show("asleep")
	if err := pool.Wake(context.Background(), weights); err != nil {
		log.Fatal(err)
	}
	show("awake")
	after := make([]byte, d.Bytes)
	if err := pool.Read(d.Ptr, after); err != nil {
		log.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		log.Fatalf("%s changed across sleep and wake", names[0])
	}
	fmt.Printf("%s at %#x: identical after sleep and wake\n", names[0], d.Ptr)
}
