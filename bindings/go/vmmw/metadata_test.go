package vmmw

import (
	"bytes"
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
