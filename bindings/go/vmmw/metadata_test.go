package vmmw

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// ggufWithMetadata writes a GGUF v3 file holding no tensors and three
// pairs: a string, a negative int32 and a nested array of uint16.
func ggufWithMetadata(t *testing.T) string {
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { w(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	w(uint32(3))
	w(uint64(0)) // tensors
	w(uint64(3)) // pairs
	str("general.architecture")
	w(uint32(MetadataString))
	str("llama")
	str("t.i32")
	w(uint32(MetadataInt32))
	w(int32(-7))
	str("t.nested")
	w(uint32(MetadataArray))
	w(uint32(MetadataArray))
	w(uint64(2))
	w(uint32(MetadataUint16))
	w(uint64(2))
	w(uint16(1))
	w(uint16(2))
	w(uint32(MetadataUint16))
	w(uint64(1))
	w(uint16(3))
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestMetadataReadsEveryPairAndNestedArrays(t *testing.T) {
	m, err := OpenMetadata(ggufWithMetadata(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if n, err := m.Len(); err != nil || n != 3 {
		t.Fatalf("Len = %d, %v", n, err)
	}
	if k, err := m.Key(1); err != nil || k != "t.i32" {
		t.Fatalf("Key(1) = %q, %v", k, err)
	}
	i, err := m.Find("t.nested")
	if err != nil || i != 2 {
		t.Fatalf("Find = %d, %v", i, err)
	}
	v, err := m.Value(i)
	want := []any{[]any{uint64(1), uint64(2)}, []any{uint64(3)}}
	if err != nil || !reflect.DeepEqual(v, want) {
		t.Fatalf("Value = %#v, %v", v, err)
	}
	if v, err := m.Int64(1); err != nil || v != -7 {
		t.Fatalf("Int64 = %d, %v", v, err)
	}
	if _, err := m.Uint64(1); !isStatus(err, StatusInvalidArgument) {
		t.Fatalf("a negative int32 read as uint64: %v", err)
	}
	if _, err := m.String(2, 5); !isStatus(err, StatusInvalidArgument) {
		t.Fatalf("index past the array: %v", err)
	}
	if _, err := m.Find("nope"); !isStatus(err, StatusInvalidArgument) {
		t.Fatalf("missing key: %v", err)
	}
	q, err := GgmlTypeOf("Q8_0")
	if err != nil || q != (GgmlType{ID: 8, Block: 32, TypeSize: 34}) {
		t.Fatalf("GgmlTypeOf = %+v, %v", q, err)
	}
	m.Close()
	if _, err := m.Len(); err == nil {
		t.Fatal("a closed Metadata answered")
	}
}

// A GGUF file loads through the same Loader: a Q8_0 tensor of ne [64, 2]
// lands as its raw blocks, with its ggml type name and the shape reversed.
func TestLoaderLoadsGGUFAsRawBlocks(t *testing.T) {
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	b.WriteString("GGUF")
	w(uint32(3))
	w(uint64(1)) // tensors
	w(uint64(0)) // pairs
	w(uint64(1))
	b.WriteString("w")
	w(uint32(2))
	w(uint64(64))
	w(uint64(2))
	w(uint32(8)) // Q8_0
	w(uint64(0))
	for b.Len()%32 != 0 {
		b.WriteByte(0)
	}
	data := make([]byte, 2*2*34)
	for i := range data {
		data[i] = byte(i * 7)
	}
	b.Write(data)
	path := filepath.Join(t.TempDir(), "model.bin")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	p := hostPool(t)
	l, err := OpenLoader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Allocate(p, mustTag(t, "go-gguf")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Load(context.Background(), p, nil); err != nil {
		t.Fatal(err)
	}
	d, err := l.Destination("w")
	if err != nil || d.Dtype != "Q8_0" || !reflect.DeepEqual(d.Shape, []uint64{2, 64}) || d.Bytes != uint64(len(data)) {
		t.Fatalf("destination %+v %v", d, err)
	}
	got := make([]byte, d.Bytes)
	if err := p.Read(d.Ptr, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("loaded bytes differ (%v)", err)
	}
}
