// Package release holds liken release: publish an OS image as a release in a channel directory, and print the digest and catalog entry of a published release.
package release

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/utils/clock"

	"liken.sh/liken/cli/internal/cmdutil"
	noderelease "liken.sh/liken/release"
)

// squashfsMagic opens every squashfs image ("hsqs").
var squashfsMagic = []byte("hsqs")

// digestTimeout bounds liken release digest's download of a release.yaml.
const digestTimeout = 30 * time.Second

// NewCommand returns liken release and its digest subcommand.
func NewCommand() *cobra.Command {
	return newCommand(clock.RealClock{})
}

func newCommand(clk clock.PassiveClock) *cobra.Command {
	var opts BuildOptions
	var output string
	cmd := &cobra.Command{
		Use:   "release IMAGE --channel DIR [--version VERSION]",
		Short: "Publish an OS image as a release, or print a release's digest",
		Long: `Publish an OS image (a squashfs file) as a release in a release channel
directory: copy it to <channel>/<version>/rootfs.squashfs with any extra
artifacts, write the release document (release.yaml: every artifact's path,
size and sha256), and add the release to <channel>/index.yaml. Any web
server can then share the channel directory.

The command prints the digest of release.yaml and a catalog entry to paste
into the Cluster's spec.releases.catalog. Without --version, the release
gets the next version of the day: YYYY.MM.DD-001, -002, ...

A published release never changes, because clusters pin its digest: the
command refuses a version the channel already holds.

A release keeps the etcd minor version of the channel's previous release
(the highest version below it in index.yaml), as the packages.txt
artifact of each names it (the line built:etcd vX.Y.Z, which make image
writes). Once the last leader runs a newer etcd minor, the datastore's
cluster version and storage schema move up to it, and a leader whose
trial then fails cannot go back to the older etcd of its proven slot. The
command refuses a release that changes etcd's minor version, or that does
not say its etcd version after one that does, unless
--allow-etcd-minor-change says the upgrade is planned. When the channel
holds no previous release, or the previous one does not say its etcd
version, it says so and publishes. What it compared is printed on
standard error.`,
		Example: `  # Publish an image as today's next release
  liken release ./rootfs.squashfs --channel /srv/liken

  # Publish with an explicit version and an extra artifact
  liken release ./rootfs.squashfs --channel /srv/liken --version 2026.10.12-001 --artifact boot/vmlinuz=./vmlinuz

  # Publish a release whose etcd moves to a new minor version, once the upgrade is planned
  liken release ./rootfs.squashfs --channel /srv/liken --artifact packages.txt=./packages.txt --allow-etcd-minor-change

  # Print the digest and catalog entry of a published release
  liken release digest https://releases.liken.sh/2026.10.12-001/release.yaml`,
		Args: cmdutil.ExactArgs("IMAGE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Image = args[0]
			if err := checkOutput(output); err != nil {
				return err
			}
			res, err := Build(opts, clk)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.ErrOrStderr(), res.Etcd.Message)
			return printEntry(cmd.OutOrStdout(), output, res, fmt.Sprintf("Published release %s in %s (%s).",
				res.Version, res.Dir, describeArtifacts(res.Document)))
		},
	}
	cmd.Flags().StringVar(&opts.Channel, "channel", "", "Release channel directory (holds index.yaml and one directory per release); created if missing.")
	cmd.Flags().StringVar(&opts.Version, "version", "", "Release version, YYYY.MM.DD-NNN. Default: the next version of the day.")
	cmd.Flags().StringArrayVar(&opts.Artifacts, "artifact", nil, "Extra artifact as PATH=FILE, such as boot/vmlinuz=./vmlinuz (repeatable).")
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: yaml or json prints only the catalog entry.")
	cmd.Flags().BoolVar(&opts.AllowEtcdMinorChange, AllowEtcdMinorChangeFlag, false,
		"Publish even if the release's etcd minor version differs from the channel's previous release, or the release does not say its etcd version. "+
			"Once the last leader runs the newer etcd, the datastore's cluster version and storage schema move up, "+
			"and a leader whose trial then fails cannot go back to its proven slot's older etcd: plan the upgrade first.")
	_ = cmd.MarkFlagDirname("channel")
	cmd.AddCommand(newDigestCommand())
	return cmd
}

func newDigestCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "digest URL|FILE",
		Short: "Print the digest and catalog entry of a published release",
		Long: `Read a release document (release.yaml) from a URL, a file or a release
directory, check it, and print its digest (sha256 of the document's bytes)
and a catalog entry to paste into the Cluster's spec.releases.catalog.

A URL that does not end in .yaml is taken as a release directory: its
release.yaml is read. The document is read with a size limit and checked
before anything is printed.`,
		Example: `  # The catalog entry of a release on a channel
  liken release digest https://releases.liken.sh/2026.10.12-001/

  # The digest of a local release, as YAML only
  liken release digest /srv/liken/2026.10.12-001 -o yaml`,
		Args: cmdutil.ExactArgs("URL|FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref := args[0]
			if isURL(ref) && !strings.HasSuffix(ref, ".yaml") {
				ref = strings.TrimSuffix(ref, "/") + "/" + noderelease.DocumentName
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), digestTimeout)
			defer cancel()
			digest, doc, err := noderelease.DigestOf(ctx, &http.Client{Timeout: digestTimeout}, ref)
			if err != nil {
				return fmt.Errorf("reading the release document %s: %w", ref, err)
			}
			res := &Result{Version: doc.Version, Digest: digest, Document: doc}
			return printEntry(cmd.OutOrStdout(), output, res, fmt.Sprintf("Release %s (%s).", doc.Version, describeArtifacts(doc)))
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: yaml or json prints only the catalog entry.")
	return cmd
}

