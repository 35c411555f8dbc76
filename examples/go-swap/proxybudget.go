package main

// The host-memory budget: the asleep servers' backups together stay within
// hostMemoryBudget; the least recently used asleep server is stopped to
// make room, and its next request is a cold start.

import (
	"fmt"
	"sort"
)

// makeRoom stops least recently used asleep servers (never target) until
// the asleep servers' backups after this swap fit the host budget, counting
// each victim's device bytes as its backup (its policy may keep less). It
// returns the victims that do not fit even alone: they are stopped instead
// of slept. Caller holds mu; it is released while servers stop.
func (p *Proxy) makeRoom(target *Server, victims []*Server, rec *SwapRecord) map[*Server]bool {
	instead := map[*Server]bool{}
	budget := p.cfg.HostMemoryBudget
	if budget == 0 {
		return instead
	}
	var need uint64
	for _, v := range victims {
		if v.policy != "discard" {
			need += v.tracked
		}
	}
	for {
		asleep := p.asleepExcept(target)
		var kept uint64
		for _, s := range asleep {
			kept += s.backup
		}
		if kept+need <= budget {
			return instead
		}
		if len(asleep) == 0 {
			// The victims alone are over the budget: stop the largest.
			sort.Slice(victims, func(i, j int) bool { return victims[i].tracked > victims[j].tracked })
			for _, v := range victims {
				if need <= budget || instead[v] {
					break
				}
				instead[v] = true
				need -= v.tracked
				rec.Stopped = append(rec.Stopped, BudgetStop{Model: v.cfg.ID, Bytes: v.tracked,
					Reason: fmt.Sprintf("its %d device bytes would not fit the host memory budget of %d bytes; stopped instead of slept", v.tracked, budget)})
				v.counts.BudgetStops++
			}
			return instead
		}
		lru := asleep[0]
		rec.Stopped = append(rec.Stopped, BudgetStop{Model: lru.cfg.ID, Bytes: lru.backup,
			Reason: fmt.Sprintf("least recently used asleep server; the asleep backups would be %d bytes, over the host memory budget of %d", kept+need, budget)})
		lru.counts.BudgetStops++
		backup := lru.backup
		p.mu.Unlock()
		p.log.Printf("go-swap: stopping %s for the host memory budget (%d backup bytes); its next request starts it cold", lru.cfg.ID, backup)
		p.stopServer(lru, StateCold, "stopped for the host memory budget")
		p.event(fmt.Sprintf("%s stopped for the host memory budget", lru.cfg.ID))
		p.mu.Lock()
	}
}

// enforceBudget stops least recently used asleep servers while the
// backups measured after a swap are over the budget (a policy's estimate
// can be off). Caller holds mu.
func (p *Proxy) enforceBudget(target *Server, rec *SwapRecord) {
	budget := p.cfg.HostMemoryBudget
	for budget > 0 {
		asleep := p.asleepExcept(target)
		var kept uint64
		for _, s := range asleep {
			kept += s.backup
		}
		if kept <= budget || len(asleep) == 0 {
			return
		}
		lru := asleep[0]
		rec.Stopped = append(rec.Stopped, BudgetStop{Model: lru.cfg.ID, Bytes: lru.backup,
			Reason: fmt.Sprintf("least recently used asleep server; the asleep backups were %d bytes, over the host memory budget of %d", kept, budget)})
		lru.counts.BudgetStops++
		backup := lru.backup
		p.mu.Unlock()
		p.log.Printf("go-swap: stopping %s for the host memory budget (the asleep backups are %d bytes, over %d; its own %d); its next request starts it cold",
			lru.cfg.ID, kept, budget, backup)
		p.stopServer(lru, StateCold, "stopped for the host memory budget")
		p.event(fmt.Sprintf("%s stopped for the host memory budget", lru.cfg.ID))
		p.mu.Lock()
	}
}

// asleepExcept lists the asleep servers other than s, least recently used
// first. Caller holds mu.
func (p *Proxy) asleepExcept(s *Server) []*Server {
	var out []*Server
	for _, o := range p.servers {
		if o != s && o.state == StateAsleep {
			out = append(out, o)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].lastUsed.Before(out[j].lastUsed) })
	return out
}
