// Package layer builds, reads and checks deployment layers: the cluster identity, the archive format, and the liken layer command.
package layer

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/internal/cmdutil"
	"liken.sh/liken/internal/atomicfile"
	"liken.sh/liken/internal/pki"
)

// NewCommand returns the liken layer command and its subcommands.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "layer",
		Short: "Create the cluster identity, pack or inspect layers, issue admin kubeconfigs",
		Long: `A deployment layer is the small archive every machine boots with, next to
the read-only OS image. It holds the Cluster document, the Machine
documents, the cluster identity (its certificate authorities and key
pairs) and each machine's join token.

Generate the identity once per cluster and keep it secret; pack a layer
whenever you install machines; inspect a layer to see what it holds without
revealing a secret.

The archive is a gzip-compressed tar of regular files, each mode 0600:

  layer.yaml                 format (liken.sh/layer/v1), cluster and machine names
  cluster.yaml               the Cluster document
  machines/<name>.yaml       one Machine document per machine
  identity/server-ca.crt     and .key: the API server's certificate authority
  identity/client-ca.crt     and .key: clients' certificate authority
  identity/request-header-ca.crt  and .key: the front proxy's
  identity/etcd/server-ca.crt     and .key: the datastore's
  identity/etcd/peer-ca.crt       and .key: between datastore members
  identity/service.key       the service-account signing key
  identity/token             the identity's join token (K10<server CA hash>::<id>.<secret>),
                             every machine's only in a layer packed with --shared-join-token
  join-tokens.yaml           each machine's own join token and its expiry (a worker's
                             layer: its own only)

Readers refuse absolute paths, .., links, devices, unexpected members and
oversized members or archives, naming the member.`,
		Example: `  # Create the identity of a new cluster
  liken layer generate ./mycluster-identity --cluster mycluster

  # Pack the layer from the documents and the identity
  liken layer pack -f cluster.yaml -f machines.yaml --identity ./mycluster-identity -o layer.tgz

  # See what a layer holds
  liken layer inspect layer.tgz

  # Get a day's administrator kubeconfig for the cluster's API
  liken layer kubeconfig --identity ./mycluster-identity --server 10.0.0.10:6443 -o admin.kubeconfig`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newGenerateCommand(), newPackCommand(), newInspectCommand(), newTokenCommand(), newKubeconfigCommand())
	return cmd
}

