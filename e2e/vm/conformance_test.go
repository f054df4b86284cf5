//go:build vmconformance

package vme2e

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/e2e/internal/userlab"
	"liken.sh/liken/internal/srctree"
)

// leftOut are the [sig-network] [Conformance] tests the run leaves out,
// each with why; docs/benchmarks.md lists them too.
var leftOut = map[string]string{}

// TestUpstreamNetworkConformance: Kubernetes' own [sig-network]
// [Conformance] tests, built from the pinned sources (make e2e-network),
// pass on a VM lab of two liken machines, a leader and a worker. The
// images the tests run are liken's own builds of them, served by the
// lab's registry and pulled by every machine through the Cluster's
// settings.registryMirrors; --kube-test-repo-list points the tests at it.
func TestUpstreamNetworkConformance(t *testing.T) {
	repo, err := srctree.Find()
	assert.NilError(t, err)
	e2eDir := filepath.Join(repo, "_output", "e2e")
	suite := filepath.Join(e2eDir, "e2e-network.test")
	for _, f := range []string{suite, filepath.Join(e2eDir, "images", "index.json")} {
		_, err := os.Stat(f)
		assert.NilError(t, err, "Kubernetes' network suite and its images: run make e2e-network (as root) first")
	}
	// LIKEN_CONFORMANCE_FOCUS narrows the run to the tests whose names
	// match it (a Ginkgo focus), to run again one that failed.
	focus, floor := `\[sig-network\].*\[Conformance\]`, 40
	if f := os.Getenv("LIKEN_CONFORMANCE_FOCUS"); f != "" {
		focus, floor = f, 1
	}
	l := userlab.Up(t, userlab.VM, "conform", 2, 1)
	ctx := t.Context()

	// The images, into the lab's registry.
	start := time.Now()
	assert.NilError(t, copyLayout(filepath.Join(e2eDir, "images"), l.St.RegistryDir))
	repoList := filepath.Join(t.TempDir(), "repo-list.yaml")
	assert.NilError(t, os.WriteFile(repoList, []byte(fmt.Sprintf("promoterE2eRegistry: %[1]s/e2e-test-images\ngcRegistry: %[1]s\n", l.St.Registry)), 0o644))

	// Each machine pulls the images before the run, so that the tests'
	// own time limits (5 minutes for a pod to start) do not count the
	// first pull on an emulated machine.
	labels := map[string]string{"app": "e2e-images"}
	var inits []corev1.Container
	for i, img := range []string{"e2e-test-images/agnhost:2.66.1", "e2e-test-images/glibc-dns-testing:2.1.1", "e2e-test-images/nginx:1.27.0-2", "e2e-test-images/busybox:1.37.0-2"} {
		inits = append(inits, corev1.Container{Name: fmt.Sprintf("image-%d", i), Image: l.St.Registry + "/" + img, Command: []string{"true"}})
	}
	_, err = l.Kube.AppsV1().DaemonSets("default").Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-images", Namespace: "default"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Tolerations:    []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					InitContainers: inits,
					Containers:     []corev1.Container{{Name: "pause", Image: l.St.Registry + "/pause:3.10.2"}},
				},
			},
		},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ds, err := l.Kube.AppsV1().DaemonSets("default").Get(ctx, "e2e-images", metav1.GetOptions{})
		if err != nil {
			return poll.Continue("the DaemonSet: %v", err)
		}
		if ds.Status.DesiredNumberScheduled != 2 || ds.Status.NumberReady != 2 {
			return poll.Continue("machines with the images: %d of %d", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled)
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Minute), poll.WithDelay(5*time.Second))
	assert.NilError(t, l.Kube.AppsV1().DaemonSets("default").Delete(ctx, "e2e-images", metav1.DeleteOptions{}))
	t.Logf("both machines pulled the tests' images from the lab's registry (%s) in %s", l.St.Registry, time.Since(start).Round(time.Second))

	// The run.
	report := filepath.Join(e2eDir, "report")
	assert.NilError(t, os.RemoveAll(report))
	assert.NilError(t, os.MkdirAll(report, 0o755))
	args := []string{
		"--kubeconfig=" + l.Kubeconfig,
		"--provider=skeleton",
		"--kubectl-path=" + filepath.Join(filepath.Dir(fleetsim.Binary(t, "liken")), "kubectl"),
		"--kube-test-repo-list=" + repoList,
		"--report-dir=" + report,
		"--ginkgo.focus=" + focus,
		"--ginkgo.timeout=4h",
		"--ginkgo.no-color",
		"--ginkgo.v",
	}
	if len(leftOut) > 0 {
		var skip []string
		for name := range leftOut {
			skip = append(skip, regexp.QuoteMeta(name))
		}
		args = append(args, "--ginkgo.skip="+strings.Join(skip, "|"))
	}
	logFile := filepath.Join(report, "e2e.log")
	log, err := os.Create(logFile)
	assert.NilError(t, err)
	defer log.Close()
	cmd := exec.CommandContext(ctx, suite, args...)
	cmd.Stdout, cmd.Stderr = log, log
	start = time.Now()
	runErr := cmd.Run()
	took := time.Since(start).Round(time.Second)

	cases := readJUnit(t, filepath.Join(report, "junit_01.xml"))
	var passed, failed []string
	for _, c := range cases {
		switch {
		case c.Status == "skipped" || c.Status == "pending":
		case !strings.Contains(c.Name, "[Conformance]"):
			// The suite's own steps (before and after the tests): a
			// failure there is the run's.
			if c.Status != "passed" {
				failed = append(failed, c.Name)
			}
		case c.Status == "passed":
			passed = append(passed, c.Name)
		default: // failed, panicked, timedout, interrupted
			failed = append(failed, c.Name)
		}
	}
	slices.Sort(failed)
	t.Logf("Kubernetes' [sig-network] [Conformance] tests: %d ran, %d passed, %d failed, %d left out, in %s (the log: %s)",
		len(passed)+len(failed), len(passed), len(failed), len(leftOut), took, logFile)
	for _, f := range failed {
		t.Logf("failed: %s", f)
	}
	assert.Assert(t, len(failed) == 0 && runErr == nil, "%d of Kubernetes' network conformance tests failed (the suite: %v); see %s", len(failed), runErr, logFile)
	assert.Assert(t, len(passed) >= floor, "only %d conformance tests ran: the focus %q matched fewer than %d", len(passed), focus, floor)
}

