package lab

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"liken.sh/liken/cli/lab/controlplane"
)

// exitedPID returns the PID of a process that has exited and been reaped.
func exitedPID(t *testing.T) int {
	t.Helper()
	c := exec.Command("true")
	assert.NilError(t, c.Run())
	return c.Process.Pid
}

// TestLabStatusReportsADownLab: liken lab status exits non-zero, naming
// each process that exited and the commands to run, for a lab whose
// processes are gone; machines powered off and cluster-operator copies
// between two starts (their supervisors stand for them) do not count.
func TestLabStatusReportsADownLab(t *testing.T) {
	self := os.Getpid()
	alive := controlplane.Process{Kind: "kube-apiserver", Name: "kube-apiserver", PID: self, Started: controlplane.ProcessStart(self), Log: "/l/apiserver.log"}
	dead := exitedPID(t)
	for _, tc := range []struct {
		name      string
		processes []controlplane.Process
		err       []string
	}{
		{name: "every process runs", processes: []controlplane.Process{alive,
			{Kind: KindMachine, Name: "node-2", PID: 0},         // powered off
			{Kind: KindOperator, Name: "operator-1", PID: dead}, // between two starts
			{Kind: KindSupervisor, Name: "operator-1", PID: self, Started: controlplane.ProcessStart(self)}}},
		{name: "the API server exited", processes: []controlplane.Process{
			{Kind: "etcd", Name: "etcd", PID: self, Started: controlplane.ProcessStart(self)},
			{Kind: "kube-apiserver", Name: "kube-apiserver", PID: dead, Log: "/l/apiserver.log"},
			{Kind: KindMachine, Name: "node-1", PID: dead, Log: "/l/node-1.log"}},
			err: []string{"lab t is down: 2 of its 3 processes have exited:\n" +
				"  kube-apiserver kube-apiserver (pid " + itoa(dead) + "); its log: /l/apiserver.log\n" +
				"  machine node-1 (pid " + itoa(dead) + "); its log: /l/node-1.log\n" +
				"Start it again with liken lab up --name t (it stops what is left of this lab first), or remove it with liken lab down --name t"}},
		{name: "a PID now another program's is no lab process", processes: []controlplane.Process{
			{Kind: "etcd", Name: "etcd", PID: self, Started: "another-boot/1"}},
			err: []string{"lab t is down: all of its 1 processes have exited (the computer restarted, or they were killed)\nStart it again with liken lab up --name t"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			t.Setenv("LIKEN_LAB_HOME", home)
			st := &State{Name: "t", Dir: filepath.Join(home, "t"), Kubeconfig: "/l/kubeconfig", Processes: tc.processes}
			assert.NilError(t, os.MkdirAll(st.Dir, 0o700))
			assert.NilError(t, st.Save())
			for _, format := range []string{"", "json"} {
				cmd := newStatusCommand()
				var out bytes.Buffer
				cmd.SetOut(&out)
				cmd.SetArgs([]string{"--name", "t", "-o", format})
				err := cmd.Execute()
				assert.Check(t, is.Contains(out.String(), "kubeconfig"), "the state is printed either way")
				if len(tc.err) == 0 {
					assert.NilError(t, err)
					continue
				}
				assert.Assert(t, err != nil, "status exited 0 for a lab that is down")
				for _, want := range tc.err {
					assert.Check(t, is.Contains(err.Error(), want))
				}
			}
		})
	}
}
