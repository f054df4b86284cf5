// Command coredns is the cluster DNS server of liken's OS image: CoreDNS
// built from its Go module with the plugins liken's Corefile uses, and no
// others (no cloud zones, no etcd, no external plugins).
package main

import (
	"github.com/coredns/coredns/coremain"

	// The plugins of manifests/addons/coredns.yaml's Corefile.
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }
