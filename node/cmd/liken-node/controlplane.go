package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"liken.sh/liken/internal/command"
	"liken.sh/liken/manifests"
	"liken.sh/liken/node/controlplane"
	"liken.sh/liken/version"
)

// execFunc replaces the running program, as syscall.Exec does; it returns
// only on failure.
type execFunc func(path string, argv []string, env []string) error

// controlPlaneFlags are the folders the control-plane commands read and
// write; tests point them at temporary folders.
type controlPlaneFlags struct {
	leaderDir string
	setupDir  string
	dataDir   string
	kube      string
	print     bool
	timeout   time.Duration
	// splitTimeout bounds split-check's wait for this leader's member.
	splitTimeout time.Duration
}

// components are the programs of the kube binary that args runs.
var components = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// controlPlaneCommand is liken-node control-plane: what a leader's units
// run around the control plane's components. exec replaces liken-node
// with a component (syscall.Exec outside tests).
func controlPlaneCommand(exec execFunc) *cobra.Command {
	var f controlPlaneFlags
	cp := &cobra.Command{
		Use:   "control-plane",
		Short: "Run a leader's control plane: certificates, etcd's start, the components, init",
		Long: "A machine is a leader exactly when " + filepath.Join(controlplane.LeaderDir, controlplane.ConfigFile) +
			" exists (liken install writes it on a Leader's layer partition). These commands are what the leader's systemd units run.",
	}
	pf := cp.PersistentFlags()
	pf.StringVar(&f.leaderDir, "leader-dir", controlplane.LeaderDir, "the leader's folder on the layer partition: "+controlplane.ConfigFile+" and the cluster identity ("+controlplane.IdentityDir+"/)")
	pf.StringVar(&f.setupDir, "setup-dir", controlplane.SetupDir, "where setup writes the certificates and kubeconfigs, in memory, and etcd-start writes "+controlplane.EtcdEnvFile)

	setup := &cobra.Command{
		Use:   "setup",
		Short: "Issue the control plane's certificates and kubeconfigs from the cluster identity into --setup-dir, and the leader's own as a machine where it has none (at every boot)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, err := f.config()
			if err != nil {
				return err
			}
			identity, now := filepath.Join(f.leaderDir, controlplane.IdentityDir), time.Now()
			if err := controlplane.Setup(cfg, identity, f.setupDir, now); err != nil {
				return err
			}
			return controlplane.IssueMachineCredentials(cfg, identity, controlplane.DefaultMachineCredentials, now)
		},
	}

	etcdStart := &cobra.Command{
		Use:   "etcd-start",
		Short: "Decide how etcd starts and write " + controlplane.EtcdEnvFile + " (before every start of etcd)",
		Long: "Decides how etcd starts (with its data; a new datastore on the first leader; or as a learner) and writes " +
			controlplane.EtcdEnvFile + " into --setup-dir for etcd.service's EnvironmentFile. It waits, without end, while it must. " +
			"The first start in a boot writes " + controlplane.EtcdStartedFile + " beside it: every later start in the same boot " +
			"(etcd exited, or was restarted) is a restart, and asks the other leaders whether this member was removed.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.etcdStart(cmd) },
	}
	etcdStart.Flags().StringVar(&f.dataDir, "data-dir", controlplane.EtcdDataDir, "etcd's data folder (etcd's --data-dir)")

	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Promote this machine's etcd member if it is a learner, then make the join token's Secret and the control plane's bindings (idempotent)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return f.init(cmd) },
	}
	initCmd.Flags().StringVar(&f.dataDir, "data-dir", controlplane.EtcdDataDir, "etcd's data folder (etcd's --data-dir), where init records the member's datastore")
	initCmd.Flags().DurationVar(&f.timeout, "timeout", controlplane.DefaultInitTimeout, "how long init tries before it fails: a learner promotes once it caught up, and the API answers once its member votes")

	splitCheck := &cobra.Command{
		Use:   "split-check",
		Short: "Fail when this leader's datastore split off the fleet's (before the API server starts)",
		Long: "Waits until this leader's etcd member answers, then asks the other leaders which datastore they answer for. " +
			"It fails at once when this leader's datastore split off the fleet's (the fleet's is the one a majority of the leaders answer for), " +
			"so that kube-apiserver.service, which runs it first, never serves it; systemd tries again 5 s later. A learner passes: it joined through the fleet's member list.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.splitCheck(cmd) },
	}
	splitCheck.Flags().DurationVar(&f.splitTimeout, "timeout", time.Minute, "how long to wait for this leader's etcd member to answer before failing")

	args := &cobra.Command{
		Use:       "args " + strings.Join(components, "|"),
		Short:     "Run a component of the kube binary with this leader's flags",
		Long:      "Replaces liken-node with `kube <component> <flags>`, the flags this leader's component runs with, so that a unit names no flag. The environment passes on (etcd reads " + controlplane.EtcdEnvFile + "'s variables from it).",
		Args:      cobra.ExactArgs(1),
		ValidArgs: components,
		RunE: func(cmd *cobra.Command, args []string) error {
			argv, err := f.componentArgv(args[0])
			if err != nil {
				return err
			}
			if f.print {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), strings.Join(argv, " "))
				return err
			}
			// exec returns only when it failed.
			switch err := exec(f.kube, argv, os.Environ()); {
			case errors.Is(err, fs.ErrNotExist):
				return fmt.Errorf("running %s: %w; the image carries the kube binary at /usr/bin/kube, or pass --kube", f.kube, err)
			case err != nil:
				return fmt.Errorf("running %s: %w", f.kube, err)
			}
			return nil
		},
	}
	args.Flags().StringVar(&f.kube, "kube", "/usr/bin/kube", "the kube binary, which runs etcd and the Kubernetes components")
	args.Flags().BoolVar(&f.print, "print", false, "print the command line instead of running it")

	cp.AddCommand(setup, etcdStart, initCmd, splitCheck, args)
	return cp
}

