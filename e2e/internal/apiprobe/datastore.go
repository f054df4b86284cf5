package apiprobe

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"liken.sh/liken/node/controlplane"
)

// Datastore is each member's view of the datastore, one line per member
// sorted by client URL, to attach to a Mark: the members it lists (name,
// or ID while not started; voter or learner) and its /health, or the
// error it answered. members maps each leader's etcd client URL (from the
// test's host, e.g. a forwarded port) to a client that reaches it; the
// members are asked at once, each call bounded by its client's Timeout.
func Datastore(ctx context.Context, members map[string]*controlplane.EtcdClient) string {
	urls := make([]string, 0, len(members))
	for u := range members {
		urls = append(urls, u)
	}
	slices.Sort(urls)
	lines := make([]string, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Go(func() { lines[i] = u + ": " + memberView(ctx, members[u], u) })
	}
	wg.Wait()
	return strings.Join(lines, "\n")
}

// memberView is what the member at u says: its member list and its
// health.
func memberView(ctx context.Context, c *controlplane.EtcdClient, u string) string {
	var list string
	if ms, err := c.MemberList(ctx, u); err != nil {
		list = "members: " + err.Error()
	} else {
		parts := make([]string, 0, len(ms))
		for _, m := range ms {
			parts = append(parts, describe(m))
		}
		list = fmt.Sprintf("%d members: %s", len(ms), strings.Join(parts, ", "))
	}
	health := "healthy"
	if _, err := c.Health(ctx, u); err != nil {
		health = "unhealthy: " + err.Error()
	}
	return list + "; " + health
}

// describe is one member as a list shows it: "vm-1 voter", "vm-2 learner",
// "8e9e05c52164694d learner (not started)".
func describe(m controlplane.Member) string {
	s := m.Name
	if s == "" {
		s = fmt.Sprintf("%x", m.ID)
	}
	if m.IsLearner {
		s += " learner"
	} else {
		s += " voter"
	}
	if m.Name == "" || len(m.ClientURLs) == 0 {
		s += " (not started)"
	}
	return s
}
