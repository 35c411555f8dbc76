package vmmw

// #include <stdlib.h>
// #include "vmmweights.h"
import "C"

import (
	"runtime"
	"unsafe"
)

// MetadataType is a GGUF metadata value type (GGUF's own numbers).
type MetadataType uint32

// Metadata value types (the C header's VMMW_METADATA_*; constants_test.go checks they agree).
const (
	MetadataUint8   MetadataType = 0
	MetadataInt8    MetadataType = 1
	MetadataUint16  MetadataType = 2
	MetadataInt16   MetadataType = 3
	MetadataUint32  MetadataType = 4
	MetadataInt32   MetadataType = 5
	MetadataFloat32 MetadataType = 6
	MetadataBool    MetadataType = 7
	MetadataString  MetadataType = 8
	MetadataArray   MetadataType = 9
	MetadataUint64  MetadataType = 10
	MetadataInt64   MetadataType = 11
	MetadataFloat64 MetadataType = 12
)

// Metadata is a checkpoint's metadata (GGUF's typed key/value pairs; none
// for safetensors), read-only. A value is addressed by its pair's index and
// a path of array indices (none for the pair's own value). Safe for
// concurrent reads.
type Metadata struct {
	ptr *C.vmmw_metadata_t
}

// OpenMetadata opens the checkpoint at path (validated as a load would
// validate it) and keeps its metadata.
func OpenMetadata(path string) (*Metadata, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.vmmw_metadata_t
	if err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_metadata_open(cs, &p, e) }); err != nil {
		return nil, err
	}
	m := &Metadata{ptr: p}
	runtime.SetFinalizer(m, (*Metadata).Close)
	return m, nil
}

// Close frees the metadata. Idempotent.
func (m *Metadata) Close() error {
	if m.ptr != nil {
		C.vmmw_metadata_free(m.ptr)
		m.ptr = nil
		runtime.SetFinalizer(m, nil)
	}
	return nil
}

func (m *Metadata) do(f func(cm *C.vmmw_metadata_t, e **C.vmmw_error_t) C.vmmw_status_t) error {
	if m == nil || m.ptr == nil {
		return closedError("Metadata")
	}
	cm := m.ptr
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return f(cm, e) })
	runtime.KeepAlive(m)
	return err
}

// cPath copies a path of array indices into C memory (freed by the caller).
func cPath(path []int) (*C.size_t, C.size_t) {
	if len(path) == 0 {
		return nil, 0
	}
	p := (*C.size_t)(C.malloc(C.size_t(len(path)) * C.size_t(unsafe.Sizeof(C.size_t(0)))))
	s := unsafe.Slice(p, len(path))
	for i, v := range path {
		s[i] = C.size_t(v)
	}
	return p, C.size_t(len(path))
}

// Len is the number of key/value pairs.
func (m *Metadata) Len() (int, error) {
	var n C.size_t
	err := m.do(func(cm *C.vmmw_metadata_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_metadata_count(cm, &n, e)
	})
	return int(n), err
}

// Key is the key of pair index (file order).
func (m *Metadata) Key(index int) (string, error) {
	if m == nil || m.ptr == nil {
		return "", closedError("Metadata")
	}
	cm := m.ptr
	s, err := readString(func(buf *C.char, capacity C.size_t, needed *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_metadata_key(cm, C.size_t(index), buf, capacity, needed, e)
	})
	runtime.KeepAlive(m)
	return s, err
}

// Find is the index of key.
func (m *Metadata) Find(key string) (int, error) {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	var i C.size_t
	err := m.do(func(cm *C.vmmw_metadata_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_metadata_find(cm, ck, &i, e)
	})
	return int(i), err
}

// Type is the type of the value at (index, path); for an array, also its
// element type and length.
func (m *Metadata) Type(index int, path ...int) (t MetadataType, elem MetadataType, length int, err error) {
	p, n := cPath(path)
	defer C.free(unsafe.Pointer(p))
	var ct, ce C.uint32_t
	var cl C.size_t
	err = m.do(func(cm *C.vmmw_metadata_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_metadata_type(cm, C.size_t(index), p, n, &ct, &ce, &cl, e)
	})
	return MetadataType(ct), MetadataType(ce), int(cl), err
}