// config loads the leader's config.yaml, saying so when this machine is no
// leader.
func (f *controlPlaneFlags) config() (controlplane.Config, error) {
	p := filepath.Join(f.leaderDir, controlplane.ConfigFile)
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return controlplane.Config{}, fmt.Errorf("this machine is no leader: %s is missing (liken install writes it on a Leader's disk)", p)
	}
	return controlplane.Load(p)
}

// setupFile is a file setup wrote, or an error that says to run setup.
func (f *controlPlaneFlags) setupFile(name string) (string, error) {
	p := filepath.Join(f.setupDir, filepath.FromSlash(name))
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: run liken-node control-plane setup first", err)
	}
	return p, nil
}

// etcdClient is liken-node's client of the leaders' etcd members, with the
// certificate setup wrote.
func (f *controlPlaneFlags) etcdClient() (*controlplane.EtcdClient, error) {
	var files []string
	for _, name := range []string{controlplane.NodeEtcdClient.Cert(), controlplane.NodeEtcdClient.Key(), controlplane.EtcdServerCA.Cert()} {
		p, err := f.setupFile(name)
		if err != nil {
			return nil, err
		}
		files = append(files, p)
	}
	return controlplane.NewEtcdClientFromFiles(files[0], files[1], files[2])
}

// etcdStart decides how etcd starts and writes etcd.env. The marker file
// tells a restart within this boot from the boot's first start: the setup
// folder is memory, empty at every boot.
func (f *controlPlaneFlags) etcdStart(cmd *cobra.Command) error {
	cfg, err := f.config()
	if err != nil {
		return err
	}
	self, err := cfg.Self()
	if err != nil {
		return err
	}
	etcd, err := f.etcdClient()
	if err != nil {
		return err
	}
	caFile, err := f.setupFile(controlplane.ServerCA.Cert())
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	serverCA := x509.NewCertPool()
	if !serverCA.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("%s holds no PEM certificate: run liken-node control-plane setup again", caFile)
	}
	var clientURLs []string
	for _, l := range cfg.Leaders {
		clientURLs = append(clientURLs, l.EtcdClient)
	}
	marker := filepath.Join(f.setupDir, controlplane.EtcdStartedFile)
	_, err = os.Stat(marker)
	restart := err == nil
	serverTLS, err := controlplane.MemberDataTLS(f.setupDir)
	if err != nil {
		return err
	}
	if _, err := controlplane.Start(cmd.Context(), controlplane.StartOptions{
		Name:        cfg.Machine,
		PeerURL:     self.EtcdPeer,
		ClientURL:   self.EtcdClient,
		Listen:      fmt.Sprintf(":%d", controlplane.EtcdClientPort),
		ServerTLS:   serverTLS,
		FirstLeader: cfg.FirstLeader == cfg.Machine,
		ClientURLs:  clientURLs,
		Etcd:        etcd,
		Endpoint:    controlplane.NewEndpointProbe(cfg.Endpoint, serverCA),
		Data:        controlplane.DiskData{Dir: f.dataDir},
		Restart:     restart,
		EnvFile:     filepath.Join(f.setupDir, controlplane.EtcdEnvFile),
	}); err != nil {
		return err
	}
	if err := os.WriteFile(marker, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
		return fmt.Errorf("marking etcd started in this boot: %w", err)
	}
	return nil
}