func newGenerateCommand() *cobra.Command {
	var cluster string
	cmd := &cobra.Command{
		Use:   "generate DIR",
		Short: "Create a new cluster identity: certificate authorities, keys and join token",
		Long: `Create a new cluster identity in DIR: the server, client and request-header
certificate authorities, the datastore's server and peer certificate
authorities, the service-account signing key, and a join token in the full
format k3s accepts (K10<server CA hash>::<id>.<secret>).

Private keys and the token are written with mode 0600, and DIR is created
with mode 0700. A cluster keeps its identity for life: back DIR up and keep
it secret. The command refuses to overwrite an existing identity.`,
		Example: `  # Create the identity of cluster mycluster
  liken layer generate ./mycluster-identity --cluster mycluster`,
		Args: cmdutil.ExactArgs("DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			id, err := GenerateIdentity(GenerateOptions{Cluster: cluster})
			if err != nil {
				return err
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return fmt.Errorf("creating %s: %w", dir, err)
			}
			if err := WriteIdentity(dir, id); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "Wrote a new cluster identity to %s:\n", dir)
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			for _, fp := range id.Fingerprints() {
				mode := "0644"
				if isSecretFile(fp.File) {
					mode = "0600"
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\n", filepath.Join(dir, filepath.FromSlash(fp.File)), mode, fp.Kind)
			}
			tw.Flush()
			fmt.Fprintf(out, "Keep %s secret and backed up: it holds the private keys and the join token, and the cluster keeps them for life.\n", dir)
			fmt.Fprintf(out, "Next: liken layer pack -f cluster.yaml -f machines.yaml --identity %s -o layer.tgz\n", dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&cluster, "cluster", "", "Name of the cluster, recorded in the certificate authorities' names.")
	return cmd
}

func newPackCommand() *cobra.Command {
	var (
		files    []string
		identity string
		output   string
		force    bool
		tokenTTL time.Duration
		shared   bool
	)
	cmd := &cobra.Command{
		Use:   "pack -f FILE... --identity DIR -o FILE",
		Short: "Pack a deployment layer from the Cluster, the Machines and the identity",
		Long: `Pack the deployment layer archive from one Cluster document, its Machine
documents and the cluster identity.

Every document is checked first, with the same rules the API server
applies (schema, allowed values, formats, spec.version in the catalog), and
the fleet as a whole (one Cluster, every Machine in it, at least one
leader, and how the leaders reach each other's control plane). With two
or more leaders, each needs a static address (spec.ports[].addresses) or
the annotations liken.sh/apiserver-url, liken.sh/etcd-client-url and
liken.sh/etcd-peer-url; a sole leader with neither is reached on
127.0.0.1. Any problem is reported with its file, document and field, and
nothing is written.

An even number of leaders is packed with a warning: the datastore
answers only while a majority of its leaders do, so two leaders survive
no more failures than one, and four no more than three. The archive (tar, gzip) is written with mode 0600
because it holds private keys and join tokens.

Each machine gets a join token of its own, bound to its name: with it
cluster-operator approves that machine's certificate and no other, and
the API server accepts it until --join-token-ttl after the pack (a week
by default), the time to install the fleet. A worker's disk holds its own
token only; a leader's holds them all, and its control plane makes them
tokens of the cluster at its first boot. --shared-join-token gives every
machine the identity's one token instead, which can ask for any
Machine's certificate: only for fleets that accept that a copied worker
disk can act as any machine.

Documents may come from several files, from directories (their .yaml,
.yml and .json files), and from kubectl get -o yaml output.`,
		Example: `  # Pack the layer of mycluster
  liken layer pack -f cluster.yaml -f machines.yaml --identity ./mycluster-identity -o layer.tgz

  # Pack every document of a directory, replacing an older layer
  liken layer pack -f ./mycluster/ --identity ./mycluster-identity -o layer.tgz --force`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output == "" {
				return fmt.Errorf("no output file: pass -o FILE, such as -o layer.tgz")
			}
			l, err := Assemble(PackOptions{Files: files, IdentityDir: identity, TokenTTL: tokenTTL, SharedJoinToken: shared})
			if err != nil {
				return err
			}
			for _, w := range exposedSecrets(identity) {
				fmt.Fprintln(cmd.ErrOrStderr(), "Warning:", w)
			}
			leaders := l.Leaders()
			if w := EvenLeadersWarning(leaders); w != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "Warning:", w)
			}
			if err := l.WriteFile(output, force); err != nil {
				return fmt.Errorf("writing %s: %w", output, err)
			}
			// Read the archive back: what was written is what a machine reads.
			if _, err := ReadFile(output, DefaultLimits); err != nil {
				return fmt.Errorf("the written layer does not read back: %w", err)
			}
			st, err := os.Stat(output)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "Wrote %s (%s, mode 0600): Cluster %s on %s, %s (%s, %s).\n",
				output, cmdutil.HumanBytes(st.Size()), l.Cluster.Name, l.Cluster.Cluster.Spec.Version,
				cmdutil.Plural(len(l.Machines), "machine", "machines"), cmdutil.Plural(leaders, "leader", "leaders"),
				cmdutil.Plural(len(l.Machines)-leaders, "worker", "workers"))
			if shared {
				fmt.Fprintf(out, "Every machine joins with the identity's shared join token, which may ask for any Machine's certificate.\n")
			} else if len(l.Tokens) > 0 {
				fmt.Fprintf(out, "Each machine joins with a token of its own, valid until %s: install the machines before then, or pack again.\n",
					l.Tokens[0].Expires.UTC().Format("2006-01-02 15:04 MST"))
			}
			fmt.Fprintf(out, "It holds private keys and join tokens: keep it secret. See what it holds with: liken layer inspect %s\n", output)
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "File or directory of Cluster and Machine documents (repeatable).")
	cmd.Flags().StringVar(&identity, "identity", "", "Directory of the cluster identity (written by liken layer generate).")
	cmd.Flags().StringVarP(&output, "output", "o", "", "Archive to write, such as layer.tgz.")
	cmd.Flags().BoolVar(&force, "force", false, "Replace the output file if it exists.")
	cmd.Flags().DurationVar(&tokenTTL, "join-token-ttl", DefaultJoinTokenTTL, "How long each machine's own join token is valid: the time to install the fleet. A machine needs it for its first join only.")
	cmd.Flags().BoolVar(&shared, "shared-join-token", false, "Let every machine join with the identity's one join token, which may then ask for the certificate of any Machine (a copied worker disk can act as any machine). Without it each machine gets a token of its own.")
	_ = cmd.MarkFlagFilename("filename", "yaml", "yml", "json")
	_ = cmd.MarkFlagDirname("identity")
	return cmd
}

