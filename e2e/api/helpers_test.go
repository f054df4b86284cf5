package api

import (
	"context"
	"os/exec"
	"strings"

	"liken.sh/liken/internal/srctree"
)

func kubectlStdin(ctx context.Context, kubeconfig, doc string) (string, error) {
	kubectl, err := srctree.Binary("kubectl")
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfig, "create", "-f", "-")
	cmd.Stdin = strings.NewReader(doc)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