// splitCheck runs controlplane.Health.SplitCheck every 2 s until it
// passes, finds a split, or --timeout passes.
func (f *controlPlaneFlags) splitCheck(cmd *cobra.Command) error {
	cfg, err := f.config()
	if err != nil {
		return err
	}
	h := controlplane.NewHealth(cfg, f.setupDir)
	ctx, cancel := context.WithTimeout(cmd.Context(), f.splitTimeout)
	defer cancel()
	for {
		err := h.SplitCheck(ctx)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, controlplane.ErrSplit):
			return fmt.Errorf("not starting the API server: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not starting the API server: after %s: %w", f.splitTimeout, err)
		case <-time.After(2 * time.Second):
		}
	}
}

// init runs controlplane.Init against the local API server and etcd
// member.
func (f *controlPlaneFlags) init(cmd *cobra.Command) error {
	cfg, err := f.config()
	if err != nil {
		return err
	}
	kubeconfig, err := f.setupFile(controlplane.InitKubeconfig)
	if err != nil {
		return err
	}
	rc, err := command.RESTConfig(kubeconfig, "liken-node/"+version.Version)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	etcd, err := f.etcdClient()
	if err != nil {
		return err
	}
	// The local member first; a learner answers nothing, so then the
	// others, through which it is promoted.
	clientURLs := []string{controlplane.LocalEtcd}
	for _, l := range cfg.Leaders {
		if l.Name != cfg.Machine {
			clientURLs = append(clientURLs, l.EtcdClient)
		}
	}
	dns, err := cfg.ClusterDNSOrDefault()
	if err != nil {
		return err
	}
	addons, err := manifests.DNSObjects(dns)
	if err != nil {
		return err
	}
	tokens, err := controlplane.LoadJoinTokens(filepath.Join(f.leaderDir, controlplane.JoinTokensFile))
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	shared := ""
	if cfg.SharedJoinToken {
		shared = filepath.Join(f.leaderDir, controlplane.IdentityDir, controlplane.TokenFile)
	}
	return controlplane.Init(cmd.Context(), controlplane.InitOptions{
		Addons:          addons,
		Documents:       filepath.Join(f.leaderDir, controlplane.DocumentsFile),
		Dynamic:         dyn,
		Kube:            kube,
		SharedTokenFile: shared,
		JoinTokens:      tokens.Tokens,
		Name:            cfg.Machine,
		ClientURLs:      clientURLs,
		Etcd:            etcd,
		Data:            controlplane.DiskData{Dir: f.dataDir},
		Timeout:         f.timeout,
	})
}

// componentArgv is the command line of a component: the kube binary, the
// component, its flags.
func (f *controlPlaneFlags) componentArgv(component string) ([]string, error) {
	cfg, err := f.config()
	if err != nil {
		return nil, err
	}
	var flags []string
	switch component {
	case "etcd":
		flags, err = controlplane.EtcdArgs(cfg, f.setupDir)
	case "kube-apiserver":
		flags, err = controlplane.APIServerArgs(cfg, f.setupDir)
	case "kube-controller-manager":
		flags, err = controlplane.ControllerManagerArgs(cfg, f.setupDir)
	case "kube-scheduler":
		flags = controlplane.SchedulerArgs(f.setupDir)
	default:
		return nil, fmt.Errorf("unknown component %q: choose one of %s", component, strings.Join(components, ", "))
	}
	if err != nil {
		return nil, err
	}
	return append([]string{f.kube, component}, flags...), nil
}