// exposedSecrets lists identity files that others may read.
func exposedSecrets(dir string) []string {
	var out []string
	for _, n := range IdentityFiles() {
		if !isSecretFile(n) {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(n))
		if st, err := os.Stat(p); err == nil && st.Mode().Perm()&0o077 != 0 {
			out = append(out, fmt.Sprintf("%s is readable by others (mode %04o): chmod 600 %s", p, st.Mode().Perm(), p))
		}
	}
	return out
}

func newInspectCommand() *cobra.Command {
	var documents bool
	cmd := &cobra.Command{
		Use:   "inspect FILE",
		Short: "Show what a deployment layer holds, without revealing a secret",
		Long: `Check a deployment layer archive as a machine would, then show what it
holds: the Cluster, the Machines, and the identity's certificates and keys
by fingerprint. Private keys and the join token are never shown.

Certificate fingerprints are SHA-256 over the certificate, as
openssl x509 -noout -fingerprint -sha256 prints them; key fingerprints are
SHA-256 over the public key (PKIX, DER).`,
		Example: `  # Summarise a layer
  liken layer inspect layer.tgz

  # Also print the Cluster and Machine documents
  liken layer inspect layer.tgz --documents`,
		Args: cmdutil.ExactArgs("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := ReadFile(args[0], DefaultLimits)
			if err != nil {
				return err
			}
			return l.Describe(cmd.OutOrStdout(), args[0], documents)
		},
	}
	cmd.Flags().BoolVar(&documents, "documents", false, "Also print the Cluster and Machine documents.")
	return cmd
}

func newKubeconfigCommand() *cobra.Command {
	var (
		identity, server, user, output string
		groups                         []string
		validity                       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "kubeconfig --identity DIR --server URL -o FILE",
		Short: "Write an administrator's kubeconfig signed by the cluster identity's client CA",
		Long: `Write a kubeconfig for the cluster's API at --server: it trusts the
identity's server CA, and authenticates with a client certificate issued
now by the identity's client CA, naming --user and, as its groups,
--group (system:masters unless told otherwise: allowed everything).

--server is the Cluster's spec.network.endpoint, host:port or URL; it is
normalised as the machines normalise it (https://, and port 443 for an
https URL without one).

The certificate is valid for --valid-for, a day unless told otherwise. Keep
it short: a certificate cannot be revoked, short of replacing the client
CA on every machine, so a copied kubeconfig gives its holder the cluster
until it expires. Issue another when it has.

The command needs the identity's private keys (the folder liken layer
generate wrote, not a worker's layer) and never replaces a file: FILE is
created with mode 0600. It prints the line that points kubectl at FILE,
so that eval "$(liken layer kubeconfig ...)" sets KUBECONFIG.`,
		Example: `  # A day's administrator kubeconfig for mycluster's API
  liken layer kubeconfig --identity ./mycluster-identity --server 10.0.0.10:6443 -o admin.kubeconfig

  # Point kubectl at it in this shell
  export KUBECONFIG=$PWD/admin.kubeconfig

  # An hour's kubeconfig for user alice in group ops (bind ops to a role first)
  liken layer kubeconfig --identity ./mycluster-identity --server 10.0.0.10:6443 --user alice --group ops --valid-for 1h -o alice.kubeconfig`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case output == "":
				return fmt.Errorf("no output file: pass -o FILE, such as -o admin.kubeconfig")
			case identity == "":
				return fmt.Errorf("no identity: pass --identity DIR, the folder liken layer generate wrote")
			}
			if _, err := os.Lstat(output); err == nil {
				return fmt.Errorf("%s already exists: remove it or choose another name; liken layer kubeconfig never replaces a file", output)
			}
			if _, err := APIServerURL(server); err != nil {
				return err
			}
			id, err := loadSigningIdentity(identity)
			if err != nil {
				return err
			}
			if len(groups) == 0 {
				groups = []string{AdminGroup}
			}
			k, err := AdminKubeconfig(id, AdminRequest{Server: server, User: user, Groups: groups, Now: time.Now(), Validity: validity})
			if err != nil {
				return err
			}
			b, err := pki.EncodeKubeconfig(k)
			if err != nil {
				return err
			}
			if err := atomicfile.WriteNew(output, b, 0o600); err != nil {
				if errors.Is(err, fs.ErrExist) {
					return fmt.Errorf("%s already exists: remove it or choose another name; liken layer kubeconfig never replaces a file", output)
				}
				return fmt.Errorf("writing %s: %w", output, err)
			}
			abs, err := filepath.Abs(output)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "Wrote %s (mode 0600): user %s in %s for %s, valid until %s.\n"+
				"Whoever holds it acts as %s until then; it cannot be revoked: keep it private and delete it when done.\n",
				output, user, strings.Join(groups, ", "), k.Server, k.Client.Cert.NotAfter.Local().Format("2006-01-02 15:04 MST"), user)
			fmt.Fprintf(cmd.OutOrStdout(), "export KUBECONFIG=%s\n", cmdutil.ShellQuote(abs))
			return nil
		},
	}
	cmd.Flags().StringVar(&identity, "identity", "", "Directory of the cluster identity (written by liken layer generate), with its private keys.")
	cmd.Flags().StringVar(&server, "server", "", "The API server: the Cluster's spec.network.endpoint, host:port or URL.")
	cmd.Flags().StringVar(&user, "user", DefaultAdminUser, "User name in the certificate (its common name).")
	cmd.Flags().StringArrayVar(&groups, "group", nil, "Group in the certificate (its organization; repeatable). Default "+AdminGroup+".")
	cmd.Flags().DurationVar(&validity, "valid-for", DefaultAdminValidity, "How long the certificate is valid; it cannot be revoked, so keep this short.")
	cmd.Flags().StringVarP(&output, "output", "o", "", "Kubeconfig file to create, such as admin.kubeconfig; never replaced.")
	_ = cmd.MarkFlagDirname("identity")
	return cmd
}

