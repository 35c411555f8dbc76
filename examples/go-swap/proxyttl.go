package main

// llama-swap's ttl: an awake server idle past it goes to sleep (llama-swap
// stops it; here its memory goes to the host and the next request wakes it).

import (
	"fmt"
	"time"
)

// ttlTicker wakes the swapper when an awake server has been idle past its
// ttl (llama-swap's key: there it stops the server; here it goes to sleep,
// so the device memory is free and the next request is a wake).
func (p *Proxy) ttlTicker() {
	var shortest time.Duration
	for _, s := range p.servers {
		if s.cfg.TTL > 0 && (shortest == 0 || s.cfg.TTL < shortest) {
			shortest = s.cfg.TTL
		}
	}
	if shortest == 0 {
		return
	}
	tick := time.NewTicker(minDuration(shortest/4, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-p.swapDone:
			return
		case <-tick.C:
			p.mu.Lock()
			if p.idleServer() != nil {
				p.cond.Broadcast()
			}
			p.mu.Unlock()
		}
	}
}

func minDuration(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

// idleServer is an awake server idle past its ttl, if any. Caller holds mu.
func (p *Proxy) idleServer() *Server {
	for _, s := range p.servers {
		if s.cfg.TTL > 0 && s.state == StateAwake && s.inflight == 0 && !s.lastUsed.IsZero() && time.Since(s.lastUsed) > s.cfg.TTL {
			return s
		}
	}
	return nil
}

// sleepIdle puts s to sleep for its ttl, within the host budget. Caller
// holds mu (released while the server sleeps).
func (p *Proxy) sleepIdle(s *Server) {
	p.swapSeq++
	rec := &SwapRecord{ID: p.swapSeq, Kind: "ttl_sleep", From: []string{s.cfg.ID}, Policies: map[string]string{s.cfg.ID: s.policy},
		Start: time.Since(p.started).Seconds()}
	p.flight = &ProxyFlight{ID: rec.ID, From: rec.From, Phase: "sleeping", Since: rec.Start}
	s.draining = true
	p.mu.Unlock()
	p.refresh([]*Server{s})
	p.mu.Lock()
	if p.makeRoom(nil, []*Server{s}, rec)[s] {
		p.mu.Unlock()
		p.stopServer(s, StateCold, "stopped for the host memory budget instead of sleeping")
	} else {
		s.state, s.phase = StateSwapping, "sleeping"
		p.mu.Unlock()
		r := p.sleepServer(s)
		rec.Slept = []SleepResult{r}
		rec.SleepSeconds, rec.SleepBytes, rec.SwapSeconds = r.Seconds, r.Bytes, r.Seconds
	}
	if len(rec.Slept) == 1 && rec.Slept[0].Error != "" {
		p.log.Printf("go-swap: %s idle for its ttl (%s): its sleep failed: %s", s.cfg.ID, s.cfg.TTL, rec.Slept[0].Error)
	} else {
		p.log.Printf("go-swap: %s idle for its ttl (%s): put to sleep", s.cfg.ID, s.cfg.TTL)
	}
	p.event(fmt.Sprintf("%s asleep after its ttl", s.cfg.ID))
	p.mu.Lock()
	s.draining = false
	p.record(rec)
	p.flight = nil
	p.cond.Broadcast()
}