// Uint64 is an integer value that fits in uint64.
func (m *Metadata) Uint64(index int, path ...int) (uint64, error) {
	p, n := cPath(path)
	defer C.free(unsafe.Pointer(p))
	var v C.uint64_t
	err := m.do(func(cm *C.vmmw_metadata_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_metadata_u64(cm, C.size_t(index), p, n, &v, e)
	})
	return uint64(v), err
}

// Int64 is an integer value that fits in int64.
func (m *Metadata) Int64(index int, path ...int) (int64, error) {
	p, n := cPath(path)
	defer C.free(unsafe.Pointer(p))
	var v C.int64_t
	err := m.do(func(cm *C.vmmw_metadata_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_metadata_i64(cm, C.size_t(index), p, n, &v, e)
	})
	return int64(v), err
}

// Float64 is a float32 or float64 value.
func (m *Metadata) Float64(index int, path ...int) (float64, error) {
	p, n := cPath(path)
	defer C.free(unsafe.Pointer(p))
	var v C.double
	err := m.do(func(cm *C.vmmw_metadata_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_metadata_f64(cm, C.size_t(index), p, n, &v, e)
	})
	return float64(v), err
}

// Bool is a bool value.
func (m *Metadata) Bool(index int, path ...int) (bool, error) {
	p, n := cPath(path)
	defer C.free(unsafe.Pointer(p))
	var v C.uint8_t
	err := m.do(func(cm *C.vmmw_metadata_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_metadata_bool(cm, C.size_t(index), p, n, &v, e)
	})
	return v != 0, err
}

// String is a string value.
func (m *Metadata) String(index int, path ...int) (string, error) {
	if m == nil || m.ptr == nil {
		return "", closedError("Metadata")
	}
	p, n := cPath(path)
	defer C.free(unsafe.Pointer(p))
	cm := m.ptr
	s, err := readString(func(buf *C.char, capacity C.size_t, needed *C.size_t, e **C.vmmw_error_t) C.vmmw_status_t {
		return C.vmmw_metadata_string(cm, C.size_t(index), p, n, buf, capacity, needed, e)
	})
	runtime.KeepAlive(m)
	return s, err
}

// Value is the value at (index, path) as a Go value: uint64 or int64 for
// integers (by signedness), float64, bool, string, or []any for arrays.
func (m *Metadata) Value(index int, path ...int) (any, error) {
	t, _, length, err := m.Type(index, path...)
	if err != nil {
		return nil, err
	}
	switch t {
	case MetadataArray:
		out := make([]any, length)
		for i := range out {
			if out[i], err = m.Value(index, append(append([]int{}, path...), i)...); err != nil {
				return nil, err
			}
		}
		return out, nil
	case MetadataString:
		return m.String(index, path...)
	case MetadataBool:
		return m.Bool(index, path...)
	case MetadataFloat32, MetadataFloat64:
		return m.Float64(index, path...)
	case MetadataInt8, MetadataInt16, MetadataInt32, MetadataInt64:
		return m.Int64(index, path...)
	default:
		return m.Uint64(index, path...)
	}
}

// GgmlType is a ggml tensor type's entry in the type table.
type GgmlType struct {
	ID       uint32 // number in GGUF files
	Block    int    // elements per block (1 for plain types)
	TypeSize int    // bytes per block
}

// GgmlTypeOf is the ggml type named name ("Q8_0", "BF16": the dtype names of GGUF tensors).
func GgmlTypeOf(name string) (GgmlType, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var id C.uint32_t
	var block, size C.size_t
	err := call(func(e **C.vmmw_error_t) C.vmmw_status_t { return C.vmmw_ggml_type(cs, &id, &block, &size, e) })
	return GgmlType{ID: uint32(id), Block: int(block), TypeSize: int(size)}, err
}
