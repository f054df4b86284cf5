package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/internal/atomicfile"
)

// KindSupervisor is the process that keeps one cluster-operator copy
// running, as the kubelet restarts a pod's container.
const KindSupervisor = "operator-supervisor"

// operatorRestartDelay is how long the supervisor waits before it starts a
// copy that exited again.
const operatorRestartDelay = 2 * time.Second

// newOperatorCommand runs one cluster-operator copy and starts it again
// whenever it exits: a copy that loses the lease exits by design, and in a
// cluster the kubelet would restart it. The running copy's PID is kept in
// <lab>/<name>.pid, so liken lab status shows the real operator process.
func newOperatorCommand() *cobra.Command {
	var labDir, name string
	cmd := &cobra.Command{
		Use:    "operator --lab-dir DIR --name NAME -- CLUSTER-OPERATOR [ARGS...]",
		Short:  "Keep one cluster-operator copy running (started by liken lab up)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return supervise(cmd.Context(), labDir, name, args, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&labDir, "lab-dir", "", "the lab's folder")
	cmd.Flags().StringVar(&name, "name", "", "the copy's name")
	_ = cmd.MarkFlagRequired("lab-dir")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

func supervise(ctx context.Context, labDir, name string, args []string, out interface{ Write([]byte) (int, error) }) error {
	pidFile := filepath.Join(labDir, name+".pid")
	for ctx.Err() == nil {
		c := exec.Command(args[0], args[1:]...)
		c.Stdout, c.Stderr = out, out
		if err := c.Start(); err != nil {
			return err
		}
		if err := atomicfile.Write(pidFile, []byte(strconv.Itoa(c.Process.Pid)), 0o644); err != nil {
			_ = c.Process.Kill()
			return err
		}
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case <-ctx.Done():
			_ = c.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = c.Process.Kill()
				<-done
			}
			return nil
		case err := <-done:
			var exit *exec.ExitError
			code := 0
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			}
			fmt.Fprintf(out, "%s lab: %s exited (code %d); starting it again in %s\n",
				time.Now().UTC().Format(time.RFC3339), name, code, operatorRestartDelay)
		}
		if sleep(ctx, operatorRestartDelay) != nil {
			return nil
		}
	}
	return nil
}

// refreshOperatorPIDs reads the PIDs the supervisors recorded.
func (st *State) refreshOperatorPIDs() {
	for i := range st.Processes {
		p := &st.Processes[i]
		if p.Kind != KindOperator {
			continue
		}
		b, err := os.ReadFile(filepath.Join(st.Dir, p.Name+".pid"))
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(string(b)); err == nil && pid != p.PID {
			p.PID, p.Started = pid, controlplane.ProcessStart(pid)
		}
	}
}