// testCase is one test of a JUnit report, as Ginkgo writes it.
type testCase struct {
	Name   string `xml:"name,attr"`
	Status string `xml:"status,attr"`
}

// readJUnit reads the tests of a JUnit report.
func readJUnit(t *testing.T, path string) []testCase {
	t.Helper()
	f, err := os.Open(path)
	assert.NilError(t, err, "the suite's report")
	defer f.Close()
	var doc struct {
		Suites []struct {
			Cases []testCase `xml:"testcase"`
		} `xml:"testsuite"`
	}
	assert.NilError(t, xml.NewDecoder(f).Decode(&doc))
	var cases []testCase
	for _, s := range doc.Suites {
		cases = append(cases, s.Cases...)
	}
	return cases
}

// copyLayout copies the OCI image layout folder src into dst, blobs
// first and index.json last, so the registry never serves an image whose
// blobs are missing.
func copyLayout(src, dst string) error {
	var index string
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == "index.json" {
			index = p
			return nil
		}
		return copyFile(p, filepath.Join(dst, rel))
	})
	if err != nil {
		return err
	}
	return copyFile(index, filepath.Join(dst, "index.json"))
}

func copyFile(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.Link(src, dst+".tmp"); err != nil {
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(dst + ".tmp")
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
	}
	return os.Rename(dst+".tmp", dst)
}
