package vmmw

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// This process's default pools served on a control socket and driven
// through it, as vmmw ctl drives a program under the interposer.
func TestControlSleepWakeStatus(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "control.sock")
	srv, err := ServeControl(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if _, err := ServeControl(sock); !errors.Is(err, ErrIO) {
		t.Fatalf("a second server on the path: %v", err)
	}
	p, err := GlobalPool(0)
	if err != nil {
		t.Fatal(err)
	}
	tag := mustTag(t, "go-control")
	ptr, err := p.AllocTagged(4<<20, tag)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Free(ptr)
	in := bytes.Repeat([]byte("go control "), 300)
	if err := p.Write(ptr+100, in); err != nil {
		t.Fatal(err)
	}
	s, err := ControlStatus(sock)
	if err != nil || !strings.Contains(s, `"tag":"go-control"`) {
		t.Fatalf("status %q: %v", s, err)
	}
	if _, err := ControlSleep(sock, Reload); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("reload: %v", err)
	}
	if _, err := ControlSleep(sock, Offload, "go-nope"); !errors.Is(err, ErrUnknownTag) || !strings.Contains(err.Error(), "go-nope") {
		t.Fatalf("unknown tag: %v", err)
	}
	r, err := ControlSleep(sock, Offload, "go-control")
	if err != nil || r.Bytes < 4<<20 || r.BackupBytes < 4<<20 {
		t.Fatalf("sleep %+v: %v", r, err)
	}
	m, err := ControlStatusMap(sock)
	if err != nil || m["state"] != "asleep" {
		t.Fatalf("status %v: %v", m, err)
	}
	r, err = ControlWake(sock, time.Second)
	if err != nil || r.Bytes < 4<<20 {
		t.Fatalf("wake %+v: %v", r, err)
	}
	out := make([]byte, len(in))
	if err := p.Read(ptr+100, out); err != nil || !bytes.Equal(in, out) {
		t.Fatalf("bytes after the wake: %v", err)
	}
	if _, err := ControlStatus(filepath.Join(t.TempDir(), "none.sock")); !errors.Is(err, ErrIO) {
		t.Fatalf("nobody there: %v", err)
	}
	srv.Close()
	srv.Close()
}
