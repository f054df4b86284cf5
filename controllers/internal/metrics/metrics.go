// Package metrics defines cluster-operator's Prometheus metrics.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are cluster-operator's collectors, registered on Registry.
type Metrics struct {
	// Registry serves /metrics.
	Registry *prometheus.Registry
	// TurnsGranted counts turns recorded in a ledger, by cluster and
	// reason (Release or Reboot).
	TurnsGranted *prometheus.CounterVec
	// TurnsEnded counts ledger entries removed, by cluster and how they
	// ended (Finished, TrialFailed, TakenBack, Released).
	TurnsEnded *prometheus.CounterVec
	// GrantLatency observes, per cluster, the seconds between this copy
	// first seeing a machine wait for a turn it may have (approved when
	// Manual) and the grant.
	GrantLatency *prometheus.HistogramVec
	// Machines is the number of machines of a cluster in each phase.
	Machines *prometheus.GaugeVec
	// MachinesLost counts the Lost verdicts this copy wrote, by cluster.
	MachinesLost *prometheus.CounterVec
	// RolloutHalted is 1 while a cluster's rollout is halted, by reason.
	RolloutHalted *prometheus.GaugeVec
	// Leading is 1 while this copy holds the lease.
	Leading prometheus.Gauge
	// ChannelReads counts reads of release channels, by cluster and result
	// (the ReleasesAvailable reason).
	ChannelReads *prometheus.CounterVec
}

// New creates the collectors on a fresh registry, with the Go and process
// collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		TurnsGranted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "liken_operator_turns_granted_total",
			Help: "Reboot turns recorded in a Cluster's ledger, by cluster and reason.",
		}, []string{"cluster", "reason"}),
		TurnsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "liken_operator_turns_ended_total",
			Help: "Reboot turns removed from a Cluster's ledger, by cluster and result (Finished, TrialFailed, TakenBack, Released).",
		}, []string{"cluster", "result"}),
		GrantLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "liken_operator_grant_latency_seconds",
			Help:    "Seconds from cluster-operator first seeing a machine wait for a turn it may have to the grant.",
			Buckets: []float64{0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
		}, []string{"cluster"}),
		Machines: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "liken_operator_machines",
			Help: "Machines of a Cluster, by phase.",
		}, []string{"cluster", "phase"}),
		MachinesLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "liken_operator_machines_lost_total",
			Help: "Machines this cluster-operator wrote Lost after their heartbeat stopped, by cluster.",
		}, []string{"cluster"}),
		RolloutHalted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "liken_operator_rollout_halted",
			Help: "1 while a Cluster's rollout is halted, by reason (RolloutStalled, TrialFailed).",
		}, []string{"cluster", "reason"}),
		Leading: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "liken_operator_leading",
			Help: "1 while this copy of cluster-operator holds the lease and grants turns.",
		}),
		ChannelReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "liken_operator_channel_reads_total",
			Help: "Reads of a Cluster's release channel, by cluster and result.",
		}, []string{"cluster", "result"}),
	}
	reg.MustRegister(m.TurnsGranted, m.TurnsEnded, m.GrantLatency, m.Machines, m.MachinesLost,
		m.RolloutHalted, m.Leading, m.ChannelReads,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
