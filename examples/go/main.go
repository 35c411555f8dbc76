// Command example shows vmmweights from Go: open a device (CUDA when present,
// else the host simulation), allocate VMM memory, write it and read it back.
//
//	CGO_LDFLAGS="-L$LIB -Wl,-rpath,$LIB" go run .
package main

import (
	"bytes"
	"fmt"
	"log"

	vmmw "github.com/vmmweights/vmmweights/bindings/go"
)

func main() {
	dev, err := vmmw.OpenDevice(vmmw.BackendAuto, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()
	desc, err := dev.Describe()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("vmmweights %s on %s\n", vmmw.Version(), desc)

	g, err := dev.Granularity()
	if err != nil {
		log.Fatal(err)
	}
	seg, err := vmmw.NewSegment(dev, 2*g, g)
	if err != nil {
		log.Fatal(err)
	}
	defer seg.Close()
	msg := []byte("weights live at stable addresses")
	back := make([]byte, len(msg))
	if err := seg.Write(g-8, msg); err != nil {
		log.Fatal(err)
	}
	if err := seg.Read(g-8, back); err != nil {
		log.Fatal(err)
	}
	if !bytes.Equal(msg, back) {
		log.Fatal("read back differs")
	}
	info, err := seg.Info()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("segment at %#x: %d bytes in %d chunks; round trip ok\n", info.Ptr, info.Reserved, info.Chunks)
}