// Describe prints a summary of the layer: Cluster, Machines and identity
// fingerprints, and with documents, the documents themselves. It never
// prints a private key or the token.
func (l *Layer) Describe(w io.Writer, name string, documents bool) error {
	c := l.Cluster.Cluster
	fmt.Fprintf(w, "Layer:     %s (%s)\n", name, Format)
	fmt.Fprintf(w, "Cluster:   %s\n", c.Name)
	fmt.Fprintf(w, "Version:   %s\n", c.Spec.Version)
	fmt.Fprintf(w, "Channel:   %s\n", c.Spec.Releases.Source)
	fmt.Fprintf(w, "Endpoint:  %s\n", c.Spec.Network.Endpoint)
	fmt.Fprintf(w, "Machines:  %d\n", len(l.Machines))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tROLE\tPOLICY\tPORTS\tDISKS\tMODULES")
	for _, d := range l.Machines {
		m := d.Machine
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%d\n", m.Name, m.Spec.Role, m.Spec.RebootPolicy, portNames(m), len(m.Spec.Disks), len(m.Spec.KernelModules))
	}
	tw.Flush()
	l.describeJoining(w, time.Now())
	switch {
	case l.Identity.HasPrivateKeys():
		fmt.Fprintln(w, "Identity:")
	case l.SharedJoinToken:
		fmt.Fprintln(w, "Identity:  certificates and the shared join token only, no private key (a worker's copy: it can join, never sign)")
	default:
		fmt.Fprintln(w, "Identity:  certificates only, no private key (a worker's copy: it joins with its own token, never signs)")
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  FILE\tKIND\tDETAIL\tSHA256")
	for _, fp := range l.Identity.Fingerprints() {
		sum := fp.SHA256
		if sum == "" {
			sum = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", fp.File, fp.Kind, fp.Detail, sum)
	}
	tw.Flush()
	if documents {
		fmt.Fprintf(w, "\n# %s\n%s", ClusterMember, l.Cluster.YAML)
		for _, d := range l.Machines {
			fmt.Fprintf(w, "---\n# %s%s.yaml\n%s", MachinesDir, d.Name, d.YAML)
		}
	}
	return nil
}

// describeJoining says how the layer's machines join, and each worker's
// token by its id (the requester system:bootstrap:<id> of its certificate
// request) and expiry; never a token's secret.
func (l *Layer) describeJoining(w io.Writer, now time.Time) {
	if l.SharedJoinToken {
		fmt.Fprintln(w, "Joining:   every machine with the identity's shared join token, which may ask for the certificate of any Machine (packed with --shared-join-token)")
		return
	}
	fmt.Fprintln(w, "Joining:   each machine with a join token of its own, which gets only that machine's certificate (a leader of liken's control plane issues its own)")
	if len(l.Tokens) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  MACHINE\tTOKEN ID\tEXPIRES")
	for _, t := range l.Tokens {
		id, _, _ := t.Split()
		when := t.Expires.UTC().Format("2006-01-02 15:04 MST")
		if !now.Before(t.Expires) {
			when += " (expired: liken layer pack makes new tokens)"
		} else {
			when += " (in " + duration.HumanDuration(t.Expires.Sub(now)) + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", t.Machine, id, when)
	}
	tw.Flush()
}

func portNames(m *v1alpha1.Machine) string {
	if len(m.Spec.Ports) == 0 {
		return "-"
	}
	var names []string
	for _, p := range m.Spec.Ports {
		names = append(names, p.Name)
	}
	return strings.Join(names, ",")
}
