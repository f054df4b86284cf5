package turns

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"testing"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
)

// benchPods is how many pods BenchmarkPodCache holds: 50,000 with
// LIKEN_BENCH=full (docs/benchmarks.md), 2,000 otherwise.
func benchPods() int {
	if os.Getenv("LIKEN_BENCH") == "full" {
		return 50000
	}
	return 2000
}

// podJSON is a pod as a Deployment's ReplicaSet makes it and the API
// server serves it to a list or watch: labels, an owner, a container with
// resources and probes, the service account token volume every pod gets,
// its status with conditions, and managed fields. %[1]d numbers it.
const podJSON = `{
 "metadata": {"name": "web-7c9f8d6b5d-%05[1]d", "generateName": "web-7c9f8d6b5d-", "namespace": "shop",
  "uid": "5f0c1d1e-0b57-4d1e-9a43-%012[1]d", "resourceVersion": "%[1]d", "creationTimestamp": "2026-11-20T10:00:00Z",
  "labels": {"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": "shop", "pod-template-hash": "7c9f8d6b5d"},
  "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-20T09:59:00Z"},
  "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7c9f8d6b5d", "uid": "0d9b4a2c-6f1e-4c3b-8a5d-1e2f3a4b5c6d", "controller": true, "blockOwnerDeletion": true}],
  "managedFields": [
   {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": "2026-11-20T10:00:00Z", "fieldsType": "FieldsV1",
    "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app.kubernetes.io/name": {}, "f:pod-template-hash": {}}, "f:ownerReferences": {}}, "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:image": {}, "f:name": {}, "f:ports": {}, "f:resources": {}}}}}},
   {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-11-20T10:00:05Z", "fieldsType": "FieldsV1", "subresource": "status",
    "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {}, "f:podIPs": {}, "f:startTime": {}}}}]},
 "spec": {
  "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}, {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}, {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}], "defaultMode": 420}}],
  "containers": [{"name": "web", "image": "registry.example/shop/web:1.42.0", "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
   "env": [{"name": "LOG_LEVEL", "value": "info"}],
   "resources": {"limits": {"memory": "256Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
   "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"}, "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
   "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
   "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
  "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst", "serviceAccountName": "default", "serviceAccount": "default",
  "nodeName": "node-%[2]d", "securityContext": {}, "schedulerName": "default-scheduler",
  "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}, {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
  "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"},
 "status": {"phase": "Running",
  "conditions": [{"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": "2026-11-20T10:00:03Z"}, {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-20T10:00:00Z"}, {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-20T10:00:05Z"}, {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-11-20T10:00:05Z"}, {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-20T10:00:00Z"}],
  "hostIP": "10.0.0.%[3]d", "hostIPs": [{"ip": "10.0.0.%[3]d"}], "podIP": "10.244.%[3]d.%[4]d", "podIPs": [{"ip": "10.244.%[3]d.%[4]d"}], "startTime": "2026-11-20T10:00:00Z",
  "containerStatuses": [{"name": "web", "state": {"running": {"startedAt": "2026-11-20T10:00:04Z"}}, "lastState": {}, "ready": true, "restartCount": 0, "image": "registry.example/shop/web:1.42.0", "imageID": "registry.example/shop/web@sha256:4b1e0c6a9d2f7e8b3c5a1d0f9e8c7b6a5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a", "containerID": "containerd://8d3f1a2b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7", "started": true}],
  "qosClass": "Burstable"}}`

// decodePod decodes pod number i, on one of 1,000 nodes, as the informer
// would receive it: every string its own allocation.
func decodePod(tb testing.TB, i int) *corev1.Pod {
	p := &corev1.Pod{}
	if err := json.Unmarshal(fmt.Appendf(nil, podJSON, i, i%1000, i%250, i%200), p); err != nil {
		tb.Fatal(err)
	}
	return p
}

// heap is the live heap after a full collection.
func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// fillCache adds n pods through transform to an indexer with indexers,
// and returns the bytes the cache holds per pod.
func fillCache(tb testing.TB, n int, transform cache.TransformFunc, indexers cache.Indexers) float64 {
	idx := cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, indexers)
	before := heap()
	for i := range n {
		obj, err := transform(decodePod(tb, i))
		if err != nil {
			tb.Fatal(err)
		}
		if err := idx.Add(obj); err != nil {
			tb.Fatal(err)
		}
	}
	after := heap()
	runtime.KeepAlive(idx)
	if len(idx.ListKeys()) != n {
		tb.Fatalf("the cache holds %d pods, not %d", len(idx.ListKeys()), n)
	}
	return float64(after-before) / float64(n)
}

// keep is the transform of an informer without one.
func keep(obj any) (any, error) { return obj, nil }

// wholeIndexers are the indexes of a factory's pod informer (namespace),
// plus the drain check's (node).
var wholeIndexers = cache.Indexers{
	cache.NamespaceIndex: cache.MetaNamespaceIndexFunc,
	ByNode:               func(obj any) ([]string, error) { return []string{obj.(*corev1.Pod).Spec.NodeName}, nil },
}

// BenchmarkPodCache measures what the drain check's pod informer cache
// costs: the live heap per pod of a cache filled through TrimPod, and,
// to compare, of one that keeps whole pods (an informer without the
// transform). docs/benchmarks.md records the figures.
//
//	LIKEN_BENCH=full go test -run '^$' -bench PodCache -benchtime 1x ./controllers/turns
func BenchmarkPodCache(b *testing.B) {
	n := benchPods()
	for range b.N {
		trimmed := fillCache(b, n, TrimPod, PodIndexers)
		whole := fillCache(b, n, keep, wholeIndexers)
		b.ReportMetric(trimmed, "B/pod")
		b.ReportMetric(whole, "B/pod-untrimmed")
		b.ReportMetric(trimmed*float64(n)/(1<<20), "MiB")
		b.ReportMetric(float64(n), "pods")
		b.Logf("%d pods: %.0f B per pod trimmed (%.1f MiB), %.0f B per pod whole (%.1f MiB): %.1f x smaller",
			n, trimmed, trimmed*float64(n)/(1<<20), whole, whole*float64(n)/(1<<20), whole/trimmed)
	}
}

// The transform's cache is several times smaller than one of whole pods
// (the smoke of BenchmarkPodCache).
func TestPodCacheIsSmall(t *testing.T) {
	trimmed := fillCache(t, 2000, TrimPod, PodIndexers)
	whole := fillCache(t, 2000, keep, wholeIndexers)
	t.Logf("%.0f B per pod trimmed, %.0f B whole", trimmed, whole)
	assert.Assert(t, trimmed*4 < whole, "trimmed %.0f B per pod, whole %.0f B", trimmed, whole)
	assert.Assert(t, trimmed < 1024, "trimmed %.0f B per pod", trimmed)
}
