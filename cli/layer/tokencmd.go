package layer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"liken.sh/liken/cli/internal/cmdutil"
	"liken.sh/liken/node/controlplane"
)

func newTokenCommand() *cobra.Command {
	var (
		ttl   time.Duration
		print bool
	)
	cmd := &cobra.Command{
		Use:   "token LAYER [MACHINE...]",
		Short: "Give machines new join tokens, or print join tokens as Secrets to apply",
		Long: `Give each named machine a new join token of its own in the layer (a
machine installed again, or one whose token expired before its install),
and print the new tokens' Secrets for kubectl apply -f -: a running
cluster takes a token only once it has its Secret, and a leader's
control-plane init creates those of its own layer once, at its first boot.
The other machines' tokens, and every other byte of the layer, stay as
they are. Install the machine from the layer written.

With --print, change nothing and print the Secrets of the named
machines' tokens (all of them when none is named): what a control plane
that is not liken's needs to let the machines join.

A token's Secret puts it in the group its machine's name binds it to;
cluster-operator approves with it that machine's certificate only.`,
		Example: `  # Install worker-3 again with a new token
  liken layer token layer.tgz worker-3 | kubectl apply -f -
  liken install --layer layer.tgz --machine worker-3 ...

  # Let a control plane that is not liken's take every machine's token
  liken layer token layer.tgz --print | kubectl apply -f -`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, machines := args[0], args[1:]
			l, err := ReadFile(path, DefaultLimits)
			if err != nil {
				return err
			}
			if l.SharedJoinToken {
				return fmt.Errorf("%s was packed with --shared-join-token: its machines share the identity's token and have none of their own; pack it again without it", path)
			}
			if !print && len(machines) == 0 {
				return errors.New("name the machines to give new join tokens (or pass --print to print the layer's tokens)")
			}
			if ttl <= 0 {
				return fmt.Errorf("--ttl %s: a join token's lifetime must be more than 0", ttl)
			}
			for _, m := range machines {
				if l.Machine(m) == nil {
					return fmt.Errorf("the layer has no Machine %q", m)
				}
			}
			if !print {
				if !l.Identity.HasPrivateKeys() {
					return fmt.Errorf("%s is a worker's copy of the layer: give new tokens in the fleet's layer (the one liken layer pack wrote)", path)
				}
				if err := l.renewTokens(machines, time.Now().Add(ttl)); err != nil {
					return err
				}
				if err := l.WriteFile(path, true); err != nil {
					return fmt.Errorf("writing %s: %w", path, err)
				}
				for _, m := range machines {
					t, _ := l.Token(m)
					fmt.Fprintf(cmd.ErrOrStderr(), "Machine %s has a new join token in %s, valid until %s: apply the Secret below to the cluster, then install the machine from %s.\n",
						m, path, t.Expires.UTC().Format("2006-01-02 15:04 MST"), path)
				}
			}
			n, err := l.writeSecrets(cmd.OutOrStdout(), machines, time.Now())
			if err != nil {
				return err
			}
			if print {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s printed (expired tokens left out).\n", cmdutil.Plural(n, "join token Secret", "join token Secrets"))
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", DefaultJoinTokenTTL, "How long a new join token is valid.")
	cmd.Flags().BoolVar(&print, "print", false, "Change nothing: print the Secrets of the named machines' tokens (all when none is named).")
	return cmd
}

// renewTokens gives each of machines a new join token expiring at expires.
func (l *Layer) renewTokens(machines []string, expires time.Time) error {
	for _, m := range machines {
		tok, err := NewJoinToken(nil)
		if err != nil {
			return err
		}
		t := controlplane.MachineToken{Machine: m, Token: tok, Expires: expires.UTC().Truncate(time.Second)}
		if i := slices.IndexFunc(l.Tokens, func(t controlplane.MachineToken) bool { return t.Machine == m }); i >= 0 {
			l.Tokens[i] = t
		} else {
			l.Tokens = append(l.Tokens, t)
		}
	}
	slices.SortFunc(l.Tokens, func(a, b controlplane.MachineToken) int {
		return slices.Index(l.machineNames(), a.Machine) - slices.Index(l.machineNames(), b.Machine)
	})
	return nil
}

func (l *Layer) machineNames() []string {
	var out []string
	for _, d := range l.Machines {
		out = append(out, d.Name)
	}
	return out
}

// writeSecrets writes, as a YAML list of documents, the bootstrap token
// Secrets of the named machines' tokens (every token when none is named)
// that have not expired at now, and returns how many.
func (l *Layer) writeSecrets(w io.Writer, machines []string, now time.Time) (int, error) {
	var buf bytes.Buffer
	n := 0
	for _, t := range l.Tokens {
		if len(machines) > 0 && !slices.Contains(machines, t.Machine) || !now.Before(t.Expires) {
			continue
		}
		s, err := t.Secret()
		if err != nil {
			return 0, err
		}
		s.APIVersion, s.Kind = "v1", "Secret"
		b, err := yaml.Marshal(s)
		if err != nil {
			return 0, err
		}
		buf.WriteString("---\n")
		buf.Write(b)
		n++
	}
	_, err := w.Write(buf.Bytes())
	return n, err
}
