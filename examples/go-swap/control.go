package main

// The client side of the interposer's control channel: one JSON object a
// line over the Unix socket named by VMMW_CONTROL_SOCKET (docs/PRELOAD.md
// has the protocol). Spoken here directly rather than through the Go
// binding's ControlSleep/ControlWake (the C library's vmmw_control_*): each
// call then carries a context (a deadline, a cancellation at shutdown), and
// a wake that waits minutes for memory holds a goroutine, not a cgo thread.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// ControlStatus is the answer to {"op":"status"}.
type ControlStatus struct {
	PID             int             `json:"pid"`
	State           string          `json:"state"`
	Tags            []ControlTag    `json:"tags"`
	Devices         []ControlDevice `json:"devices"`
	HostBackupBytes uint64          `json:"host_backup_bytes"`
	Last            json.RawMessage `json:"last,omitempty"`
}

// ControlTag is one tag of a process under the interposer.
type ControlTag struct {
	Device       int    `json:"device"`
	Tag          string `json:"tag"`
	Asleep       bool   `json:"asleep"`
	LiveBytes    uint64 `json:"live_bytes"`
	TrackedBytes uint64 `json:"tracked_bytes"`
	BackupBytes  uint64 `json:"backup_bytes"`
}

// ControlDevice is one device as the process sees it.
type ControlDevice struct {
	Device int    `json:"device"`
	Free   uint64 `json:"free"`
	Total  uint64 `json:"total"`
	Ours   uint64 `json:"ours"`
	// Cached is the part of Ours no block uses (given back on demand).
	Cached uint64 `json:"cached"`
}

// TrackedBytes is the device memory the process's tags hold (or held, asleep).
func (s *ControlStatus) TrackedBytes() uint64 {
	var n uint64
	for _, t := range s.Tags {
		n += t.TrackedBytes
	}
	return n
}

// ControlCycle is the answer to a sleep or a wake.
type ControlCycle struct {
	Seconds     float64 `json:"seconds"`
	SyncSeconds float64 `json:"sync_seconds"`
	// WaitSeconds is a wake's wait for memory.
	WaitSeconds float64 `json:"wait_seconds"`
	// Bytes are the physical bytes released (sleep) or mapped (wake).
	Bytes       uint64            `json:"bytes"`
	BackupBytes uint64            `json:"backup_bytes"`
	Tags        []ControlTagCycle `json:"tags"`
}

// ControlTagCycle is what a sleep or wake did to one tag.
type ControlTagCycle struct {
	Device      int     `json:"device"`
	Tag         string  `json:"tag"`
	Bytes       uint64  `json:"bytes"`
	CopiedBytes uint64  `json:"copied_bytes"`
	Seconds     float64 `json:"seconds"`
}

// CopiedBytes is what the cycle copied between the device and the host.
func (c *ControlCycle) CopiedBytes() uint64 {
	var n uint64
	for _, t := range c.Tags {
		n += t.CopiedBytes
	}
	return n
}

// ControlError is a refusal from the interposer ({"ok":false,...}) or a
// failure to reach it.
type ControlError struct {
	Op      string
	Code    string // the library's status name; "UNREACHABLE" when the socket did not answer
	Message string
}

func (e *ControlError) Error() string {
	return fmt.Sprintf("control %s: %s: %s", e.Op, e.Code, e.Message)
}

// Control talks to one process's control socket. Each call opens its own
// connection, so calls from different goroutines do not share a stream.
type Control struct {
	Socket string
}

// call sends req and decodes the answer into out; ctx bounds the whole call.
func (c *Control) call(ctx context.Context, req map[string]any, out any) error {
	op, _ := req["op"].(string)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		return &ControlError{Op: op, Code: "UNREACHABLE", Message: err.Error()}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	// A context cancelled mid-call closes the connection, so the read below returns.
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			conn.SetDeadline(time.Unix(1, 0))
		case <-done:
		}
	}()
	line, _ := json.Marshal(req)
	if _, err := conn.Write(append(line, '\n')); err != nil {
		return &ControlError{Op: op, Code: "UNREACHABLE", Message: err.Error()}
	}
	rd := bufio.NewReaderSize(conn, 64<<10)
	ans, err := rd.ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return &ControlError{Op: op, Code: "UNREACHABLE", Message: "no answer: " + err.Error()}
	}
	var head struct {
		OK    bool   `json:"ok"`
		Code  string `json:"code"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(ans, &head); err != nil {
		return &ControlError{Op: op, Code: "BAD_ANSWER", Message: fmt.Sprintf("%v: %.200s", err, ans)}
	}
	if !head.OK {
		if head.Code == "" {
			head.Code = "REFUSED"
		}
		return &ControlError{Op: op, Code: head.Code, Message: head.Error}
	}
	if out != nil {
		if err := json.Unmarshal(ans, out); err != nil {
			return &ControlError{Op: op, Code: "BAD_ANSWER", Message: fmt.Sprintf("%v: %.200s", err, ans)}
		}
	}
	return nil
}

// Status asks for the process's state, tags and devices.
func (c *Control) Status(ctx context.Context) (*ControlStatus, error) {
	var s ControlStatus
	if err := c.call(ctx, map[string]any{"op": "status"}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// StatusRaw is the status answer as the interposer wrote it (with the
// fields it adds beyond ControlStatus's).
func (c *Control) StatusRaw(ctx context.Context) (json.RawMessage, error) {
	var raw json.RawMessage
	if err := c.call(ctx, map[string]any{"op": "status"}, &raw); err != nil {
		return nil, err
	}
	return raw, nil
}

// Sleep puts every tag of the process to sleep with policy.
func (c *Control) Sleep(ctx context.Context, policy string) (*ControlCycle, error) {
	var r ControlCycle
	if err := c.call(ctx, map[string]any{"op": "sleep", "policy": policy}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Wake brings the process's memory back; waitMemory > 0 lets each chunk
// wait that long for memory another process is releasing (a swap's sleep).
func (c *Control) Wake(ctx context.Context, waitMemory time.Duration) (*ControlCycle, error) {
	req := map[string]any{"op": "wake"}
	if waitMemory > 0 {
		req["wait_memory_ms"] = waitMemory.Milliseconds()
	}
	var r ControlCycle
	if err := c.call(ctx, req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