func isURL(s string) bool { return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") }

// BuildOptions say what to publish where.
type BuildOptions struct {
	// Image is the OS image, a squashfs file.
	Image string
	// Channel is the channel directory.
	Channel string
	// Version is the release version; empty picks the next of the day.
	Version string
	// Artifacts are extra artifacts, each PATH=FILE.
	Artifacts []string
	// AllowEtcdMinorChange publishes a release whose etcd minor version
	// differs from the channel's previous release, or that does not say
	// its etcd version after one that does.
	AllowEtcdMinorChange bool
}

// Result is a published release.
type Result struct {
	// Version is the release version.
	Version string
	// Digest is the digest of release.yaml.
	Digest string
	// Dir is the release directory.
	Dir string
	// Document is the release document.
	Document *noderelease.Document
	// Etcd is what the comparison of the release's etcd version with the
	// channel's previous release found; nil for liken release digest.
	Etcd *EtcdCheck
}

// Build checks the inputs and publishes the release (see the command's
// help), refusing a change of etcd's minor version against the channel's
// previous release unless opts allow it. The clock gives the publication
// time and the day of a default version.
func Build(opts BuildOptions, clk clock.PassiveClock) (*Result, error) {
	if opts.Channel == "" {
		return nil, errors.New("no channel directory: pass --channel DIR (the directory your web server shares)")
	}
	if err := checkImage(opts.Image); err != nil {
		return nil, err
	}
	sources := []noderelease.Source{{Path: noderelease.RootfsPath, File: opts.Image}}
	packages := ""
	for _, a := range opts.Artifacts {
		p, f, ok := strings.Cut(a, "=")
		if !ok || p == "" || f == "" {
			return nil, fmt.Errorf("--artifact %q must be PATH=FILE, such as boot/vmlinuz=./vmlinuz", a)
		}
		if p == noderelease.RootfsPath || p == noderelease.DocumentName {
			return nil, fmt.Errorf("--artifact %q: %s is reserved (the image is the IMAGE argument)", a, p)
		}
		if p == noderelease.PackagesPath {
			packages = f
		}
		sources = append(sources, noderelease.Source{Path: p, File: f})
	}
	if err := os.MkdirAll(opts.Channel, 0o755); err != nil {
		return nil, fmt.Errorf("creating the channel directory: %w", err)
	}
	now := clk.Now().UTC()
	version := opts.Version
	if version == "" {
		v, err := NextVersion(opts.Channel, now)
		if err != nil {
			return nil, err
		}
		version = v
	}
	if !noderelease.ValidVersion(version) {
		return nil, fmt.Errorf("release version %q must look like YYYY.MM.DD-NNN, for example 2026.07.20-001", version)
	}
	etcd, err := checkEtcd(opts.Channel, version, packages, opts.AllowEtcdMinorChange)
	if err != nil {
		return nil, err
	}
	digest, err := noderelease.Build(opts.Channel, version, sources, now)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(opts.Channel, version)
	_, doc, err := noderelease.DigestOf(context.Background(), nil, dir)
	if err != nil {
		return nil, fmt.Errorf("release %s was written but does not read back: %w", version, err)
	}
	return &Result{Version: version, Digest: digest, Dir: dir, Document: doc, Etcd: etcd}, nil
}

// checkImage refuses anything but a squashfs file.
func checkImage(p string) error {
	if p == "" {
		return errors.New("no image: pass the squashfs file of the OS image")
	}
	st, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("image %s is not a regular file", p)
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer f.Close()
	magic := make([]byte, len(squashfsMagic))
	if _, err := io.ReadFull(f, magic); err != nil || string(magic) != string(squashfsMagic) {
		return fmt.Errorf("image %s is not a squashfs file (it does not start with the squashfs magic %q): liken boots squashfs images only (mksquashfs builds one)", p, squashfsMagic)
	}
	return nil
}

// NextVersion is the next free version of the day in the channel:
// YYYY.MM.DD-NNN with NNN one more than any release of that day in the
// index or the directory.
func NextVersion(channel string, now time.Time) (string, error) {
	day := now.UTC().Format("2006.01.02")
	last := 0
	consider := func(v string) {
		if rest, ok := strings.CutPrefix(v, day+"-"); ok && noderelease.ValidVersion(v) {
			if n, err := strconv.Atoi(rest); err == nil && n > last {
				last = n
			}
		}
	}
	idx, err := noderelease.ReadIndex(channel)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", filepath.Join(channel, noderelease.IndexName), err)
	}
	for _, e := range idx.Releases {
		consider(e.Version)
	}
	entries, err := os.ReadDir(channel)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		consider(e.Name())
	}
	if last >= 999 {
		return "", fmt.Errorf("the channel already holds release %s-999: pass --version", day)
	}
	return fmt.Sprintf("%s-%03d", day, last+1), nil
}

func describeArtifacts(doc *noderelease.Document) string {
	var names []string
	for _, a := range doc.Artifacts {
		names = append(names, a.Path)
	}
	return fmt.Sprintf("%s, %s: %s", cmdutil.Plural(len(doc.Artifacts), "artifact", "artifacts"), cmdutil.HumanBytes(doc.TotalSize()), strings.Join(names, ", "))
}

// catalogEntry is one entry of spec.releases.catalog.
type catalogEntry struct {
	Version string `json:"version"`
	Digest  string `json:"digest"`
}

func checkOutput(output string) error {
	switch output {
	case "", "yaml", "json":
		return nil
	}
	return fmt.Errorf("--output %q is not supported: use yaml or json, or leave it out", output)
}

func printEntry(w io.Writer, output string, res *Result, summary string) error {
	entry := catalogEntry{Version: res.Version, Digest: res.Digest}
	switch output {
	case "":
		fmt.Fprintln(w, summary)
		fmt.Fprintf(w, "Digest: %s\n", res.Digest)
		fmt.Fprintln(w, "Catalog entry (add it to spec.releases.catalog, then set spec.version to it):")
		fmt.Fprintf(w, "- version: %q\n  digest: %s\n", res.Version, res.Digest)
	case "yaml":
		fmt.Fprintf(w, "- version: %q\n  digest: %s\n", res.Version, res.Digest)
	case "json":
		b, err := json.MarshalIndent(entry, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintln(w, string(b))
	default:
		return fmt.Errorf("--output %q is not supported: use yaml or json, or leave it out", output)
	}
	return nil
}
