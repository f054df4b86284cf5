package api

import (
	"context"
	"os/exec"
	"strings"
)

func kubectlStdin(ctx context.Context, kubeconfig, doc string) (string, error) {
	cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", kubeconfig, "create", "-f", "-")
	cmd.Stdin = strings.NewReader(doc)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
